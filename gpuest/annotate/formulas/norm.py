"""Cost formulas of normalisation layers: batch norm (training statistics or the eval-mode affine pass),
layer and RMS norm, group norm, each with the rows its kernel reduces."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..registry import (
    NHWC_VARIANT, REGISTRY, Cost, OpCall, by_category, expanded_run, is_channels_last, iter_ops, register_cost,
    schema_arg, shape_of, tensors,
)

BATCH_NORM_OPS = ("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm",
                  "_native_batch_norm_legit_no_training", "_batch_norm_no_update")
# Batch-norm ops whose name, not a `training` argument, says whether they compute batch statistics.
BATCH_NORM_FIXED_MODE = {"_native_batch_norm_legit_no_training": False, "_batch_norm_no_update": False}


def batch_norm_training(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a batch-norm call computes batch statistics (its `training` argument)."""
    fixed = BATCH_NORM_FIXED_MODE.get(func.overloadpacket.__name__)
    if fixed is not None:
        return fixed
    return bool(schema_arg(func, args, kwargs, "training"))


def _channel_rows(call: OpCall) -> tuple[int, int, int]:
    """Batch norm reduces each channel (dim 1) over batch and space; on channels-first data a channel is
    N runs of one plane each (channels-last data reads across channels, every run the whole row)."""
    x = tensors(call.first_arg)
    shape = shape_of(x[0]) if x else ()
    channels = shape[1] if len(shape) > 1 else 1
    plane = math.prod(shape[2:])
    segmented = len(shape) > 2 and shape[0] > 1 and not is_channels_last(x[0])
    return channels, math.prod(shape) // max(channels, 1), plane if segmented else 0


def _trailing_rows(call: OpCall) -> tuple[int, int]:
    """Layer/RMS norm reduce the trailing `normalized_shape` of each row."""
    x = tensors(call.first_arg)
    total = x[0].numel() if x else 0
    normalized = call.arg("normalized_shape")
    length = math.prod(normalized) if isinstance(normalized, (list, tuple)) else 1
    return total // max(length, 1), length


def _group_rows(call: OpCall) -> tuple[int, int]:
    """Group norm reduces each (sample, group): N * group rows of C / group * HxW elements."""
    n, c, hw, groups = (int(call.arg(name)) for name in ("N", "C", "HxW", "group"))
    return n * groups, c // max(groups, 1) * hw


def _per_channel(formula: Any) -> Any:
    """`formula` with the memory format of the input (the activation, also in a backward, whose incoming
    gradient is made to match it) recorded: batch norm's kernels index by channel, and on NHWC data
    PyTorch and cuDNN run other kernels (channels-last reductions) than on NCHW data."""
    def priced(call: OpCall) -> Cost:
        x = tensors(call.arg("input"))
        return _nhwc(formula(call), bool(x) and is_channels_last(x[0]))
    return priced


def _nhwc(cost: Cost, channels_last: bool) -> Cost:
    """`cost` of a batch norm kernel with its memory format recorded, channels-last as NHWC_VARIANT."""
    return replace(cost, channels_last=channels_last, variant=NHWC_VARIANT if channels_last else cost.variant)


_norm_statistics = _per_channel(by_category("norm", flops_per_input=5.0, rows=_channel_rows))
_affine = by_category("elementwise", flops_per_input=2.0)


@register_cost(*iter_ops(BATCH_NORM_OPS))
def _batch_norm(call: OpCall) -> Cost:
    # With running statistics (eval) batch norm is one per-channel affine pass, a different kernel
    # from the reduce-then-normalise one training runs.
    if batch_norm_training(call.func, call.args, call.kwargs):
        return _norm_statistics(call)
    # The per-channel scale and shift are expanded along dimension 1, not by the right-aligned rule.
    cost, x = _affine(call), tensors(call.first_arg)
    if not cost.broadcast or not x or x[0].dim() < 2:
        return cost
    if is_channels_last(x[0]):
        # Each pixel reads the channels' scale and shift in turn: rows of C elements, whose count sets the
        # 16-bit rate (C = 18 streams at 0.8 TB/s, C = 256 at 2.1 on the H100: kernel_facts nhwc_eval_batch_norms).
        channels = int(x[0].shape[1])
        return replace(_nhwc(cost, True), broadcast_run=1, row_count=x[0].numel() // channels, row_len=channels)
    per_channel = tuple(x[0].shape[1] if d == 1 else 1 for d in range(x[0].dim()))
    run = expanded_run(per_channel, x[0])
    # On NCHW data CUDA's kernel (batch_norm_transform_input_kernel) walks each channel plane by plane
    # (Cost.row_segment); channels-last data (a run of 1) takes TensorIterator's flat loop.
    return replace(cost, broadcast_run=run, row_segment=run if run > 1 else 0)


def _weight_gradient_columns(formula: Any) -> Any:
    """`formula` of a layer/RMS norm backward, with Cost.sums_columns where its output mask asks for the
    weight (or bias) gradient: a sum of the incoming gradient over every row, per column."""
    def priced(call: OpCall) -> Cost:
        mask = call.arg("output_mask")
        return replace(formula(call), sums_columns=bool(mask) and any(bool(m) for m in list(mask)[1:]))
    return priced


def _keep(formula: Any) -> Any:
    """`formula` as it is."""
    return formula


for _names, _flops_in, _rows, _wrap in [
    (["native_layer_norm", "_fused_rms_norm"], 5.0, _trailing_rows, _keep),
    (["native_layer_norm_backward", "_fused_rms_norm_backward"], 8.0, _trailing_rows, _weight_gradient_columns),
    (["_batch_norm_with_update"], 5.0, _channel_rows, _per_channel),
    (["native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward"], 8.0, _channel_rows,
     _per_channel),
    (["native_group_norm"], 5.0, _group_rows, _keep),
    (["native_group_norm_backward"], 8.0, _group_rows, _keep),
    (["instance_norm"], 5.0, None, _keep),  # composite: traces as batch norm; registered in case a backend keeps it
]:
    register_cost(*iter_ops(_names))(_wrap(by_category("norm", flops_per_input=_flops_in, rows=_rows)))


# PyTorch's layer norm kernels copy a non-contiguous input (and, backward, the incoming gradient) to a
# contiguous one first: after nn.MultiheadAttention with batch_first, whose output is a
# transposed view, every layer norm of a ViT block pays a copy of its activation (the profiler shows it
# inside native_layer_norm).
REGISTRY.stage_contiguous(*iter_ops(["native_layer_norm"]), args=("input", "weight", "bias"))
REGISTRY.stage_contiguous(*iter_ops(["native_layer_norm_backward"]), args=("grad_out", "input", "weight", "bias"))
# aten::group_norm hands CUDA's kernel input.contiguous() but keeps a CPU input's memory format, so a CPU
# trace of a channels-last group norm never sees the copy to NCHW that CUDA runs (the profiler shows
# aten::contiguous inside every aten::group_norm of PoolFormer channels-last in
# data/validation/H200-nontest-perop.jsonl.gz).
REGISTRY.stage_contiguous(*iter_ops(["native_group_norm"]), args=("input",))
