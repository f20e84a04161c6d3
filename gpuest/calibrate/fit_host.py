"""The host side's fit: per-phase scales of the micro-benchmarks' dispatch costs, module-call, host-only and
autocast costs from whole-model validation runs that were host-bound, and the GPU's power while it waits."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from gpuest.catalog import GPUSpec
from gpuest.evaluate.accuracy import busy_spans_annotations, latest_per_config, trace_config, trace_key
from gpuest.jsonl import read_jsonl
from gpuest.price.generation import HOST_KEYS as GENERATE_HOST_KEYS
from gpuest.price.host_timeline import launch_costs
from gpuest.profile import Profile


def load_validation(*paths: str | Path) -> list[dict[str, Any]]:
    """The rows of validation JSONL files (gpuest.calibrate.validate), read as gpuest.jsonl reads every
    measurement file; where several rows measure one config on one GPU (a re-measurement), the last wins,
    as in the accuracy report."""
    return latest_per_config(row for path in paths for row in read_jsonl(path))


HOST_BOUND_BUSY_FRACTION = 0.5   # validation runs whose GPU was busy less than this are host-bound
HOST_TERMS = ("forward", "backward", "optimizer", "module_call", "host_only", "autocast")
HOST_SCALE_BOUNDS = (0.25, 8.0)  # what a whole-model step's phase may cost per op against the micro-benchmark dispatch


def host_terms(graph: Any, profile: Profile) -> np.ndarray:
    """Per-config regressors of host time (HOST_TERMS): the profile's per-category dispatch costs summed
    per phase, Python module calls, metadata/host-only ops, and ops dispatched under autocast (counts)."""
    from gpuest.price.node_table import node_table
    t = node_table(graph)
    base = t.map_category(profile.host_op_s, profile.host_op_s["default"]) + launch_costs(t, profile.host_op_s)
    light = t.free | t.host_only
    dispatched = ~light
    fwd = dispatched & np.isin(t.phase, ["forward", "loss"])
    return np.array([base[fwd].sum(), base[dispatched & (t.phase == "backward")].sum(),
                     base[dispatched & (t.phase == "optimizer")].sum(), t.module_calls.sum(), light.sum(),
                     (dispatched & t.autocast).sum()])


@lru_cache(maxsize=None)
def validation_graph(key: tuple) -> Any:
    """The traced graph of a validation config (accuracy.trace_key); cached, as configs recur across
    validation files and GPUs."""
    return trace_config(*key)


def fit_host_and_gap(profile: Profile, validation: list[dict[str, Any]], gpu: GPUSpec) -> tuple[Profile, dict]:
    """Calibrate the host side on whole-network runs that were host-bound.

    Micro-benchmarks time one op in a tight loop; in a real model every op also pays Python and
    autograd bookkeeping, and every nn.Module call costs host time. Non-negative least squares of
    the measured wall time on HOST_TERMS gives per-phase scales of the dispatch costs, the module
    call cost, the host-only op cost and the cost of autocast's dispatch per op. The GPU's power while
    it waits for the host (gap_w) follows from the measured energy of the same runs. Held-out models are
    never used."""
    from gpuest.price.estimate import estimate_graph
    rows = [r for r in validation if r.get("status") == "ok" and not r.get("heldout") and not r.get("dry_run")
            and r.get("gpu_canonical") == gpu.name and r.get("wall_s") and r.get("device_busy_s") is not None
            and r["device_busy_s"] < HOST_BOUND_BUSY_FRACTION * r["wall_s"]]
    if len(rows) < len(HOST_TERMS):
        return profile, {"host_fit": f"skipped: {len(rows)} host-bound validation runs"}
    xs, ys, graphs = [], [], []
    for r in rows:
        g = validation_graph(trace_key(r))
        graphs.append(g)
        xs.append(host_terms(g, profile))
        ys.append(r["wall_s"])
    # Relative errors: every run counts equally, so long training steps do not drown small ones.
    x_arr, y_arr = np.array(xs), np.array(ys)
    # The phase terms scale dispatch costs the micro-benchmarks measured: a fit of few runs (a calibration's
    # eight host probes) could otherwise drive one to zero and hand its time to another term (a fresh H100
    # profile's forward scale came out 1e-16, its backward factor 7e14).
    lo = [HOST_SCALE_BOUNDS[0]] * 3 + [0.0] * (len(HOST_TERMS) - 3)
    hi = [HOST_SCALE_BOUNDS[1]] * 3 + [np.inf] * (len(HOST_TERMS) - 3)
    coef = lsq_linear(x_arr / y_arr[:, None], np.ones(len(y_arr)), bounds=(lo, hi)).x
    scale_fwd, scale_bwd, scale_opt, module_call_s, host_only_s, autocast_s = (float(c) for c in coef)
    # generate()'s own Python work is not in these runs: a fitted profile leaves it to the prior.
    # A category's per-op and per-launch costs (launch_<category>) scale with the term its ops enter:
    # the optimizer's with the optimizer term, every other category's with the forward one.
    host = {k: v * (scale_opt if k.removeprefix("launch_") == "optimizer" else scale_fwd)
            for k, v in profile.host_op_s.items()
            if k not in ("module_call", "graph_launch", "autocast") and k not in GENERATE_HOST_KEYS}
    host.setdefault("optimizer", profile.host_op_s["default"] * scale_opt)
    host["module_call"] = module_call_s
    host["autocast"] = autocast_s
    host["graph_launch"] = profile.host_op_s["default"]
    fitted = replace(profile, host_op_s=host, host_only_op_s=host_only_s,
                     host_backward_factor=scale_bwd / scale_fwd if scale_fwd > 0 else profile.host_backward_factor)
    pred = x_arr @ coef
    info = {"host_fit_runs": len(rows), "host_fit_median_ape": float(np.median(np.abs(pred / y_arr - 1)) * 100)}
    gaps = []
    if fitted.power is not None:
        for r, g in zip(rows, graphs):
            energy = r.get("energy_j")
            # The GPU's idle time is wall - busy: a busy time that spans annotations says nothing of it.
            if not energy or not r.get("power_reliable", True) or busy_spans_annotations(r):
                continue
            est = estimate_graph(g, gpu, profile=fitted, warn=False)
            busy = est.per_node["power_w"].to_numpy() * est.per_node["time_s"].to_numpy()
            busy_j = float(np.nansum(busy)) * r["device_busy_s"] / max(est.device_time_s, 1e-12)
            gaps.append((energy - busy_j) / max(r["wall_s"] - r["device_busy_s"], 1e-9))
        if gaps:
            gap = float(np.clip(np.median(gaps), fitted.power.idle_w, fitted.power.static_w))
            fitted = replace(fitted, power=replace(fitted.power, gap_w=gap))
            info["gap_power_runs"] = len(gaps)
    return fitted, info
