"""Which calibration benchmarks a run of a given wall-clock budget measures, in which order.

The order serves the fit: probes first (every fit needs the latency floor and the host costs), then one
benchmark of every (category, dtype) stratum, then more shapes where they buy the most, by Neyman
allocation: a stratum gets shapes in proportion to its size times the residual spread of its category's
fit (the reference profile's sigma) over the square root of what one of its benchmarks costs. Any prefix
of the order therefore covers every stratum, and a longer budget only adds shapes.

The wall time a benchmark costs (build, trace, warm-up, timing, an optional NVML power window) is a
model fitted by non-negative least squares on the elapsed time of every committed calibration row:

    python3 -m gpuest.calibrate.budget data/calibration/fresh/H100-SXM-budget420.jsonl.gz

prints the constants below: the rows of a run that timed each op until its median was known
(timing.MEDIAN_REL_PRECISION), about half the timing cost per benchmark of the rows before it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..jsonl import read_jsonl
from .suite import BUSY_CALLS, Benchmark, all_benchmarks

# Seconds one time-only benchmark of a category costs beyond its trace (fit over the 1156 rows of the file
# above). Attention loads a kernel per new shape; RNNs build cuDNN plans.
CATEGORY_OVERHEAD_S = {"attention": 0.663, "conv": 0.132, "copy": 0.049, "elementwise": 0.055, "embedding": 0.052,
                       "matmul": 0.030, "norm": 0.103, "optimizer": 2.963, "pool": 0.062, "reduction": 0.047,
                       "rnn": 0.308}
DEFAULT_OVERHEAD_S = 0.25       # a category the fit has not seen
TRACE_SCALE = 0.599             # measured trace seconds per planned Benchmark.trace_cost_s
POWER_WINDOW_EXTRA_S = 0.000    # a power window's cost beyond its length (sync, NVML reads)
POWER_OP_CALLS = 485.1          # ... and beyond it, this many further calls of the op (fitted on the slow RNN,
#                                 optimizer and attention rows; without them the fit finds none)
POWER_WINDOW_S = 0.6            # NVML's energy counter needs windows of at least 0.5 s
FIXED_START_S = 20.0            # CUDA context, cuDNN/cuBLAS handles, NVML start and the idle-power read
DRY_RUN_START_S = 1.0
SUITE_BUDGET_S = {"quick": 300.0}   # named suites: the benchmarks a run of this budget plans on an H100
QUICK_PLAN_SHARE = 0.75         # a named suite is planned to this share of its budget: margin for the host
# Residual spread (log time) of each category's fit in the H100 profile, which weights its strata; a
# constant, so that refitting a profile does not change what the named suites measure
# (python3 -m gpuest.calibrate.budget --sigmas prints the shipped profile's).
CATEGORY_SIGMA = {"attention": 0.272, "conv": 0.374, "copy": 0.109, "elementwise": 0.186, "embedding": 0.337,
                  "matmul": 0.224, "norm": 0.451, "optimizer": 0.014, "pool": 0.541, "reduction": 0.293,
                  "rnn": 0.458}
DEFAULT_SIGMA = 0.3             # a category the reference profile lacks
REFERENCE_PROFILE = "H100-SXM"


def time_only_cost_s(b: Benchmark, dry_run: bool = False) -> float:
    """Estimated wall seconds to build, trace and time `b` (no power window)."""
    if dry_run:  # tiny CPU tensors (a GRU of 4 steps): Python overhead dominates
        return 0.04 + min(b.trace_cost_s, 0.05)
    op_s = b.est_ms / 1e3
    return (CATEGORY_OVERHEAD_S.get(b.category, DEFAULT_OVERHEAD_S) + TRACE_SCALE * b.trace_cost_s
            + 25 * op_s + (BUSY_CALLS * op_s if b.host_paced else 0.0))


def power_cost_s(b: Benchmark, window_s: float = POWER_WINDOW_S) -> float:
    """Estimated wall seconds of `b`'s NVML power window."""
    return window_s + POWER_WINDOW_EXTRA_S + POWER_OP_CALLS * b.est_ms / 1e3


def stratum(b: Benchmark) -> tuple[str, str]:
    """The (category, dtype) a benchmark samples: each has fits of its own (a category in one math mode)."""
    return b.category, str(b.params.get("dtype", ""))


def category_sigmas(profile_name: str = REFERENCE_PROFILE) -> dict[str, float]:
    """Residual spread (log time) of each category's fit in a shipped profile; {} if it has none."""
    from gpuest.profile import shipped_profiles
    profile = shipped_profiles().get(profile_name)
    return {k: fit.sigma for k, fit in profile.residuals.items()} if profile is not None else {}


