"""Cost formulas of copies, fills, scatters and data-dependent sizes, host reads of device values, and the
metadata-only ops (views, allocations) that launch no kernel."""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..registry import (
    Cost, OpCall, by_category, generic_cost, is_channels_last, is_dense, iter_ops, layout_order, mark_free,
    register_cost, strided_read_amplification, tensors, unique_bytes, with_atomic_adds,
)

# scatter_add and index_add accumulate by index with atomic adds (their 16-bit cost: formulas.pool).
register_cost(*iter_ops(["scatter_add", "index_add"]))(with_atomic_adds(by_category("copy")))
register_cost(*iter_ops([
    "_to_copy", "clone", "scatter",
    "scatter_reduce",
    "index_copy", "index_fill", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    "reflection_pad2d", "replication_pad2d", "reflection_pad1d",
    "zeros", "ones", "full", "arange", "repeat", "flip", "masked_scatter", "_unsafe_view_copy",
    "select_backward", "slice_backward", "index_select_backward", "unfold_backward", "narrow_copy",
    "tril_indices", "triu_indices", "_reshape_copy", "expand_copy", "permute_copy", "view_copy",
    "embedding_renorm_", "eye", "linspace", "scalar_tensor", "_unsafe_masked_index",
    "_unsafe_masked_index_put_accumulate", "lift_fresh_copy",
    "randperm", "searchsorted", "bucketize", "one_hot", "_pin_memory", "resize_",
]))(by_category("copy"))


# An in-place scatter writes only the elements its index names, into a target it does not read: HF's StaticCache
# writes one token per layer into a cache of thousands with index_copy_, which priced by all its tensors' bytes
# read and wrote the whole cache every decode step. It reads the index and the updates it writes.
def _indexed_write(call: OpCall, written: int, source: torch.Tensor | None = None) -> Cost:
    """A scatter of `written` elements into the op's target, reading its index and, per element, `source`."""
    read = unique_bytes([call.arg("index")]) + (written * source.element_size() if source is not None else 0)
    return Cost(0.0, float(read), float(written * call.first_arg.element_size()), "copy")


@register_cost(*iter_ops(["index_copy_", "put_"]))
def _copy_at_index(call: OpCall) -> Cost:
    source = call.arg("source")
    return _indexed_write(call, source.numel(), source)


@register_cost(*iter_ops(["scatter_"]))
def _scatter_into(call: OpCall) -> Cost:
    # one element per index entry, from src where the overload has one (else a scalar value)
    src = call.arg("src") if call.has_arg("src") else None
    return _indexed_write(call, call.arg("index").numel(), src)


