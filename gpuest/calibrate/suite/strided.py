"""Ops on strided views (a slice, a chunk) rather than dense tensors: elementwise ops on a chunk, cats
of strided halves, of a kept-apart token and of a rotated part with a head's pass-through slice, stacks of
4-d views (categories "elementwise" and "copy")."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _simple
from .shape_tables import shape_table


def _strided_operands(out: list[Benchmark]) -> None:
    """Ops whose operands are strided views (a slice, a chunk) rather than dense tensors. TensorIterator
    then runs its non-vectorised loop, and CUDA's cat reads every element through its strides in a batched
    kernel of one element per lane or, past 4 dims (a stack of 4-d tensors), copies each input on its own.
    Networks make them in gated units (SwiGLU's chunk) and rotary embeddings (rotate_half's halves, EVA's
    class token kept apart from the rotated tokens, interleaved pairs)."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for rows, cols in shape_table("strided", "chunk"):
            n = rows * cols // 2

            def build_chunk(device: torch.device, seed: int, rows=rows, cols=cols, dt=dt) -> Built:
                return _simple(lambda x: F.silu(x[:, : x.shape[1] // 2]), [(_d(rows, device), _d(cols, device))],
                               [dt])(device, seed)
            out.append(Benchmark(f"ew_chunk_silu_{mode}_r{rows}_c{cols}", "elementwise",
                                 {"op": "silu", "dtype": mode, "rows": rows, "cols": cols, "operands": "chunk"},
                                 build_chunk, est_ms=_est(n, 2 * n * dt.itemsize, mode)))
    for mode, b, h, sq, d in shape_table("strided", "halves"):
        dt = DTYPES[mode]

        def build_halves(device: torch.device, seed: int, shape=(b, h, sq, d), dt=dt) -> Built:
            dims = tuple(_d(v, device, 4) for v in shape)
            return _simple(lambda x: torch.cat((x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), -1),
                           [dims], [dt])(device, seed)
        out.append(Benchmark(f"cat_strided_halves_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "cat", "dtype": mode, "shape": [b, h, sq, d], "operands": "halves"},
                             build_halves, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
    for mode, b, h, sq, d in shape_table("strided", "class_token"):
        dt = DTYPES[mode]

        def build_token(device: torch.device, seed: int, b=b, h=h, sq=sq, d=d, dt=dt) -> Built:
            q = tuple(_d(v, device, 4) for v in (b, h, sq + 1, d))
            return _simple(lambda q, y: torch.cat((q[:, :, :1], y), 2), [q, q[:2] + (q[2] - 1, q[3])],
                           [dt, dt])(device, seed)
        out.append(Benchmark(f"cat_strided_token_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "cat", "dtype": mode, "shape": [b, h, sq, d], "operands": "token"},
                             build_token, est_ms=_est(0, 2.0 * dt.itemsize * b * h * (sq + 1) * d)))
    for mode, b, h, sq, d in shape_table("strided", "pairs"):
        dt = DTYPES[mode]

        def build_pairs(device: torch.device, seed: int, shape=(b, h, sq, d), dt=dt) -> Built:
            dims = tuple(_d(v, device, 4) for v in shape)
            return _simple(lambda x: torch.stack((x[..., 1::2], x[..., ::2]), -1), [dims], [dt])(device, seed)
        out.append(Benchmark(f"stack_pairs_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "stack", "dtype": mode, "shape": [b, h, sq, d], "operands": "pairs"},
                             build_pairs, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
    for mode, b, h, sq, d in shape_table("strided", "dense_strided"):
        dt = DTYPES[mode]

        def build_mixed(device: torch.device, seed: int, b=b, h=h, sq=sq, d=d, dt=dt) -> Built:
            x = tuple(_d(v, device, 4) for v in (b, h, sq, d))
            return _simple(lambda x, y: torch.stack((y, x[..., ::2]), -1), [x, x[:3] + (x[3] // 2,)],
                           [dt, dt])(device, seed)
        out.append(Benchmark(f"stack_dense_strided_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "stack", "dtype": mode, "shape": [b, h, sq, d], "operands": "dense+strided"},
                             build_mixed, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
    for mode, b, h, sq, rot, d in shape_table("strided", "rotary_pass"):
        dt = DTYPES[mode]

        def build_pass(device: torch.device, seed: int, b=b, h=h, sq=sq, rot=rot, d=d, dt=dt) -> Built:
            bb, hh, ss, rr = (_d(v, device, 4) for v in (b, h, sq, rot))
            dd = rr + _d(d - rot, device, 4)
            # the rotated part (dense) beside the rest of each head, sliced from the (batch, seq, heads, dim)
            # projection output seen as (batch, heads, seq, dim)
            return _simple(lambda y, x: torch.cat((y, x.transpose(1, 2)[..., rr:]), -1),
                           [(bb, hh, ss, rr), (bb, ss, hh, dd)], [dt, dt])(device, seed)
        out.append(Benchmark(f"cat_rotary_pass_{mode}_b{b}_h{h}_s{sq}_r{rot}_d{d}", "copy",
                             {"op": "cat", "dtype": mode, "shape": [b, h, sq, d], "rotary": rot,
                              "operands": "dense+transposed slice"},
                             build_pass, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
