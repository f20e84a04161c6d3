"""Cost formulas of mixture-of-experts layers: grouped GEMMs and the routing ops dense models lack.

A grouped GEMM (`aten._grouped_mm`, fp8 `_scaled_grouped_mm`) multiplies each expert's rows by that
expert's weights; `offs` holds the cumulative rows per group. Where the trace knows the offsets
(capture.routing gives them values from the routing assumption) the groups' sizes are priced as routed,
else as equal. On CUDA (torch 2.9-2.11) bf16 operands run one CUTLASS grouped kernel on sm90+;
fp32 and fp16 take `_grouped_mm_fallback`, which copies the offsets to the host (one sync) and runs one
`mm` per non-empty group. The router's softmax, top-k and sort, the token gathers (`index`) and the combine
(`sum`) are priced by the generic formulas; `histc`, `bincount`, `floor_divide` and in-place scatters are
added here.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..registry import (
    Cost, OpCall, by_category, generic_cost, iter_ops, register_cost, tensor_bytes, tensors, with_atomic_adds,
)

# Operand dtypes CUDA's grouped kernel runs in one launch; others loop over torch.mm per group.
GROUPED_KERNEL_DTYPES = (torch.bfloat16,) + tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def group_sizes(call: OpCall, offs: torch.Tensor | None, extent: int, groups: int) -> np.ndarray:
    """Elements of the grouped dimension (of size `extent`) each group takes: from the offsets' values
    where the trace knows them, else `extent` split equally over `groups`."""
    known = call.known_value(offs)
    if known is not None and known.size == groups:
        ends = np.minimum(known.astype(np.int64), extent)
        return np.diff(np.concatenate([[0], ends])).clip(min=0)
    base, extra = divmod(extent, max(groups, 1))
    return np.array([base + (1 if g < extra else 0) for g in range(groups)], dtype=np.int64)


# The groups' sizes are the routed rows (or, in a weight gradient, the contraction) of each expert: no operand
# is laid out along them, so they set no vector width (torch requires the hidden and expert widths 16-byte
# aligned). Where the groups differ, their mean size, which stands for them in the GEMM shape, is rounded to
# this many elements so that an uneven routing (4096, 3916, 180 rows) is not read as a misaligned GEMM.
GROUP_SIZE_ROUNDING = 16


def _representative(dim: np.ndarray) -> int:
    """The mean of a GEMM dimension over the non-empty groups; rounded to GROUP_SIZE_ROUNDING where it differs
    between groups (only the groups' own size can)."""
    if not len(dim):
        return 0
    mean = float(dim.mean())
    if len(set(dim.tolist())) > 1:
        return max(GROUP_SIZE_ROUNDING, int(round(mean / GROUP_SIZE_ROUNDING)) * GROUP_SIZE_ROUNDING)
    return int(round(mean))


def grouped_mm_cost(call: OpCall) -> Cost:
    """FLOPs 2 * sum over groups of M_g * N * K, with the GEMM shape of the mean non-empty group, the
    rows of the largest (Cost.gemm_m_max) and the weights of the groups that have rows."""
    a, b = call.arg("self"), call.arg("mat2")
    offs = call.arg("offs")
    out = call.outputs[0]
    if a.dim() == 2 and b.dim() == 3:      # groups of rows (experts' tokens) x per-group weights
        sizes = group_sizes(call, offs, int(a.shape[0]), int(b.shape[0]))
        m, n, k = sizes, int(b.shape[-1]), int(a.shape[1])
        used_a = float(sizes.sum()) * k * a.element_size()
        used_b = float((sizes > 0).sum()) * tensor_bytes(b) / max(int(b.shape[0]), 1)
        used_out = float(sizes.sum()) * n * out.element_size()
        flops = 2.0 * float(sizes.sum()) * n * k
        shape_m, shape_k = sizes, np.full(len(sizes), k)
    elif a.dim() == 2 and b.dim() == 2:    # groups along K: a weight gradient, one (M, N) block per group
        sizes = group_sizes(call, offs, int(a.shape[1]), int(out.shape[0]))
        m, n = int(a.shape[0]), int(b.shape[1])
        used_a = float(sizes.sum()) * m * a.element_size()
        used_b = float(sizes.sum()) * n * b.element_size()
        used_out = tensor_bytes(out)
        flops = 2.0 * m * n * float(sizes.sum())
        shape_m, shape_k = np.full(len(sizes), m), sizes
    elif a.dim() == 3 and b.dim() == 2:    # per-group left operands x groups of columns
        sizes = group_sizes(call, offs, int(b.shape[1]), int(a.shape[0]))
        m, k = int(a.shape[1]), int(a.shape[2])
        used_a, used_b, used_out = tensor_bytes(a), float(sizes.sum()) * k * b.element_size(), tensor_bytes(out)
        flops = 2.0 * m * k * float(sizes.sum())
        n = int(sizes[sizes > 0].mean()) if (sizes > 0).any() else 0
        shape_m, shape_k = np.full(len(sizes), m), np.full(len(sizes), k)
    else:                                  # 3-D x 3-D: a batched GEMM
        g, m0, k = (int(v) for v in a.shape)
        n = int(b.shape[-1])
        sizes = np.full(g, m0)
        used_a, used_b, used_out = tensor_bytes(a), tensor_bytes(b), tensor_bytes(out)
        flops = 2.0 * g * m0 * n * k
        shape_m, shape_k = sizes, np.full(g, k)
    active = sizes > 0
    groups = int(active.sum())
    mean_m = _representative(shape_m[active])
    mean_k = _representative(shape_k[active])
    offs_bytes = tensor_bytes(offs) if isinstance(offs, torch.Tensor) else 0.0
    one_launch = a.dtype in GROUPED_KERNEL_DTYPES
    return Cost(flops, used_a + used_b + offs_bytes, used_out, "matmul",
                gemm_mnk=(mean_m, int(n), mean_k), gemm_batch=max(groups, 1),
                gemm_m_max=int(shape_m[active].max()) if groups else 0,
                kernels=1 if one_launch else max(groups, 1), host_syncs=0 if one_launch else int(offs is not None),
                variant="grouped" if one_launch else "grouped_fallback")


register_cost(*iter_ops(["_grouped_mm", "_scaled_grouped_mm"]))(grouped_mm_cost)


def _counting(call: OpCall) -> Cost:
    """histc / bincount: every input element adds one to a bin, with atomic adds."""
    n = sum(t.numel() for t in tensors(call.first_arg))
    return replace(generic_cost(call, category="reduction", flops=float(n), kernels=2), atomic_adds=True)


register_cost(*iter_ops(["histc", "bincount"]))(_counting)
# In-place scatters with accumulation (the per-expert combine of the eager loop): atomic adds by index.
register_cost(*iter_ops(["index_add_", "scatter_add_", "index_reduce", "index_reduce_"]))(
    with_atomic_adds(by_category("copy")))
register_cost(*iter_ops(["floor_divide", "floor_divide_", "remainder", "fmod"]))(
    by_category("elementwise", flops_per_output=1.0))
