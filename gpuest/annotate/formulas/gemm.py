"""Helpers of the GEMM-shaped formulas (matmul, convolution, attention, recurrent layers): torch's own FLOP
count, so totals agree with `FlopCounterMode`, and a Cost carrying the implicit GEMM shape."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch.utils.flop_counter import flop_registry

from ..registry import Cost, OpCall, generic_cost


def torch_flops(call: OpCall, packet: Any = None) -> float:
    """FLOPs by torch's own formula for `packet` (defaults to the call's op)."""
    fn = flop_registry[packet or call.func.overloadpacket]
    return float(fn(*call.args, **call.kwargs, out_val=call.out))


def with_gemm(call: OpCall, category: str, flops: float, mnk: tuple[int, int, int], batch: int = 1,
              kernels: int = 1) -> Cost:
    """The generic traffic of `call` with `flops` and `batch` GEMMs of shape `mnk` (Cost.gemm_mnk)."""
    return replace(generic_cost(call, category=category, flops=flops, kernels=kernels),
                   gemm_mnk=tuple(int(v) for v in mnk), gemm_batch=int(batch))
