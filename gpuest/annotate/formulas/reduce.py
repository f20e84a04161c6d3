"""Cost formulas of softmax and reductions (sums, norms, arg-extrema, losses, sorts), each with the rows its
kernel reduces; ATen's generic reduction kernel is told apart (Cost.reduce_kernel)."""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..registry import REGISTRY, Cost, OpCall, by_category, iter_ops, reduced_rows, register_cost, shape_of, tensors
from .embedding import RADIX_BITS


def _dim_rows(call: OpCall) -> tuple[int, int]:
    """Softmax-like ops normalise along their `dim` of their first input."""
    x = tensors(call.first_arg)
    shape = shape_of(x[0]) if x else ()
    if not shape:
        return 1, 1
    length = shape[int(call.arg("dim")) % len(shape)]
    return math.prod(shape) // max(length, 1), length


# PyTorch's softmax kernels copy a non-contiguous input (and, backward, the incoming gradient) to a
# contiguous one first (as layer norm does, formulas.norm).
REGISTRY.stage_contiguous(*iter_ops(["_softmax", "_log_softmax"]), args=("self",))
REGISTRY.stage_contiguous(*iter_ops(["_softmax_backward_data", "_log_softmax_backward_data"]),
                          args=("grad_output", "output"))
register_cost(*iter_ops(["_softmax", "_log_softmax", "_safe_softmax"]))(
    by_category("reduction", flops_per_input=5.0, rows=_dim_rows))
register_cost(*iter_ops(["_softmax_backward_data", "_log_softmax_backward_data"]))(
    by_category("reduction", flops_per_input=3.0, rows=_dim_rows))
_REDUCED_ROWS = by_category("reduction", flops_per_input=1.0, rows=reduced_rows)


def _reduce_kernel(call: OpCall) -> Cost:
    return replace(_REDUCED_ROWS(call), reduce_kernel=True)


register_cost(*iter_ops([
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "all", "any", "norm",
    "linalg_vector_norm", "var", "std", "var_mean", "std_mean", "nansum", "aminmax",
]))(_reduce_kernel)
register_cost(*iter_ops([
    "logsumexp", "cumsum", "cumprod", "count_nonzero", "nll_loss_forward", "nll_loss2d_forward",
    "nll_loss_backward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "smooth_l1_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss", "kl_div",
    "_cdist_forward", "dist", "trace", "median", "kthvalue", "mode",
]))(_REDUCED_ROWS)


# CUDA's sort (aten/src/ATen/native/cuda/Sort.cpp) sorts rows of at most SORT_IN_PLACE_MAX elements with one
# block per row, in place, after copying the values and filling the indices (SORT_IN_PLACE_LAUNCHES in all).
# Longer rows go to cub's onesweep radix sort: one pass per RADIX_BITS of the key, each pass a kernel and a
# memset that read and write every key and its int64 index, plus SORT_RADIX_LAUNCHES (histogram, exclusive
# sum, index fill, copies), and SORT_SEGMENTED_LAUNCHES more for several rows, which sort as one array keyed by
# row. Launch counts: data/kernels/H200-sort-topk.jsonl.gz (`python3 benchmarks/kernel_facts.py`: `sort and
# top-k`); priced as one pass over the data, a 1x8192 int64 sort's 22 launches took 66 us, not 3.
SORT_IN_PLACE_MAX = 4096
SORT_IN_PLACE_LAUNCHES = 5
SORT_RADIX_LAUNCHES = 6
SORT_SEGMENTED_LAUNCHES = 7
# CUDA's top-k (TensorTopK.cu) finds each row's k-th value by a radix select: rows at least as long as
# TOPK_MULTIBLOCK_MIN_LENGTH for their row count take the multi-block kernels, TOPK_MULTIBLOCK_PASS_LAUNCHES
# per RADIX_BITS of the key plus TOPK_MULTIBLOCK_LAUNCHES (scans, counts, the gather); shorter rows one block
# each, which re-reads its row once per TOPK_BLOCK_RADIX_BITS of the key and twice more to gather. Either
# sorts the k results when k > 1 (one more launch). Same probe and facts.
TOPK_MULTIBLOCK_MIN_LENGTH = ((20, 20000), (40, 10000), (80, 8000), (199, 5000), (799, 3000), (4000, 800))
TOPK_MULTIBLOCK_LONG_ROWS_MIN_LENGTH = 400   # beyond 4000 rows
TOPK_MULTIBLOCK_PASS_LAUNCHES = 3
TOPK_MULTIBLOCK_LAUNCHES = 9
TOPK_BLOCK_RADIX_BITS = 2
INDEX_BYTES = 8


def _radix_passes(x: torch.Tensor, bits_per_pass: int) -> int:
    return max(1, math.ceil(8 * x.element_size() / bits_per_pass))


@register_cost(*iter_ops(["sort"]))
def _sort(call: OpCall) -> Cost:
    x = tensors(call.first_arg)[0]
    rows, length = _dim_rows(call)
    n, key = x.numel(), x.element_size()
    if length <= SORT_IN_PLACE_MAX:
        kernels = SORT_IN_PLACE_LAUNCHES
        read, written = n * (2 * key + INDEX_BYTES), n * (2 * key + 2 * INDEX_BYTES)
    else:
        passes = _radix_passes(x, RADIX_BITS)
        kernels = 2 * passes + SORT_RADIX_LAUNCHES + (SORT_SEGMENTED_LAUNCHES if rows > 1 else 0)
        read = n * key + passes * n * (key + INDEX_BYTES)
        written = n * INDEX_BYTES + passes * n * (key + INDEX_BYTES)
    return replace(_REDUCED_ROWS(call), bytes_read=float(read), bytes_written=float(written), kernels=kernels,
                   row_count=rows, row_len=length)


def topk_multiblock(rows: int, length: int) -> bool:
    """Whether CUDA's top-k takes its multi-block radix select for `rows` rows of `length` elements."""
    if rows > TOPK_MULTIBLOCK_MIN_LENGTH[-1][0]:
        return length >= TOPK_MULTIBLOCK_LONG_ROWS_MIN_LENGTH
    return length >= next(min_len for max_rows, min_len in TOPK_MULTIBLOCK_MIN_LENGTH if rows <= max_rows)


@register_cost(*iter_ops(["topk"]))
def _topk(call: OpCall) -> Cost:
    x = tensors(call.first_arg)[0]
    rows, length = _dim_rows(call)
    k = int(call.arg("k"))
    n, key = x.numel(), x.element_size()
    sorts_results = int(k > 1 and bool(call.arg("sorted")))
    if topk_multiblock(rows, length):
        passes = _radix_passes(x, RADIX_BITS)
        kernels = TOPK_MULTIBLOCK_PASS_LAUNCHES * passes + TOPK_MULTIBLOCK_LAUNCHES
    else:
        passes = _radix_passes(x, TOPK_BLOCK_RADIX_BITS) + 2
        kernels = 1
    out = rows * k * (key + INDEX_BYTES)
    return replace(_REDUCED_ROWS(call), bytes_read=float(passes * n * key + sorts_results * out),
                   bytes_written=float(out * (1 + sorts_results)), kernels=kernels + sorts_results,
                   row_count=rows, row_len=length)
