"""Measure real runs of the validation set on a GPU, one JSONL row per config.

    python3 -m gpuest.calibrate.validate --set quick --out results/h100-quick.jsonl [--resume]
    python3 -m gpuest.calibrate.validate --models resnet50,hf:gpt2 --batch 1,64 --modes inference,training \
        --precision fp32,bf16-mixed --out results.jsonl
    python3 -m gpuest.calibrate.validate --dry-run          # 2 tiny configs on the CPU (no CUDA, no NVML)
    python3 -m gpuest.calibrate.validate --set quick --list # print the configs and the estimated duration

Each config runs the step `gpuest.capture.trace.trace` defines, eagerly:
  inference: model.eval(), torch.no_grad(), forward
  training:  model.train(), forward (+ default loss) under torch.autocast for *-mixed, loss.backward(),
             AdamW(foreach=True).step(), grads set to None
and measures (a) wall time per iteration (CUDA events around each iteration, synchronised after each:
one iteration from an idle GPU until host and device are done; median), (b) device-busy time per
iteration (torch.profiler: union of GPU kernel/memcpy/memset intervals / iterations), (c) energy per
iteration and average power over a >= window_s window of synchronised iterations (NVML energy
counter via `gpuest.calibrate.nvml_monitor.PowerMonitor`), with SM clock, temperature and throttle
reasons, and (d) provenance. Optionally (per_op) the top-level ATen ops of one profiled iteration
with their device time, for per-op comparison in the accuracy report.

Failures (OOM, unsupported dtype, ...) are recorded in the row's `error` and the run continues.
A CUDA error that poisons the context (illegal address, device-side assert) stops the run with exit
code 3: rerun the same command (resume is on by default) to continue with the next config. A config
that killed the process is recorded as an error on the next resume and not retried.

Nothing here changes clocks, power limits or any other GPU setting.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .timing import is_device_work, is_gpu_event, union_length

# How device busy time was measured. Rows written before annotations were excluded say
# "profiler_gpu_events": their busy time also spans record_function ranges on the GPU timeline (a
# training step's "Optimizer.step#..."), idle gaps included (gpuest.report.accuracy flags them).
DEVICE_BUSY_SOURCE = "profiler_gpu_work"
from ..evaluate.validation_set import (MODES, PRECISIONS, SETS, ValidationConfig, estimated_duration_s,
                                       explicit_configs, get_set, with_per_op)

ROW_SCHEMA = "gpuest.validation/1"
WARMUP_MIN_ITERS = 3
WARMUP_MIN_S = 0.5
TIMING_TARGET_S = 1.0
TIMING_MIN_ITERS = 5
TIMING_MAX_ITERS = 200
ENERGY_MIN_ITERS = 3
PROFILE_ITERS_FAST = 3          # iterations under the profiler when one takes < PROFILE_SLOW_S
PROFILE_ITERS_SLOW = 2
PROFILE_SLOW_S = 0.25
FATAL_CUDA_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                      "misaligned address", "illegal instruction", "uncorrectable ecc", "cuda error: an illegal")
DRY_RUN_OUT = Path("/tmp/gpuest-validate-dryrun.jsonl")

MeasureFn = Callable[[ValidationConfig, "RunContext"], dict]


class FatalCudaError(RuntimeError):
    """The CUDA context is unusable; the process must restart (resume continues after this config)."""


# ================================================================== context: device, monitor, provenance

class RunContext:
    """What every config's measurement shares: device, power monitor, window length, provenance."""

    def __init__(self, *, dry_run: bool = False, device_index: int = 0, window_s: float = 2.0,
                 monitor: Any | None = None) -> None:
        self.dry_run = dry_run
        self.window_s = float(window_s)
        if dry_run:
            self.device = torch.device("cpu")
        else:
            if not torch.cuda.is_available():
                raise RuntimeError("gpuest.calibrate.validate needs a CUDA GPU (torch.cuda.is_available() is False); "
                                   "use --dry-run to smoke-test on the CPU")
            torch.cuda.set_device(device_index)
            self.device = torch.device("cuda", device_index)
        self.device_index = device_index
        self.monitor = monitor if monitor is not None else _make_monitor(dry_run, device_index)
        self.provenance = collect_provenance(self)
        self.gpu = self.provenance.get("gpu_name") or "unknown"
        self.gpu_canonical = _canonical_gpu(self.gpu)
        self._cache_key: tuple | None = None
        self._cache: Any = None

    # one-entry cache of the built model: consecutive configs of the same (model, batch) reuse it
    def model_for(self, cfg: ValidationConfig, dtype: torch.dtype | None) -> Any:
        key = (cfg.model, cfg.batch, cfg.seq, cfg.image_size, dtype, cfg.memory_format)
        if key != self._cache_key:
            self.drop_model()
            from gpuest.capture.models import load_model
            loaded = load_model(cfg.model, batch=cfg.batch, seq=cfg.seq, image_size=cfg.image_size,
                                device=str(self.device), dtype=dtype, memory_format=cfg.memory_format)
            self._cache_key, self._cache = key, loaded
        return self._cache

    def drop_model(self) -> None:
        self._cache_key, self._cache = None, None
        free_memory(self.device)

    def close(self) -> None:
        self.drop_model()
        close = getattr(self.monitor, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _make_monitor(dry_run: bool, device_index: int) -> Any:
    from .nvml_monitor import FakePowerMonitor, NvmlUnavailableError, PowerMonitor
    if dry_run:
        return FakePowerMonitor()
    try:
        return PowerMonitor(device_index)
    except NvmlUnavailableError as exc:
        print(f"warning: NVML unavailable ({exc}); energy and power are not measured", file=sys.stderr)
        return None


def _canonical_gpu(name: str) -> str | None:
    try:
        from gpuest.catalog import get_gpu
        return get_gpu(name).name
    except Exception:  # noqa: BLE001 - an uncatalogued GPU is not an error here
        return None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # noqa: BLE001
        return None
    return getattr(mod, "__version__", None)


def _git_commit() -> str | None:
    """HEAD's hash, with "+dirty" when tracked files differ from it (a device machine runs the
    working tree shipped over the last landed commit, so HEAD alone can name older code)."""
    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=where)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=10, cwd=where)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if status.returncode == 0 and status.stdout.strip() else "")


