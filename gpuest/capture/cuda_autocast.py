"""CUDA autocast's precision policy, applied to a trace that runs under CPU autocast.

Tracing runs on the CPU, so `torch.autocast` applies the CPU op lists; CUDA's differ. Under CUDA
autocast `pow`, `exp`, `log`, `layer_norm`, `group_norm`, `softplus` and the losses run in fp32 (their
16-bit inputs are cast up), and `softmax`, `log_softmax`, `sum`, `prod`, `cumsum`, `cumprod` and `norm`
compute and return fp32 unless a dtype is given; CPU autocast leaves most of them in 16 bits. A GPT-2
block's GELU (`0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3))))`) therefore runs in fp32 on the
GPU, at twice the traffic a CPU trace would record. Its promote ops (cat, stack, addcmul, ...) run in their
inputs' widest floating dtype, as CUDA's do, also for a cuDNN RNN's fp16 output under bf16 autocast, which CPU
autocast refuses. The lists are those of torch's
`aten/src/ATen/autocast_mode.cpp` (CUDA), at the Python API level where a trace can intercept them.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from ..annotate.registry import tensors

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _functions(*names: str) -> set[Callable[..., Any]]:
    """The torch, Tensor and functional callables of these names that this torch version has."""
    found: set[Callable[..., Any]] = set()
    for name in names:
        for owner in (torch, torch.Tensor, F, torch.special, torch.linalg):
            fn = getattr(owner, name, None)
            if callable(fn):
                found.add(fn)
    return found


# Run in fp32: every 16-bit floating input is cast to fp32 first.
FP32_OPS = _functions(
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
    "cross_entropy", "dist", "pdist", "cdist", "renorm", "logsumexp",
)
# Compute and return fp32 when no dtype is given (CUDA autocast's fp32_set_opt_dtype list).
FP32_OUTPUT_OPS = _functions("softmax", "log_softmax", "sum", "prod", "cumsum", "cumprod", "norm",
                             "vector_norm", "matrix_norm")

# Run in the widest floating dtype of their inputs (CUDA autocast's promote list): where that is a 16-bit dtype
# other than CPU autocast's (a cuDNN LSTM's fp16 output under bf16 autocast), CPU autocast refuses the call.
PROMOTE_OPS = _functions("cat", "concat", "concatenate", "stack", "hstack", "vstack", "index_copy", "addcdiv",
                         "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sample", "index_put",
                         "tensordot", "scatter_add")


def _widest(dtypes: set[torch.dtype]) -> torch.dtype:
    """The floating dtype type promotion gives these (fp16 with bf16: fp32), in Python: torch.promote_types would
    dispatch under the trace's modes and be recorded as an op."""
    wide = max(dtypes, key=lambda d: d.itemsize)
    return wide if len(dtypes) == 1 or wide.itemsize >= 4 else torch.float32


def _up(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in LOW_PRECISION else x


def _has_low_precision_input(args: tuple, kwargs: dict) -> bool:
    return any(t.dtype in LOW_PRECISION for t in tensors((args, kwargs)))


def call_with_cuda_policy(func: Callable[..., Any], args: tuple, kwargs: dict, device_type: str) -> tuple[bool, Any]:
    """(handled, result): run `func` as CUDA autocast would when `device_type` autocast is on and CUDA's
    policy differs for it; (False, None) when the caller should run it unchanged."""
    if not torch.is_autocast_enabled(device_type):
        return False, None
    if func in FP32_OPS and _has_low_precision_input(args, kwargs):
        args, kwargs = tree_map(_up, (args, kwargs))
        with torch.autocast(device_type, enabled=False):
            return True, func(*args, **kwargs)
    if func in FP32_OUTPUT_OPS and kwargs.get("dtype") is None and _has_low_precision_input(args, kwargs) \
            and not any(isinstance(a, torch.dtype) for a in args):
        with torch.autocast(device_type, enabled=False):
            return True, func(*args, **{**kwargs, "dtype": torch.float32})
    if func in PROMOTE_OPS and _has_low_precision_input(args, kwargs):
        widest = _widest({x.dtype for x in tensors((args, kwargs)) if x.is_floating_point()})
        args, kwargs = tree_map(lambda x: x.to(widest) if isinstance(x, torch.Tensor) and x.is_floating_point()
                                else x, (args, kwargs))
        with torch.autocast(device_type, enabled=False):
            return True, func(*args, **kwargs)
    return False, None
