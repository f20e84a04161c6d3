"""Cost formulas of embeddings and gathers: a lookup reads the rows it selects, and the embedding gradient
takes CUDA's direct or sorting path by its index count."""
from __future__ import annotations

import math

import torch

from ..registry import Cost, OpCall, by_category, iter_ops, register_cost, shape_of, tensors, unique_bytes

register_cost(*iter_ops(["_embedding_bag", "embedding_bag", "_embedding_bag_forward_only"]))(by_category("embedding"))


def expected_distinct(draws: float, population: float) -> float:
    """Distinct items among `draws` drawn uniformly with replacement from `population`: the rows of a
    table that `draws` lookups touch (8192 tokens of a 50257-word vocabulary touch ~7600 rows, 8192 of a
    512-word one all 512)."""
    if draws <= 0 or population <= 0:
        return 0.0
    if population <= 1:
        return 1.0
    return float(-population * math.expm1(draws * math.log1p(-1.0 / population)))


def _gather(category: str, table_lookup: bool = False):
    """A gather reads the rows it selects, not its whole source (an embedding lookup of 8 tokens touches
    8 rows of a 250k-row table), plus its indices. A table lookup (indices into dim 0 of its first
    argument) reads a row selected twice from cache the second time."""
    def formula(call: OpCall) -> Cost:
        source = tensors(call.first_arg)
        keys = {id(t) for t in source}
        indices = [t for t in call.inputs if id(t) not in keys]
        written = unique_bytes(call.outputs)
        rows = sum(t.numel() for t in indices)
        n_out = sum(t.numel() for t in call.outputs)
        distinct = 1.0
        if table_lookup and rows and source and shape_of(source[0]):
            distinct = expected_distinct(rows, shape_of(source[0])[0]) / rows
        read = min(unique_bytes(source), written * distinct) + unique_bytes(indices)
        # Rows: one per index, as long as the output per index (a row of the table for a lookup); the
        # row length decides how well each gathered row coalesces.
        return Cost(0.0, read, written, category, row_count=rows if n_out else 0, row_len=n_out // max(rows, 1),
                    table_lookup=table_lookup)
    return formula


register_cost(*iter_ops(["embedding"]))(_gather("embedding", table_lookup=True))
register_cost(*iter_ops(["index_select", "gather", "index", "_unsafe_index"]))(_gather("copy"))


# PyTorch's CUDA embedding backward (aten/src/ATen/native/cuda/Embedding.cu) zeroes the whole weight
# gradient, then takes one of two paths. Up to EMBEDDING_BWD_DIRECT_MAX indices (and without
# scale_grad_by_freq) one kernel accumulates every gradient row into its weight row directly: a block per
# 32 columns walks all indices in chunks of EMBEDDING_BWD_CHUNK (a warp per index), each chunk loading its
# gradient rows, then loading and storing the weight rows it adds them to, before the next
# (EMBEDDING_BWD_CHUNK_TRIPS serial round trips to memory; the ceil(width / 32) blocks of 1024 threads
# fit in one wave up to a width of 64 per SM, 8448 on an H100). Beyond, it sorts the indices, finds the
# segments of equal indices, sums each segment's rows into an fp32 buffer of partial sums and scatters
# those into the weight gradient: some ten kernels, and twice a segment count is copied to the host,
# which waits for it before it can size the next launches. Embedding bags always take the sorting path.
EMBEDDING_BWD_DIRECT_MAX = 3072
EMBEDDING_BWD_SORT_KERNELS = 10
EMBEDDING_BWD_SORT_SYNCS = 2
RADIX_BITS = 8                   # index bits a radix-sort pass consumes
EMBEDDING_BWD_ROWS_PER_PARTIAL = 10   # NROWS_PER_THREAD in EmbeddingBackwardKernel.cu
EMBEDDING_BWD_CHUNK = 32              # BLOCKDIMY in Embedding.cu
EMBEDDING_BWD_CHUNK_TRIPS = 3        # gradient load, weight load, weight store


@register_cost(*iter_ops(["embedding_dense_backward", "_embedding_bag_backward", "_embedding_bag_dense_backward"]))
def _embedding_backward(call: OpCall) -> Cost:
    grad, indices = call.first_arg, call.arg("indices")
    out = call.outputs[0]
    vocab, width = shape_of(out)[0], shape_of(out)[-1]
    n_idx = indices.numel()
    size = out.element_size()
    # Rows of the weight gradient the indices touch.
    touched = expected_distinct(n_idx, vocab) * width
    zero_fill = float(out.numel() * size)
    grad_bytes = float(grad.numel() * grad.element_size())
    index_bytes = float(n_idx * indices.element_size())
    dense = call.func.overloadpacket is torch.ops.aten.embedding_dense_backward
    scale_by_freq = dense and bool(call.arg("scale_grad_by_freq"))
    if dense and n_idx <= EMBEDDING_BWD_DIRECT_MAX and not scale_by_freq:
        read = grad_bytes + index_bytes + touched * size
        written = zero_fill + touched * size
        kernels, syncs = 2, 0
        serial = math.ceil(n_idx / EMBEDDING_BWD_CHUNK) * EMBEDDING_BWD_CHUNK_TRIPS
    else:
        passes = max(1, math.ceil(math.log2(max(vocab, 2)) / RADIX_BITS))
        sort_bytes = passes * n_idx * 2.0 * 2 * indices.element_size()   # keys and positions, read + written
        # fp32 sums of partial segments: each run of equal indices is cut into pieces of at most
        # EMBEDDING_BWD_ROWS_PER_PARTIAL rows, one thread per piece and column.
        partial_sums = (touched + n_idx / EMBEDDING_BWD_ROWS_PER_PARTIAL * width) * 4.0
        read = grad_bytes + index_bytes + partial_sums + sort_bytes / 2
        written = zero_fill + partial_sums + touched * size + sort_bytes / 2
        kernels, syncs = 1 + EMBEDDING_BWD_SORT_KERNELS + passes, EMBEDDING_BWD_SORT_SYNCS
        serial = 0
    # One row per index, as wide as the embedding (an embedding bag's gradient has a row per bag).
    return Cost(float(grad.numel()), read, written, "embedding", row_count=n_idx, row_len=shape_of(grad)[-1],
                kernels=kernels, host_syncs=syncs, serial_steps=float(serial))
