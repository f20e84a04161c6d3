"""What every family of the calibration suite builds with: the `Benchmark`, `Built` and `TraceSpec`
records, the dtype table, the planning estimate of one call's time (`_est`), the element counts the
streaming families share (`_numels`, from shapes/base.json), the name hash the grid orders and samples by
(`_stable_hash`), and the helpers builders make their inputs and forward/backward pairs with (sizes capped
on CPU dry runs, seeded draws). What a build must return and must not do: the package docstring
(gpuest.calibrate.suite).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .shape_tables import shape_column

# Rough H100-class peaks, only used to estimate each benchmark's cost for --budget-s planning.
_EST_PEAK_TFLOPS = {"fp32": 50.0, "tf32": 350.0, "bf16": 700.0, "fp16": 700.0, "none": 50.0}
_EST_BW_BYTES_S = 2.5e12
_EST_LAUNCH_MS = 0.006

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TraceSpec:
    """How the runner traces a benchmark: `trace(module, inputs, mode=..., optimizer=..., loss_fn=...)`.

    phases: keep only nodes of these phases (e.g. ("optimizer",)).
    skip: a second spec whose nodes are dropped from the front of this one's (the forward of an
    autograd backward benchmark, so only the backward ops remain).
    """

    module: torch.nn.Module
    inputs: tuple
    mode: str = "inference"
    optimizer: str | None = None
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    phases: tuple[str, ...] | None = None
    skip: "TraceSpec | None" = None


@dataclass
class Built:
    """What a build returns. fn(*make_set(i)) runs the op once on input set i."""

    fn: Callable[..., Any]
    make_set: Callable[[int], tuple]
    trace: TraceSpec | None = None
    bytes_per_set: int | None = None  # override when inputs are not plain tensors (optimizers)
    max_sets: int = 8


@dataclass
class Benchmark:
    """One calibration point. kind: "device" (GPU time), "latency" (tiny op), "host_dispatch" (CPU enqueue cost)."""

    name: str
    category: str
    params: dict[str, Any]
    build: Callable[[torch.device, int], Built]
    holdout: bool = False
    kind: str = "device"
    est_ms: float = 0.01  # estimated GPU time of one call on an H100, ms (planning only)
    priority: int = 0  # lower runs first; budget trimming keeps the lowest
    matmul_tf32: bool = False  # torch.set_float32_matmul_precision("high") when True, "highest" otherwise
    cudnn_tf32: bool = True  # torch.backends.cudnn.allow_tf32 (torch's default: True)
    trace_cost_s: float = 0.01  # CPU seconds to trace it (optimizers with many tensors, GRUs take longer)
    # The op launches its kernels from a host loop (cuDNN RNNs: a few per time step; a foreach optimizer
    # step groups its tensors in Python, ~10 us each, so 1000 small tensors take the host longer than the
    # GPU), so its elapsed time includes GPU idle gaps: the runner also records its device-busy time.
    host_paced: bool = False


# ---------------------------------------------------------------- helpers

def _tiny(device: torch.device) -> bool:
    """CPU dry runs use capped sizes; CUDA (measuring) and meta (re-tracing offline) use the real ones."""
    return device.type not in ("cuda", "meta")


def _d(x: int, device: torch.device, cap: int = 16) -> int:
    """A dimension: `x` on the GPU, at most `cap` on CPU dry runs."""
    return x if not _tiny(device) else max(1, min(x, cap))


def _nchw(device: torch.device, n: int, c: int, hw: int) -> tuple[int, int, int, int]:
    """An (N, C, H, W) activation shape: as given on the GPU, capped at (2, 4, 8, 8) on CPU dry runs."""
    return _d(n, device, 2), _d(c, device, 4), _d(hw, device, 8), _d(hw, device, 8)


def _gen(device: torch.device, seed: int, i: int) -> torch.Generator | None:
    if device.type == "meta":
        return None  # meta tensors hold no values to draw
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1000 + i)
    return g


def _randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, seed: int, i: int) -> torch.Tensor:
    return torch.randn(tuple(shape), dtype=dtype, device=device, generator=_gen(device, seed, i))


def _est(flops: float, nbytes: float, mode: str = "fp32") -> float:
    """Estimated ms of one call on an H100 (planning only)."""
    return _EST_LAUNCH_MS + 1e3 * max(flops / (_EST_PEAK_TFLOPS.get(mode, 50.0) * 1e12), nbytes / _EST_BW_BYTES_S)


class _FnModule(torch.nn.Module):
    """Wraps a benchmark's fn so `trace` sees the same call on fake tensors."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class _BackwardModule(torch.nn.Module):
    """Runs fwd(*leaves) with grad enabled and, when `backward`, autograd.grad with the given dout."""

    def __init__(self, fwd: Callable[..., torch.Tensor], n_grad: int, backward: bool) -> None:
        super().__init__()
        self.fwd, self.n_grad, self.backward = fwd, n_grad, backward

    def forward(self, *args: torch.Tensor) -> Any:
        *leaves, dout = args
        with torch.enable_grad():
            grads = [t.requires_grad_() for t in leaves[:self.n_grad]]
            out = self.fwd(*leaves)
            if not self.backward:
                return out
            return torch.autograd.grad(out, grads, dout)


