"""Timing one op on the GPU (CUDA events) or, for dry runs, on the CPU (perf_counter)."""
from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

DEFAULT_L2_BYTES = 50 * 2**20  # used when torch cannot report the L2 size
MIN_SAMPLE_MS = 0.2  # ops shorter than this are timed in back-to-back groups, so launch jitter averages out
MAX_INNER = 200
QUEUE_BELOW_MS = 1.0          # ops shorter than this are timed with the host running ahead of the GPU
HOST_US_PER_CALL_BOUND = 40.0  # generous bound on one call's host dispatch time (us): the spin never needs more
# The spin ahead of a queued group lasts SPIN_HOST_MARGIN x the enqueue time the timing measures, plus
# SPIN_FLOOR_S: on the H100 it times 80 suite ops as the fixed 40 us/call spin did (median 1.0001, p10-p90
# 0.997-1.004; python3 benchmarks/spin_sizing_ab.py --summary data/calibration/experiments/spin_ab.H100-SXM.jsonl)
# at a fraction of its wall time.
SPIN_HOST_MARGIN = 4.0
SPIN_FLOOR_S = 5e-5
# Sampling stops once the median is known to this relative half-width (95 %, from the samples' spread):
# each queued sample costs its spin (~0.3-1 ms on the H100), so a fixed 100 samples of a 10 us op spent
# ~0.1 s where ~30 give the same median (python3 benchmarks/sample_count_ab.py --summary
# data/calibration/experiments/sample_ab.H100-SXM.jsonl).
MEDIAN_REL_PRECISION = 0.005
MIN_STOP_SAMPLES = 20   # the spread estimate needs this many samples before it may stop the sampling


