"""Rename CPU-only kernels that a CPU trace produces to the kernels the CUDA path runs.

We trace on the CPU (fake tensors, no GPU). Most ATen ops are device-independent at the
level we record, but a few dispatch to CPU-specific kernels; costs are priced as the CUDA
kernel, and the node keeps the CPU name in `cpu_op`.
"""
from __future__ import annotations

from typing import Any

import torch

from ..annotate.formulas.norm import batch_norm_training
from ..annotate.registry import tensors

# CPU kernel -> CUDA kernel, where the choice does not depend on arguments.
CUDA_EQUIVALENT = {
    "aten.native_batch_norm.default": "aten.cudnn_batch_norm.default",
    "aten._native_batch_norm_legit.default": "aten.cudnn_batch_norm.default",
    "aten._native_batch_norm_legit.no_stats": "aten.cudnn_batch_norm.default",
    "aten._batch_norm_with_update.default": "aten.cudnn_batch_norm.default",
    "aten.native_batch_norm_backward.default": "aten.cudnn_batch_norm_backward.default",
    "aten.batch_norm_backward.default": "aten.cudnn_batch_norm_backward.default",
    "aten.mkldnn_rnn_layer.default": "aten._cudnn_rnn.default",
    "aten.mkldnn_rnn_layer_backward.default": "aten._cudnn_rnn_backward.default",
}

# Batch norm with running statistics (eval) runs cuDNN's inference kernel, a per-channel affine pass;
# it is named by the ATen op that means exactly that, so it is priced apart from training batch norm.
BATCH_NORM_EVAL = "aten._native_batch_norm_legit_no_training.default"
BATCH_NORM_WITH_FLAG = {"aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
                        "aten.cudnn_batch_norm.default"}

SDPA_CPU = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "forward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "backward",
}
SDPA_CUDA = {
    ("flash", "forward"): "aten._scaled_dot_product_flash_attention.default",
    ("flash", "backward"): "aten._scaled_dot_product_flash_attention_backward.default",
    ("efficient", "forward"): "aten._scaled_dot_product_efficient_attention.default",
    ("efficient", "backward"): "aten._scaled_dot_product_efficient_attention_backward.default",
}
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
