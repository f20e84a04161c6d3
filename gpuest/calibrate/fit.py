"""Fit a calibration profile from the raw micro-benchmark rows (no GPU needed).

Residual: robust regression (statsmodels RLM, Huber weights) of log(measured / roofline) on the
estimator's own residual features, so the fit corrects exactly what the estimator computes; one fit
per category, per ATen op and per either of them in one math mode where the benchmarks suffice.
Huber weights keep a few disturbed timings from moving a whole category. Latency: the
median time of tiny kernels. Host dispatch: the measured per-op enqueue cost per category, scaled on
host-bound validation runs (fit_host). Power: bounded least squares of window-average power on the
measured utilisations (fit_power).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import statsmodels.api as sm
from scipy.optimize import lsq_linear
from scipy.spatial.distance import cdist

from gpuest.catalog import GPUSpec, get_gpu
from gpuest.errors import ProfileError
from gpuest.jsonl import read_jsonl
from gpuest.price.device_time import (CUDA_CORE_GROUPS_KEY, RESIDUAL_CLIP, DeviceTimes, cuda_core_convolutions,
                                         dependent_update_time_s, device_times, dram_floor_s, fit_key, fit_keys,
                                         log_floor, persistent_step_time_s, persistent_steps, within_fit_range)
from gpuest.price.host_timeline import later_host_work
from gpuest.price.node_table import NodeTable
from gpuest.price.estimate import power_capped_clocks
from gpuest.price.profile_choice import ProfileChoice, roofline_profile, with_power
from gpuest.price.features import RESIDUAL_FEATURES, coefficient_ceilings
from gpuest.annotate.registry import CATEGORIES, ISOLATED_VARIANTS
from gpuest.profile import (MODE_FIT_FAMILY, MODE_KEY_SEP, PREDICTS_ALL, PROFILE_SCHEMA, Profile, ResidualFit,
                            ResidualPoints, mode_key, op_variants, prior_profile, profile_from_json)

from .calibration_rows import POWER_CAPPED_CLOCK_KEY, device_nodes, row_clock
from .fit_host import fit_host_and_gap, load_validation
from .fit_power import fit_power, simt_from_prior

# Training rows a category (an op) needs for a fit of its own; with fewer it uses its parent's fit.
MIN_ROWS_PER_CATEGORY = 8
MIN_ROWS_PER_OP = 10
# An op in one math mode is fitted as a correction to its category in that mode (at most one coefficient
# per CHILD_ROWS_PER_COEF rows), so it needs fewer rows of its own than an op fitted across modes.
MIN_ROWS_PER_OP_IN_MODE = 6
ROWS_PER_COEF = 2               # a fit gets at most one coefficient per this many benchmarks
CHILD_ROWS_PER_COEF = 4         # ... and a fit pooled with its parent one correction per this many
# Largest condition number of a fit's column-scaled design: near-collinear flags get slopes that cancel
# on every benchmark and blow up on a combination none has (docs/DESIGN.md 3.5).
MAX_CONDITION = 1e2
MIN_FEATURE_SPREAD = 0.1        # feature units (log2 / flags) by which a sample must differ to count as
MIN_ROWS_APART = 3              # ... varying that feature, and how many must
TINY_BYTES = 64 * 1024          # a kernel moving less than this is pure latency on any modern GPU
TINY_FLOPS = 1e5
# Measured time left after the fixed costs (kernel latency, synchronisations, persistent steps), as a
# floor fraction of the measured time: a benchmark its fixed costs explain all but noise of must leave
# the residual fit little to price (at 0.2 the fit added a fifth of such a persistent RNN's time back;
# 0.05 chosen by 5-fold cross-validation, benchmarks/cross_validate.py; docs/CV_HISTORY.md).
MIN_RESIDUAL_SHARE = 0.05
HOST_BOUND_MARGIN = 1.5        # measured / host dispatch cost below which a timing is host-limited
HOST_PACED_MARGIN = 1.5         # elapsed / device-busy above which a host-paced row measured the host
MIN_HOST_LAUNCH_ROWS = 4       # rows with distinct launch counts needed to split a host cost per launch
# A calibration that measured less of the suite than this (a default 5-minute run measures about 30 %; a
# complete one may miss a few failed benchmarks) corrects the nearest other calibrated GPU's fits
# (shape_prior_for): fitted alone, half to two thirds of the suite priced worse than a third with the prior
# (docs/QUICK_SUITE_STUDY.md, python3 benchmarks/quick_suite_study.py --budget-s 450)
PARTIAL_SUITE_SHARE = 0.95
MIN_SPLIT_ROWS = 4             # benchmarks with barriers needed to split their cost from the serial work
MIN_POOL_ROWS = 6               # training benchmarks an op (or op in one math mode) needs for a residual pool
MIN_POINT_SCALE = 0.5           # smallest distance unit of a feature in a pool (feature units)
POINT_CLIP_SIGMAS = 3.0         # residuals beyond this many of the fit's robust sigmas are clipped,
POINT_CLIP_MIN = math.log(2.0)  # ... or beyond this (log time), whichever is wider
SAME_SHAPE_DISTANCE = 0.25      # closer than this (pool scales), a lent residual point is a benchmark this run measured
POINT_DECIMALS = 5              # residual points are stored (and used) rounded to this many decimals
MEMORY_LIKE = ("elementwise", "reduction", "copy", "norm", "pool", "embedding", "optimizer", "other")


@dataclass(frozen=True)
class RawData:
    meta: dict[str, Any]
    rows: list[dict[str, Any]]


def load_raw(path: str | Path) -> RawData:
    """Rows of a calibration run (JSONL) and its provenance (first-line meta or `<path>.meta.json`)."""
    path = Path(path)
    meta: dict[str, Any] = {}
    rows = []
    for row in read_jsonl(path):
        if "meta" in str(row.get("schema", "")):
            meta.update(row)
        else:
            rows.append(row)
    # a run gzipped after it was measured keeps its sidecar's plain name (run.jsonl.gz -> run.jsonl.meta.json)
    for sidecar in (path.with_name(path.name + ".meta.json"),
                    path.with_name(path.name.removesuffix(".gz") + ".meta.json")):
        if sidecar.exists():
            meta.update(json.loads(sidecar.read_text()))
            break
    # The runner's sidecar lists one entry per (resumed) session; provenance is the first real one.
    for session in meta.get("sessions", []):
        if session.get("gpu_name"):
            meta = {**session, **{k: v for k, v in meta.items() if k != "sessions"},
                    "sessions": meta["sessions"]}
            break
    return RawData(meta, rows)


def usable(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r.get("error") and not r.get("dry_run") and r.get("nodes")
            and (r.get("time_ms_median") or 0) > 0]


def rows_node_table(rows: list[dict[str, Any]]) -> tuple[NodeTable, np.ndarray]:
    """One node table of the device nodes of calibration `rows`, and the index of each node's row (so
    np.bincount(owner, weights=per-node seconds) gives each row's priced time)."""
    nodes, owner = [], []
    for i, row in enumerate(rows):
        for n in device_nodes(row):
            nodes.append(n)
            owner.append(i)
    return NodeTable.from_records(nodes), np.array(owner, dtype=int)


