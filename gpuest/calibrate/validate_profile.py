"""Device-busy time and per-op device times of a few iterations under torch.profiler, for
`gpuest.calibrate.validate`."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .timing import is_device_work, is_gpu_event, union_length

# How device busy time was measured. Rows written before annotations were excluded say
# "profiler_gpu_events": their busy time also spans record_function ranges on the GPU timeline (a
# training step's "Optimizer.step#..."), idle gaps included (gpuest.report.accuracy flags them).
DEVICE_BUSY_SOURCE = "profiler_gpu_work"


def _evt_device_us(evt: Any) -> float:
    for attr in ("device_time_total", "cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def _is_aten(evt: Any) -> bool:
    return str(getattr(evt, "name", "")).startswith("aten::")


def _top_level_aten(events: list[Any], t0: float, t1: float) -> list[Any]:
    """ATen op events within [t0, t1] (us) that have no ATen ancestor, in start order (all threads)."""
    out = []
    for e in events:
        if is_gpu_event(e) or not _is_aten(e):
            continue
        tr = e.time_range
        if tr.start < t0 or tr.end > t1:
            continue
        parent, nested = getattr(e, "cpu_parent", None), False
        while parent is not None:
            if _is_aten(parent):
                nested = True
                break
            parent = getattr(parent, "cpu_parent", None)
        if not nested:
            out.append(e)
    out.sort(key=lambda e: e.time_range.start)
    return out


def _iteration_work(evt: Any) -> bool:
    """GPU work of a profiled iteration: no annotation, by the profiler's flag or, where a torch leaves it
    unset, by the name of this module's own per-iteration marks."""
    return is_device_work(evt) and not str(evt.name).startswith("gpuest_iter_")


def profile_iterations(step: Callable[[], None], n: int, device: torch.device, *,
                       per_op: bool) -> dict[str, Any]:
    """Run `n` synchronised iterations under torch.profiler; device busy time per iteration and
    (per_op) the top-level ATen ops of the last iteration with their device time in us."""
    from torch.profiler import ProfilerActivity, profile, record_function
    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    marks = []
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        for i in range(n):
            with record_function(f"gpuest_iter_{i}"):
                step()
                if gpu:
                    torch.cuda.synchronize()
    events = list(prof.events())
    for e in events:
        if str(e.name).startswith("gpuest_iter_") and not is_gpu_event(e):
            marks.append((e.time_range.start, e.time_range.end))
    marks.sort()
    out: dict[str, Any] = {"profile_iters": n}
    if gpu:
        # GPU-side events include the record_function ranges ("gpu_user_annotation": this function's
        # per-iteration marks, the optimizer's step), which span idle gaps: kernels, memcpys and memsets only.
        dev = [(e.time_range.start, e.time_range.end) for e in events if _iteration_work(e)]
        out["device_busy_s"] = union_length(dev) / 1e6 / n
        out["device_kernel_sum_s"] = sum(e - s for s, e in dev) / 1e6 / n
        out["device_events_per_iter"] = len(dev) / n
        out["device_busy_source"] = DEVICE_BUSY_SOURCE
    else:  # dry run: CPU time of top-level ATen ops stands in for device time
        t0 = marks[0][0] if marks else -math.inf
        t1 = marks[-1][1] if marks else math.inf
        tops = _top_level_aten(events, t0, t1)
        out["device_busy_s"] = union_length((e.time_range.start, e.time_range.end) for e in tops) / 1e6 / n
        out["device_kernel_sum_s"] = sum(e.time_range.end - e.time_range.start for e in tops) / 1e6 / n
        out["device_events_per_iter"] = len(tops) / n
        out["device_busy_source"] = "dry_run_cpu_ops"
    if per_op:
        t0, t1 = marks[-1] if marks else (-math.inf, math.inf)
        tops = _top_level_aten(events, t0, t1)
        ops = []
        for e in tops:
            us = _evt_device_us(e) if gpu else float(e.time_range.end - e.time_range.start)
            children = [[str(c.name), round(_evt_device_us(c) if gpu else
                                            float(c.time_range.end - c.time_range.start), 3)]
                        for c in sorted(getattr(e, "cpu_children", []) or [], key=lambda c: c.time_range.start)
                        if _is_aten(c)]
            ops.append([str(e.name), round(us, 3), children])
        iter_busy = None
        if gpu:
            iter_busy = union_length((e.time_range.start, e.time_range.end) for e in events
                                     if _iteration_work(e) and e.time_range.start >= t0) / 1e6
        out["per_op"] = {
            "iteration": len(marks) - 1,
            "time_source": "device" if gpu else "cpu (dry run)",
            "ops": ops,  # [aten op name, device time us, [[child aten op, us], ...]]
            "sum_top_level_us": round(sum(o[1] for o in ops), 3),
            "iteration_device_busy_us": round(iter_busy * 1e6, 3) if iter_busy is not None else None,
        }
    return out
