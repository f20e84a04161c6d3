"""Attention with a learned bias, as CUDA runs it.

`F.scaled_dot_product_attention` with a floating `attn_mask` that requires grad (BEiT's and Swin's relative
position bias, trained with the model) runs on CUDA in the memory-efficient kernel, which also returns the
bias's gradient. The CPU's flash kernel takes no mask that requires grad, so a CPU trace would take the math
path instead (batched GEMMs, softmax, and fp32 casts of every 16-bit operand), several kernels and far more
traffic than the one CUDA runs. `efficient_attention_call` makes the call CUDA makes, on fake tensors:
ATen's `preprocess_mask` (pad the bias to the kernel's alignment, expand it over batch and heads), then
`_scaled_dot_product_efficient_attention`, whose backward autograd derives.
"""
from __future__ import annotations

from typing import Any

import torch

# The memory-efficient kernel's alignment, in elements: ATen pads a bias whose strides are not multiples of it
# (aten/src/ATen/native/transformers/attention.cpp, preprocess_mask's mem_eff_alignment) ...
MEM_EFF_BIAS_ALIGNMENT = 8
# ... and the head dims it takes (sdp_utils: check_head_dim_size_mem_efficient, 16-bit and fp32 alike).
MEM_EFF_HEAD_DIM_MULTIPLE = 8
# F.scaled_dot_product_attention's parameters, in order (torch >= 2.5).
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _bound(args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    return bound


def takes_learned_bias_path(args: tuple, kwargs: dict, device_type: str) -> bool:
    """Whether an SDPA call is one CUDA runs as memory-efficient attention with a learned bias and a CPU
    trace would decompose: a floating mask that requires grad (grad mode on), 4-d q/k/v of one dtype and
    head count, head dims the kernel takes, no GQA."""
    a = _bound(args, kwargs)
    q, k, v, mask = a.get("query"), a.get("key"), a.get("value"), a.get("attn_mask")
    if device_type != "cpu" or not all(isinstance(t, torch.Tensor) for t in (q, k, v, mask)):
        return False
    if not (mask.is_floating_point() and mask.requires_grad and torch.is_grad_enabled()) or a.get("enable_gqa"):
        return False
    return (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float32, torch.float16, torch.bfloat16) and q.shape[1] == k.shape[1] == v.shape[1]
            and q.shape[-1] % MEM_EFF_HEAD_DIM_MULTIPLE == 0 and v.shape[-1] % MEM_EFF_HEAD_DIM_MULTIPLE == 0)


def aligned_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """ATen's preprocess_mask: a bias with a stride off the kernel's alignment is padded (one copy) and
    sliced back; then expanded over (batch, heads, queries, keys)."""
    if any(s % MEM_EFF_BIAS_ALIGNMENT for s in mask.stride()[:-1]):
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, MEM_EFF_BIAS_ALIGNMENT - last % MEM_EFF_BIAS_ALIGNMENT))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def efficient_attention_call(args: tuple, kwargs: dict) -> torch.Tensor:
    """The SDPA call as CUDA makes it for a learned bias (takes_learned_bias_path): dropout off, as the
    trace prices every step; the bias in the query's dtype, as autocast or the kernel requires."""
    a = _bound(args, kwargs)
    q, k, v = a["query"], a["key"], a["value"]
    bias = aligned_bias(a["attn_mask"].to(q.dtype), q, k)
    lse = any(t.requires_grad for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, lse, 0.0,
                                                                 bool(a.get("is_causal", False)), scale=a.get("scale"))
    return out[0]

