"""Helpers of the GEMM-shaped formulas (matmul, convolution, attention, recurrent layers): torch's own FLOP
count, so totals agree with `FlopCounterMode`, and a Cost carrying the implicit GEMM shape."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from ..registry import ROW_VECTOR_BYTES, Cost, OpCall, generic_cost


def torch_flops(call: OpCall, packet: Any = None) -> float:
    """FLOPs by torch's own formula for `packet` (defaults to the call's op)."""
    fn = flop_registry[packet or call.func.overloadpacket]
    return float(fn(*call.args, **call.kwargs, out_val=call.out))


def with_gemm(call: OpCall, category: str, flops: float, mnk: tuple[int, int, int], batch: int = 1,
              kernels: int = 1) -> Cost:
    """The generic traffic of `call` with `flops` and `batch` GEMMs of shape `mnk` (Cost.gemm_mnk)."""
    return replace(generic_cost(call, category=category, flops=flops, kernels=kernels),
                   gemm_mnk=tuple(int(v) for v in mnk), gemm_batch=int(batch))


def _row_strides(t: torch.Tensor) -> list[int]:
    """The strides, in elements, along which `t`'s rows and matrices lie as cuBLAS is handed them: the leading
    dimension (whichever of the last two strides is not 1; ATen first copies a matrix that has neither
    contiguous) and, batched, the batch stride. A dimension of one element has no stride that matters."""
    *batch, rows, cols = t.shape
    *batch_stride, s_row, s_col = t.stride()
    if s_col == 1 or cols == 1:
        lead = [s_row] if rows > 1 else []
    elif s_row == 1 or rows == 1:
        lead = [s_col] if cols > 1 else []
    else:
        lead = [cols]
    return lead + [s for n, s in zip(batch, batch_stride) if n > 1 and s != 0]


def _k_contiguous(t: Any, k_dim: int) -> bool:
    """Whether matrix `t` (its last two dimensions) is handed to cuBLAS with its dimension `k_dim` (0 or 1 of
    those two) contiguous: a vector either way; a matrix with neither dimension contiguous is first copied
    row-major by ATen."""
    sizes, strides = tuple(t.shape[-2:]), tuple(t.stride()[-2:])
    other = 1 - k_dim
    if sizes[0] == 1 or sizes[1] == 1 or strides[k_dim] == 1:
        return True
    return strides[other] != 1 and k_dim == 1


def mn_major_operands(a: Any, b: Any) -> int:
    """How many of a GEMM's operands, A (.. x M x K) and B (.. x K x N), are stored with K not contiguous
    (Cost.gemm_mn_major); operands that are not matrices count as K-major."""
    return sum(isinstance(t, torch.Tensor) and t.dim() >= 2 and not _k_contiguous(t, k_dim)
               for t, k_dim in ((a, 1), (b, 0)))


def row_alignment_bytes(*matrices: Any) -> int:
    """The largest power of two up to ROW_VECTOR_BYTES dividing every row and batch stride, in bytes, of the
    tensors among `matrices` (a GEMM's operands and output; Cost.gemm_row_bytes)."""
    align = ROW_VECTOR_BYTES
    for t in matrices:
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            for stride in _row_strides(t):
                align = math.gcd(align, stride * t.element_size())
    return align
