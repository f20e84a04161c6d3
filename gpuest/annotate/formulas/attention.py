"""Cost formulas of attention kernels (scaled dot-product attention, forward and backward, on every backend)
and of the fused inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from ..cuda_kernels import SDPA_CPU_PRICED_AS, packet_name
from ..registry import Cost, OpCall, generic_cost, iter_ops, register_cost, shape_of
from .gemm import torch_flops, with_gemm

aten = torch.ops.aten

ATTENTION_FORWARD = [
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
]
ATTENTION_BACKWARD = [name + "_backward" for name in ATTENTION_FORWARD[:3]] + [
    "_flash_attention_backward", "_efficient_attention_backward"]

ATTENTION_TILE = 128  # query/key block edge of the flash and memory-efficient kernels
# The (batch, heads, seq, head_dim) ops, counted by sdpa_flops; the others keep torch's formulas.
SDPA_PACKETS = frozenset(name for name in ATTENTION_FORWARD + ATTENTION_BACKWARD
                         if name.startswith("_scaled_dot_product"))


def sdpa_flops(q: tuple, k: tuple, v: tuple, backward: bool) -> float:
    """torch's count (flop_counter.sdpa_flop_count, sdpa_backward_flop_count) with grouped-query attention's
    key/value heads broadcast to the query's, as the kernels do: torch before 2.14 refuses such shapes.
    Forward: the score and output GEMMs; backward: the recomputed scores and the four gradient GEMMs."""
    b, h, s_q, d_q = q
    s_k, d_v = k[-2], v[-1]
    return 2.0 * b * h * s_q * s_k * (3 * d_q + 2 * d_v if backward else d_q + d_v)


def causal_mask_kind(call: OpCall) -> int:
    """0: no causal mask; 1: causal, aligned top-left (torch's is_causal); 2: aligned bottom-right
    (the memory-efficient kernel's custom_mask_type 2)."""
    # The memory-efficient kernels take a custom_mask_type where the others take is_causal.
    if call.has_arg("is_causal") and call.arg("is_causal", default=False) is True:
        return 1
    kind = call.arg("custom_mask_type", default=0) if call.has_arg("custom_mask_type") else 0
    return int(kind) if isinstance(kind, int) and kind in (1, 2) else 0


def causal_kept_fraction(s_q: int, s_k: int, kind: int) -> float:
    """Share of the s_q x s_k score matrix a causal mask keeps (query i sees keys up to i, plus
    s_k - s_q when the mask is aligned bottom-right)."""
    if kind == 0 or s_q <= 0 or s_k <= 0:
        return 1.0
    shift = s_k - s_q if kind == 2 else 0
    # sum over queries i of clip(i + 1 + shift, 0, s_k), in closed form over the three ranges of i
    lo = min(max(-shift, 0), s_q)                      # rows that see no key
    hi = min(max(s_k - shift, lo), s_q)                # rows before the mask saturates at s_k
    ramp = (hi - lo) * (lo + 1 + shift + hi + shift) / 2.0
    full = (s_q - hi) * s_k
    return (ramp + full) / float(s_q * s_k)


def _attention(call: OpCall, packet: Any, backward: bool) -> Cost:
    q, k = shape_of(call.arg("query")), shape_of(call.arg("key"))
    *lead, s_q, d = q
    s_k = k[-2]
    flops = (sdpa_flops(q, k, shape_of(call.arg("value")), backward)
             if packet.__name__ in SDPA_PACKETS else torch_flops(call, packet))
    # Flash-style kernels keep the S x S scores on chip: traffic is the operands, not S^2. Under a causal
    # mask they skip the tiles wholly above the diagonal and compute the diagonal ones in full; torch's
    # count (kept as the FLOPs) includes them all.
    kept = causal_kept_fraction(-(-s_q // ATTENTION_TILE), -(-s_k // ATTENTION_TILE), causal_mask_kind(call))
    return replace(with_gemm(call, "attention", flops, (s_q, s_k, d), math.prod(lead), kernels=3 if backward else 1),
                   flops_skipped=flops * (1.0 - kept), variant="bias_grad" if _computes_bias_grad(call) else "")


def _computes_bias_grad(call: OpCall) -> bool:
    """Whether a memory-efficient attention backward also computes its bias's gradient (a learned bias): the
    kernel then writes a (batch, heads, queries, keys) gradient, another kernel family (grad_input_mask[3])."""
    if not call.has_arg("grad_input_mask"):
        return False
    mask = call.arg("grad_input_mask")
    return isinstance(mask, (list, tuple)) and len(mask) > 3 and bool(mask[3])


for _name in ATTENTION_FORWARD + ATTENTION_BACKWARD:
    for _op in iter_ops([_name]):
        register_cost(_op)(lambda call, _p=_op, _b=_name.endswith("backward"): _attention(call, _p, _b))
# A CPU-only SDPA kernel carries the formula of the CUDA kernel it stands in for (annotate.cuda_kernels).
for _cpu, _cuda in SDPA_CPU_PRICED_AS.items():
    for _op in iter_ops([packet_name(_cpu)]):
        register_cost(_op)(lambda call, _p=getattr(aten, packet_name(_cuda)), _b=_cpu.endswith("backward.default"):
                           _attention(call, _p, _b))


# Inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer (eval, no grad): one ATen op
# that runs the projections, attention and (for the layer) the feed-forward block. FLOPs are those of its
# GEMMs and attention, as FlopCounterMode counts them on the decomposed (slow) path; the traffic adds the
# intermediates (qkv, attention output, FFN hidden) each written and read once.


def _mha_parts(q: Any, k: Any, embed_dim: int) -> tuple[int, int, int, int]:
    """(batch, query length, key length, embed dim) of a batch-first (or unbatched) MHA input."""
    qs, ks = shape_of(q), shape_of(k)
    lead = math.prod(qs[:-2]) if len(qs) > 2 else 1
    s_q = qs[-2] if len(qs) >= 2 else 1
    s_k = ks[-2] if len(ks) >= 2 else 1
    return lead, s_q, s_k, int(embed_dim)


@register_cost(*iter_ops(["_native_multi_head_attention"]))
def _native_mha(call: OpCall) -> Cost:
    q, k = call.arg("query"), call.arg("key")
    b, s_q, s_k, e = _mha_parts(q, k, call.arg("embed_dim"))
    proj = 2.0 * b * e * e * (s_q + 2 * s_k) + 2.0 * b * s_q * e * e  # q, k, v and output projections
    attn = 4.0 * b * s_q * s_k * e  # QK^T and PV over all heads
    base = generic_cost(call, category="attention")
    extra = (b * (s_q + 2 * s_k) * e + b * s_q * e) * 2.0 * q.element_size()
    return Cost(proj + attn, base.bytes_read + extra / 2, base.bytes_written + extra / 2, "attention",
                gemm_mnk=(b * s_q, 3 * e, e), gemm_batch=1, kernels=4)


@register_cost(*iter_ops(["_transformer_encoder_layer_fwd"]))
def _transformer_layer_fast(call: OpCall) -> Cost:
    src = call.arg("src")
    b, s, _, e = _mha_parts(src, src, call.arg("embed_dim"))
    ffn = shape_of(call.arg("ffn_weight_1"))[0]
    flops = 2.0 * b * s * e * 3 * e + 4.0 * b * s * s * e + 2.0 * b * s * e * e + 4.0 * b * s * e * ffn
    base = generic_cost(call, category="attention")
    extra = (b * s * (3 * e + e + e + ffn + e)) * 2.0 * src.element_size()
    return Cost(flops, base.bytes_read + extra / 2, base.bytes_written + extra / 2, "attention",
                gemm_mnk=(b * s, ffn, e), gemm_batch=1, kernels=10)