def priority_order(benchmarks: Sequence[Benchmark], sigmas: dict[str, float] | None = None) -> list[Benchmark]:
    """Probes, then a benchmark of every category, then the first of every stratum, then the rest by
    Neyman allocation (module doc).
    Within a stratum benchmarks keep their fixed pseudo-random priority, so any prefix samples each one's
    ops and sizes evenly."""
    sigmas = CATEGORY_SIGMA if sigmas is None else sigmas
    probes = sorted((b for b in benchmarks if b.kind != "device"), key=lambda b: (b.category, b.name))
    strata: dict[tuple[str, str], list[Benchmark]] = {}
    for b in sorted((b for b in benchmarks if b.kind == "device"), key=lambda b: (b.priority, b.name)):
        strata.setdefault(stratum(b), []).append(b)
    keyed = []
    seen_categories: set[str] = set()
    for key, items in sorted(strata.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        cost = float(np.mean([time_only_cost_s(b) for b in items]))
        weight = len(items) * sigmas.get(key[0], DEFAULT_SIGMA) / math.sqrt(cost)
        # Each category's largest stratum opens first, then every other stratum's first benchmark.
        first = -2.0 if key[0] not in seen_categories else -1.0
        seen_categories.add(key[0])
        keyed += [(k / weight if k else first, key, b.name, b) for k, b in enumerate(items)]
    return probes + [entry[-1] for entry in sorted(keyed, key=lambda e: e[:3])]


@dataclass
class Plan:
    """Which benchmarks run, which get a power window, and the estimated wall time (s)."""

    benchmarks: list[Benchmark]
    power: set[str] = field(default_factory=set)
    est_s: float = 0.0
    dropped: int = 0


def plan(benchmarks: Sequence[Benchmark], budget_s: float, *, power: bool = True, fixed_s: float = FIXED_START_S,
         window_s: float = POWER_WINDOW_S, time_share: float = 0.7, min_power_ms: float = 0.02,
         dry_run: bool = False, sigmas: dict[str, float] | None = None) -> Plan:
    """The longest prefix of priority_order whose estimated wall time fits `budget_s`: time-only
    measurements may take `time_share` of the budget after the fixed start-up cost, then power windows go
    to benchmarks estimated at >= `min_power_ms` per call, in the same order, while the budget lasts."""
    order = priority_order(benchmarks, sigmas)
    available = max(0.0, budget_s - fixed_s)
    chosen: list[Benchmark] = []
    spent = 0.0
    for b in order:
        cost = time_only_cost_s(b, dry_run)
        if spent + cost > available * (time_share if power else 1.0) and chosen:
            break
        chosen.append(b)
        spent += cost
    powered: set[str] = set()
    if power:
        for b in chosen:
            if not dry_run and (b.kind != "device" or b.est_ms < min_power_ms):
                continue
            cost = power_cost_s(b, window_s) if not dry_run else window_s + 0.005
            if spent + cost > available:
                break
            powered.add(b.name)
            spent += cost
    return Plan(chosen, powered, fixed_s + spent, len(order) - len(chosen))


SUITES = ("quick", "full")


def run_plan(suite: str = "quick", budget_s: float | None = None, categories: Iterable[str] | None = None, *,
             power: bool = True, window_s: float = POWER_WINDOW_S, dry_run: bool = False) -> Plan:
    """What one calibration run measures: the longest prefix of the priority order (of `categories`, else
    of the whole suite) that fits `budget_s`, so a longer budget only adds shapes. With no budget, a named
    suite: "quick" is what SUITE_BUDGET_S plans on an H100 (at QUICK_PLAN_SHARE of it, the rest a margin
    for the host), "full" every benchmark."""
    if suite not in SUITES:
        raise ValueError(f"unknown calibration suite {suite!r}; accepted: {', '.join(SUITES)}")
    if budget_s is None:
        budget_s = SUITE_BUDGET_S[suite] * QUICK_PLAN_SHARE if suite in SUITE_BUDGET_S else math.inf
    return plan(all_benchmarks(categories), budget_s, power=power, window_s=window_s, dry_run=dry_run,
                fixed_s=DRY_RUN_START_S if dry_run else FIXED_START_S)


def suite_version() -> str:
    """A fingerprint of the full suite (its benchmarks' names and parameters): profiles record it, so two
    profiles say whether they were measured on the same suite."""
    import hashlib
    text = json.dumps(sorted((b.name, b.params) for b in all_benchmarks()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def fit_wall_model(paths: Sequence[str | Path]) -> dict[str, float]:
    """Non-negative least squares of each row's elapsed seconds on its category, trace cost and power
    window (the constants at the top of this module)."""
    by_name = {b.name: b for b in all_benchmarks()}
    cats = sorted({b.category for b in by_name.values()})
    xs, ys = [], []
    for path in paths:
        for r in read_jsonl(path):
            b = by_name.get(r.get("name"))
            if b is None or r.get("elapsed_s") is None or r.get("error"):
                continue
            windowed = r.get("duration_s") is not None
            x = [float(b.category == c) for c in cats]
            x += [b.trace_cost_s, float(windowed) * (r["duration_s"] or 0.0), float(windowed),
                  float(windowed) * b.est_ms / 1e3]
            xs.append(x)
            ys.append(r["elapsed_s"] - (r["duration_s"] or 0.0) if windowed else r["elapsed_s"])
    from scipy.optimize import lsq_linear
    x_arr = np.array(xs)
    x_arr[:, len(cats) + 1] = 0.0   # the window's own length is subtracted from y, not fitted
    coef = lsq_linear(x_arr, np.array(ys), bounds=(0.0, np.inf)).x
    out = {f"overhead_s[{c}]": float(v) for c, v in zip(cats, coef)}
    out.update(trace_scale=float(coef[len(cats)]), power_window_extra_s=float(coef[len(cats) + 2]),
               power_op_calls=float(coef[len(cats) + 3]), rows=len(ys))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.budget", description="Fit the wall-time model.")
    p.add_argument("calibration", nargs="*", help="calibration JSONL files with elapsed_s per row")
    p.add_argument("--sigmas", action="store_true", help="print the reference profile's residual sigmas")
    args = p.parse_args(argv)
    if args.sigmas:
        for k, v in sorted(category_sigmas().items()):
            print(f"{k:32s} {v:.3f}")
    for k, v in (fit_wall_model(args.calibration).items() if args.calibration else ()):
        print(f"{k:32s} {v:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