def kernel_latency_s(rows: list[dict[str, Any]]) -> float:
    """Median time per kernel of the tiny benchmarks (bytes and FLOPs negligible)."""
    per_kernel = []
    for r in rows:
        nodes = device_nodes(r)
        total_bytes = sum(n.get("bytes_read", 0) + n.get("bytes_written", 0) for n in nodes)
        total_flops = sum(n.get("flops", 0) for n in nodes)
        kernels = sum(n.get("kernels", 1) for n in nodes)
        if nodes and kernels and total_bytes < TINY_BYTES and total_flops < TINY_FLOPS:
            per_kernel.append(r["time_ms_median"] * 1e-3 / kernels)
    if not per_kernel:
        raise ProfileError("the calibration data has no tiny-kernel rows to measure kernel latency from")
    return float(np.median(per_kernel))


SYNC_ROOF_SHARE = 0.2           # benchmarks whose roofline is below this share of their time give the sync cost


def _time_beyond(rows: list[dict[str, Any]], gpu: GPUSpec, field: str,
                 fixed_s: Callable[[NodeTable, DeviceTimes], float]) -> list[tuple[float, NodeTable, float]]:
    """(events, node table, seconds beyond `fixed_s(table, times)` and the roofline) of the fitting (not
    held-out) benchmarks that have events of node field `field` and whose time is mostly fixed cost."""
    plain = roofline_profile()
    out = []
    for r in rows:
        nodes = device_nodes(r)
        events = sum(n.get(field, 0) for n in nodes)
        if not events or r.get("holdout") or r.get("kind") in ("latency", "host_dispatch"):
            continue
        table = NodeTable.from_records(nodes)
        times = device_times(table, gpu, row_clock(r, gpu), plain)[0]
        roof = float(times.roofline_s.sum())
        measured = measured_device_s(r)
        if roof <= SYNC_ROOF_SHARE * measured:
            out.append((float(events), table, measured - fixed_s(table, times) - roof))
    return out


def _cost_per_event(rows: list[dict[str, Any]], gpu: GPUSpec, field: str,
                    fixed_s: Callable[[NodeTable, DeviceTimes], float], fallback: float | None) -> float | None:
    """Fixed device time per counted event of node field `field` (s): the median, over the benchmarks
    _time_beyond keeps, of their time beyond fixed cost and roofline per event; `fallback` where none."""
    per_event = [left / events for events, _, left in _time_beyond(rows, gpu, field, fixed_s)]
    return float(max(np.median(per_event), 0.0)) if per_event else fallback


def host_sync_s(rows: list[dict[str, Any]], gpu: GPUSpec, latency_s: float, fallback: float | None) -> float | None:
    """GPU idle per host synchronisation inside an op (s), beyond kernel latency and roofline."""
    return _cost_per_event(rows, gpu, "host_syncs", lambda t, times: float(times.kernels.sum()) * latency_s,
                           fallback)


@dataclass(frozen=True)
class PersistentStepCosts:
    """Device time of persistent kernels' steps (s): per grid-wide barrier, per serial step and per
    spilled serial step (gpuest.price.device_time.persistent_steps; None: the prior's)."""

    grid_sync_s: float | None
    persistent_step_s: float | None
    spilled_step_s: float | None

    def seconds(self) -> tuple[float, float, float]:
        return (self.grid_sync_s or 0.0, self.persistent_step_s or 0.0, self.spilled_step_s or 0.0)


def persistent_step_costs(rows: list[dict[str, Any]], gpu: GPUSpec, latency_s: float, sync_s: float,
                          prior: Profile) -> PersistentStepCosts:
    """What a persistent recurrent kernel's steps cost beyond kernel latency, host synchronisations and
    roofline: non-negative least squares on relative errors splits each fitting benchmark's time into a
    cost per grid-wide barrier, per serial step (the recurrent weights' multiply) and per spilled serial
    step (weights beyond those the kernel keeps in registers; a persistent step takes 0.3 us at 4096
    recurrent weights and 7.7 us at 147456 on the H100). A share no benchmark has keeps the prior's cost;
    too few benchmarks to split give the median per barrier and no step costs."""
    def launches_and_syncs_s(table: NodeTable, times: DeviceTimes) -> float:
        return float(times.kernels.sum()) * latency_s + float(table.host_syncs.sum()) * sync_s

    kept = []
    for events, table, left in _time_beyond(rows, gpu, "grid_syncs", launches_and_syncs_s):
        serial, spilled = persistent_steps(table)
        if left > 0:
            kept.append((events, float(serial.sum()), float(spilled.sum()), left))
    if not kept:
        return PersistentStepCosts(prior.grid_sync_s, prior.persistent_step_s, prior.spilled_step_s)
    x, y = np.array([k[:3] for k in kept]), np.array([k[3] for k in kept])
    if len(y) < MIN_SPLIT_ROWS or not np.ptp(x[:, 1] / x[:, 0]) > 0:
        return PersistentStepCosts(float(np.median(y / x[:, 0])), 0.0, 0.0)
    cols = [0, 1, 2] if x[:, 2].any() else [0, 1]
    cost = lsq_linear(x[:, cols] / y[:, None], np.ones(len(y)), bounds=(0.0, np.inf)).x
    return PersistentStepCosts(float(cost[0]), float(cost[1]),
                               float(cost[2]) if len(cols) == 3 else prior.spilled_step_s)


