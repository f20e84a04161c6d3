"""fp16 twins: a name-hashed share of the bf16 benchmarks of some categories, rebuilt with float16
wherever they make bfloat16."""
from __future__ import annotations

from typing import Any, Callable

import torch

from .base import Benchmark, Built, TraceSpec, _stable_hash


class _Float16ForBfloat16(torch.overrides.TorchFunctionMode):
    """Every torch call made under it gets float16 wherever it asked for bfloat16 (factories, `.to`)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        swap = lambda v: torch.float16 if v is torch.bfloat16 else v  # noqa: E731
        return func(*map(swap, args), **{k: swap(v) for k, v in (kwargs or {}).items()})


class _InFloat16(torch.nn.Module):
    """Runs a traced module with bfloat16 requests turned into float16, as its fp16 twin was built."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        with _Float16ForBfloat16():
            return self.inner(*args)


def _in_float16(spec: TraceSpec | None) -> TraceSpec | None:
    if spec is None:
        return None
    return TraceSpec(_InFloat16(spec.module), spec.inputs, spec.mode, spec.optimizer, spec.loss_fn, spec.phases,
                     _in_float16(spec.skip))


def _fp16_twin(b: Benchmark) -> Benchmark:
    """`b` (a bf16 benchmark) with float16 wherever it makes bfloat16: fp16 autocast and fp16 weights run
    their own kernels (other tile shapes, no bf16 rounding), and the suite measures both 16-bit types."""
    def build(device: torch.device, seed: int) -> Built:
        with _Float16ForBfloat16():
            built = b.build(device, seed)

        def make_set(i: int) -> tuple:
            with _Float16ForBfloat16():
                return built.make_set(i)
        return Built(built.fn, make_set, _in_float16(built.trace), built.bytes_per_set, built.max_sets)
    params = {k: v.replace("bf16", "fp16") if isinstance(v, str) else v for k, v in b.params.items()}
    return Benchmark(b.name.replace("bf16", "fp16"), b.category, params, build, kind=b.kind, est_ms=b.est_ms,
                     matmul_tf32=b.matmul_tf32, cudnn_tf32=b.cudnn_tf32, trace_cost_s=b.trace_cost_s,
                     host_paced=b.host_paced)


FP16_TWIN_CATEGORIES = ("conv", "norm", "elementwise", "reduction", "pool", "embedding")
FP16_TWIN_SHARE = 5             # one bf16 benchmark in this many (by name hash) gets an fp16 twin


def _fp16_twins(grid: list[Benchmark]) -> list[Benchmark]:
    """fp16 twins of an even, name-hashed share of the bf16 benchmarks of the categories whose bf16 rows
    have no fp16 counterpart (matmul and attention measure fp16 shapes of their own)."""
    return [_fp16_twin(b) for b in grid
            if b.category in FP16_TWIN_CATEGORIES and b.kind == "device" and "bf16" in b.name
            and "fp32" not in b.name and _stable_hash("fp16:" + b.name) % FP16_TWIN_SHARE == 0]