def _backward_built(fwd: Callable[..., torch.Tensor], make_leaves: Callable[[int], tuple], n_grad: int) -> Built:
    """A benchmark of the backward of `fwd` only: the forward runs once per input set at build time
    (graph retained), the timed fn runs autograd.grad(out, leaves[:n_grad], dout, retain_graph=True)."""
    def make_set(i: int) -> tuple:
        leaves = make_leaves(i)
        with torch.enable_grad():
            grads = [t.requires_grad_() for t in leaves[:n_grad]]
            out = fwd(*leaves)
        dout = torch.randn_like(out)
        return (out, dout, *grads)

    def fn(out: torch.Tensor, dout: torch.Tensor, *grads: torch.Tensor) -> Any:
        return torch.autograd.grad(out, grads, dout, retain_graph=True)

    leaves0 = make_leaves(0)
    with torch.no_grad():
        out_meta = fwd(*[t.to("meta") for t in leaves0])
    trace_inputs = (*[t.to("meta") for t in leaves0], torch.empty_like(out_meta, device="meta"))
    spec = TraceSpec(_BackwardModule(fwd, n_grad, True), trace_inputs,
                     skip=TraceSpec(_BackwardModule(fwd, n_grad, False), trace_inputs))
    return Built(fn, make_set, spec)


def _fwd_bwd(out: list[Benchmark], prefix: str, tag: str, category: str, op: str, params: dict[str, Any],
             fwd: Callable[..., torch.Tensor], leaves: Callable[..., tuple], n_grad: int,
             fwd_est_ms: float, bwd_est_ms: float) -> None:
    """Append the forward benchmark of `fwd` and the benchmark of its backward alone."""
    out.append(Benchmark(f"{prefix}_fwd_{tag}", category, {"op": op, **params},
                         lambda device, seed: Built(fwd, lambda i: leaves(device, seed, i)), est_ms=fwd_est_ms))
    out.append(Benchmark(f"{prefix}_bwd_{tag}", category, {"op": op + "_backward", **params},
                         lambda device, seed: _backward_built(fwd, lambda i: leaves(device, seed, i), n_grad),
                         est_ms=bwd_est_ms))


def _simple(fn: Callable[..., Any], shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]) \
        -> Callable[[torch.device, int], Built]:
    def build(device: torch.device, seed: int) -> Built:
        def make_set(i: int) -> tuple:
            return tuple(_randn(s, dt, device, seed, i * 16 + j) for j, (s, dt) in enumerate(zip(shapes, dtypes)))
        return Built(fn, make_set)
    return build


def _channels_last(build: Callable[[torch.device, int], Built], args: tuple[int, ...]) -> Callable[..., Built]:
    """`build` with the 4-d inputs at positions `args` stored channels-last (NHWC), as a model that
    permutes its activations hands them to the op."""
    def wrapped(device: torch.device, seed: int) -> Built:
        built = build(device, seed)
        def make_set(i: int) -> tuple:
            return tuple(t.contiguous(memory_format=torch.channels_last) if j in args else t
                         for j, t in enumerate(built.make_set(i)))
        return Built(built.fn, make_set)
    return wrapped


def _numels() -> list[int]:
    """Element counts of the flat streaming benchmarks (elementwise ops, casts)."""
    return shape_column("base", "numels")


def _stable_hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:12], 16)