def host_costs(rows: list[dict[str, Any]], fallback: dict[str, float]) -> dict[str, float]:
    """Per-category host dispatch cost (s) from the rows that measured it (host probes, and host-paced
    rows whose GPU was mostly idle); unmeasured categories keep the prior.

    Where a category's rows do different amounts of host work per op from a host loop (cuDNN RNNs over more
    or fewer time steps, foreach ops over more or fewer tensors: host_timeline.later_host_work), non-negative
    least squares splits their host time into a cost per op and a cost per later unit, `launch_<category>`;
    elsewhere the cost per op is the median."""
    by_cat: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        us = r.get("host_dispatch_us")
        if r.get("busy_ms") and r["time_ms_median"] > HOST_PACED_MARGIN * r["busy_ms"]:
            # The GPU sat idle for much of the call: the host's launches paced it, so its elapsed
            # time is the host's time (timing it with the GPU kept busy fails: cuDNN RNNs synchronise).
            us = r["time_ms_median"] * 1e3
        if not isinstance(us, (int, float)) or us <= 0:
            continue
        nodes = device_nodes(r) or r["nodes"]
        cats = [n["category"] for n in nodes]
        cat = max(set(cats), key=cats.count) if cats else "default"
        extra = float(later_host_work(NodeTable.from_records(nodes)).sum())
        by_cat.setdefault(cat, []).append((us * 1e-6, max(len(nodes), 1), extra))
    out = dict(fallback)
    for cat, obs in by_cat.items():
        host_s, n_ops, extra = (np.array(v, dtype=float) for v in zip(*obs))
        if len(obs) >= MIN_HOST_LAUNCH_ROWS and len(np.unique(extra)) >= MIN_HOST_LAUNCH_ROWS:
            # Relative errors: a 20-step and a 500-step RNN count alike.
            x = np.column_stack([n_ops, extra]) / host_s[:, None]
            per_op, per_launch = lsq_linear(x, np.ones(len(obs)), bounds=(0.0, np.inf)).x
            out[cat], out[f"launch_{cat}"] = float(per_op), float(per_launch)
        else:
            out[cat] = float(np.median(host_s / n_ops))
    if "elementwise" in by_cat:
        out["default"] = out["elementwise"]
    return out


def measured_device_s(row: dict[str, Any]) -> float:
    """The device time a row measured (s): its device-busy time where the runner recorded one (ops that
    launch from a host loop, whose elapsed time includes GPU idle gaps), else its CUDA-event time."""
    busy = row.get("busy_ms")
    if isinstance(busy, (int, float)) and busy > 0:
        return busy * 1e-3
    # Launch-inclusive timings of one call (imported public data) also hold the call's host dispatch.
    return (row["time_ms_median"] - (row.get("host_overhead_ms") or 0.0)) * 1e-3


@dataclass
class RowFeatures:
    category: str
    op: str                      # the op that dominates the row's roofline time
    mode: str                    # the math mode that dominates it (as priced: after GPU fallbacks)
    y: float                     # log(measured_after_latency / roofline)
    x: np.ndarray
    holdout: bool
    measured_s: float
    row: dict[str, Any]
    log_floor: float = 0.0       # the lowest log correction pricing allows (device_time.log_floor)
    cuda_core_groups: bool = False   # its op is a convolution run on CUDA cores (device_time.CUDA_CORE_GROUPS_KEY)


def host_limited(row: dict[str, Any], host_op_s: dict[str, float]) -> bool:
    """Whether a back-to-back timing measured the host's dispatch rate rather than the kernel: an op
    that takes less than HOST_BOUND_MARGIN x its category's dispatch cost says nothing about the GPU."""
    if row.get("timing_method") == "events_queued" or row.get("busy_ms"):
        return False  # timed with the host running ahead, or profiled: device time by construction
    nodes = device_nodes(row)
    host = sum(host_op_s.get(n["category"], host_op_s["default"]) for n in nodes)
    return row["time_ms_median"] * 1e-3 < HOST_BOUND_MARGIN * host


# A benchmark whose serial walks (DeviceTimes.walk_s) take at least this share of its measured time
# beyond latency is priced by the walk, not by a corrected roofline, and is left out of the residual fit.
WALK_BOUND_SHARE = 0.5


def row_features(rows: list[dict[str, Any]], gpu: GPUSpec, latency_s: float,
                 host_op_s: dict[str, float] | None = None, sync_s: float = 0.0,
                 steps: PersistentStepCosts | None = None) -> list[RowFeatures]:
    """One regression sample per device-bound benchmark: roofline-time-weighted features of its nodes."""
    plain = roofline_profile()
    step_costs = steps.seconds() if steps else (0.0, 0.0, 0.0)
    out = []
    for r in rows:
        nodes = device_nodes(r)
        if not nodes or r.get("kind") in ("latency", "host_dispatch"):
            continue
        if host_op_s is not None and host_limited(r, host_op_s):
            continue
        table = NodeTable.from_records(nodes)
        times, _ = device_times(table, gpu, row_clock(r, gpu), plain)
        # The correction scales the bandwidth-or-compute roofline; a serial walk is a floor beside it.
        roof = np.maximum(times.compute_s, times.memory_s)
        total_roof = float(roof.sum())
        if total_roof <= 0:
            continue
        measured = measured_device_s(r)
        # Everything pricing adds beside the corrected roofline, so the fit does not learn it a second time.
        fixed = (float(times.kernels.sum()) * latency_s + float(table.host_syncs.sum()) * sync_s
                 + float(persistent_step_time_s(table, *step_costs).sum())
                 + float(dependent_update_time_s(table).sum()))
        after_latency = max(measured - fixed, MIN_RESIDUAL_SHARE * measured)
        # A benchmark its walk floor prices says nothing about how the roofline is corrected.
        if float(times.walk_s.sum()) >= WALK_BOUND_SHARE * after_latency:
            continue
        cats = table.category
        dominant = max(set(cats.tolist()), key=lambda c: roof[cats == c].sum())
        # Features describe the fit's own nodes: a side node of another category (an RNN benchmark's
        # loss reduction) is priced by its own fit and must not lend this one its shape features.
        own = np.where(cats == dominant, roof, 0.0)
        weights = own / own.sum()
        top = int(np.argmax(roof))
        out.append(RowFeatures(dominant, str(table.fit_op[top]), str(times.effective_mode[top]),
                               math.log(after_latency / total_roof), weights @ times.features,
                               bool(r.get("holdout")), measured, r,
                               float(weights @ log_floor(times.compute_s, dram_floor_s(table, gpu), roof)),
                               bool(cuda_core_convolutions(table)[top])))
    return out