def collect_provenance(ctx: RunContext) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if ctx.monitor is not None and hasattr(ctx.monitor, "device_info"):
        with contextlib.suppress(Exception):
            info = dict(ctx.monitor.device_info())
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        gpu_name = torch.cuda.get_device_name(ctx.device)
        extra = {"compute_capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
                 "memory_total_bytes": props.total_memory}
    else:
        gpu_name = info.get("name") or "dry-run (no GPU)"
        extra = {}
    return {
        "gpu_name": gpu_name,
        "gpu_index": ctx.device_index,
        "nvml": info,
        **extra,
        "driver_version": info.get("driver_version"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torchvision": _version("torchvision"),
        "timm": _version("timm"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "gpuest_commit": _git_commit(),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "dry_run": ctx.dry_run,
    }


def run_provenance(module: str, argv: list[str]) -> dict[str, Any]:
    """Provenance of a measuring run on this machine's GPU (collect_provenance: GPU, driver, CUDA, cuDNN,
    libraries, commit) with its command, `python3 -m MODULE ARGV...`, and the UTC date."""
    ctx = RunContext()
    info = dict(ctx.provenance)
    ctx.close()
    info.update(command=f"python3 -m {module} " + " ".join(argv),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return info


def free_memory(device: torch.device | None = None) -> None:
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


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


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ================================================================== profiler: device busy and per-op

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


# ================================================================== rows, resume, the loop

def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a results file; a torn last line (killed mid-write) is ignored."""
    rows = []
    if not path.exists():
        return rows
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _append(path: Path, row: dict[str, Any]) -> None:
    lead = ""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:  # a torn last line (killed mid-write) must not swallow this row
            f.seek(-1, os.SEEK_END)
            lead = "" if f.read(1) == b"\n" else "\n"
    with path.open("a") as f:
        f.write(lead + json.dumps(row, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _inflight_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".inflight")


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc).lower()
    return not _is_oom(exc) and any(m in text for m in FATAL_CUDA_MARKERS)


def _base_row(cfg: ValidationConfig, ctx: RunContext | None, gpu: str, set_name: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"schema": ROW_SCHEMA, **cfg.as_dict(), "set": set_name, "gpu": gpu}
    if ctx is not None:
        row.update(gpu_canonical=ctx.gpu_canonical, dry_run=ctx.dry_run, provenance=ctx.provenance)
    row["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return row


def run_validation(configs: list[ValidationConfig], out_path: str | Path, *, resume: bool = True,
                   window_s: float = 2.0, per_op: bool | Iterable[str] = False, dry_run: bool = False,
                   device_index: int = 0, measure: MeasureFn | None = None, context: RunContext | None = None,
                   retry_errors: bool = False, set_name: str | None = None,
                   log: Callable[[str], None] | None = print) -> Path:
    """Measure `configs`, appending one JSONL row per config to `out_path` as each completes.

    resume: skip configs that already have a row for this GPU in `out_path` (errored ones too, unless
        retry_errors). Without resume every config is measured again and new rows are appended (the
        report uses the last row of a config).
    per_op: True (all configs), False (each config's own `per_op` flag) or a collection of model
        specs / config keys whose per-op device times are recorded.
    measure / context: injectable for tests (default: `measure_config` on a real `RunContext`).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    configs = with_per_op(configs, per_op)
    ctx = context if context is not None else RunContext(dry_run=dry_run, device_index=device_index,
                                                         window_s=window_s)
    measure = measure or measure_config
    gpu = ctx.gpu
    say = log or (lambda _msg: None)
    try:
        done: dict[str, dict[str, Any]] = {}
        for r in read_rows(out_path):
            if r.get("gpu") == gpu and "key" in r:
                done[r["key"]] = r
        inflight = _inflight_path(out_path)
        if inflight.exists():  # the previous run died inside a config: record it, never retry it blindly
            with contextlib.suppress(Exception):
                crashed = json.loads(inflight.read_text())
                if crashed.get("gpu") == gpu and crashed.get("key") not in done:
                    cfg = next((c for c in configs if c.key == crashed["key"]), None)
                    if cfg is not None:
                        row = _base_row(cfg, ctx, gpu, set_name)
                        row.update(status="error", error_type="ProcessDied",
                                   error="the process died while measuring this config (previous run)")
                        _append(out_path, row)
                        done[cfg.key] = row
            inflight.unlink(missing_ok=True)
        todo = []
        for cfg in configs:
            prev = done.get(cfg.key)
            if resume and prev is not None and (prev.get("status") == "ok" or not retry_errors):
                continue
            todo.append(cfg)
        say(f"gpuest validate: {len(todo)} of {len(configs)} configs to measure on {gpu} "
            f"(~{estimated_duration_s(todo, ctx.window_s) / 60:.1f} min) -> {out_path}")
        # group configs of the same (model, batch) so the built model is reused
        order = {}
        for cfg in todo:
            order.setdefault((cfg.model, cfg.batch, cfg.seq, cfg.image_size), []).append(cfg)
        todo = [c for group in order.values() for c in group]
        for i, cfg in enumerate(todo, 1):
            inflight.write_text(json.dumps({"key": cfg.key, "gpu": gpu}))
            row = _base_row(cfg, ctx, gpu, set_name)
            t0 = time.perf_counter()
            fatal: BaseException | None = None
            err: tuple[str, str, str] | None = None
            try:
                measured = measure(cfg, ctx)
                row.update(measured)
                row["status"] = "ok"
                row["error"] = None
            except Exception as exc:  # noqa: BLE001 - record and continue
                err = (type(exc).__name__, f"{type(exc).__name__}: {exc}"[:2000],
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
                if _is_fatal_cuda(exc):
                    fatal = FatalCudaError(str(exc))
                del exc
            if err is not None:
                row.update(status="error", error_type="OutOfMemory" if "out of memory" in err[1].lower()
                           else err[0], error=err[1], traceback=err[2])
                ctx.drop_model()  # frees memory (OOM) and never reuses a model in an unknown state
            row["elapsed_s"] = time.perf_counter() - t0
            _append(out_path, row)
            inflight.unlink(missing_ok=True)
            msg = (f"[{i}/{len(todo)}] {cfg.key}: " +
                   (f"wall {row['wall_s'] * 1e3:.3f} ms, busy {row.get('device_busy_s', float('nan')) * 1e3:.3f} ms"
                    + (f", {row['avg_power_w']:.0f} W" if row.get("avg_power_w") is not None else "")
                    if row["status"] == "ok" and row.get("wall_s") is not None
                    else f"{row['status']}" + (f" ({row.get('error')})" if row.get("error") else "")))
            say(msg[:300])
            if fatal is not None:
                raise fatal
            next_cfg = todo[i] if i < len(todo) else None
            if next_cfg is None or (next_cfg.model, next_cfg.batch) != (cfg.model, cfg.batch):
                ctx.drop_model()
    finally:
        if context is None:
            ctx.close()
    return out_path


# ================================================================== CLI

def _split(text: str | None, sep: str = ",") -> list[str]:
    return [t.strip() for t in (text or "").split(sep) if t.strip()]


def build_configs(args: argparse.Namespace) -> tuple[list[ValidationConfig], str]:
    if args.models:
        batches = [int(b) for b in _split(args.batch)] or None
        modes = _split(args.modes) or list(MODES)
        precisions = _split(args.precision) or list(PRECISIONS)
        for m in modes:
            if m not in MODES:
                raise SystemExit(f"unknown mode {m!r}; accepted: {', '.join(MODES)}")
        configs = explicit_configs(_split(args.models), batches, modes, precisions, seq=args.seq,
                                   image_size=args.image_size)
        return configs, "explicit"
    name = "dry" if args.dry_run and not args.set else (args.set or "quick")
    configs = get_set(name)
    # --modes/--precision/--batch narrow a predefined set, e.g. to re-measure only its host-bound
    # (batch-1) training configs.
    for field, wanted in (("mode", _split(args.modes)), ("precision", _split(args.precision)),
                          ("batch", _split(args.batch))):
        if wanted:
            known = sorted({str(getattr(c, field)) for c in configs},
                           key=lambda v: (int(v), v) if v.isdigit() else (0, v))
            unknown = [w for w in wanted if w not in known]
            if unknown:
                raise SystemExit(f"set {name!r} has no {field} {', '.join(map(repr, unknown))}; "
                                 f"it has: {', '.join(known)}")
            configs = [c for c in configs if str(getattr(c, field)) in wanted]
    keys = _split(args.keys, ";")
    if keys:
        known_keys = {c.key for c in configs}
        unknown_keys = [k for k in keys if k not in known_keys]
        if unknown_keys:
            raise SystemExit(f"set {name!r} has no config {', '.join(map(repr, unknown_keys))}; "
                             f"`--set {name} --list` prints its keys")
        configs = [c for c in configs if c.key in keys]
    return configs, name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.validate",
                                description="Measure the validation set on this GPU (one JSONL row per config).")
    p.add_argument("--set", choices=sorted(SETS), help="predefined set (default quick; dry with --dry-run)")
    p.add_argument("--models", help="comma-separated model specs (instead of --set)")
    p.add_argument("--batch", help="comma-separated batch sizes (default: each model's small and large batch)")
    p.add_argument("--modes", help="comma-separated: inference,training (default both)")
    p.add_argument("--precision", help="comma-separated: fp32,bf16-mixed,... (default fp32,bf16-mixed)")
    p.add_argument("--seq", type=int, help="sequence length for language models")
    p.add_argument("--image-size", type=int, help="image size for vision models")
    p.add_argument("--keys", help="semicolon-separated config keys (as --list prints them) to measure from the set, "
                                   "e.g. to profile a few configs per op")
    p.add_argument("--out", "-o", type=Path, help="results JSONL (appended to)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", dest="resume", action="store_true", default=True,
                        help="skip configs already in --out for this GPU (default)")
    resume.add_argument("--no-resume", dest="resume", action="store_false",
                        help="measure every config again (rows are appended; the report uses the last)")
    p.add_argument("--retry-errors", action="store_true", help="with resume: measure errored configs again")
    p.add_argument("--window-s", type=float, default=2.0, help="energy window length in s (default 2)")
    p.add_argument("--per-op", default=None,
                   help="'all', 'none', or comma-separated model specs/config keys to record per-op times for "
                        "(default: the set's own choice)")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--dry-run", action="store_true",
                   help="run tiny configs on the CPU through the same code path (no CUDA, no NVML)")
    p.add_argument("--list", action="store_true", help="print the configs and the estimated duration, then exit")
    args = p.parse_args(argv)

    configs, set_name = build_configs(args)
    if args.per_op is None:
        per_op: bool | list[str] = False
    elif args.per_op.lower() == "all":
        per_op = True
    elif args.per_op.lower() == "none":
        configs = [replace(c, per_op=False) for c in configs]
        per_op = False
    else:
        per_op = _split(args.per_op)
    configs = with_per_op(configs, per_op)
    if args.list:
        for c in configs:
            print(c.key, "heldout" if c.heldout else "", "per-op" if c.per_op else "")
        print(f"{len(configs)} configs, {len({c.model for c in configs})} models; "
              f"estimated {estimated_duration_s(configs, args.window_s) / 60:.1f} min on an H100")
        return 0
    out = args.out
    window_s = args.window_s
    resume_flag = args.resume
    if args.dry_run:
        if out is None:
            out = DRY_RUN_OUT
            out.unlink(missing_ok=True)
        window_s = min(window_s, 0.3)
    elif out is None:
        p.error("--out is required (except with --dry-run or --list)")
    try:
        run_validation(configs, out, resume=resume_flag, window_s=window_s, dry_run=args.dry_run,
                       device_index=args.device_index, retry_errors=args.retry_errors, set_name=set_name)
    except FatalCudaError as exc:
        print(f"fatal CUDA error, the CUDA context is unusable: {exc}\n"
              f"rerun the same command to continue with the next config (resume is on)", file=sys.stderr)
        return 3
    rows = [r for r in read_rows(Path(out)) if r.get("key") in {c.key for c in configs}]
    ok = sum(r.get("status") == "ok" for r in rows)
    print(f"done: {ok} ok / {len(rows) - ok} errors in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
