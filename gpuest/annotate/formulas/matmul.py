"""Cost formulas of matrix multiplications (mm, addmm, bmm, baddbmm, fp8 _scaled_mm): torch's FLOPs, the
GEMM shape read from the two multiplied operands."""
from __future__ import annotations

import torch

from ..registry import Cost, OpCall, iter_ops, register_cost, shape_of
from .gemm import torch_flops, with_gemm

aten = torch.ops.aten


@register_cost(aten.mm)
def _mm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return with_gemm(call, "matmul", torch_flops(call), (m, n, k))


@register_cost(aten.addmm)
def _addmm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("mat1")), shape_of(call.arg("mat2"))
    return with_gemm(call, "matmul", torch_flops(call), (m, n, k))


@register_cost(aten.bmm)
def _bmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return with_gemm(call, "matmul", torch_flops(call), (m, n, k), b)


@register_cost(aten.baddbmm)
def _baddbmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = shape_of(call.arg("batch1")), shape_of(call.arg("batch2"))
    return with_gemm(call, "matmul", torch_flops(call), (m, n, k), b)


@register_cost(*iter_ops(["_scaled_mm"]))
def _scaled_mm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return with_gemm(call, "matmul", torch_flops(call), (m, n, k))