# IRLS run to convergence of the coefficients themselves: statsmodels' default stops once the deviance
# changes by < 1e-8, and where that lands between two iterations moved a coefficient by 1e-3 between
# machines whose BLAS sums in another order.
IRLS_TOL = 1e-13
IRLS_MAX_ITER = 1000


def _robust_fit(y: np.ndarray, x: np.ndarray) -> Any:
    return sm.RLM(y, x, M=sm.robust.norms.HuberT()).fit(conv="coefs", tol=IRLS_TOL, maxiter=IRLS_MAX_ITER)


def usable_features(x: np.ndarray, rows_per_coef: int = ROWS_PER_COEF) -> list[int]:
    """Features that vary in these samples and are not (near-)collinear with earlier ones, in
    RESIDUAL_FEATURES order, at most one per `rows_per_coef` samples: a key with a dozen benchmarks is
    not fitted with ten free slopes."""
    budget = max(1, len(x) // rows_per_coef)
    kept: list[int] = []
    for j in [0] + [j for j in range(1, x.shape[1]) if _informative(x[:, j])]:
        if len(kept) < budget and _well_conditioned(x[:, kept + [j]]):
            kept.append(j)
    return kept


def _informative(column: np.ndarray) -> bool:
    """A feature says something about these samples only if several of them take values apart from
    the rest: a sliver from a side node (a loss reduction's share of an RNN benchmark) lets the fit buy
    any residual with an enormous slope that then multiplies every real node of that key."""
    apart = np.abs(column - np.median(column)) > MIN_FEATURE_SPREAD
    return int(apart.sum()) >= MIN_ROWS_APART


def _well_conditioned(x: np.ndarray, max_cond: float = MAX_CONDITION) -> bool:
    """Columns (scaled to unit norm) independent enough that the coefficients and their covariance
    are numbers, not cancellation noise: near-collinear features make both explode."""
    scaled = x / np.maximum(np.linalg.norm(x, axis=0), 1e-12)
    s = np.linalg.svd(scaled, compute_uv=False)
    return bool(s[-1] > 0 and s[0] / s[-1] < max_cond)


def fit_category(samples: list[RowFeatures], parent: ResidualFit | None = None,
                 level_only: bool = False) -> ResidualFit:
    """Huber-robust regression on the usable features; the others get coefficient 0.

    With a parent fit (partial pooling), the regression is of what the parent leaves unexplained, on
    at most one feature per CHILD_ROWS_PER_COEF samples: a narrow key (one op, one math mode) corrects
    its parent's level and the slopes its own data pin down, and inherits the rest of the parent's
    shape dependence instead of re-learning it from a dozen benchmarks. level_only: the pooled fit corrects
    its parent's level alone (a partial calibration's, see fit_residuals)."""
    y = np.array([s.y for s in samples])
    x = np.vstack([s.x for s in samples])
    coef = np.zeros(x.shape[1])
    cov = np.zeros((x.shape[1], x.shape[1]))
    x_lo, x_hi = x.min(axis=0), x.max(axis=0)
    log_lo, log_hi = float(y.min()), float(y.max())
    if parent is not None:
        log_lo, log_hi = min(log_lo, parent.log_lo), max(log_hi, parent.log_hi)
        coef[:] = parent.coef
        cov[:] = parent.cov
        x_lo = np.minimum(x_lo, parent.x_lo) if parent.x_lo is not None else x_lo
        x_hi = np.maximum(x_hi, parent.x_hi) if parent.x_hi is not None else x_hi
        target = y - within_fit_range(parent, x) @ coef
        kept = [0] if level_only else usable_features(x, CHILD_ROWS_PER_COEF)
    else:
        target = y
        kept = usable_features(x)
    model, kept, pinned, target = _fit_within_ceilings(target, x, coef, kept)
    coef[pinned] = CEILINGS[pinned]
    coef[kept] += model.params
    # The parent's coefficients are estimated from other rows too; treating the two estimates as
    # independent adds their covariances.
    cov[np.ix_(kept, kept)] += np.asarray(model.cov_params())
    sigma = float(model.scale)  # robust (MAD-based) residual scale of log time
    resid = target - x[:, kept] @ model.params
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 and (parent or len(kept) > 1) else 0.0
    return ResidualFit(tuple(map(float, coef)), tuple(tuple(map(float, row)) for row in cov), sigma, r2, len(y),
                       x_lo=tuple(map(float, x_lo)), x_hi=tuple(map(float, x_hi)), log_lo=log_lo, log_hi=log_hi)


# Each residual feature's largest coefficient (its registration's max_coef; inf where none), in column order.
CEILINGS = coefficient_ceilings()


def _fit_within_ceilings(target: np.ndarray, x: np.ndarray, base: np.ndarray,
                         kept: list[int]) -> tuple[Any, list[int], list[int], np.ndarray]:
    """A robust fit of `target` adding to coefficients `base` on features `kept`, none of whose sums may pass
    its ceiling (features.coefficient_ceilings): a feature whose unconstrained coefficient passes it is
    pinned there and the rest refitted, until none passes (the least-squares optimum under one bound lies
    on it). Returns the fit, the features it left free, those pinned, and the target the fit was of (what
    the pinned features leave of `target`)."""
    pinned = [j for j in range(len(base)) if base[j] > CEILINGS[j]]
    kept = [j for j in kept if j not in pinned]
    while True:
        rest = target - x[:, pinned] @ (CEILINGS[pinned] - base[pinned])
        model = _robust_fit(rest, x[:, kept])
        over = [j for j, p in zip(kept, model.params) if base[j] + p > CEILINGS[j]]
        if not over:
            return model, kept, pinned, rest
        pinned = sorted(pinned + over)
        kept = [j for j in kept if j not in over]


def shape_prior_for(gpu: GPUSpec, suite_share: float) -> Profile | None:
    """The shipped profile a calibration of `gpu` that measured `suite_share` of the suite corrects: the
    nearest other GPU calibrated with power, for a partial run (0 < share < PARTIAL_SUITE_SHARE); None for a
    (near-)complete suite and for rows that are not the suite's (imported public timings, share 0)."""
    from gpuest.price.profile_choice import nearest_full_profile
    if not 0.0 < suite_share < PARTIAL_SUITE_SHARE:
        return None
    return nearest_full_profile(gpu, exclude=gpu.name)


def fit_residuals(samples: list[RowFeatures], shape_prior: Profile | None = None) -> dict[str, ResidualFit]:
    """One fit per category, op, and either in one math mode where the samples suffice, and a default.
    shape_prior: another GPU's profile whose fits a partial calibration corrects. Each key it fits is
    the parent of this data's fit of that key, and every pooled fit then corrects its parent's level
    only: a 5-minute run measures a few shapes per key, enough to pin a level but not slopes
    (docs/QUICK_SUITE_STUDY.md)."""
    train = [s for s in samples if not s.holdout]
    fits: dict[str, ResidualFit] = {}
    lent = dict(shape_prior.residuals) if shape_prior is not None else {}
    level_only = shape_prior is not None
    shared = [s for s in train if not isolated_variant(s.op)]
    for cat in sorted({s.category for s in shared}):
        cat_rows = [s for s in shared if s.category == cat]
        if len(cat_rows) >= MIN_ROWS_PER_CATEGORY:
            fits[cat] = fit_category(cat_rows, lent.get(cat), level_only)
    # Ops with enough benchmarks of their own (e.g. layer norm vs batch norm, attention forward vs
    # backward) get their own fit, and so do ops and categories in one math mode (an fp32 SIMT GEMM
    # and a bf16 tensor-core GEMM approach their peaks differently); the estimator uses the most
    # specific fit there is (see gpuest.price.device_time.fit_keys). Each is pooled with its parent.
    # A narrower key whose rows are all of its parent's adds nothing and is skipped.
    # Pooling follows the larger effect: math mode changes a GEMM's behaviour more than which GEMM op
    # it is, so an op in one mode pools with its category in that mode (else with the op).
    # An isolated variant's rows take part in its own op keys only, each pooled with nothing but its own.
    parent_size = Counter(s.category for s in shared) + Counter(s.op for s in train) + \
        Counter(mode_key(s.category, s.mode) for s in shared)
    for key_of, parents_of, min_rows, rows_of in (
            (lambda s: s.op, lambda s: () if isolated_variant(s.op) else (s.category,), MIN_ROWS_PER_OP, train),
            (lambda s: mode_key(s.category, s.mode), lambda s: (s.category,), MIN_ROWS_PER_OP, shared),
            (lambda s: mode_key(s.op, s.mode),
             lambda s: (s.op,) if isolated_variant(s.op) else (mode_key(s.category, s.mode), s.op, s.category),
             MIN_ROWS_PER_OP_IN_MODE, train)):
        for key in sorted({key_of(s) for s in rows_of}):
            rows = [s for s in rows_of if key_of(s) == key]
            parents = parents_of(rows[0])
            if (len(rows) >= min_rows and len({s.category for s in rows}) == 1 and key not in fits
                    and all(len(rows) < parent_size[p] for p in parents)):
                parent = lent.get(key) or next((fits[p] for p in parents if p in fits), None)
                fits[key] = fit_category(rows, parent, level_only)
    default_rows = [s for s in train if s.category in MEMORY_LIKE] or train
    if not default_rows:
        raise ProfileError("the calibration data has no usable timing rows")
    fits["default"] = fit_category(default_rows, lent.get("default"), level_only)
    if level_only:
        fits.update(inherited_fits(fits, lent, {s.op: s.category for s in train}))
    return fits


def isolated_variant(op: str) -> bool:
    """Whether `op` (variant_op-qualified) carries a variant of ISOLATED_VARIANTS."""
    return any(v in ISOLATED_VARIANTS for v in op_variants(op))


def inherited_fits(fits: dict[str, ResidualFit], lent: dict[str, ResidualFit],
                   category_of: dict[str, str]) -> dict[str, ResidualFit]:
    """The shape prior's fits of keys a partial run measured too few benchmarks of, each moved by the level
    shift the run measured for the key it would otherwise fall back to (an op in one math mode falls back
    to the op, then its category in that mode, then its category: gpuest.price.device_time.fit_key). Without
    them a node whose op the prior fits in its math mode takes a coarser fit of other modes' shapes: the
    fp32 addmm of BERT-base priced far slower than the full profile does, at the 16-bit fit's slopes. Ops
    the run never measured keep the run's own fallback (their category is not known here)."""
    out = {}
    for key, fit in sorted(lent.items()):
        base, sep, mode = key.partition(MODE_KEY_SEP)
        if key in fits or key == "default" or base in CATEGORIES and not sep:
            continue
        if base in CATEGORIES:
            fallbacks = [base]
        elif base in category_of:
            category = category_of[base]
            fallbacks = ([base, mode_key(category, mode)] if sep else []) + [category]
        else:
            continue
        fallback = next((k for k in fallbacks if k in fits and k in lent), None)
        if fallback is None:
            continue
        shift = fits[fallback].coef[0] - lent[fallback].coef[0]
        out[key] = replace(fit, coef=(fit.coef[0] + shift, *fit.coef[1:]),
                           log_lo=None if fit.log_lo is None else fit.log_lo + shift,
                           log_hi=None if fit.log_hi is None else fit.log_hi + shift)
    return out


def fit_residual_points(samples: list[RowFeatures], fits: dict[str, ResidualFit]) -> dict[str, ResidualPoints]:
    """Residual pools for the local correction (gpuest.price.local_correction): per ATen op, and per
    op in one math mode, where it has MIN_POOL_ROWS training benchmarks, each benchmark's features and
    what the fit that prices it leaves of its log time. A feature's distance unit is its spread in
    the pool (at least MIN_POINT_SCALE), so a flag that no benchmark of the pool sets still separates a
    node that sets it from all of them."""
    train = [s for s in samples if not s.holdout]
    residual = []
    for s in train:
        fit = fits[fit_key(s.op, s.category, s.mode, fits)]
        fitted = float(np.clip(within_fit_range(fit, s.x[None, :])[0] @ np.asarray(fit.coef), s.log_floor,
                               RESIDUAL_CLIP[1]))
        # Huber-style: the fit down-weighted its outliers, and so does the correction (a host-bound
        # or pathological benchmark must not drag its neighbours along), though never below a factor
        # of two: a tight fit's sigma says its noise is small, not that a kernel cannot be 2x slower.
        bound = max(POINT_CLIP_SIGMAS * fit.sigma, POINT_CLIP_MIN)
        residual.append(float(np.clip(s.y - fitted, -bound, bound)))
    pools: dict[str, list[int]] = {}
    for i, s in enumerate(train):
        pools.setdefault(s.op, []).append(i)
        pools.setdefault(mode_key(s.op, s.mode), []).append(i)
    out = {}
    for key, members in sorted(pools.items()):
        op = train[members[0]].op
        if len(members) < MIN_POOL_ROWS or (key != op and len(members) == len(pools[op])):
            continue  # too few, or the op's own pool under another name
        x = np.round(np.vstack([train[i].x for i in members]), POINT_DECIMALS)
        scale = np.round(np.maximum(x.std(axis=0), MIN_POINT_SCALE), POINT_DECIMALS)
        out[key] = ResidualPoints(tuple(map(float, scale)), tuple(tuple(map(float, row)) for row in x),
                                  tuple(round(residual[i], POINT_DECIMALS) for i in members))
    return out


def lend_residual_points(own: dict[str, ResidualPoints], lent: dict[str, ResidualPoints]) -> dict[str, ResidualPoints]:
    """A partial run's residual pools with the shape prior's benchmarks added where this run measured
    nothing near them. The prior's residuals are taken against its own fits, which a partial run moves in
    level only, so they say what the linear fit misses at shapes this run did not measure; a prior point
    within SAME_SHAPE_DISTANCE of one of this run's (in the pool's scales) is the same benchmark measured
    on the other GPU, and this GPU's own measurement of it wins."""
    out = dict(own)
    for key, prior in lent.items():
        if len(prior.residual) == 0:
            continue
        if key not in own:
            out[key] = prior
            continue
        mine = own[key]
        x_own, x_lent = np.asarray(mine.x), np.asarray(prior.x)
        scale = np.asarray(mine.scale)
        if x_own.shape[1] != x_lent.shape[1]:
            continue   # a prior of another feature set
        d = cdist(x_lent / scale, x_own / scale).min(axis=1)
        keep = d >= SAME_SHAPE_DISTANCE
        x = np.round(np.vstack([x_own, x_lent[keep]]), POINT_DECIMALS)
        new_scale = np.round(np.maximum(x.std(axis=0), MIN_POINT_SCALE), POINT_DECIMALS)
        out[key] = ResidualPoints(tuple(map(float, new_scale)), tuple(tuple(map(float, r)) for r in x),
                                  tuple(mine.residual) + tuple(np.asarray(prior.residual)[keep].tolist()))
    return dict(sorted(out.items()))


def holdout_errors(profile: Profile, samples: list[RowFeatures], gpu: GPUSpec,
                   by_fit: bool = True) -> dict[str, list[float]]:
    """Absolute percentage error of the full device-time model on held-out benchmarks, filed under
    their category and (by_fit) under the residual fit that priced their dominant node."""
    errs: dict[str, list[float]] = {}
    for s in samples:
        if not s.holdout:
            continue
        table = NodeTable.from_records(device_nodes(s.row))
        times, _ = device_times(table, gpu, row_clock(s.row, gpu), profile)
        err = abs(float(times.device_s.sum()) - s.measured_s) / s.measured_s * 100
        key = str(fit_keys(table, times.effective_mode, profile.residuals)[int(np.argmax(times.roofline_s))])
        for name in {s.category, key} if by_fit else {s.category}:
            errs.setdefault(name, []).append(err)
    return errs


def with_current_nodes(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Rows whose nodes are re-derived by this estimator (gpuest.calibrate.retrace); rows of benchmarks the
    suite no longer has keep the nodes stored at measurement time. Returns (rows, number retraced)."""
    from .retrace import retrace_nodes
    names = [r["name"] for r in rows if r.get("name")]
    current = retrace_nodes(names)
    out = [{**r, "nodes": current[r["name"]]} if r.get("name") in current else r for r in rows]
    return out, sum(1 for r in rows if r.get("name") in current)


@dataclass
class CalibrationSamples:
    """Raw calibration rows turned into what the fits regress on."""

    gpu: GPUSpec
    rows: list[dict[str, Any]]
    retrace: bool                    # nodes re-derived by this estimator where it knows the benchmark
    retraced: int                    # rows whose nodes it re-derived
    host_op_s: dict[str, float]
    latency_s: float
    sync_s: float | None
    samples: list[RowFeatures]
    steps: PersistentStepCosts | None = None


def measured_power(rows: list[dict[str, Any]]) -> bool:
    """Whether any row measured power (else the data makes a time-only profile)."""
    return any(r.get("energy_j") or r.get("avg_power_w") for r in rows)


# Refits of time-only data at its power-capped clocks: the in-sample error settles by the third
# (PYTHONPATH=. python3 benchmarks/power_clock_passes.py T4 P4 V100-PCIe-32GB).
POWER_CLOCK_PASSES = 3


def row_capped_clocks(table: NodeTable, owner: np.ndarray, gpu: GPUSpec, profile: Profile,
                      donors: tuple[Profile, ...] = ()) -> np.ndarray:
    """Per-node SM clock (MHz) at which `gpu`'s TDP holds each calibration row's repeated kernel (`owner`: the
    row of each node) when the estimator prices it with `profile` and `donors`, borrowing a power model where
    the profile has none (price.estimate.power_capped_clocks)."""
    choice = with_power(ProfileChoice(profile, "measured", "", donors=tuple(donors)))
    return power_capped_clocks(table, gpu, gpu.max_clock_mhz, gpu.tdp_w, choice, groups=owner)


def with_power_capped_clocks(rows: list[dict[str, Any]], gpu: GPUSpec, profile: Profile) -> list[dict[str, Any]]:
    """`rows` with POWER_CAPPED_CLOCK_KEY on each device row that measured no clock and that `gpu`'s TDP
    throttles when the estimator prices it with `profile` (its repeated kernel a group of its own:
    price.estimate.power_capped_clocks, with the power model the estimator borrows for a time-only profile)."""
    out = [{k: v for k, v in r.items() if k != POWER_CAPPED_CLOCK_KEY} for r in rows]
    todo = [i for i, r in enumerate(out) if r.get("kind") == "device" and device_nodes(r)
            and not isinstance(r.get("sm_clock_mhz"), (int, float))]
    if not todo:
        return out
    table, owner = rows_node_table([out[i] for i in todo])
    clocks = row_capped_clocks(table, owner, gpu, profile)
    first = np.unique(owner, return_index=True)[1]     # a group's nodes share its clock
    for i, clock in zip(todo, clocks[first]):
        if clock < gpu.max_clock_mhz:
            out[i][POWER_CAPPED_CLOCK_KEY] = float(clock)
    return out


def calibration_samples(raw: RawData, retrace: bool = True) -> CalibrationSamples:
    """Usable rows, host costs, kernel latency and regression samples of raw calibration data.
    retrace: regress on the nodes this version of the estimator derives for each benchmark (default),
    not the nodes stored when it was measured."""
    # The fit must not depend on the order rows were measured or stored in.
    rows = sorted(usable(raw.rows), key=lambda r: (str(r.get("name")), str(r.get("timestamp")), r.get("session", 0)))
    if not rows:
        raise ProfileError("no usable calibration rows (all failed, dry-run, or without nodes)")
    retraced = 0
    if retrace:
        rows, retraced = with_current_nodes(rows)
    gpu_name = raw.meta.get("catalog_gpu") or raw.meta.get("gpu_name")
    if not gpu_name:
        raise ProfileError("the calibration data names no GPU (meta field gpu_name)")
    gpu = get_gpu(str(gpu_name))
    prior = prior_profile()
    host = host_costs(rows, dict(prior.host_op_s))
    # Tiny kernels timed with the host running ahead give the device's per-kernel latency; timed
    # plainly back to back they are host-limited and bound it from above only (then the prior's
    # documented latency applies when lower).
    queued = any(r.get("timing_method") == "events_queued" for r in rows if r.get("kind") == "latency")
    latency = kernel_latency_s(rows) if queued else min(kernel_latency_s(rows), prior.kernel_latency_s)
    sync = host_sync_s(rows, gpu, latency, prior.host_sync_s)
    steps = persistent_step_costs(rows, gpu, latency, sync or 0.0, prior)
    return CalibrationSamples(gpu, rows, retrace, retraced, host, latency, sync,
                              row_features(rows, gpu, latency, host, sync or 0.0, steps), steps)


def suite_share(rows: list[dict[str, Any]]) -> float:
    """Share of the current suite's benchmarks that `rows` measured (rounded to 4 places, as stored)."""
    from .suite import all_benchmarks
    full = {b.name for b in all_benchmarks()}
    return round(len({r.get("name") for r in rows} & full) / len(full), 4)


def calibration_provenance(meta: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where and how calibration rows were measured (gpuest.profile.REQUIRED_PROVENANCE but the fit's own
    command): the GPU, driver, CUDA, cuDNN and torch of the first session, every session's date and
    command, and the share of the current suite (gpuest.calibrate.budget.suite_version) the rows measured."""
    from .budget import suite_version
    sessions = meta.get("sessions") or [meta]
    nvml = meta.get("nvml") or {}
    dates = sorted({str(s.get("started") or s.get("date") or "")[:10] for s in sessions} - {""})
    prov = {"gpu_name": meta.get("gpu_name"), "driver_version": nvml.get("driver_version", meta.get("driver_version")),
            "cuda_version": meta.get("torch_cuda_version", meta.get("cuda_version")),
            "cudnn_version": meta.get("cudnn_version"), "torch_version": meta.get("torch_version"),
            "measured_dates": meta.get("measured_dates") or (f"{dates[0]}..{dates[-1]}" if dates else None),
            "calibration_commands": [s.get("command") for s in sessions if s.get("command")],
            "suite_version": suite_version(),
            "suite_share": suite_share(rows)}
    prov.update({k: meta[k] for k in ("hostname", "power_limit_w", "idle_power_w") if k in meta})
    return prov


def fitted_modes(samples: list[RowFeatures]) -> dict[str, tuple[str, ...]]:
    """Per category and per op, the math-mode families (MODE_FIT_FAMILY) the regression samples ran in; a
    convolution run on CUDA cores under CUDA_CORE_GROUPS_KEY alone, whose kernels no dense one shares (what
    another GPU may borrow of this profile: price.device_time.correction_sources)."""
    seen: dict[str, set[str]] = {}
    for s in samples:
        for name in (CUDA_CORE_GROUPS_KEY,) if s.cuda_core_groups else (s.category, s.op):
            seen.setdefault(name, set()).add(MODE_FIT_FAMILY.get(s.mode, s.mode))
    return {name: tuple(sorted(modes)) for name, modes in sorted(seen.items())}


def fit_profile(raw: RawData, *, command: str = "", validation: list[dict[str, Any]] | None = None,
                retrace: bool = True, calibration: CalibrationSamples | None = None,
                shape_prior: Profile | None = None, passes: int = POWER_CLOCK_PASSES) -> Profile:
    """A measured Profile from raw calibration data (see calibration_samples for `retrace`; pass
    `calibration` to reuse samples already derived from `raw`; see fit_residuals for `shape_prior`).

    Data that measured neither power nor clocks (imported public timings) is fitted `passes` more times,
    each row at the clock the GPU's TDP holds it to when the previous pass's profile prices it: its
    corrections then leave the throttling to the estimate's power limit, which prices it on every GPU alike."""
    cal = calibration or calibration_samples(raw, retrace)
    profile = _fit_profile_once(raw, cal, command, validation, shape_prior)
    if measured_power(cal.rows) or not passes:
        return profile
    for _ in range(passes):
        rows = with_power_capped_clocks(cal.rows, cal.gpu, profile)
        cal = replace(cal, rows=rows, samples=row_features(rows, cal.gpu, cal.latency_s, cal.host_op_s,
                                                           cal.sync_s or 0.0, cal.steps))
        profile = _fit_profile_once(raw, cal, command, validation, shape_prior)
    capped = sum(POWER_CAPPED_CLOCK_KEY in r for r in cal.rows)
    power = with_power(ProfileChoice(profile, "measured", "")).power_note
    note = (f"{capped} of {len(cal.rows)} rows fitted at the clock the {cal.gpu.tdp_w:g} W TDP holds them to "
            f"when this profile prices them ({passes} passes; {power})")
    return replace(profile, provenance={**profile.provenance, "power_capped_clocks": note})


def _fit_profile_once(raw: RawData, cal: CalibrationSamples, command: str,
                      validation: list[dict[str, Any]] | None, shape_prior: Profile | None) -> Profile:
    """fit_profile's one pass over the rows and samples of `cal`."""
    gpu, rows, samples, host, latency, retraced = (cal.gpu, cal.rows, cal.samples, cal.host_op_s, cal.latency_s,
                                                   cal.retraced)
    prior = prior_profile()
    residuals = fit_residuals(samples, shape_prior)
    points = fit_residual_points(samples, residuals)
    idle = raw.meta.get("idle_power_w")
    power = fit_power(rows, gpu, float(idle) if isinstance(idle, (int, float)) else gpu.idle_power_w,
                      prior.power.v_min_ratio if prior.power else 0.7)
    power = simt_from_prior(power, shape_prior)
    # Data that never measured power (imported public timings) makes a time-only profile: the estimator then
    # borrows a measured GPU's power model and says so, rather than passing the prior off as this GPU's.
    time_only = not measured_power(rows)
    provenance = calibration_provenance(raw.meta, rows)
    provenance.update(fitted_by=command or "gpuest fit", fitted_rows=len(rows),
                      nodes="retraced" if cal.retrace else "as stored at measurement", retraced_rows=retraced)
    if shape_prior is not None:
        provenance["shape_prior"] = (f"{shape_prior.gpu} (suite {shape_prior.provenance.get('suite_version')}, "
                                     f"share {shape_prior.provenance.get('suite_share')})")
    profile = Profile(gpu=gpu.name, kind="measured", kernel_latency_s=latency,
                      graph_kernel_latency_s=min(prior.graph_kernel_latency_s, latency),
                      host_op_s=host, host_backward_factor=prior.host_backward_factor,
                      host_only_op_s=prior.host_only_op_s, residual_features=RESIDUAL_FEATURES,
                      residuals=residuals, power=None if time_only else power or prior.power,
                      provenance=provenance, predicts=("time",) if time_only else PREDICTS_ALL,
                      residual_points=points, host_sync_s=cal.sync_s, fitted_modes=fitted_modes(samples),
                      **(asdict(cal.steps) if cal.steps else {}))
    errs = holdout_errors(profile, samples, gpu)
    with_holdout = {}
    for cat, fit in residuals.items():
        e = errs.get(cat, [])
        with_holdout[cat] = replace(fit, holdout_median_ape=float(np.median(e)) if e else None,
                                    holdout_p90_ape=float(np.percentile(e, 90)) if e else None)
    prov = dict(provenance, power_model="none (no power measured)" if time_only else
                "fitted" if power else "prior (too few reliable power windows)")
    if shape_prior is not None:
        # A partial run's fits move levels only, and every benchmark pins one: once the held-out errors are
        # measured, the fits are made again on all rows (held-out figures stay those of the split).
        every = [replace(s, holdout=False) for s in samples]
        refit = fit_residuals(every, shape_prior)
        with_holdout = {k: replace(fit, holdout_median_ape=with_holdout[k].holdout_median_ape,
                                   holdout_p90_ape=with_holdout[k].holdout_p90_ape) if k in with_holdout else fit
                        for k, fit in refit.items()}
        points = lend_residual_points(fit_residual_points(every, refit), dict(shape_prior.residual_points))
        prov["final_fit"] = "every row, after the held-out errors of the split"
    profile = Profile(**{**profile.__dict__, "residuals": with_holdout, "residual_points": points,
                         "provenance": prov})
    if validation:
        profile, info = fit_host_and_gap(profile, validation, gpu)
        profile = replace(profile, provenance={**profile.provenance, **info})
    return profile


def resolve_shape_prior(choice: str, raw: RawData) -> Profile | None:
    """`gpuest fit --shape-prior`: "none", "auto" (shape_prior_for the rows' GPU and suite share), or a GPU
    with a shipped profile."""
    if choice == "none":
        return None
    if choice == "auto":
        gpu_name = raw.meta.get("catalog_gpu") or raw.meta.get("gpu_name")
        if not gpu_name:
            raise ProfileError("the calibration data names no GPU (meta field gpu_name)")
        return shape_prior_for(get_gpu(str(gpu_name)), suite_share(usable(raw.rows)))
    from gpuest.profile import shipped_profiles
    from gpuest.price.profile_choice import shipped_profile_named
    prior = shipped_profile_named(choice)
    if prior is None:
        raise ProfileError(f"--shape-prior {choice!r}: no shipped profile of that GPU; accepted: auto, none, or one "
                           f"of {', '.join(sorted(shipped_profiles()))} (or their aliases)")
    return prior


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuest fit", description="Fit a profile from raw calibration rows.")
    parser.add_argument("raw", help="calibration JSONL written by `gpuest calibrate`")
    parser.add_argument("-o", "--out", required=True, help="profile JSON to write")
    parser.add_argument("--validation", nargs="+", default=None,
                        help="validation JSONL files of the same GPU: calibrate host dispatch and idle-gap power "
                             "on their host-bound, non-held-out runs")
    parser.add_argument("--stored-nodes", action="store_true",
                        help="regress on the nodes stored in the rows at measurement time instead of "
                             "re-deriving them with this version of the estimator")
    parser.add_argument("--shape-prior", default="auto", metavar="GPU|auto|none",
                        help="the shipped profile whose fits a partial calibration corrects in level (auto: the "
                             f"nearest other calibrated GPU when the rows measured less than {PARTIAL_SUITE_SHARE:.0%} "
                             "of the suite; none: fit every slope from these rows alone)")
    args = parser.parse_args(argv)
    validation = None
    command = f"gpuest fit {args.raw} -o {args.out}"
    # The host probes the calibration run measured beside its rows (gpuest.calibrate.runner.host_probe_path).
    probes = Path(args.raw).with_name(Path(args.raw).name + ".host.jsonl")
    sources = list(args.validation or []) + ([str(probes)] if probes.exists() and str(probes) not in
                                              (args.validation or []) else [])
    if sources:
        validation = load_validation(*sources)
        command += " --validation " + " ".join(sources)
    if args.stored_nodes:
        command += " --stored-nodes"
    if args.shape_prior != "auto":
        command += f" --shape-prior {args.shape_prior}"
    raw = load_raw(args.raw)
    profile = fit_profile(raw, command=command, validation=validation, retrace=not args.stored_nodes,
                          shape_prior=resolve_shape_prior(args.shape_prior, raw))
    profile.save(args.out)
    profile_from_json(json.loads(Path(args.out).read_text()))  # what we wrote must load back
    print(f"wrote {args.out}: {profile.gpu}, {len(profile.residuals)} residual fits, "
          f"kernel latency {profile.kernel_latency_s * 1e6:.2f} us, power model "
          f"{profile.provenance.get('power_model')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
