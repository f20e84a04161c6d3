"""Run the calibration suite on a real NVIDIA GPU and write one JSONL row per benchmark.

    python3 -m gpuest.calibrate.runner --out calib.jsonl [--budget-s 300] [--resume] [--dry-run]
                                  [--categories matmul,conv] [--no-power]

Rows (schema ROW_SCHEMA) are appended and flushed as each benchmark finishes, so an interrupted
run loses nothing: `--resume` skips the benchmarks already in the file (by name) and appends the
rest. Provenance (GPU, driver, CUDA, torch, host, command, idle power, clocks, power limit) goes to
the sidecar `<out>.meta.json`, one entry per session, with the session's summary.

Dry runs (`--dry-run`) execute the whole pipeline on the CPU with tiny sizes and a fake power
monitor; their rows say `dry_run: true` and must never be used as calibration data.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from .nvml_monitor import FakePowerMonitor, NvmlUnavailableError, PowerMeasurement, PowerMonitor
from .budget import FIXED_START_S, SUITE_BUDGET_S, SUITES, Plan, run_plan, suite_version
from .suite import BUSY_CALLS, Benchmark, Built, TraceSpec, _FnModule, all_benchmarks
from .timing import device_busy_ms, host_dispatch_us, input_bytes, l2_cache_bytes, rotation_for, time_op
from ..annotate.registry import node_attr_names

ROW_SCHEMA = "gpuest.calib-row/1"
META_SCHEMA = "gpuest.calib-meta/1"
# What a calibration row stores of each node: where it ran and the Cost fields (the node schema).
NODE_KEYS = ("op", "cpu_op", "phase", "math_mode", "dtype", *node_attr_names(), "input_shapes", "output_shapes")
POWER_KEYS = ("energy_j", "avg_power_w", "duration_s", "source", "sm_clock_mhz", "sm_clock_min_mhz", "mem_clock_mhz",
              "temperature_c", "throttle_reasons", "throttled", "reliable", "power_limit_w", "power_samples",
              "power_iters")
POWER_CUTOFF = 0.8      # share of the wall-clock budget after which benchmarks are timed without power windows
MIN_POWER_OP_MS = 0.02  # ops shorter than ~20 us are launch-bound: their power says little per op
HOST_PROBE_RESERVE_S = 40.0  # the host probes' share of a run's budget (8 small steps, each with a power window)


class CalibrationError(RuntimeError):
    """The calibration run cannot start (file exists without --resume, no GPU, mismatched resume)."""


def meta_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".meta.json")


# ---------------------------------------------------------------- tracing

@contextlib.contextmanager
def tf32_flags(matmul_tf32: bool, cudnn_tf32: bool) -> Iterator[None]:
    """Set torch's TF32 switches for one benchmark (measurement and trace alike), then restore them.

    Only the legacy `set_float32_matmul_precision` API is used: the estimator's trace reads it back,
    and mixing it with the newer fp32_precision API makes torch raise."""
    old_prec, old_cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if matmul_tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old_prec)
        torch.backends.cudnn.allow_tf32 = old_cudnn


def _graph_nodes(spec: TraceSpec) -> list[dict[str, Any]]:
    from gpuest.capture import trace  # imported late: the estimator is only needed for the trace

    graph = trace(spec.module, spec.inputs, mode=spec.mode, precision="fp32", optimizer=spec.optimizer,
                  loss_fn=spec.loss_fn)
    return [graph.nodes[n] for n in sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"])]


def trace_nodes(spec: TraceSpec) -> list[dict[str, Any]]:
    """The non-free graph nodes the estimator sees for one benchmark, reduced to NODE_KEYS."""
    nodes = _graph_nodes(spec)
    if spec.skip is not None:
        nodes = nodes[len(_graph_nodes(spec.skip)):]
    if spec.phases is not None:
        nodes = [n for n in nodes if n.get("phase") in spec.phases]
    return [{**{k: n.get(k) for k in NODE_KEYS}, "count": 1} for n in nodes if not n.get("free")]


MAX_ROW_NODES = 256
_SUMMED = ("flops", "flops_skipped", "bytes_read", "bytes_written", "kernels", "count")
_GROUP_KEYS = ("op", "cpu_op", "category", "phase", "math_mode", "dtype", "host_only", "supported")
# The rest describe a node's shape: merged nodes keep them only where they all agree.
_AGREED = tuple(k for k in NODE_KEYS if k not in _SUMMED + _GROUP_KEYS)


def compact_nodes(nodes: list[dict[str, Any]], limit: int = MAX_ROW_NODES) -> tuple[list[dict[str, Any]], bool]:
    """Keep rows small: more than `limit` nodes (a GRU traced step by step, an optimizer over 1000
    tensors) are merged per (op, category, phase, math_mode, dtype); FLOPs, bytes, kernels and
    `count` are summed, GEMM sizes kept only where every merged node agrees (else 0)."""
    if len(nodes) <= limit:
        return nodes, False
    groups: dict[tuple, dict[str, Any]] = {}
    for n in nodes:
        key = tuple(n.get(k) for k in _GROUP_KEYS)
        g = groups.get(key)
        if g is None:
            groups[key] = dict(n)
            continue
        for k in _SUMMED:
            g[k] = (g.get(k) or 0) + (n.get(k) or 0)
        for k in _AGREED:
            if g.get(k) != n.get(k):
                g[k] = "mixed" if k.endswith("shapes") else 0
    return list(groups.values()), True


def _default_spec(built: Built, inputs: Sequence[Any]) -> TraceSpec:
    def to_meta(x: Any) -> Any:
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta") \
            if isinstance(x, torch.Tensor) else x
    return TraceSpec(_FnModule(built.fn), tuple(torch.utils._pytree.tree_map(to_meta, list(inputs))))


def built_nodes(built: Built, first: Sequence[Any]) -> tuple[list[dict[str, Any]], bool, int]:
    """A built benchmark's nodes as a row stores them: (nodes, whether they were aggregated, number
    traced). `first` is its first input set (what the default trace spec is made from)."""
    spec = built.trace if built.trace is not None else _default_spec(built, first)
    nodes = trace_nodes(spec)
    compact, aggregated = compact_nodes(nodes)
    return compact, aggregated, len(nodes)


# ---------------------------------------------------------------- one benchmark

def input_sets(built: Built, kind: str, l2_bytes: int) -> tuple[list[tuple], int]:
    """The input sets a benchmark's timing cycles through, and the bytes of one: a device benchmark gets
    enough sets that together they exceed L2 (rotation_for), so each call reads from DRAM; a probe one."""
    first = built.make_set(0)
    nbytes = built.bytes_per_set if built.bytes_per_set is not None else input_bytes(first)
    rotate = 1 if kind != "device" else rotation_for(nbytes, l2_bytes, built.max_sets)
    return [first] + [built.make_set(i) for i in range(1, rotate)], nbytes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _power_window(monitor: Any, name: str, fn: Callable[..., Any], sets: list[tuple], median_ms: float,
                  window_s: float, device: torch.device) -> tuple[PowerMeasurement, int]:
    """Loop fn (no sync per call) for >= window_s and measure the window."""
    iters = max(1, math.ceil(window_s * 1e3 / max(median_ms, 1e-4)))
    k = len(sets)
    _sync(device)
    monitor.begin_window(name)
    start = time.perf_counter()
    i, target = 0, iters
    # Launch the planned count, wait for the GPU, and top up if the window came out short (clocks
    # drop under sustained load, or the host could not keep the GPU fed): never more than needed.
    while True:
        while i < target:
            fn(*sets[i % k])
            i += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= window_s or i >= 20 * iters:
            break
        target = i + math.ceil((window_s - elapsed) / (elapsed / i) * 1.05) + 1
    return monitor.end_window(name), i


# Wall seconds of each phase of one benchmark (elapsed_s holds them and the rest): what the budget model prices.
PHASE_KEYS = ("build_s", "trace_s", "timing_s", "power_s")


def _empty_row(b: Benchmark, *, dry_run: bool, session: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "schema": ROW_SCHEMA, "name": b.name, "category": b.category, "kind": b.kind, "params": b.params,
        "holdout": b.holdout, "dry_run": dry_run, "session": session,
        "matmul_tf32": b.matmul_tf32, "cudnn_tf32": b.cudnn_tf32,
        "nodes": [], "n_nodes_traced": 0, "nodes_aggregated": False, "trace_error": None,
        "time_ms_median": None, "time_ms_p10": None, "time_ms_p90": None, "repeats": None, "inner": None,
        "rotate": None, "bytes_per_set": None, "host_dispatch_us": None, "busy_ms": None,
    }
    row.update({k: None for k in POWER_KEYS})
    row.update({"timing_sm_clock_mhz": None, "timing_throttle_reasons": None, "error": None,
                "timestamp": None, "elapsed_s": None})
    row.update({k: 0.0 for k in PHASE_KEYS})
    return row


def run_benchmark(b: Benchmark, *, device: torch.device, monitor: Any | None, power: bool, window_s: float,
                  seed: int, dry_run: bool, session: int, l2_bytes: int) -> dict[str, Any]:
    """Measure one benchmark and return its row; failures are recorded in `error`, never raised."""
    row = _empty_row(b, dry_run=dry_run, session=session)
    t_start = time.perf_counter()
    sets: list[tuple] = []
    try:
        with tf32_flags(b.matmul_tf32, b.cudnn_tf32):
            built = b.build(device, seed)
            sets, nbytes = input_sets(built, b.kind, l2_bytes)
            first, rotate = sets[0], len(sets)
            row["bytes_per_set"] = nbytes
            t_phase = time.perf_counter()
            row["build_s"] = round(t_phase - t_start, 4)
            try:
                row["nodes"], row["nodes_aggregated"], row["n_nodes_traced"] = built_nodes(built, first)
            except Exception as exc:  # the trace is best effort: the timing is still worth keeping
                row["trace_error"] = f"{type(exc).__name__}: {exc}"
            row["trace_s"] = round(time.perf_counter() - t_phase, 4)
            t_phase = time.perf_counter()
            with torch.no_grad():
                if monitor is not None:
                    monitor.begin_window(b.name + ":timing")
                try:
                    res = time_op(built.fn, sets, rotate=rotate, device=device,
                                  warmup=2 if dry_run else 3, repeats=3 if dry_run else 10,
                                  target_total_ms=5.0 if dry_run else 30.0)
                finally:
                    if monitor is not None:
                        _sync(device)
                        tm = monitor.end_window(b.name + ":timing")
                        row["timing_sm_clock_mhz"] = tm.sm_clock_mhz
                        row["timing_throttle_reasons"] = tm.throttle_reasons
                row.update(time_ms_median=res.median_ms, time_ms_p10=res.p10_ms, time_ms_p90=res.p90_ms,
                           repeats=res.n, inner=res.inner, rotate=res.rotate, timing_method=res.method,
                           timing_discarded=res.discarded)
                if b.kind == "host_dispatch":
                    row["host_dispatch_us"] = host_dispatch_us(built.fn, first, n=20 if dry_run else 200,
                                                               device=device)
                if b.host_paced and device.type == "cuda":
                    # Its host dispatch cost cannot be timed with the GPU kept busy (cuDNN's RNNs
                    # synchronise inside the call); where the host paces it, elapsed time is host time.
                    row["busy_ms"] = device_busy_ms(built.fn, sets, calls=BUSY_CALLS)
                row["timing_s"] = round(time.perf_counter() - t_phase, 4)
                t_phase = time.perf_counter()
                if monitor is not None and power and (res.median_ms >= MIN_POWER_OP_MS or dry_run):
                    pm, iters = _power_window(monitor, b.name, built.fn, sets, res.median_ms, window_s, device)
                    row.update(energy_j=pm.energy_j, avg_power_w=pm.avg_power_w, duration_s=pm.duration_s,
                               source=pm.source, sm_clock_mhz=pm.sm_clock_mhz, sm_clock_min_mhz=pm.sm_clock_min_mhz,
                               mem_clock_mhz=pm.mem_clock_mhz, temperature_c=pm.temperature_c,
                               throttle_reasons=pm.throttle_reasons, throttled=pm.throttled, reliable=pm.reliable,
                               power_limit_w=pm.power_limit_w, power_samples=pm.samples, power_iters=iters)
                    row["power_s"] = round(time.perf_counter() - t_phase, 4)
    except Exception as exc:  # a failing benchmark is recorded with its message; the suite goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=4)
    finally:
        sets.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    row["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    row["elapsed_s"] = round(time.perf_counter() - t_start, 4)
    return row


# ---------------------------------------------------------------- provenance

def _provenance(device: torch.device, monitor: Any | None, *, dry_run: bool, command: str, budget_s: float,
                idle_w: float | None, n_planned: int, n_power: int, est_s: float) -> dict[str, Any]:
    info: dict[str, Any] = {
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "python": platform.python_version(), "torch_version": torch.__version__,
        "torch_cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version()
        if torch.backends.cudnn.is_available() else None,
        "command": command, "budget_s": budget_s if math.isfinite(budget_s) else None, "dry_run": dry_run, "device": str(device),
        "planned_benchmarks": n_planned, "planned_power_windows": n_power, "estimated_duration_s": round(est_s, 1),
        "idle_power_w": idle_w, "nvml": None, "gpu_name": None, "catalog_gpu": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu_name=props.name, sm_count=props.multi_processor_count,
                    memory_bytes=props.total_memory, l2_cache_bytes=getattr(props, "L2_cache_size", None),
                    compute_capability=f"{props.major}.{props.minor}")
        try:
            from gpuest.catalog.gpu_spec import get_gpu
            info["catalog_gpu"] = get_gpu(props.name).name
        except Exception as exc:  # an uncatalogued GPU can still be calibrated
            info["catalog_gpu_error"] = f"{type(exc).__name__}: {exc}"
    if monitor is not None:
        info["nvml"] = monitor.device_info()
    if dry_run:
        info["gpu_name"] = "dry-run (CPU)"
        info["warning"] = "DRY RUN on the CPU with tiny sizes and a fake power monitor: NOT calibration data"
    return info


def _read_existing(out_path: Path) -> tuple[list[str], int]:
    """Names already in the file, and the number of complete lines (a torn last line is dropped)."""
    names: list[str] = []
    if not out_path.exists():
        return names, 0
    raw = out_path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        # The previous run died mid-write: cut the torn line so the file stays valid JSONL.
        keep = raw[: raw.rfind(b"\n") + 1]
        out_path.write_bytes(keep)
        raw = keep
    for line in raw.decode().splitlines():
        if line.strip():
            names.append(json.loads(line)["name"])
    return names, len(names)


def superseded_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".superseded.jsonl")


def supersede(out_path: str | os.PathLike[str], categories: Sequence[str]) -> int:
    """Move the rows of `categories` out of `out_path` into `<out>.superseded.jsonl` (appended, so no
    measurement is ever lost), so that a `--resume` run measures them again; returns how many moved."""
    out_path = Path(out_path)
    if not out_path.exists():
        raise CalibrationError(f"--redo needs an existing file to re-measure rows of: {out_path} does not exist")
    _read_existing(out_path)  # cuts a torn last line first
    wanted = set(categories)
    keep, moved = [], []
    for line in out_path.read_text().splitlines(keepends=True):
        if line.strip():
            (moved if json.loads(line).get("category") in wanted else keep).append(line)
    if moved:
        with superseded_path(out_path).open("a") as f:
            f.writelines(moved)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, out_path)
    return len(moved)


def _load_meta(out_path: Path) -> dict[str, Any]:
    mp = meta_path(out_path)
    if mp.exists():
        return json.loads(mp.read_text())
    return {"schema": META_SCHEMA, "sessions": []}


def _write_meta(out_path: Path, meta: dict[str, Any]) -> None:
    mp = meta_path(out_path)
    tmp = mp.with_name(mp.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, default=str))
    os.replace(tmp, mp)


class _Progress:
    """tqdm when importable, else one rewritten stderr line."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled, self.total, self.n, self.bar = enabled, total, 0, None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="bench", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def update(self, name: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(name[:40], refresh=False)
            self.bar.update(1)
        else:
            sys.stderr.write(f"\r[{self.n:4d}/{self.total}] {name[:60]:<60}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


# ---------------------------------------------------------------- the suite

def run_suite(out_path: str | os.PathLike[str], *, suite: str = "quick", budget_s: float | None = None,
              resume: bool = False, dry_run: bool = False, categories: Sequence[str] | None = None,
              power: bool = True, progress: bool = True, seed: int = 0, command: str | None = None,
              monitor_factory: Callable[[], Any] | None = None, window_s: float | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None, host_probes: bool | None = None) -> Path:
    """Run the calibration suite, appending one JSON row per benchmark to `out_path`; returns the path.

    suite: "quick" (the default: what fits 5 minutes on an H100) or "full" (gpuest.calibrate.budget.run_plan).
    budget_s: wall-clock budget in seconds instead of the suite's; the grid is trimmed deterministically to
    fit it, power windows stop at POWER_CUTOFF of it, and the run stops at it (rerun with resume to finish).
    host_probes: then measure the host-bound whole-model steps of gpuest.evaluate.validation_set.host_set into
    `<out>.host.jsonl`, which `gpuest fit` reads for the host costs (default: unless `categories` is given).
    resume: skip benchmarks already in the file and append; without it a non-empty file is an error.
    dry_run: CPU, tiny sizes, fake power monitor (CI only; rows are marked and unusable for fitting).
    categories: only these estimator cost categories (e.g. ["matmul", "conv"]).
    power: measure energy with NVML; if NVML is unavailable the run is time-only, with a warning.
    monitor_factory: builds the power monitor (tests inject a fake NVML); default PowerMonitor
        (FakePowerMonitor for dry runs).
    window_s: power window length in s (default 0.6 on the GPU, 0.02 in dry runs).
    on_row: called with each row after it is written (progress hooks, tests).
    """
    out = Path(out_path)
    probing = host_probes if host_probes is not None else categories is None
    _check_budget(budget_s, probing and not dry_run)
    existing = _check_can_start(out, resume, dry_run)
    device = torch.device("cpu") if dry_run else torch.device("cuda", torch.cuda.current_device())
    window_s = window_s if window_s is not None else (0.02 if dry_run else 0.6)
    meta = _session_meta(out, resume, dry_run)
    monitor = _open_monitor(monitor_factory, dry_run) if power else None
    the_plan = run_plan(suite, budget_s, categories, power=monitor is not None, window_s=window_s, dry_run=dry_run)
    if budget_s is None:
        budget_s = SUITE_BUDGET_S.get(suite, math.inf)
    stop_s = budget_s - (HOST_PROBE_RESERVE_S if probing and not dry_run else 0.0)
    done = set(existing)
    todo = [b for b in the_plan.benchmarks if b.name not in done]
    session = len(meta["sessions"])
    _check_same_gpu(out, meta, device, dry_run)
    idle_w = monitor.idle_power(5.0 if not dry_run else 0.0) if monitor is not None else None
    l2 = l2_cache_bytes(device)
    info = _start_session(out, meta, device, monitor, the_plan, len(todo), dry_run=dry_run,
                          command=command or " ".join(sys.argv), budget_s=budget_s, idle_w=idle_w,
                          categories=categories, suite=suite)

    summary = _new_summary()
    t0 = time.perf_counter()
    bar = _Progress(len(todo), progress)
    threads = torch.get_num_threads()
    if dry_run:
        torch.set_num_threads(1)  # tiny CPU ops: a thread pool only adds contention on shared CI machines
    try:
        with open(out, "a", encoding="utf-8") as fh:
            for b in todo:
                elapsed = time.perf_counter() - t0
                if elapsed > stop_s and not dry_run:
                    _stop_over_budget(summary, elapsed, budget_s, len(todo))
                    break
                # Near the budget: no more power windows, time only, so the run ends on time.
                over = elapsed > POWER_CUTOFF * stop_s
                row = run_benchmark(b, device=device, monitor=monitor,
                                    power=b.name in the_plan.power and not over,
                                    window_s=window_s, seed=seed, dry_run=dry_run, session=session, l2_bytes=l2)
                _record_row(fh, row, summary, bar, b.name, on_row)
    finally:
        _close_session(out, meta, info, summary, t0, threads, bar, monitor)
    _finish_run(out, meta, info, summary, probing, dry_run, progress)
    return out


def _check_can_start(out: Path, resume: bool, dry_run: bool) -> list[str]:
    """Names of the benchmarks `out` already holds; raises CalibrationError where the run cannot start."""
    existing, _ = _read_existing(out)
    if existing and not resume:
        raise CalibrationError(f"{out} already holds {len(existing)} rows; pass --resume to continue it "
                               "or --out to write a new file")
    if not dry_run and not torch.cuda.is_available():
        raise CalibrationError("no CUDA GPU is visible to torch; calibration must run on the GPU it "
                               "calibrates (use --dry-run to test the pipeline on the CPU)")
    return existing


def _session_meta(out: Path, resume: bool, dry_run: bool) -> dict[str, Any]:
    """The run's provenance file contents (read back when resuming), marked for a dry run."""
    meta = _load_meta(out) if resume else {"schema": META_SCHEMA, "sessions": []}
    if meta["sessions"] and bool(meta.get("dry_run")) != dry_run:
        raise CalibrationError(f"{out} was written by a {'dry' if meta.get('dry_run') else 'GPU'} run; "
                               "do not mix dry-run and GPU rows in one file")
    meta["dry_run"] = dry_run
    if dry_run:
        meta["warning"] = "DRY RUN: rows were measured on the CPU with tiny sizes; never use them as calibration"
    return meta


def _open_monitor(monitor_factory: Callable[[], Any] | None, dry_run: bool) -> Any | None:
    """The power monitor, or None (with a warning) where NVML is unavailable."""
    factory = monitor_factory or (FakePowerMonitor if dry_run else PowerMonitor)
    try:
        return factory()
    except NvmlUnavailableError as exc:
        # stacklevel 3: the warning names run_suite's caller, as it did when this ran inline
        warnings.warn(f"NVML unavailable ({exc}); running a time-only calibration (no energy/power rows)",
                      RuntimeWarning, stacklevel=3)
        return None


def _check_same_gpu(out: Path, meta: dict[str, Any], device: torch.device, dry_run: bool) -> None:
    """Raises CalibrationError when resuming a file that another GPU model measured."""
    if meta["sessions"] and not dry_run:
        first_gpu = meta["sessions"][0].get("gpu_name")
        here = torch.cuda.get_device_properties(device).name
        if first_gpu and first_gpu != here:
            raise CalibrationError(f"cannot resume {out}: it was measured on {first_gpu}, this is {here}")


def _check_budget(budget_s: float | None, probing: bool) -> None:
    """Refuses a budget (s) that the host probes' reserve and the start-up leave no benchmark time in."""
    least_s = HOST_PROBE_RESERVE_S + FIXED_START_S
    if probing and budget_s is not None and budget_s <= least_s:
        raise CalibrationError(f"--budget-s {budget_s:g} leaves no time for benchmarks: the host probes reserve "
                               f"{HOST_PROBE_RESERVE_S:g} s of it and start-up takes about {FIXED_START_S:g} s; "
                               f"accepted: a budget above {least_s:g} s, or --no-host-probes")


def _start_session(out: Path, meta: dict[str, Any], device: torch.device, monitor: Any | None, the_plan: Plan,
                   n_todo: int, *, dry_run: bool, command: str, budget_s: float, idle_w: float | None,
                   categories: Sequence[str] | None, suite: str) -> dict[str, Any]:
    """This session's provenance, appended to the run's meta file (written before any benchmark runs)."""
    info = _provenance(device, monitor, dry_run=dry_run, command=command, budget_s=budget_s,
                       idle_w=idle_w, n_planned=len(the_plan.benchmarks), n_power=len(the_plan.power),
                       est_s=the_plan.est_s)
    info.update(skipped_existing=len(the_plan.benchmarks) - n_todo, trimmed_by_budget=the_plan.dropped,
                categories=list(categories) if categories else "all", power=monitor is not None,
                suite=suite, suite_version=suite_version(), suite_benchmarks=[b.name for b in the_plan.benchmarks])
    meta["sessions"].append(info)
    _write_meta(out, meta)
    return info


def _new_summary() -> dict[str, Any]:
    """An empty run summary: counts of rows, errors and power windows, filled by _count."""
    return {"rows": 0, "errors": 0, "trace_errors": 0, "power_windows": 0, "unreliable_windows": 0,
            "throttled_windows": 0, "throttle_reasons": {}, "by_category": {}}


def _stop_over_budget(summary: dict[str, Any], elapsed_s: float, budget_s: float, n_todo: int) -> None:
    """Warns that the run stops at its budget and marks the summary so."""
    # stacklevel 3: the warning names run_suite's caller, as it did when this ran inline
    warnings.warn(f"stopping after {elapsed_s:.0f} s (budget {budget_s:.0f} s); "
                  f"{n_todo - summary['rows']} benchmarks left: rerun with --resume to finish",
                  RuntimeWarning, stacklevel=3)
    summary["stopped_over_budget"] = True


def _record_row(fh: Any, row: dict[str, Any], summary: dict[str, Any], bar: _Progress, name: str,
                on_row: Callable[[dict[str, Any]], None] | None) -> None:
    """Appends one benchmark's row to the open file, counts it and reports progress."""
    fh.write(json.dumps(row, default=str) + "\n")
    fh.flush()
    _count(summary, row)
    bar.update(name)
    if on_row is not None:
        on_row(row)


def _close_session(out: Path, meta: dict[str, Any], info: dict[str, Any], summary: dict[str, Any], t0: float,
                   threads: int, bar: _Progress, monitor: Any | None) -> None:
    """Restores torch's threads, closes the progress bar and monitor, and records the session's summary."""
    torch.set_num_threads(threads)
    bar.close()
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    info["summary"] = summary
    info["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    _write_meta(out, meta)
    if monitor is not None:
        monitor.close()


def _finish_run(out: Path, meta: dict[str, Any], info: dict[str, Any], summary: dict[str, Any], probing: bool,
                dry_run: bool, progress: bool) -> None:
    """Runs the host probes (when asked), records the file's suite coverage and prints the summary."""
    if probing:
        summary["host_probes"] = _run_host_probes(out, dry_run)
        _write_meta(out, meta)
    coverage = suite_coverage(out)
    info["coverage"] = coverage
    _write_meta(out, meta)
    if progress:
        sys.stderr.write(format_summary(summary) + "\n" + format_coverage(coverage) + "\n")


def host_probe_path(out_path: Path) -> Path:
    """Where a calibration run writes its host-bound whole-model steps (read by `gpuest fit`)."""
    return out_path.with_name(out_path.name + ".host.jsonl")


def _run_host_probes(out_path: Path, dry_run: bool) -> int:
    """Measure the host probes (gpuest.evaluate.validation_set.host_set; tiny CPU configs in a dry run);
    returns how many rows the file holds."""
    from .validate import run_validation, read_rows
    from ..evaluate.validation_set import get_set
    path = host_probe_path(out_path)
    run_validation(get_set("dry" if dry_run else "host"), path, dry_run=dry_run, window_s=0.05 if dry_run else 0.6,
                   set_name="host", log=None)
    return len(read_rows(path))


def suite_coverage(out_path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a calibration file holds of the suites it planned: benchmarks measured without error, of
    those its sessions planned, and of the full suite (by name; the suite's current version)."""
    out_path = Path(out_path)
    meta = _load_meta(out_path)
    planned = {n for s in meta["sessions"] for n in s.get("suite_benchmarks", [])}
    measured = set()
    for line in out_path.read_text().splitlines() if out_path.exists() else []:
        row = json.loads(line)
        if not row.get("error") and row.get("time_ms_median"):
            measured.add(row["name"])
    full = {b.name for b in all_benchmarks()}
    names = [s.get("suite") for s in meta["sessions"] if s.get("suite")]
    return {"suite": names[0] if names and len(set(names)) == 1 else "+".join(sorted(set(names))) or None,
            "suite_version": suite_version(), "planned": len(planned), "measured_of_planned": len(measured & planned),
            "full_suite": len(full), "measured_of_full": len(measured & full),
            "share_of_planned": len(measured & planned) / len(planned) if planned else None,
            "share_of_full": len(measured & full) / len(full)}


def format_coverage(c: dict[str, Any]) -> str:
    """One line: the share of the planned suite and of the full suite measured."""
    planned = (f"{c['measured_of_planned']} of the {c['planned']} benchmarks of suite '{c['suite']}' "
               f"({100 * c['share_of_planned']:.0f} %)") if c["planned"] else "no planned suite recorded"
    return (f"measured {planned}; {c['measured_of_full']} of the full suite's {c['full_suite']} "
            f"({100 * c['share_of_full']:.0f} %, suite version {c['suite_version']})")


def _count(summary: dict[str, Any], row: dict[str, Any]) -> None:
    summary["rows"] += 1
    summary["errors"] += row["error"] is not None
    summary["trace_errors"] += row["trace_error"] is not None
    cat = summary["by_category"].setdefault(row["category"], 0)
    summary["by_category"][row["category"]] = cat + 1
    if row["energy_j"] is not None:
        summary["power_windows"] += 1
        summary["unreliable_windows"] += not row["reliable"]
        if row["throttled"]:
            summary["throttled_windows"] += 1
            for r in row["throttle_reasons"] or []:
                summary["throttle_reasons"][r] = summary["throttle_reasons"].get(r, 0) + 1


def format_summary(summary: dict[str, Any]) -> str:
    """One paragraph for humans."""
    lines = [f"calibration: {summary['rows']} rows in {summary.get('wall_s', '?')} s, {summary['errors']} errors, "
             f"{summary['trace_errors']} trace errors, {summary['power_windows']} power windows "
             f"({summary['unreliable_windows']} < 0.5 s), {summary['throttled_windows']} throttled"]
    if summary["throttle_reasons"]:
        lines.append("  throttle reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["throttle_reasons"].items())))
    lines.append("  per category: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["by_category"].items())))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "python3 -m gpuest.calibrate.runner") -> int:
    """CLI entry point: `python3 -m gpuest.calibrate.runner [--out PATH] [...]`, also `gpuest calibrate` (`prog`,
    which the recorded command names)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpuest.calibrate.jsonl",
                   help="JSONL file to write (provenance goes to <out>.meta.json; default %(default)s)")
    p.add_argument("--suite", default="quick", choices=SUITES,
                   help="quick (default: what fits 5 minutes on an H100) or full (every benchmark)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget in seconds instead of the suite's: the longest prefix of the priority "
                        "order that fits (a longer budget adds shapes, never drops a category)")
    p.add_argument("--no-host-probes", action="store_true", help="skip the host-bound whole-model steps")
    p.add_argument("--resume", action="store_true", help="append to an existing file, skipping finished benchmarks")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, fake power: tests the pipeline only")
    p.add_argument("--categories", default=None, help="comma-separated cost categories, e.g. matmul,conv")
    p.add_argument("--no-power", action="store_true", help="time only; no NVML energy windows")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="print the planned benchmarks and exit")
    p.add_argument("--redo", default=None, metavar="CATEGORIES",
                   help="re-measure these categories of an existing --out file (implies --resume); the old rows "
                        "move to <out>.superseded.jsonl")
    args = p.parse_args(argv)
    cats = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    if args.list:
        pl = run_plan(args.suite, args.budget_s, cats, power=not args.no_power)
        for b in pl.benchmarks:
            print(f"{b.category:12s} {b.kind:13s} {'H' if b.holdout else ' '} {'P' if b.name in pl.power else ' '} "
                  f"{b.est_ms:9.4f} ms  {b.name}")
        print(f"{len(pl.benchmarks)} benchmarks ({pl.dropped} trimmed), {len(pl.power)} power windows, "
              f"estimated {pl.est_s:.0f} s")
        return 0
    try:
        if args.redo:
            redo = [c.strip() for c in args.redo.split(",") if c.strip()]
            print(f"{supersede(args.out, redo)} rows of {', '.join(redo)} moved to {superseded_path(Path(args.out))}")
            args.resume = True
        run_suite(args.out, suite=args.suite, budget_s=args.budget_s, resume=args.resume, dry_run=args.dry_run,
                  categories=cats, power=not args.no_power, progress=not args.no_progress,
                  host_probes=False if args.no_host_probes else None,
                  command=" ".join([*prog.split(), *(argv if argv is not None else sys.argv[1:])]))
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}; fit it with: gpuest fit {args.out} -o profile.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
