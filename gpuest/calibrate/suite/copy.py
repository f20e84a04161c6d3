"""Copies (category "copy"): casts, transposes, NCHW<->NHWC and attention-head permutes, concatenations,
the permuted copies networks make (channel shuffles, window partitions, channel splits, rolls), and
accumulating index_put and gathers along the last dim."""
from __future__ import annotations

import math
from typing import Any

import torch

from .base import DTYPES, Benchmark, Built, _d, _est, _gen, _nchw, _numels, _randn, _simple
from .shape_tables import shape_table


def _cast(out: list[Benchmark], src: str, dst: str, n: int) -> None:
    """A cast of n contiguous elements from dtype src to dst."""
    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.to(DTYPES[dst]), [(_d(n, device, 1024),)], [DTYPES[src]])(device, seed)
    out.append(Benchmark(f"cast_{src}_to_{dst}_n{n}", "copy", {"op": f"to_{dst}", "dtype": src, "numel": n},
                         build, est_ms=_est(0, 6.0 * n)))


def _transpose(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """A contiguous copy of the transpose of an r x c matrix."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.t().contiguous(), [(_d(r, device), _d(c, device))], [dt])(device, seed)
    out.append(Benchmark(f"transpose_contig_{mode}_{r}x{c}", "copy",
                         {"op": "transpose_contiguous", "dtype": mode, "rows": r, "cols": c}, build,
                         est_ms=_est(0, 2.0 * dt.itemsize * r * c)))


def _heads_transpose(out: list[Benchmark], mode: str, shape: tuple[int, int, int, int]) -> None:
    """(batch, seq, heads, dim) -> (batch, heads, seq, dim), the copies around eager attention."""
    b, sq, h, d = shape
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.transpose(1, 2).contiguous(),
                       [(_d(b, device, 2), _d(sq, device), _d(h, device, 4), _d(d, device))], [dt])(device, seed)
    out.append(Benchmark(f"heads_transpose_{mode}_b{b}_s{sq}_h{h}_d{d}", "copy",
                         {"op": "transpose_contiguous", "dtype": mode, "batch": b, "seq": sq, "heads": h, "dim": d},
                         build, est_ms=_est(0, 2.0 * dt.itemsize * b * sq * h * d)))


def _copy(out: list[Benchmark]) -> None:
    numels = _numels()
    for src, dst, counts in [("fp32", "bf16", numels), ("bf16", "fp32", numels), ("fp32", "fp16", numels[::2])]:
        for n in counts:
            _cast(out, src, dst, n)
    for r, c in shape_table("copy", "transposes"):
        _transpose(out, "fp32", r, c)
    for n, c, hw in shape_table("copy", "nchw_to_nhwc"):
        def build(device: torch.device, seed: int, n=n, c=c, hw=hw) -> Built:
            return _simple(lambda x: x.permute(0, 2, 3, 1).contiguous(),
                           [_nchw(device, n, c, hw)],
                           [torch.bfloat16])(device, seed)
        out.append(Benchmark(f"nchw_to_nhwc_bf16_n{n}_c{c}_hw{hw}", "copy",
                             {"op": "permute_contiguous", "dtype": "bf16", "batch": n, "channels": c, "hw": hw},
                             build, est_ms=_est(0, 4.0 * n * c * hw * hw)))
    for mode in ("fp32", "bf16"):
        for shape in shape_table("copy", "heads_transpose"):
            _heads_transpose(out, mode, shape)
    # channels-last conversions both ways
    for mode, src, perm in [("fp32", "nchw", (0, 2, 3, 1)), ("bf16", "nhwc", (0, 3, 1, 2))]:
        for n, c, hw in shape_table("copy", "channels_last_conversions"):
            def build_perm(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=DTYPES[mode], perm=perm) -> Built:
                return _simple(lambda x: x.permute(*perm).contiguous(),
                               [_nchw(device, n, c, hw)],
                               [dt])(device, seed)
            dst = "nhwc" if src == "nchw" else "nchw"
            out.append(Benchmark(f"{src}_to_{dst}_{mode}_n{n}_c{c}_hw{hw}", "copy",
                                 {"op": "permute_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_perm, est_ms=_est(0, 2.0 * DTYPES[mode].itemsize * n * c * hw * hw)))
    for parts, n in shape_table("copy", "cat"):
        def build(device: torch.device, seed: int, parts=parts, n=n) -> Built:
            return _simple(lambda *ts: torch.cat(ts, 0), [(_d(n, device, 256),)] * parts,
                           [torch.float32] * parts)(device, seed)
        out.append(Benchmark(f"cat_fp32_{parts}x{n}", "copy", {"op": "cat", "dtype": "fp32", "parts": parts,
                                                                "numel": n}, build,
                             est_ms=_est(0, 8.0 * parts * n)))
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for parts, n, c, hw in shape_table("copy", "cat_channels"):
            def build_ch(device: torch.device, seed: int, parts=parts, n=n, c=c, hw=hw, dt=dt) -> Built:
                shape = _nchw(device, n, c, hw)
                return _simple(lambda *ts: torch.cat(ts, 1), [shape] * parts, [dt] * parts)(device, seed)
            out.append(Benchmark(f"cat_channels_{mode}_{parts}x{n}x{c}x{hw}x{hw}", "copy",
                                 {"op": "cat", "dtype": mode, "parts": parts, "batch": n, "channels": c, "hw": hw},
                                 build_ch, est_ms=_est(0, 2.0 * dt.itemsize * parts * n * c * hw * hw)))
    _copy_more(out)


def _copy_more(out: list[Benchmark]) -> None:
    """Copy had 8 held-out shapes. More casts, and layout changes over many channel counts at
    similar bytes (the NCHW<->NHWC transposes around cuDNN's convolutions depend on the channel count)."""
    for n in _numels()[1::2]:
        _cast(out, "fp16", "fp32", n)
    for src, dst, n in shape_table("copy", "casts_more"):
        _cast(out, src, dst, n)
    for r, c in shape_table("copy", "transposes_bf16"):
        _transpose(out, "bf16", r, c)
    for mode, src, perm in [("fp32", "nchw", (0, 2, 3, 1)), ("bf16", "nchw", (0, 2, 3, 1)),
                            ("bf16", "nhwc", (0, 3, 1, 2))]:
        for n, c, hw in shape_table("copy", "channels_last_conversions_more"):
            def build_perm(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=DTYPES[mode], perm=perm) -> Built:
                return _simple(lambda x: x.permute(*perm).contiguous(), [_nchw(device, n, c, hw)], [dt])(device, seed)
            dst = "nhwc" if src == "nchw" else "nchw"
            name = f"{src}_to_{dst}_{mode}_n{n}_c{c}_hw{hw}"
            out.append(Benchmark(name, "copy",
                                 {"op": "permute_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_perm, est_ms=_est(0, 2.0 * DTYPES[mode].itemsize * n * c * hw * hw)))
    for mode, b, sq, h, d in shape_table("copy", "heads_transpose_more"):
        _heads_transpose(out, mode, (b, sq, h, d))
    for mode, parts, n, c, hw in shape_table("copy", "cat_channels_more"):
        dt = DTYPES[mode]

        def build_ch(device: torch.device, seed: int, parts=parts, n=n, c=c, hw=hw, dt=dt) -> Built:
            return _simple(lambda *ts: torch.cat(ts, 1), [_nchw(device, n, c, hw)] * parts, [dt] * parts)(device, seed)
        out.append(Benchmark(f"cat_channels_{mode}_{parts}x{n}x{c}x{hw}x{hw}", "copy",
                             {"op": "cat", "dtype": mode, "parts": parts, "batch": n, "channels": c, "hw": hw},
                             build_ch, est_ms=_est(0, 2.0 * dt.itemsize * parts * n * c * hw * hw)))
    _copy_network_layouts(out)


def _permuted_copy(out: list[Benchmark], name: str, mode: str, shape: tuple[int, ...], perm: tuple[int, ...],
                   params: dict[str, Any]) -> None:
    """A contiguous copy of a permuted view of a contiguous tensor of `shape`."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        dims = tuple(_d(x, device, 4) for x in shape)
        return _simple(lambda x: x.permute(*perm).contiguous(), [dims], [dt])(device, seed)
    out.append(Benchmark(name, "copy", {"op": "permute_contiguous", "dtype": mode, "shape": list(shape),
                                        "perm": list(perm), **params},
                         build, est_ms=_est(0, 2.0 * dt.itemsize * math.prod(shape))))


def _copy_network_layouts(out: list[Benchmark]) -> None:
    """The permutations networks copy besides transposes, whose contiguous runs differ: a
    channel shuffle (ShuffleNet: (N, g, C/g, H, W) -> (N, C/g, g, H, W), runs of H * W) and Swin's window
    partition and its reverse ((N, H/w, w, W/w, w, C) <-> (N, H/w, W/w, w, w, C), runs of w * C), and the
    copy a convolution makes of one half of a channel split (ShuffleNet's x.chunk(2, dim=1), runs of C/2 * H * W)."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in shape_table("copy", "channel_half"):
            def build_half(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=dt) -> Built:
                shape = _nchw(device, n, c, hw)
                return _simple(lambda x: x[:, x.shape[1] // 2:].contiguous(), [shape], [dt])(device, seed)
            out.append(Benchmark(f"channel_half_{mode}_n{n}_c{c}_hw{hw}", "copy",
                                 {"op": "slice_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_half, est_ms=_est(0, dt.itemsize * n * c * hw * hw)))
    for mode in ("fp32", "bf16"):
        for n, c, hw, g in shape_table("copy", "channel_shuffle"):
            _permuted_copy(out, f"channel_shuffle_{mode}_n{n}_c{c}_hw{hw}_g{g}", mode, (n, g, c // g, hw, hw),
                           (0, 2, 1, 3, 4), {"batch": n, "channels": c, "hw": hw, "groups": g})
    for mode, n, hw, c, w in shape_table("copy", "window_partition"):
        shape = (n, hw // w, w, hw // w, w, c)
        params = {"batch": n, "hw": hw, "channels": c, "window": w}
        _permuted_copy(out, f"window_partition_{mode}_n{n}_hw{hw}_c{c}_w{w}", mode, shape, (0, 1, 3, 2, 4, 5), params)
        _permuted_copy(out, f"window_reverse_{mode}_n{n}_hw{hw}_c{c}_w{w}", mode,
                       (n, hw // w, hw // w, w, w, c), (0, 1, 3, 2, 4, 5), params)
    for mode, n, hw, c, dims in shape_table("copy", "roll"):
        dt = DTYPES[mode]

        def build_roll(device: torch.device, seed: int, n=n, hw=hw, c=c, dims=dims, dt=dt) -> Built:
            shape = (_d(n, device, 2), _d(hw, device, 8), _d(hw, device, 8), _d(c, device, 4))
            shifts = tuple(-3 for _ in dims)
            return _simple(lambda x: torch.roll(x, shifts, dims), [shape], [dt])(device, seed)
        name = f"roll{len(dims)}d_{mode}_n{n}_hw{hw}_c{c}"
        out.append(Benchmark(name, "copy", {"op": "roll", "dtype": mode, "batch": n, "hw": hw, "channels": c,
                                            "dims": list(dims)},
                             build_roll, est_ms=_est(0, 2.0 * len(dims) * dt.itemsize * n * hw * hw * c)))


def index_put_accumulate_shapes() -> list[tuple[int, int, int]]:
    """(target rows, indices, row width) of the accumulating index_put benchmarks."""
    return shape_table("copy", "index_put_accumulate")


def _index_put_accumulate(out: list[Benchmark], mode: str, targets: int, n_idx: int, width: int) -> None:
    """torch.index_put(zeros(targets, width), (idx,), values, accumulate=True), idx a shuffled balanced
    draw: every target row receives n_idx / targets of the values."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        t, n, w = _d(targets, device, 4), _d(n_idx, device), _d(width, device)

        def make_set(i: int) -> tuple:
            order = torch.randperm(n, device=device, generator=_gen(device, seed, i))
            return (torch.zeros((t, w), dtype=dt, device=device), order % t,
                    _randn((n, w), dt, device, seed, 100 + i))

        def fn(base: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.index_put(base, [idx], values, True)
        return Built(fn, make_set)
    nbytes = dt.itemsize * (2.0 * targets * width + n_idx * width) + 16.0 * n_idx
    out.append(Benchmark(f"index_put_acc_{mode}_t{targets}_n{n_idx}_w{width}", "copy",
                         {"op": "index_put", "accumulate": True, "dtype": mode, "targets": targets,
                          "indices": n_idx, "width": width},
                         build, est_ms=_est(0, nbytes) + 4e-3 * n_idx / targets))


def _index_put(out: list[Benchmark]) -> None:
    for mode in ("fp32", "bf16"):
        for targets, n_idx, width in index_put_accumulate_shapes():
            _index_put_accumulate(out, mode, targets, n_idx, width)


def _gathers(out: list[Benchmark]) -> None:
    """torch.gather(src, -1, index) of shapes/copy.json gather_last_dim: src (batch, seq, span), index
    (batch, seq, seq) into the span, drawn once per (seq, seq) and expanded over the batch, or per element."""
    for mode, batch, seq, span, expanded in shape_table("copy", "gather_last_dim"):
        dt = DTYPES[mode]

        def build(device: torch.device, seed: int, batch=batch, seq=seq, span=span, expanded=expanded,
                  dt=dt) -> Built:
            b, s, k = _d(batch, device, 2), _d(seq, device), _d(span, device)

            def make_set(i: int) -> tuple:
                idx = torch.randint(0, k, (1 if expanded else b, s, s), device=device,
                                    generator=_gen(device, seed, i))
                return _randn((b, s, k), dt, device, seed, 100 + i), idx.expand(b, s, s)
            return Built(lambda src, idx: torch.gather(src, -1, idx), make_set)
        n_out = batch * seq * seq
        out.append(Benchmark(f"gather_lastdim_{mode}_b{batch}_s{seq}_k{span}{'_expanded' if expanded else ''}",
                             "copy", {"op": "gather", "dtype": mode, "batch": batch, "seq": seq, "span": span,
                                      "expanded_index": bool(expanded)},
                             build, est_ms=_est(0, 2.0 * n_out * dt.itemsize + 8.0 * (seq * seq if expanded
                                                                                          else n_out))))
