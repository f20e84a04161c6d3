"""Name each traced call by the kernel the CUDA path runs (the map: gpuest.annotate.cuda_kernels), choosing
among CUDA kernels where the arguments decide (SDPA's backend, batch norm's training flag)."""
from __future__ import annotations

from typing import Any

import torch

from ..annotate.formulas.norm import batch_norm_training
from ..annotate.cuda_kernels import CUDA_EQUIVALENT, SDPA_CPU, SDPA_CUDA
from ..annotate.registry import tensors

# Batch norm with running statistics (eval) runs cuDNN's inference kernel, a per-channel affine pass;
# it is named by the ATen op that means exactly that, so it is priced apart from training batch norm.
BATCH_NORM_EVAL = "aten._native_batch_norm_legit_no_training.default"
BATCH_NORM_WITH_FLAG = {"aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
                        "aten.cudnn_batch_norm.default"}

FLASH_MAX_HEAD_DIM = 256


def sdpa_backend(query: torch.Tensor, has_mask: bool) -> str:
    """The backend torch's CUDA SDPA dispatcher picks first: flash for fp16/bf16 without an explicit
    mask and head_dim <= 256, memory-efficient attention otherwise."""
    if query.dtype in (torch.float16, torch.bfloat16) and not has_mask and query.shape[-1] <= FLASH_MAX_HEAD_DIM:
        return "flash"
    return "efficient"


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
    return CUDA_EQUIVALENT.get(name, name), None
