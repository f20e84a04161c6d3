"""Cost formulas of softmax and reductions (sums, norms, arg-extrema, losses, sorts), each with the rows its
kernel reduces; ATen's generic reduction kernel is told apart (Cost.reduce_kernel)."""
from __future__ import annotations

import math
from dataclasses import replace

from ..registry import REGISTRY, Cost, OpCall, by_category, iter_ops, reduced_rows, register_cost, shape_of, tensors


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
    "logsumexp", "cumsum", "cumprod", "count_nonzero", "topk", "sort", "nll_loss_forward", "nll_loss2d_forward",
    "nll_loss_backward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "smooth_l1_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss", "kl_div",
    "_cdist_forward", "dist", "trace", "median", "kthvalue", "mode",
]))(_REDUCED_ROWS)
