"""Cost formulas of convolutions, forward and backward: torch's FLOPs (less its overcount of grouped weight
gradients), the implicit-GEMM shape, the window, layout and kernel variant cuDNN's choice depends on."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch.utils.flop_counter import conv_flop_count

from ..registry import (DILATED_VARIANT, GROUPED_POINTWISE_VARIANT, REGISTRY, Cost, OpCall, is_channels_last,
                        iter_ops, register_cost, shape_of, tensor_bytes, tensors)
from .gemm import torch_flops, with_gemm

aten = torch.ops.aten


def _conv_gemm(x: tuple, w: tuple, y: tuple, groups: int, transposed: bool) -> tuple[tuple, int]:
    """Implicit-GEMM shape of a forward convolution producing `y` from `x`: M = N * output spatial,
    N = output channels per group, K = input channels per group * kernel area. A transposed convolution's
    weight is (Cin, Cout/groups, kernel...), a normal one's (Cout, Cin/groups, kernel...)."""
    n = x[0] if x else 1
    kernel = math.prod(w[2:]) if len(w) > 2 else 1
    g = max(groups, 1)
    out_g, in_g = (w[1], w[0] // g) if transposed else (w[0] // g, w[1])
    spatial_out = math.prod(y[2:]) if len(y) > 2 else 1
    return (n * spatial_out, out_g, in_g * kernel), groups


@register_cost(aten.convolution, aten._convolution, *iter_ops(["cudnn_convolution", "convolution_overrideable"]))
def _convolution(call: OpCall) -> Cost:
    # cudnn_convolution has no `transposed` (cudnn_convolution_transpose is an op of its own).
    x, w = call.first_arg, call.arg("weight")
    transposed = bool(call.arg("transposed")) if call.has_arg("transposed") else False
    groups = int(call.arg("groups"))
    y = shape_of(tensors(call.out)[0])
    mnk, g = _conv_gemm(shape_of(x), shape_of(w), y, groups, transposed)
    variant, cudnn_depthwise = _kernel_variant(call, x, w, groups, transposed)
    return replace(with_gemm(call, "conv", torch_flops(call), mnk, g), window=math.prod(shape_of(w)[2:]),
                   channels_last=is_channels_last(x), gemm_plane=_gemm_plane(shape_of(x), shape_of(w), y, groups),
                   variant=variant,
                   relayout_bytes=_relayout_bytes(x, tensors(call.out)[0], w, groups, cudnn_depthwise))


def _kernel_variant(call: OpCall, x: Any, w: Any, groups: int, transposed: bool,
                    weight_only: bool = False) -> tuple[str, bool]:
    """(Cost.variant, whether cuDNN runs it as an fp16 depthwise layer) of a convolution or its backward:
    its shape's variant, "weight_grad" for a backward of the weight gradient alone, DILATED_VARIANT,
    GROUPED_POINTWISE_VARIANT and CUDNN_DEPTHWISE_VARIANT, "+"-joined."""
    cudnn_depthwise = _cudnn_takes_depthwise(call, x, w, groups)
    parts = (_conv_variant(shape_of(w), transposed), "weight_grad" if weight_only else "", _dilated(call),
             _grouped_pointwise(shape_of(x), shape_of(w), groups),
             CUDNN_DEPTHWISE_VARIANT if cudnn_depthwise else "")
    return "+".join(p for p in parts if p), cudnn_depthwise


def _conv_variant(w: tuple, transposed: bool) -> str:
    """Cost.variant of a convolution with weight `w`: "transposed" (cuDNN runs it with data-gradient
    kernels), "1d"/"3d" by its spatial dimensions, "" for a plain 2-D one."""
    if transposed:
        return "transposed"
    dims = len(w) - 2
    return "" if dims == 2 else f"{dims}d"


def _dilated(call: OpCall) -> str:
    """DILATED_VARIANT for a convolution with a dilation above 1, else ""."""
    dilation = call.arg("dilation") if call.has_arg("dilation") else None
    return DILATED_VARIANT if dilation is not None and any(int(d) > 1 for d in dilation) else ""


def _grouped_pointwise(x: tuple, w: tuple, groups: int) -> str:
    """GROUPED_POINTWISE_VARIANT for a 1x1 convolution of more than one group and more than one input channel
    per group (not depthwise), else "". Grouped 3x3 layers stay with the dense fits: cuDNN's kernels for them
    ran within a few times their forward, as dense ones do (kernel_facts `grouped conv`)."""
    pointwise = len(w) > 2 and math.prod(w[2:]) == 1
    return GROUPED_POINTWISE_VARIANT if pointwise and groups > 1 and len(x) > 1 and x[1] > groups else ""


def _gemm_plane(x: tuple, w: tuple, y: tuple, groups: int) -> int:
    """Cost.gemm_plane of a convolution from `x` to `y` with weight `w`: H * W when it is a 1x1, ungrouped
    one that keeps the input's spatial size (a GEMM over the activation as stored), else 0."""
    plain = groups <= 1 and len(x) > 2 and math.prod(w[2:]) == 1 and tuple(x[2:]) == tuple(y[2:])
    return math.prod(x[2:]) if plain else 0


@register_cost(aten.convolution_backward)
def _convolution_backward(call: OpCall) -> Cost:
    grad_out, x, w = call.arg("grad_output"), call.arg("input"), call.arg("weight")
    transposed, groups = bool(call.arg("transposed")), int(call.arg("groups"))
    mask = call.arg("output_mask")
    mnk, g = _conv_gemm(shape_of(x), shape_of(w), shape_of(grad_out), groups, transposed)
    window = math.prod(shape_of(w)[2:])
    # Data gradient: M = N*spatial_in, N = Cin/g, K = Cout/g*kernel. Use it as the representative GEMM.
    m_in = (shape_of(x)[0] * math.prod(shape_of(x)[2:])) if len(shape_of(x)) > 2 else mnk[0]
    dgrad = (m_in, mnk[2] // max(window, 1), mnk[1] * window)
    kernels = max(1, sum(bool(v) for v in mask))
    flops = torch_flops(call)
    if groups > 1 and mask[1]:
        flops -= _weight_grad_overcount(grad_out, x, w, groups, transposed)
    # The weight gradient alone (a stem over the image, which needs no gradient) is one GEMM whose output
    # is the weight (Cout/g x Cin/g*kernel) and whose K runs over the batch's output positions: a few tiles
    # over a deep K, run by cuDNN's weight-gradient kernels (variant "weight_grad"), not the forward's GEMM.
    weight_only = bool(mask[1]) and not mask[0]
    gemm = dgrad if mask[0] else (mnk[1], mnk[2], mnk[0]) if weight_only else mnk
    variant, cudnn_depthwise = _kernel_variant(call, x, w, groups, transposed, weight_only)
    cost = replace(with_gemm(call, "conv", flops, gemm, g, kernels),
                   window=window, channels_last=is_channels_last(x),
                   gemm_plane=_gemm_plane(shape_of(x), shape_of(w), shape_of(grad_out), groups),
                   variant=variant,
                   relayout_bytes=_relayout_bytes(x, grad_out, w, groups, cudnn_depthwise))
    if mask[1] and not transposed and _runs_native_depthwise(w, groups, x, cudnn_depthwise):
        # PyTorch's own depthwise weight gradient gives each weight a block that reduces over the batch
        # and the output positions: a row-wise reduction (Cost.row_count / row_len), not a GEMM.
        cost = replace(cost, row_count=math.prod(shape_of(w)),
                       row_len=shape_of(grad_out)[0] * math.prod(shape_of(grad_out)[2:]))
    return cost


def _relayout_bytes(x: Any, y: Any, w: Any, groups: int, cudnn_depthwise: bool) -> float:
    """Cost.relayout_bytes of a convolution between activations `x` and `y` with weight `w`: both their
    bytes, 0 where PyTorch's own depthwise kernels run it (no cuDNN workspace). A backward that computes
    both gradients makes two cuDNN calls, one after the other, each holding one such workspace."""
    if _runs_native_depthwise(w, groups, x, cudnn_depthwise):
        return 0.0
    return float(tensor_bytes(x) + tensor_bytes(y))


def _nchw_depthwise(w: Any, groups: int, x: Any) -> bool:
    """2-D, one input channel per group, on NCHW data `x` (cuDNN takes channels-last depthwise convolutions)."""
    ws = shape_of(w)
    return groups > 1 and len(ws) == 4 and ws[1] == 1 and not is_channels_last(x)


def _runs_native_depthwise(w: Any, groups: int, x: Any, cudnn_depthwise: bool) -> bool:
    """Whether PyTorch runs a convolution with weight `w` in its own depthwise kernels rather than cuDNN:
    an NCHW depthwise one (`_nchw_depthwise`) that is not an fp16 one cuDNN takes (`_cudnn_takes_depthwise`)."""
    return _nchw_depthwise(w, groups, x) and not cudnn_depthwise


# PyTorch hands a 2-D depthwise convolution of NCHW data to cuDNN instead of its own kernels only in fp16
# (never bf16 or fp32), with at least 32 channels, sides of at least 7, a square 1/3/5 filter, an equal stride
# of 1 or 2 and no dilation, and then only where a per-architecture workload check says cuDNN is faster
# (aten/src/ATen/native/Convolution.cpp, use_cudnn_depthwise). On the H100 and H200 the stride-1 layers the
# suite has run 1.6-3.8x faster in fp16 than in bf16, the stride-2 ones (96 channels at 112 px) and the 7x7
# ones at the same speed (`python3 benchmarks/kernel_facts.py`, fp16_depthwise): stride 1 is taken as cuDNN's.
CUDNN_DEPTHWISE_VARIANT = "cudnn_depthwise"
CUDNN_DEPTHWISE_FILTERS = (1, 3, 5)
CUDNN_DEPTHWISE_STRIDES = (1,)
CUDNN_DEPTHWISE_MIN_CHANNELS = 32
CUDNN_DEPTHWISE_MIN_SIDE = 7


def _cudnn_takes_depthwise(call: OpCall, x: Any, w: Any, groups: int) -> bool:
    """Whether cuDNN, not PyTorch's own kernels, runs this depthwise convolution of NCHW fp16 data."""
    if not _nchw_depthwise(w, groups, x) or _dilated(call):
        return False
    if getattr(x, "dtype", None) != torch.float16 or getattr(w, "dtype", None) != torch.float16:
        return False
    xs, ws = shape_of(x), shape_of(w)
    stride = tuple(call.arg("stride")) if call.has_arg("stride") else (1, 1)
    transposed = bool(call.arg("transposed")) if call.has_arg("transposed") else False
    return (not transposed and ws[2] == ws[3] and ws[2] in CUDNN_DEPTHWISE_FILTERS
            and len(set(stride)) == 1 and stride[0] in CUDNN_DEPTHWISE_STRIDES
            and xs[1] >= CUDNN_DEPTHWISE_MIN_CHANNELS and min(xs[2:]) >= CUDNN_DEPTHWISE_MIN_SIDE)


def _weight_grad_overcount(grad_out: Any, x: Any, w: Any, groups: int, transposed: bool) -> float:
    """What torch's count of a grouped convolution's weight gradient holds too much: torch prices that
    gradient as a convolution over all input channels, not the Cin/groups each group sees, so a depthwise
    convolution's weight gradient would count `groups` times the work it does."""
    t = lambda shape: [shape[1], shape[0], *shape[2:]]  # noqa: E731 (channels <-> batch, as torch does)
    first, second = (grad_out, x) if transposed else (x, grad_out)
    weight_grad = conv_flop_count(t(shape_of(first)), t(shape_of(second)), t(shape_of(w)), transposed=False)
    return weight_grad * (1.0 - 1.0 / groups)


# Every convolution backend takes its input and weight (backward: also the output gradient) in one dense
# memory format: ShuffleNet convolves one half of a channel split, a strided view, and copies it first
# (forward and backward; the profiler shows the copy inside aten::convolution).
REGISTRY.stage_contiguous(aten.convolution, aten._convolution, args=("input", "weight"), channels_last_ok=True)
REGISTRY.stage_contiguous(aten.convolution_backward, args=("grad_output", "input", "weight"), channels_last_ok=True)
