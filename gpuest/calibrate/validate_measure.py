"""The measurement of one validation config for `gpuest.calibrate.validate`: the step `trace` prices, built
and run eagerly, its wall time, device-busy time (validate_profile), energy and, for mixture-of-experts
models, the routing it ran."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..evaluate.validation_set import MODES, ValidationConfig
from .validate_context import RunContext
from .validate_profile import profile_iterations

WARMUP_MIN_ITERS = 3
WARMUP_MIN_S = 0.5
TIMING_TARGET_S = 1.0
TIMING_MIN_ITERS = 5
TIMING_MAX_ITERS = 200
ENERGY_MIN_ITERS = 3
PROFILE_ITERS_FAST = 3          # iterations under the profiler when one takes < PROFILE_SLOW_S
PROFILE_ITERS_SLOW = 2
PROFILE_SLOW_S = 0.25


# ================================================================== the step (same as trace())

def _precision(precision: str) -> tuple[torch.dtype | None, torch.dtype | None]:
    from gpuest.capture.trace import PRECISIONS as TRACE_PRECISIONS
    if precision not in TRACE_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; accepted: {', '.join(TRACE_PRECISIONS)}")
    return TRACE_PRECISIONS[precision]


def make_step(loaded: Any, cfg: ValidationConfig, device: torch.device) -> tuple[Callable[[], None], Any]:
    """A zero-argument function running one iteration, and the optimizer (training) or None."""
    from gpuest.capture.trace import OPTIMIZERS, default_loss
    _, autocast_dtype = _precision(cfg.precision)
    model = loaded.model
    inputs = loaded.example_inputs
    if isinstance(inputs, dict):
        args, kwargs = (), inputs
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}

    def amp() -> Any:
        return (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())

    if cfg.mode == "inference":
        model.eval()

        def step() -> None:
            with torch.no_grad(), amp():
                model(*args, **kwargs)
        return step, None
    if cfg.mode != "training":
        raise ValueError(f"unknown mode {cfg.mode!r}; accepted: {', '.join(MODES)}")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZERS[cfg.optimizer](params) if (params and cfg.optimizer) else None

    def train_step() -> None:
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        with amp():
            out = model(*args, **kwargs)
            loss = default_loss(out)
        loss.backward()
        if opt is not None:
            opt.step()
    return train_step, opt


# ================================================================== timers

class _Timer:
    """Per-iteration wall time: CUDA events (GPU) or perf_counter (dry run), synchronised after each."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_iters(self, step: Callable[[], None], n: int) -> tuple[list[float], list[float]]:
        """(event times, host perf_counter times) in s for `n` synchronised iterations."""
        ev, host = [], []
        for _ in range(n):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                step()
                end.record()
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                ev.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                ev.append(t1 - t0)
            host.append(t1 - t0)
        return ev, host


