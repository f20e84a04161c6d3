"""Predicted timeline of one step as a Chrome trace / Perfetto JSON (`*.trace.json`).

Open the file in https://ui.perfetto.dev or chrome://tracing. Tracks:
  - host: one slice per op for its predicted CPU dispatch (ends when the op is issued),
  - device: one slice per kernel group at its predicted start, for its predicted time,
  - power: a counter of predicted board power (W) over time (absent when the profile has no power model).
Timestamps and durations are in microseconds, as the format requires.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..price.estimate import Estimate

# Integer ids: Perfetto's JSON importer handles integer pid/tid best; the M events below give them names.
HOST_PID, HOST_TID = 1, 1
DEVICE_PID, DEVICE_TID = 2, 1
US = 1e6  # seconds -> microseconds


def _num(value: Any) -> float | None:
    """A JSON-safe float: NaN/inf (no power model) become null."""
    v = float(value)
    return v if math.isfinite(v) else None


def _short(op: str) -> str:
    return op[len("aten."):] if op.startswith("aten.") else op


def _counter(ts_us: float, watts: float) -> dict[str, Any]:
    return {"name": "power (W)", "ph": "C", "pid": DEVICE_PID, "tid": DEVICE_TID, "ts": ts_us,
            "args": {"W": _num(watts)}}


def trace_events(est: "Estimate") -> dict[str, Any]:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
    df = est.per_node
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": HOST_PID, "tid": HOST_TID, "ts": 0,
         "args": {"name": "host (predicted CPU dispatch)"}},
        {"name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": HOST_TID, "ts": 0,
         "args": {"name": f"launch={est.launch}"}},
        {"name": "process_sort_index", "ph": "M", "pid": HOST_PID, "tid": HOST_TID, "ts": 0,
         "args": {"sort_index": 0}},
        {"name": "process_name", "ph": "M", "pid": DEVICE_PID, "tid": DEVICE_TID, "ts": 0,
         "args": {"name": f"GPU {est.gpu} (predicted)"}},
        {"name": "thread_name", "ph": "M", "pid": DEVICE_PID, "tid": DEVICE_TID, "ts": 0,
         "args": {"name": "stream 0"}},
        {"name": "process_sort_index", "ph": "M", "pid": DEVICE_PID, "tid": DEVICE_TID, "ts": 0,
         "args": {"sort_index": 1}},
    ]
    host: list[dict[str, Any]] = []
    device: list[dict[str, Any]] = []
    power: list[dict[str, Any]] = []
    have_power = bool(df["power_w"].notna().any()) if len(df) else False
    prev_end_us = host_end_us = 0.0
    for r in df.itertuples(index=False):
        args = {"node": int(r.node), "op": r.op, "module": r.module or "(top level)", "phase": r.phase,
                "category": r.category, "math_mode": r.math_mode, "flops": float(r.flops), "bytes": float(r.bytes),
                "bound": r.bound, "clock_mhz": _num(r.clock_mhz), "power_w": _num(r.power_w),
                "energy_j": _num(r.energy_j)}
        name = _short(r.op)
        if r.host_s > 0:
            # Clamp for the same rounding reason as the device track below: host dispatch is sequential.
            start_us = max((r.issue_s - r.host_s) * US, host_end_us)
            host_end_us = max(r.issue_s * US, start_us)
            host.append({"name": name, "cat": r.category, "ph": "X", "pid": HOST_PID, "tid": HOST_TID,
                         "ts": start_us, "dur": host_end_us - start_us, "args": args})
        if r.time_s > 0:
            # The timeline computes start = end - time, so consecutive kernels can overlap by a rounding
            # error; clamp to the previous end so the single-stream device track never overlaps.
            ts = max(r.start_s * US, prev_end_us)
            end = max((r.start_s + r.time_s) * US, ts)
            if have_power and r.wait_s > 0 and math.isfinite(r.energy_j):
                # The GPU idles at static power for wait_s before this kernel: the rest of the node's energy.
                idle_w = (r.energy_j - r.power_w * r.queue_s) / r.wait_s
                power.append(_counter(prev_end_us, idle_w))
            device.append({"name": name, "cat": r.category, "ph": "X", "pid": DEVICE_PID, "tid": DEVICE_TID,
                           "ts": ts, "dur": end - ts, "args": args})
            if have_power and math.isfinite(r.power_w):
                power.append(_counter(ts, r.power_w))
            # The node holds the queue (and its power) through the gaps after its kernels, past the slice's end.
            prev_end_us = max((r.start_s + r.queue_s) * US, end)
    if power:
        wall_us = max(est.time_s * US, prev_end_us)
        tail_s = (wall_us - prev_end_us) / US
        if tail_s > 0:
            # After the last kernel the GPU idles until the host finishes: the estimate's energy has a
            # tail term (static power x tail) that no node carries; recover its power from the totals.
            tail_j = est.energy_j - float(df["energy_j"].sum())
            power.append(_counter(prev_end_us, max(tail_j, 0.0) / tail_s))
        # Close the counter at the end of the step so the last value does not extend forever.
        power.append(_counter(wall_us, 0.0))
    events += host + device + power
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "gpuest", "model": est.model, "mode": est.mode, "precision": est.precision,
                      "batch": est.batch, "gpu": est.gpu, "clock_mhz": est.clock_mhz, "launch": est.launch,
                      "profile": est.profile_source, "predicted_time_s": est.time_s,
                      "predicted_energy_j": _num(est.energy_j)},
    }


def write_trace(est: "Estimate", path: str | Path) -> Path:
    """Write the predicted timeline of `est` as Chrome trace JSON to `path`."""
    path = Path(path)
    path.write_text(json.dumps(trace_events(est), allow_nan=False))
    return path
