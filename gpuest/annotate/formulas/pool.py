"""Cost formulas of pooling, interpolation and sampling: the window each output reads, the atomic adds of
their gradients, and NCHW interpolation's walk over the planes."""
from __future__ import annotations

import math
from dataclasses import replace

from ..registry import (
    Cost, OpCall, by_category, generic_cost, is_channels_last, iter_ops, register_cost, shape_of, with_atomic_adds,
)


def _pool(backward: bool):
    def formula(call: OpCall) -> Cost:
        kernel = call.arg("kernel_size")
        window = math.prod(kernel) if isinstance(kernel, (list, tuple)) and kernel else 1
        big = max((t.numel() for t in call.inputs), default=0)
        cost = generic_cost(call, category="pool", flops=float(window * sum(t.numel() for t in call.outputs)
                                                                if not backward else big * window))
        return replace(cost, window=int(window))
    return formula


register_cost(*iter_ops(["max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
                         "max_pool1d", "avg_pool1d", "max_pool2d"]))(_pool(False))
register_cost(*iter_ops(["max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
                         "avg_pool2d_backward", "avg_pool3d_backward"]))(_pool(True))
register_cost(*iter_ops([
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
]))(by_category("pool", flops_per_input=1.0))
_RESAMPLE = by_category("pool", flops_per_output=4.0)
INTERPOLATE_BLOCK_THREADS = 1024   # UpSample*.cu launch min(maxThreadsPerBlock, 1024) threads a block
register_cost(*iter_ops([
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact2d",
    "upsample_nearest2d_backward", "_upsample_bilinear2d_aa", "grid_sampler_2d", "col2im",
]))(_RESAMPLE)


@register_cost(*iter_ops(["im2col"]))
def _im2col(call: OpCall) -> Cost:
    # ATen's CUDA im2col (Im2Col.cu) loops over the batch on the host, one kernel per sample; col2im has a
    # batched kernel. A probe's im2col of small inputs took about 4.9 us per sample (kernel_facts `fold probe`).
    cost = _RESAMPLE(call)
    shape = shape_of(call.first_arg)
    return replace(cost, kernels=max(1, shape[0]) if len(shape) == 4 else 1)


# Interpolation and sampling gradients scatter each output gradient into the inputs it was read from;
# index_add and scatter_add scatter by index (2x bilinear upsampling backward took 2.1x as long in bf16
# as in fp32 on the H100, 2.2x on the H200; python3 benchmarks/kernel_facts.py).
register_cost(*iter_ops(["upsample_bilinear2d_backward", "upsample_bicubic2d_backward", "upsample_linear1d_backward",
                         "upsample_trilinear3d_backward", "grid_sampler_2d_backward"]))(with_atomic_adds(_RESAMPLE))


@register_cost(*iter_ops(["upsample_bilinear2d", "upsample_bicubic2d", "upsample_linear1d", "upsample_trilinear3d"]))
def _interpolate(call: OpCall) -> Cost:
    # PyTorch's CUDA kernels for interpolating contiguous (NCHW) data give each thread one output
    # position and loop over every (sample, channel) plane in turn (Cost.plane_walks); channels-last
    # data takes a kernel parallel over all outputs.
    cost = _RESAMPLE(call)
    x = call.first_arg
    shape = shape_of(x)
    if len(shape) < 3 or is_channels_last(x) or not call.outputs:
        return cost
    positions = math.prod(shape_of(call.outputs[0])[2:])
    return replace(cost, plane_walks=float(shape[0] * shape[1]),
                   walk_blocks=math.ceil(positions / INTERPOLATE_BLOCK_THREADS))
