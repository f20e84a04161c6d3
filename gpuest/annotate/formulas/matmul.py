"""Cost formulas of matrix multiplications (mm, addmm, bmm, baddbmm, fp8 _scaled_mm): torch's FLOPs, the
GEMM shape read from the two multiplied operands."""
from __future__ import annotations

from dataclasses import replace

import torch

from ..registry import (REGISTRY, TINY_INNER_VARIANT, Cost, OpCall, iter_ops, register_cost, shape_of, tensor_bytes,
                        tensors)
from .gemm import mn_major_operands, row_alignment_bytes, torch_flops, with_gemm

aten = torch.ops.aten

# A GEMM whose N or K is below TINY_INNER fills no tensor-core tile, and its kernels run far from the roofline
# the wider shapes' fit describes, unlike each other: in bf16 on the H100 a 1048576 x 4 x 4 mm takes 107 us (0.16
# TB/s), a linear layer of that shape 240 us, a 4 x 4 x 1048576 mm 38 us (0.44 TB/s), while a 262144 x 512 x 8
# one writes its output at 2.6 TB/s (the suite's shapes/matmul.json `tiny_*`; python3 benchmarks/kernel_facts.py).
# Their Cost.variant (TINY_INNER_VARIANT, an isolated one) gives them fits of their own, so they neither borrow
# nor bend the wide ones'.
TINY_INNER = 32


def _gemm(call: OpCall, a: str, b: str, mnk: tuple[int, int, int], batch: int = 1) -> Cost:
    """A matmul-category Cost of `batch` GEMMs of shape `mnk` multiplying arguments `a` and `b`, with the row
    alignment of its operands and output, and how many operands are stored with K not contiguous."""
    return replace(with_gemm(call, "matmul", torch_flops(call), mnk, batch),
                   gemm_row_bytes=row_alignment_bytes(call.arg(a), call.arg(b), *tensors(call.out)),
                   gemm_mn_major=mn_major_operands(call.arg(a), call.arg(b)))


def _matmul(call: OpCall, a: str, b: str, mnk: tuple[int, int, int], batch: int = 1) -> Cost:
    """_gemm with its kernel variant."""
    cost = _gemm(call, a, b, mnk, batch)
    return replace(cost, variant=TINY_INNER_VARIANT) if min(mnk[1], mnk[2]) < TINY_INNER else cost


@register_cost(aten.mm)
def _mm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return _matmul(call, "self", "mat2", (m, n, k))


@register_cost(aten.addmm)
def _addmm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("mat1")), shape_of(call.arg("mat2"))
    bias = len(shape_of(call.arg("self"))) == 1 and call.arg("beta") != 0
    return replace(_matmul(call, "mat1", "mat2", (m, n, k)), gemm_bias=bias)


@register_cost(aten.bmm)
def _bmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return _matmul(call, "self", "mat2", (m, n, k), b)


@register_cost(aten.baddbmm)
def _baddbmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = shape_of(call.arg("batch1")), shape_of(call.arg("batch2"))
    cost = _matmul(call, "batch1", "batch2", (m, n, k), b)
    if call.arg("beta") == 0:
        return cost
    # The GEMM reads back the output its staged copy filled (beta != 0) before it overwrites it.
    return replace(cost, bytes_read=cost.bytes_read + tensor_bytes(tensors(call.out)[0]))


# baddbmm first copies its added input, expanded (often broadcast: an ALiBi bias), into the output by a copy
# kernel of its own, priced as that copy (BLOOM-560M's 128x1x1024 bias into 128x1024x1024: 272 of the 484 us,
# data/validation/H200-nontest-perop.run4.jsonl.gz).
REGISTRY.stage_into_output(aten.baddbmm, arg="self", unless_zero="beta")


@register_cost(*iter_ops(["_scaled_mm"]))
def _scaled_mm(call: OpCall) -> Cost:
    (m, k), (_, n) = shape_of(call.arg("self")), shape_of(call.arg("mat2"))
    return _gemm(call, "self", "mat2", (m, n, k))