def time_calls(fn: Callable[[], Any], timer: _Timer, *, target_s: float, min_iters: int, max_iters: int,
               warm_s: float) -> dict[str, float]:
    """Warm up (at least 2 calls, up to 20 within `warm_s` s), then time enough synchronised calls to fill
    `target_s` s, within [min_iters, max_iters]: median, p10 and p90 wall time per call (s, CUDA events), the
    host's median and the count."""
    t0 = time.perf_counter()
    warm = 0
    while warm < 2 or (time.perf_counter() - t0 < warm_s and warm < 20):
        fn()
        timer.sync()
        warm += 1
    guess = (time.perf_counter() - t0) / warm
    n = int(min(max_iters, max(min_iters, math.ceil(target_s / max(guess, 1e-6)))))
    ev, host = timer.time_iters(fn, n)
    return {"wall_s": statistics.median(ev), "wall_p10_s": sorted(ev)[len(ev) // 10],
            "wall_p90_s": sorted(ev)[(9 * len(ev)) // 10], "wall_host_s": statistics.median(host), "wall_iters": n}


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ================================================================== one config

# A routing decision (capture.routing.ROUTING_DECISIONS: a top-k, or an argmax of top-1 routers) over at
# most this many choices; wider ones pick tokens, not experts.
MAX_ROUTED_EXPERTS = 1024


class _RoutingCounts(TorchDispatchMode):
    """Counts, per routing decision of the steps run under it, how many slots each expert got: the ops
    and arguments the trace gives values to (capture.routing), read here from the GPU's own values."""

    def __init__(self, decisions: dict[Any, tuple[int, Callable[[tuple, dict], tuple[int, int, bool]]]]) -> None:
        super().__init__()
        self.decisions = decisions
        self.counts: list[list[int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        decision = self.decisions.get(func)
        if decision is not None and args[0].dim():
            position, parse = decision
            _, dim, _ = parse(args, kwargs)
            experts = int(args[0].shape[dim])
            indices = out[position] if isinstance(out, (tuple, list)) else out
            if 2 <= experts <= MAX_ROUTED_EXPERTS:
                self.counts.append(torch.bincount(indices.flatten(), minlength=experts).tolist())
        return out


def routing_counts(step: Callable[[], None]) -> list[list[int]]:
    """One more step, recording each routing decision's slots per expert (a mixture-of-experts model's
    top-k or argmax over its router): the routing the measured steps ran, which a balanced assumption need not match
    (randomly initialised routers send tokens unevenly)."""
    from ..capture.routing import ROUTING_DECISIONS
    recorder = _RoutingCounts(ROUTING_DECISIONS)
    with recorder:
        step()
    return recorder.counts


def measure_config(cfg: ValidationConfig, ctx: RunContext) -> dict[str, Any]:
    """Build, warm up and measure one config; returns the measured fields of its row."""
    weight_dtype, _ = _precision(cfg.precision)
    t_build = time.perf_counter()
    loaded = ctx.model_for(cfg, weight_dtype)
    build_s = time.perf_counter() - t_build
    step, opt = make_step(loaded, cfg, ctx.device)
    timer = _Timer(ctx.device)
    res: dict[str, Any] = {"name": loaded.name, "loader_family": loaded.family}
    try:
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        # warm-up: >= 3 iterations and >= 0.5 s (allocator, cuBLAS/cuDNN handles, optimizer state)
        t0 = time.perf_counter()
        warm = 0
        while warm < WARMUP_MIN_ITERS or time.perf_counter() - t0 < WARMUP_MIN_S:
            step()
            timer.sync()
            warm += 1
        warm_s = time.perf_counter() - t0
        per_iter_guess = warm_s / warm
        # (a) wall time per iteration
        n_time = int(min(TIMING_MAX_ITERS, max(TIMING_MIN_ITERS, math.ceil(TIMING_TARGET_S / max(per_iter_guess,
                                                                                                 1e-6)))))
        ev, host = timer.time_iters(step, n_time)
        wall = statistics.median(ev)
        res.update(wall_s=wall, wall_p10_s=_percentile(ev, 0.1), wall_p90_s=_percentile(ev, 0.9),
                   wall_min_s=min(ev), wall_host_s=statistics.median(host), wall_iters=n_time,
                   wall_source="cuda_events" if timer.cuda else "perf_counter", warmup_iters=warm, warmup_s=warm_s)
        # (b) device busy time (and per-op) from the profiler
        n_prof = PROFILE_ITERS_FAST if wall < PROFILE_SLOW_S else PROFILE_ITERS_SLOW
        res.update(profile_iterations(step, n_prof, ctx.device, per_op=cfg.per_op))
        # (c) energy over a window of >= window_s of synchronised iterations
        res.update(measure_energy(step, timer, ctx, wall))
        if ctx.device.type == "cuda":
            res["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
        if cfg.family == "moe":  # after the timed steps: recording reads values to the host
            res["routing_counts"] = routing_counts(step)
        res["build_s"] = build_s
    finally:
        del step, opt
        if cfg.mode == "training":
            with contextlib.suppress(Exception):
                loaded.model.zero_grad(set_to_none=True)
    return res


def measure_energy(step: Callable[[], None], timer: _Timer, ctx: RunContext, wall_s: float) -> dict[str, Any]:
    n = int(max(ENERGY_MIN_ITERS, math.ceil(ctx.window_s / max(wall_s, 1e-6))))
    out: dict[str, Any] = {"energy_iters": n, "energy_sync_each_iter": True}
    if ctx.monitor is None:
        out.update(energy_j=None, avg_power_w=None, energy_source=None, power_reliable=False)
        return out
    name = f"gpuest-validate-{time.monotonic_ns()}"
    timer.sync()
    ctx.monitor.begin_window(name)
    t0 = time.perf_counter()
    try:
        done = 0
        while done < n or time.perf_counter() - t0 < ctx.window_s:  # keep going if iterations ran fast
            step()
            timer.sync()
            done += 1
    finally:
        m = ctx.monitor.end_window(name)
    row = m.as_row() if hasattr(m, "as_row") else dict(vars(m))
    out.update(
        energy_iters=done,
        energy_window_s=m.duration_s,
        window_time_per_iter_s=m.duration_s / done,
        energy_window_j=m.energy_j,
        energy_j=m.energy_j / done,
        avg_power_w=m.avg_power_w,
        energy_source=m.source,
        power_reliable=bool(m.reliable),
        sm_clock_mhz=row.get("sm_clock_mhz"),
        sm_clock_min_mhz=row.get("sm_clock_min_mhz"),
        max_sm_clock_mhz=row.get("max_sm_clock_mhz"),
        mem_clock_mhz=row.get("mem_clock_mhz"),
        temperature_c=row.get("temperature_c"),
        throttle_reasons=list(row.get("throttle_reasons") or []),
        throttled=bool(row.get("throttled", False)),
        power_limit_w=row.get("power_limit_w"),
        power_samples=row.get("samples"),
    )
    return out
