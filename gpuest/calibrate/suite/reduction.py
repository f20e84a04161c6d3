"""Reductions (category "reduction"): sums, means and maxima along rows and columns and over whole
tensors, column sums (linear layers' bias gradients), and softmax / log-softmax forward and backward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _fwd_bwd, _randn, _simple


def _reduction(out: list[Benchmark]) -> None:
    shapes = [(1024, 1024), (8192, 8192), (32, 2 ** 20), (2 ** 20, 32), (4096, 50257), (64, 1000),
              (4096, 64), (64, 65536), (16384, 2048)]
    both_dims = ((8192, 8192), (2 ** 20, 32), (64, 65536))
    for opname, fn in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}.items():
        for r, c in shapes:
            for dim in (-1, 0):
                if opname != "sum" and dim == 0 and (r, c) not in both_dims:
                    continue

                def build(device: torch.device, seed: int, r=r, c=c, fn=fn, dim=dim) -> Built:
                    return _simple(lambda x: fn(x, dim), [(_d(r, device), _d(c, device))], [torch.float32])(
                        device, seed)
                out.append(Benchmark(f"reduce_{opname}_fp32_{r}x{c}_dim{dim}", "reduction",
                                     {"op": opname, "dtype": "fp32", "rows": r, "cols": c, "dim": dim}, build,
                                     est_ms=_est(r * c, 4.0 * r * c)))
    # reductions of a whole tensor to one number (a loss's mean, a norm for gradient clipping)
    for mode in ("fp32", "bf16"):
        for opname, fn in {"sum": torch.sum, "mean": torch.mean}.items():
            for n in (2 ** 20, 2 ** 24, 2 ** 27):
                def build_all(device: torch.device, seed: int, n=n, fn=fn, dt=DTYPES[mode]) -> Built:
                    return _simple(lambda x: fn(x), [(_d(n, device, 1024),)], [dt])(device, seed)
                out.append(Benchmark(f"reduce_{opname}_all_{mode}_n{n}", "reduction",
                                     {"op": opname, "dtype": mode, "numel": n}, build_all,
                                     est_ms=_est(n, DTYPES[mode].itemsize * n)))
    # column sums over tokens: the bias gradient of every linear layer in training
    for mode in ("fp32", "bf16"):
        for r, c in [(8192, 768), (16384, 3072), (50176, 96), (4096, 1024)]:
            _colsum(out, mode, r, c)
    # softmax / log_softmax forward and backward (category "reduction" in the estimator)
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for opname, fn in {"softmax": F.softmax, "log_softmax": F.log_softmax}.items():
            for r, c in [(4096, 1024), (16384, 4096), (8 * 16 * 512, 512), (8192, 50257), (128, 128),
                         (65536, 64), (2048, 2048), (512, 32000),
                         # rows that are not a multiple of 4: eager attention over ViT's 197 tokens
                         (64 * 12 * 197, 197), (4096, 1001), (8192, 77),
                         # language-model heads: rows longer than a block's shared memory
                         (4096, 32000), (1024, 128256)]:
                if mode == "bf16" and opname == "log_softmax" and c not in (50257, 32000, 128256):
                    continue

                def leaves(device: torch.device, seed: int, i: int, r=r, c=c, dt=dt) -> tuple:
                    return (_randn((_d(r, device), _d(c, device)), dt, device, seed, i),)

                def fwd(x: torch.Tensor, fn=fn) -> torch.Tensor:
                    return fn(x, -1)
                nb = 2.0 * r * c * dt.itemsize
                params = {"op": opname, "dtype": mode, "rows": r, "cols": c}
                _fwd_bwd(out, opname, f"{mode}_{r}x{c}", "reduction", opname,
                         {k: v for k, v in params.items() if k != "op"}, fwd, leaves, 1,
                         _est(5.0 * r * c, nb), _est(3.0 * r * c, 1.5 * nb))
    _reduction_more(out)


def _colsum(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """A sum over the rows of an r x c matrix (dim 0)."""
    dt = DTYPES[mode]

    def build_col(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: torch.sum(x, 0), [(_d(r, device), _d(c, device))], [dt])(device, seed)
    out.append(Benchmark(f"colsum_{mode}_{r}x{c}", "reduction",
                         {"op": "sum", "dtype": mode, "rows": r, "cols": c, "dim": 0}, build_col,
                         est_ms=_est(r * c, dt.itemsize * r * c)))


def _reduction_more(out: list[Benchmark]) -> None:
    """Row reductions on bf16 data, column sums of more widths, softmax over attention-score
    rows (eager attention: 1024, 577 and 256 keys)."""
    for opname, fn in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}.items():
        for r, c in [(4096, 4096), (512, 16384), (65536, 256), (1000, 1000)]:
            def build(device: torch.device, seed: int, r=r, c=c, fn=fn) -> Built:
                return _simple(lambda x: fn(x, -1), [(_d(r, device), _d(c, device))], [torch.bfloat16])(device, seed)
            out.append(Benchmark(f"reduce_{opname}_bf16_{r}x{c}_dim-1", "reduction",
                                 {"op": opname, "dtype": "bf16", "rows": r, "cols": c, "dim": -1}, build,
                                 est_ms=_est(r * c, 2.0 * r * c)))
    for mode in ("fp32", "bf16"):
        for r, c in [(32768, 512), (2048, 4096), (131072, 64)]:
            _colsum(out, mode, r, c)
    for mode in ("fp32", "bf16"):
        for r, c in [(4 * 12 * 1024, 1024), (8 * 16 * 577, 577), (32 * 8 * 256, 256)]:
            _softmax_rows(out, mode, r, c)
    # Softmax over the 49 (7x7) keys of Swin's window attention, millions of short odd rows
    for mode, r in [("fp32", 8192 * 3 * 49), ("fp32", 512 * 12 * 49), ("bf16", 2048 * 6 * 49)]:
        _softmax_rows(out, mode, r, 49)


def _softmax_rows(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """Softmax over the last dimension of an r x c matrix, forward and backward."""
    dt = DTYPES[mode]

    def leaves(device: torch.device, seed: int, i: int) -> tuple:
        return (_randn((_d(r, device), _d(c, device)), dt, device, seed, i),)

    def fwd(x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, -1)
    nb = 2.0 * r * c * dt.itemsize
    _fwd_bwd(out, "softmax", f"{mode}_{r}x{c}", "reduction", "softmax", {"dtype": mode, "rows": r, "cols": c},
             fwd, leaves, 1, _est(5.0 * r * c, nb), _est(3.0 * r * c, 1.5 * nb))