@dataclass(frozen=True)
class TimingResult:
    """Per-call time in ms: median and 10th/90th percentiles over `n` samples of `inner` calls each."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    inner: int = 1
    rotate: int = 1
    method: str = "events"  # "events_queued": the host enqueued the group while the GPU was kept busy
    discarded: int = 0      # queued groups dropped because the host fell behind the spin ahead of them


def l2_cache_bytes(device: torch.device | None = None) -> int:
    """L2 size of the CUDA device in bytes (DEFAULT_L2_BYTES when unknown or on CPU)."""
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        size = getattr(props, "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def input_bytes(inputs: Sequence[Any]) -> int:
    """Bytes of the tensors in one input set (nested lists/tuples included, each storage once)."""
    seen: set[int] = set()
    total = 0
    for t in torch.utils._pytree.tree_leaves(list(inputs)):
        if isinstance(t, torch.Tensor):
            key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
            if key in seen:
                continue
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def rotation_for(bytes_per_set: int, l2_bytes: int, max_sets: int = 8) -> int:
    """Input sets to rotate among so the sets together are >= 3x L2: each call then reads from DRAM."""
    if bytes_per_set <= 0:
        return 1
    if bytes_per_set >= 3 * l2_bytes:
        return 1
    return int(min(max_sets, max(2, math.ceil(3 * l2_bytes / bytes_per_set))))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _as_sets(make_inputs: Callable[[int], Sequence[Any]] | Sequence[Sequence[Any]], rotate: int) -> list:
    if callable(make_inputs):
        return [tuple(make_inputs(i)) for i in range(max(1, rotate))]
    sets = [tuple(s) for s in make_inputs]
    if not sets:
        raise ValueError("time_op needs at least one input set")
    return sets[:max(1, rotate)] if rotate else sets


def time_op(fn: Callable[..., Any], make_inputs: Callable[[int], Sequence[Any]] | Sequence[Sequence[Any]], *,
            warmup: int = 3, repeats: int = 20, rotate: int = 1, device: torch.device | str | None = None,
            target_total_ms: float = 30.0, max_repeats: int = 100,
            rel_precision: float | None = MEDIAN_REL_PRECISION) -> TimingResult:
    """Time `fn(*inputs)`, cycling through `rotate` input sets (given as a list, or made by
    `make_inputs(i)`), so that small working sets are not served from L2.

    CUDA: one pair of events brackets `inner` back-to-back calls per sample (inner > 1 only for
    ops shorter than MIN_SAMPLE_MS). CPU (dry runs): time.perf_counter.
    `repeats` is a minimum; more samples are taken, in rounds of `repeats`, up to `max_repeats` while the
    samples together stay under `target_total_ms`, and only until the median's 95 % half-width (relative)
    is below `rel_precision` (None: always the maximum).
    """
    sets = _as_sets(make_inputs, rotate)
    dev = torch.device(device) if device is not None else _device_of(sets)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    k = len(sets)

    def run(count: int, offset: int = 0) -> None:
        for i in range(count):
            fn(*sets[(offset + i) % k])

    for i in range(max(1, warmup)):
        fn(*sets[i % k])
    sync()
    # A rough per-call time decides the group size and the number of samples.
    t0 = time.perf_counter()
    run(k)
    enqueue_s = (time.perf_counter() - t0) / k     # host time per call: what the spin must outlast
    sync()
    rough_ms = (time.perf_counter() - t0) * 1e3 / k
    inner = 1 if rough_ms >= MIN_SAMPLE_MS else int(min(MAX_INNER, math.ceil(MIN_SAMPLE_MS / max(rough_ms, 1e-4))))
    n = int(min(max_repeats, max(repeats, target_total_ms // max(rough_ms * inner, 1e-3))))
    samples: list[float] = []
    method = "perf_counter"
    discarded = 0
    if cuda:
        # Short ops: a spin kernel ahead of each group keeps the stream busy while the host enqueues
        # the group, so the events bracket back-to-back kernels (device time), not host dispatch.
        queued = rough_ms < QUEUE_BELOW_MS
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        # The spin must outlast the host's enqueue of the group, or the events bracket host gaps.
        # Some calls (autograd backward, optimizers) cost more host time than the bound: each group's
        # enqueue time is measured, the spin grows to twice the slowest seen, and groups enqueued
        # slower than the spin ahead of them are discarded.
        # Sized by the enqueue time just measured (a spin much longer than the enqueue only costs wall time).
        spin_s = inner * min(SPIN_HOST_MARGIN * enqueue_s, HOST_US_PER_CALL_BOUND * 1e-6) + SPIN_FLOOR_S
        valid: list[bool] = []
        all_samples: list[float] = []
        for first in range(0, n, max(1, repeats)):
            batch = events[first:first + max(1, repeats)]
            for j, (start, end) in enumerate(batch, start=first):
                if queued:
                    _keep_gpu_busy(spin_s, dev)
                t0 = time.perf_counter()
                start.record()
                run(inner, j * inner)
                end.record()
                host_s = time.perf_counter() - t0
                valid.append(not queued or host_s < spin_s)
                if queued and 2 * host_s > spin_s:
                    spin_s = 2 * host_s
            sync()
            all_samples += [s.elapsed_time(e) / inner for s, e in batch]
            samples = [v for v, ok in zip(all_samples, valid) if ok] or all_samples
            if _median_known(samples, rel_precision):
                break
        discarded = valid.count(False)
        method = "events_queued" if queued else "events"
    else:
        for j in range(n):
            t0 = time.perf_counter()
            run(inner, j * inner)
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
            if (j + 1) % max(1, repeats) == 0 and _median_known(samples, rel_precision):
                break
    return TimingResult(statistics.median(samples), _percentile(samples, 0.1), _percentile(samples, 0.9),
                        len(samples), inner, k, method, discarded)


def _median_known(samples: list[float], rel_precision: float | None) -> bool:
    """Whether the median of `samples` is known to `rel_precision` (relative 95 % half-width): the
    median's standard error is sqrt(pi/2) sigma / sqrt(n), sigma estimated robustly as IQR / 1.349."""
    if rel_precision is None or len(samples) < MIN_STOP_SAMPLES:
        return False
    median = statistics.median(samples)
    sigma = (_percentile(samples, 0.75) - _percentile(samples, 0.25)) / 1.349
    return median > 0 and 1.96 * math.sqrt(math.pi / 2) * sigma / math.sqrt(len(samples)) <= rel_precision * median


