"""Name each traced call by the kernel the CUDA path runs (the map: gpuest.annotate.cuda_kernels), choosing
among CUDA kernels where the arguments decide (SDPA's backend, batch norm's training flag and backend)."""
from __future__ import annotations

from typing import Any

import torch

from ..annotate.formulas.norm import batch_norm_training
from ..annotate.cuda_kernels import (
    BATCH_NORM_CPU, BATCH_NORM_CUDA, BATCH_NORM_EVAL, CUDA_EQUIVALENT, SDPA_CPU, SDPA_CUDA,
)
from ..annotate.registry import schema_arg, tensors

# Batch-norm ops whose `training` argument decides between the eval kernel (BATCH_NORM_EVAL) and training's.
BATCH_NORM_WITH_FLAG = {"aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
                        "aten.cudnn_batch_norm.default"}

FLASH_MAX_HEAD_DIM = 256

# The limits of torch's _select_batch_norm_backend (aten/src/ATen/native/Normalization.cpp) past which batch
# norm with batch statistics leaves cuDNN: CUDNN_BN_MIN_EPSILON, the largest training batch, 32-bit indexing.
CUDNN_BATCH_NORM_MIN_EPS = 1e-5
CUDNN_BATCH_NORM_MAX_TRAINING_BATCH = 880801
CUDNN_BATCH_NORM_MAX_NUMEL = 2 ** 31 - 1


def sdpa_backend(query: torch.Tensor, has_mask: bool) -> str:
    """The backend torch's CUDA SDPA dispatcher picks first: flash for fp16/bf16 without an explicit
    mask and head_dim <= 256, memory-efficient attention otherwise."""
    if query.dtype in (torch.float16, torch.bfloat16) and not has_mask and query.shape[-1] <= FLASH_MAX_HEAD_DIM:
        return "flash"
    return "efficient"


def batch_norm_backend(x: torch.Tensor, weight: torch.Tensor | None, has_bias: bool, eps: float) -> str:
    """"cudnn" or "native": whose CUDA kernels torch's batch norm with batch statistics (and its backward)
    runs for these arguments, as its _select_batch_norm_backend decides. bf16 anywhere, fp16 data with fp16
    weights (not autocast's fp32 ones), no affine parameters, 2-D inputs (BatchNorm1d over (N, C)), a small
    eps or a huge tensor take PyTorch's native kernels, whose cost differs from cuDNN's (their own fits)."""
    if weight is None or not has_bias or x.dim() < 3 or torch.bfloat16 in (x.dtype, weight.dtype):
        return "native"
    if x.dtype == torch.float16 and weight.dtype != torch.float32:
        return "native"
    if (x.shape[0] > CUDNN_BATCH_NORM_MAX_TRAINING_BATCH or eps < CUDNN_BATCH_NORM_MIN_EPS
            or x.numel() >= CUDNN_BATCH_NORM_MAX_NUMEL):
        return "native"
    return "cudnn"


def _batch_norm_kernel(func: Any, args: tuple, kwargs: dict, direction: str) -> str:
    """The CUDA kernel of a batch norm with batch statistics (forward) or of its backward."""
    x, weight = schema_arg(func, args, kwargs, "input"), schema_arg(func, args, kwargs, "weight")
    # A backward has no bias argument; affine batch norm has both parameters or neither.
    has_bias = (weight is not None if direction == "backward"
                else schema_arg(func, args, kwargs, "bias") is not None)
    backend = batch_norm_backend(x, weight, has_bias, float(schema_arg(func, args, kwargs, "eps")))
    return BATCH_NORM_CUDA[(backend, direction)]


def cuda_op_name(func: Any, args: tuple, kwargs: dict) -> tuple[str, str | None]:
    """(name of the CUDA kernel this call stands for, SDPA backend assumed or None)."""
    name = str(func)
    direction = SDPA_CPU.get(name)
    if direction is not None:
        q = args[1] if direction == "backward" else args[0]
        has_mask = bool(tensors(kwargs.get("attn_mask")))
        backend = sdpa_backend(q, has_mask)
        return SDPA_CUDA[(backend, direction)], backend
    if "scaled_dot_product" in name and "attention" in name:
        return name, "flash" if "flash" in name else "cudnn" if "cudnn" in name else "efficient"
    if name in BATCH_NORM_WITH_FLAG and not batch_norm_training(func, args, kwargs):
        return BATCH_NORM_EVAL, None
    direction = BATCH_NORM_CPU.get(name)
    if direction is not None:
        return _batch_norm_kernel(func, args, kwargs, direction), None
    return CUDA_EQUIVALENT.get(name, name), None
