"""Scaled dot-product attention (`F.scaled_dot_product_attention`), forward and backward, causal and
not, in bf16, fp16 and fp32, and with a learned additive bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _backward_built, _d, _est, _fwd_bwd, _randn
from .shape_tables import shape_table


def _attention(out: list[Benchmark]) -> None:
    shapes = shape_table("attention", "sdpa")
    for mode in ("bf16", "fp16", "fp32"):
        for si, shape in enumerate(shapes):
            if mode != "bf16" and si % 2:
                continue
            for causal in (False, True):
                _sdpa_benchmark(out, mode, shape, causal, False)
                if si < 6:
                    _sdpa_benchmark(out, mode, shape, causal, True)
    _attention_more(out)
    _attention_short_sequences(out)
    _attention_learned_bias(out)


def _sdpa_benchmark(out: list[Benchmark], mode: str, shape: tuple[int, int, int, int], causal: bool,
                    backward: bool) -> None:
    b, h, s, dh = shape
    dt = DTYPES[mode]
    fl = 4.0 * b * h * s * s * dh * (0.5 if causal else 1.0)
    nb = 4 * b * h * s * dh * dt.itemsize
    params = {"dtype": mode, "batch": b, "heads": h, "seq": s, "head_dim": dh, "causal": causal}
    tag = f"{mode}_b{b}_h{h}_s{s}_d{dh}{'_causal' if causal else ''}"

    def leaves(device: torch.device, seed: int, i: int) -> tuple:
        shp = (_d(b, device, 2), _d(h, device, 2), _d(s, device, 16), _d(dh, device, 8))
        return tuple(_randn(shp, dt, device, seed, i * 4 + j) for j in range(3))

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    est_mode = mode if mode != "fp32" else "tf32"
    if backward:
        out.append(Benchmark(f"sdpa_bwd_{tag}", "attention", {"op": "sdpa_backward", **params},
                             lambda device, seed: _backward_built(fwd, lambda i: leaves(device, seed, i), 3),
                             est_ms=_est(2.5 * fl, 2 * nb, est_mode)))
    else:
        out.append(Benchmark(f"sdpa_fwd_{tag}", "attention", {"op": "sdpa", **params},
                             lambda device, seed: Built(fwd, lambda i: leaves(device, seed, i)),
                             est_ms=_est(fl, nb, est_mode)))


def _attention_more(out: list[Benchmark]) -> None:
    """The shapes added to the held-out ones: bf16 in every pass, fp32 and fp16 in some."""
    for si, shape in enumerate(shape_table("attention", "more")):
        for causal in (False, True):
            for backward in (False, True):
                _sdpa_benchmark(out, "bf16", shape, causal, backward)
        if si % 2 == 0:  # fp32 (the memory-efficient kernels) and fp16 on every other shape
            for backward in (False, True):
                _sdpa_benchmark(out, "fp32", shape, False, backward)
            _sdpa_benchmark(out, "fp16", shape, True, False)


def _attention_short_sequences(out: list[Benchmark]) -> None:
    """One short sequence in every dtype, causal or not; the backward in bf16 and fp32 (batch-1 training)."""
    for shape in shape_table("attention", "short_sequence"):
        for mode in ("bf16", "fp16", "fp32"):
            for causal in (False, True):
                _sdpa_benchmark(out, mode, shape, causal, False)
            if mode != "fp16":
                _sdpa_benchmark(out, mode, shape, False, True)


def _attention_learned_bias(out: list[Benchmark]) -> None:
    """SDPA with a learned bias broadcast over the batch (relative-position tables of Swin, MaxViT, BEiT):
    CUDA runs memory-efficient attention with the bias, and its backward writes a bias gradient per
    (batch, head), which autograd then sums to the table."""
    for mode in ("bf16", "fp32"):
        dt = DTYPES[mode]
        for b, h, s, dh in shape_table("attention", "learned_bias", "learned_bias_long"):
            def leaves(device: torch.device, seed: int, i: int, b=b, h=h, s=s, dh=dh, dt=dt) -> tuple:
                shp = (_d(b, device, 2), _d(h, device, 2), _d(s, device, 16), _d(dh, device, 8))
                qkv = tuple(_randn(shp, dt, device, seed, i * 4 + j) for j in range(3))
                return (*qkv, _randn((1, shp[1], shp[2], shp[2]), dt, device, seed, i * 4 + 3))

            def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            fl, nb = 4.0 * b * h * s * s * dh, (4 * b * h * s * dh + b * h * s * s) * dt.itemsize
            est_mode = mode if mode != "fp32" else "tf32"
            params = {"dtype": mode, "batch": b, "heads": h, "seq": s, "head_dim": dh, "bias": "learned"}
            _fwd_bwd(out, "sdpa_learned_bias", f"{mode}_b{b}_h{h}_s{s}_d{dh}", "attention", "sdpa", params, fwd,
                     leaves, 4, _est(fl, nb, est_mode), _est(2.5 * fl, 2 * nb, est_mode))