def _device_of(sets: list) -> torch.device:
    for t in torch.utils._pytree.tree_leaves([list(s) for s in sets]):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _keep_gpu_busy(seconds: float, device: torch.device) -> None:
    """Enqueue `seconds` of GPU work so the stream never drains while the host enqueues more."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(seconds * _spin_cycles_per_s(torch.device(device).index or 0)))
        return
    # No _sleep in this build: a chain of large matmuls (~1 ms each on a datacenter GPU).
    a = torch.randn(4096, 4096, device=device)
    for _ in range(max(1, int(seconds / 1e-3))):
        a = a @ a
        a.mul_(1e-3)


@functools.lru_cache(maxsize=None)
def _spin_cycles_per_s(device_index: int) -> float:
    """Cycles of torch.cuda._sleep per second of spin: the max SM clock (2 GHz when torch does not report it),
    with 1.5x margin (a spin at a lower clock lasts longer, never shorter)."""
    props = torch.cuda.get_device_properties(device_index)
    rate_hz = props.clock_rate * 1e3 if hasattr(props, "clock_rate") else 2e9
    return rate_hz * 1.5


def host_dispatch_us(fn: Callable[..., Any], inputs: Sequence[Any], n: int = 200,
                     device: torch.device | str | None = None) -> float:
    """Host (CPU) time in microseconds to enqueue one `fn(*inputs)` while the GPU is kept busy,
    so the measurement is the Python + dispatcher + launch cost, never waiting on the GPU."""
    dev = torch.device(device) if device is not None else _device_of([tuple(inputs)])
    inputs = tuple(inputs)
    for _ in range(5):
        fn(*inputs)
    if dev.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*inputs)
        return (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    # Rough host cost first, to size the busy period generously (x4 + 50 ms).
    t0 = time.perf_counter()
    for _ in range(10):
        fn(*inputs)
    rough_s = (time.perf_counter() - t0) / 10
    torch.cuda.synchronize()
    _keep_gpu_busy(rough_s * n * 4 + 0.05, dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed * 1e6 / n


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def is_gpu_event(evt: Any) -> bool:
    """Whether a torch.profiler event ran on the GPU (kernel, memcpy, memset or annotation)."""
    kind = getattr(evt, "device_type", None)
    return kind is not None and getattr(kind, "name", str(kind)).upper() in ("CUDA", "PRIVATEUSE1", "HIP")


def is_device_work(evt: Any) -> bool:
    """Whether a torch.profiler event is GPU work (a kernel, memcpy or memset), not an annotation.

    record_function ranges appear on the GPU timeline too ("gpu_user_annotation"), spanning everything
    launched inside them, idle gaps included: with the optimizer's own "Optimizer.step#AdamW.step" counted,
    a batch-1 ResNet-18 bf16 training step read 3.33 ms busy on the H100, without it 1.81 ms
    (data/validation/H100-SXM-busy-recheck.jsonl)."""
    return is_gpu_event(evt) and not getattr(evt, "is_user_annotation", False)


def device_busy_ms(fn: Callable[..., Any], sets: Sequence[Sequence[Any]], *, calls: int = 5) -> float:
    """Device-busy time of one `fn(*inputs)` call in ms: the union of its GPU kernel, memcpy and memset
    intervals (torch.profiler), averaged over `calls` synchronised calls.

    CUDA events bracket a call's elapsed time, which for an op that launches its kernels from a host
    loop (cuDNN's RNNs: a few kernels per time step) includes the gaps while the GPU waits for the
    host. The busy time is what the device model prices; the gaps belong to the host timeline.
    """
    from torch.profiler import ProfilerActivity, profile
    sets = [tuple(s) for s in sets]
    fn(*sets[0])  # warm: the first call may pick algorithms
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if is_device_work(e)]
    return union_length(spans) / 1e3 / calls