@register_cost(*iter_ops(["index_fill_"]))
def _fill_at_index(call: OpCall) -> Cost:
    # each index entry fills a whole slice of the target along dim
    target = call.first_arg
    dim = int(call.arg("dim")) % max(target.dim(), 1)
    return _indexed_write(call, call.arg("index").numel() * (target.numel() // max(int(target.shape[dim]), 1)))


@register_cost(*iter_ops(["copy_"]))
def _copy_into(call: OpCall) -> Cost:
    # copy_ overwrites its destination without reading what it held: only the source is read.
    return replace(generic_cost(call, category="copy"), bytes_read=unique_bytes([call.arg("src")]))


# CUDA's constant_pad_nd (aten/src/ATen/native/PadNd.cpp) fills the whole output with the value, then copies the
# input into the output's interior, a narrowed view: two kernels, the interior written twice (and through
# TensorIterator's strided, non-vectorised copy, data/kernels/H200-in-model-ops.jsonl.gz). Priced as one copy, it
# took 1.8-1.9x its price in NFNet-F0, ResNetV2-BiT and MaxViT (non-test per-op rows,
# data/validation/H200-nontest-perop.run3.jsonl.gz and H200-perop.jsonl). Without a positive pad it is a copy.
@register_cost(*iter_ops(["constant_pad_nd"]))
def _constant_pad(call: OpCall) -> Cost:
    cost = generic_cost(call, category="copy")
    if not any(int(p) > 0 for p in call.arg("pad")):
        return cost
    return replace(cost, bytes_written=cost.bytes_written + unique_bytes(tensors(call.first_arg)), kernels=2)


# A fill writes its output and reads nothing: the tensor a `*_like` or `new_*` op takes gives it a shape and a
# dtype only, and fill_/zero_ overwrite theirs (fill's value, when a tensor, is one element). Priced as a copy,
# they had read their tensor too, well over DeBERTa-v3's attention-gradient `new_zeros` in the non-test per-op
# rows of data/validation/H100-SXM-architectures.jsonl.gz.
FILL_OPS = ("fill", "fill_", "zero_", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full")


@register_cost(*iter_ops(FILL_OPS))
def _fill(call: OpCall) -> Cost:
    return Cost(0.0, 0.0, unique_bytes(call.outputs), "copy")


# CUDA's cat (cat_out_cuda, aten/src/ATen/native/cuda/Shape.cu) takes one of three paths. Inputs all
# contiguous in the output's memory format, one dtype, at most CAT_MAX_DIMS dims: batched kernels of up to
# CAT_BATCH_INPUTS inputs with vectorised loads. Other strides, contiguous format: batched kernels of half
# as many inputs that read every element through its strides, one per lane (a strided loop). Otherwise
# (more dims, as a stack of 4-d tensors has; channels-last with strided inputs; mixed dtypes): one
# TensorIterator copy per input into its narrow of the output, strided where either side has gaps. The
# strided batched kernel is its own variant: its fixed grid of one element per lane is not a copy's loop.
CAT_MAX_DIMS = 4
CAT_BATCH_INPUTS = 128


@register_cost(*iter_ops(["cat", "stack"]))
def _concatenate(call: OpCall) -> Cost:
    cost = generic_cost(call, category="copy")
    ins = [t for t in tensors(call.first_arg) if t.numel() > 0]
    outs = call.outputs
    if not ins or not outs:
        return cost
    out = outs[0]
    fmt = torch.channels_last if all(is_channels_last(t) for t in ins) else torch.contiguous_format
    contiguous = [t.is_contiguous(memory_format=fmt) for t in ins]
    one_dtype = len({t.dtype for t in ins}) == 1
    strided = [t for t, c in zip(ins, contiguous) if not c]
    dim = call.arg("dim") % out.dim()
    order = layout_order(out) or ()
    # The output's memory order in the inputs' dimensions (a stack's output has a new dimension `dim`).
    in_order = tuple(d - (d > dim) for d in order if d != dim) if out.dim() > ins[0].dim() else order
    batched = len(ins) > 1 and out.dim() <= CAT_MAX_DIMS and one_dtype
    if batched and all(contiguous):
        return replace(cost, kernels=math.ceil(len(ins) / CAT_BATCH_INPUTS))
    if batched and fmt == torch.contiguous_format:
        return replace(cost, kernels=math.ceil(len(ins) / (CAT_BATCH_INPUTS // 2)), permuted=True,
                       read_amplification=strided_read_amplification(strided, in_order), variant="strided")
    # A narrow of the output along `dim` is dense only where `dim` is its outermost dimension in memory.
    narrow_dense = is_dense(out) and (not order or order[0] == dim)
    if not strided and narrow_dense:
        return replace(cost, kernels=len(ins))
    return replace(cost, kernels=len(ins), permuted=True,
                   read_amplification=strided_read_amplification(strided, in_order))


@register_cost(*iter_ops(["roll"]))
def _roll(call: OpCall) -> Cost:
    # CUDA's roll shifts one dimension per kernel: a roll over k dimensions (Swin's shifted windows roll
    # two) recurses dimension by dimension inside the op, k passes over the tensor. Its kernel maps every
    # element's index on its own, one element per lane (the suite's rolls run at the same element rate in
    # bf16 as in fp32), like TensorIterator's strided loop: priced as a permuted copy.
    dims = call.arg("dims")
    passes = max(len(dims), 1) if isinstance(dims, (list, tuple)) else 1
    cost = generic_cost(call, category="copy")
    return replace(cost, bytes_read=cost.bytes_read * passes, bytes_written=cost.bytes_written * passes,
                   kernels=passes, permuted=True)


@register_cost(*iter_ops(["nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"]))
def _data_dependent_size(call: OpCall) -> Cost:
    # The output's size depends on the data: the op counts on the GPU and copies the count to the host,
    # which waits for it before it can allocate the output and launch the rest.
    return replace(generic_cost(call, category="copy", kernels=2), host_syncs=1)


@register_cost(*iter_ops(["_local_scalar_dense", "item", "is_nonzero", "equal"]))
def _host_read(call: OpCall) -> Cost:
    # Reading a GPU value on the host waits for everything queued before it; a CPU tensor's (the
    # optimizer's step count) is read at once.
    on_device = any(t.device.type != "cpu" for t in call.inputs)
    return Cost(0.0, unique_bytes(call.inputs), 0.0, "copy", kernels=0, host_only=True, host_syncs=int(on_device))


mark_free(*iter_ops([
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "detach_",
    "lift_fresh", "alias", "_unsafe_view", "_reshape_alias", "set_", "resolve_conj", "resolve_neg",
    "_conj", "_neg_view", "conj", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "_assert_tensor_metadata", "_functional_assert_async", "record_stream", "_nested_tensor_size",
    "as_strided", "unsqueeze_", "squeeze_", "t_", "transpose_", "as_strided_",
]))
# Splits that alias their input without view tracking (GRU/LSTM cells on the CPU use them): no kernel.
mark_free(*iter_ops(["unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk"]))


# The accumulating pipeline's launches (an async index check, the radix sort, the sorted positions, the
# indexing kernel): 10 up to 1024 indices, 13 from 4096 on, where the sort takes more passes
# (data/kernels/H100-SXM-index-put.txt, `python3 benchmarks/index_put_facts.py`). 1024 < n < 4096 was not measured.
ACCUMULATE_KERNELS = (10, 13)
ACCUMULATE_SINGLE_TILE_INDICES = 1024


@register_cost(*iter_ops(["index_put", "index_put_", "_index_put_impl_"]))
def _index_put(call: OpCall) -> Cost:
    # With accumulate=True, CUDA sorts the indices and one warp walks each run of equal ones, adding its
    # values into the row in turn (Indexing.cu): a pipeline of its own (the `accumulate` variant), where a
    # plain index_put is one scatter kernel. The runs' lengths depend on the data; priced at the balanced
    # share, indices / rows indexed, which the longest run can never be shorter than.
    cost = generic_cost(call, category="copy")
    if not call.arg("accumulate"):
        return cost
    target, index_list = call.first_arg, list(call.arg("indices"))
    indices = [t for t in index_list if t is not None]
    n_idx = math.prod(torch.broadcast_shapes(*(t.shape for t in indices))) if indices else 0
    cost = replace(cost, variant="accumulate", kernels=ACCUMULATE_KERNELS[n_idx > ACCUMULATE_SINGLE_TILE_INDICES])
    if not indices or any(t.dtype == torch.bool for t in indices):
        return cost  # a mask selects each position at most once
    positions = math.prod(target.shape[d] for d, t in enumerate(index_list) if t is not None)
    return replace(cost, dependent_updates=float(max(math.ceil(n_idx / max(positions, 1)) - 1, 0)))
