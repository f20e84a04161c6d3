"""nn.MultiheadAttention's inference fast path, as CUDA runs it.

In eval mode without autograd or autocast, `nn.MultiheadAttention.forward` calls
`torch._native_multi_head_attention`. On CUDA, with self-attention, no attention weights asked for, no mask and
a head size divisible by 8, that op runs one biased QKV GEMM, fused SDPA (flash or memory-efficient) and the
output projection (`native_multi_head_attention_cuda` in ATen's transformers/cuda/attention.cu). Traced on fake
tensors the fast path is never taken (fake tensors answer `has_torch_function`), so the trace would record the
Python path: a transposed input copied, an unbiased GEMM, a bias add, a copy splitting heads, SDPA and the
projection, about twice the measured time of torchvision's ViT-B/16 bf16 attention (the `recipes` per-op rows,
data/validation/H100-SXM-recipes.jsonl). `fast_path_call` replays the CUDA op sequence instead.

Not replayed (left on the traced Python path, which CUDA then also differs from): calls with a mask or with
need_weights=True, whose CUDA kernels are the unfused GEMM / `_transform_bias_rescale_qkv` / softmax path.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

# native_multi_head_attention_cuda takes its fused SDPA branch only for head sizes divisible by this.
FUSED_HEAD_DIM_MULTIPLE = 8


@lru_cache(maxsize=1)
def _signature() -> inspect.Signature:
    return inspect.signature(F.multi_head_attention_forward)


def _bound(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name, torch's defaults filled in."""
    bound = _signature().bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def takes_fast_path(module: torch.nn.Module | None, args: tuple, kwargs: dict, device_type: str) -> bool:
    """Whether this `F.multi_head_attention_forward` call, made by `module`, runs as CUDA's fused fast path:
    nn.MultiheadAttention's own fast-path conditions (fast path enabled, batch_first, eval, no grad, no
    autocast, packed projection, even head count, matching dtypes) and the fused branch's (self-attention, no mask, no
    weights returned, head size divisible by FUSED_HEAD_DIM_MULTIPLE)."""
    if (not isinstance(module, torch.nn.MultiheadAttention) or not module.batch_first
            or not torch.backends.mha.get_fastpath_enabled()):
        return False
    b = _bound(args, kwargs)
    q, k, v = b["query"], b["key"], b["value"]
    w, bias, num_heads = b["in_proj_weight"], b["in_proj_bias"], b["num_heads"]
    tensors = [t for t in (q, w, bias, b["out_proj_weight"], b["out_proj_bias"]) if isinstance(t, torch.Tensor)]
    if not (isinstance(q, torch.Tensor) and q is k and k is v and q.dim() == 3 and isinstance(w, torch.Tensor)
            and isinstance(bias, torch.Tensor) and isinstance(num_heads, int)):
        return False
    embed_dim = q.shape[-1]
    return (not b["training"] and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch.is_autocast_enabled(device_type)
            and b["bias_k"] is None and b["bias_v"] is None and not b["add_zero_attn"]
            and not b["use_separate_proj_weight"] and num_heads % 2 == 0
            and q.dtype == w.dtype == bias.dtype
            and b["attn_mask"] is None and b["key_padding_mask"] is None and not b["need_weights"]
            and embed_dim % num_heads == 0 and (embed_dim // num_heads) % FUSED_HEAD_DIM_MULTIPLE == 0)


def fast_path_call(args: tuple, kwargs: dict) -> tuple[torch.Tensor, None]:
    """The fused branch's ops on the call's tensors, returned as `F.multi_head_attention_forward` returns
    (sequence-first output, no weights). The module passed the batch-first input transposed; it transposes
    the output back."""
    b = _bound(args, kwargs)
    x = b["query"].transpose(0, 1)   # the caller's batch-first tensor
    heads = b["num_heads"]
    batch, embed_dim = x.shape[0], x.shape[-1]
    qkv = F.linear(x, b["in_proj_weight"], b["in_proj_bias"])
    q, k, v = (t.view(batch, -1, heads, embed_dim // heads).transpose(1, 2) for t in qkv.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)
    out = F.linear(y.transpose(1, 2).reshape(batch, -1, embed_dim), b["out_proj_weight"], b["out_proj_bias"])
    return out.transpose(0, 1), None
