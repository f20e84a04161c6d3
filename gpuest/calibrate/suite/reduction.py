"""Reductions (category "reduction"): sums, means and maxima along rows and columns and over whole
tensors, column sums (linear layers' bias gradients), and softmax / log-softmax forward and backward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _channels_last, _d, _est, _fwd_bwd, _randn, _simple
from .shape_tables import shape_column, shape_table


def _reduction(out: list[Benchmark]) -> None:
    shapes = shape_table("reduction", "rows_and_columns")
    both_dims = shape_table("reduction", "both_dims")
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
    for mode in ("fp32", "bf16"):
        for opname, fn in {"sum": torch.sum, "mean": torch.mean}.items():
            for n in shape_column("reduction", "whole_tensor"):
                def build_all(device: torch.device, seed: int, n=n, fn=fn, dt=DTYPES[mode]) -> Built:
                    return _simple(lambda x: fn(x), [(_d(n, device, 1024),)], [dt])(device, seed)
                out.append(Benchmark(f"reduce_{opname}_all_{mode}_n{n}", "reduction",
                                     {"op": opname, "dtype": mode, "numel": n}, build_all,
                                     est_ms=_est(n, DTYPES[mode].itemsize * n)))
    for mode in ("fp32", "bf16"):
        for r, c in shape_table("reduction", "column_sums"):
            _colsum(out, mode, r, c)
    # softmax / log_softmax forward and backward (category "reduction" in the estimator)
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for opname, fn in {"softmax": F.softmax, "log_softmax": F.log_softmax}.items():
            for r, c in shape_table("reduction", "softmax", "softmax_odd_rows", "softmax_vocabulary"):
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
    rows (eager attention: 1024, 577 and 256 keys), and narrow column sums over many tokens."""
    for opname, fn in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}.items():
        for r, c in shape_table("reduction", "bf16_rows"):
            def build(device: torch.device, seed: int, r=r, c=c, fn=fn) -> Built:
                return _simple(lambda x: fn(x, -1), [(_d(r, device), _d(c, device))], [torch.bfloat16])(device, seed)
            out.append(Benchmark(f"reduce_{opname}_bf16_{r}x{c}_dim-1", "reduction",
                                 {"op": opname, "dtype": "bf16", "rows": r, "cols": c, "dim": -1}, build,
                                 est_ms=_est(r * c, 2.0 * r * c)))
    for mode in ("fp32", "bf16"):
        for r, c in shape_table("reduction", "column_sums_more"):
            _colsum(out, mode, r, c)
    for mode in ("fp32", "bf16"):
        for r, c in shape_table("reduction", "attention_softmax"):
            _softmax_rows(out, mode, r, c)
    for mode, r, c in shape_table("reduction", "window_softmax"):
        _softmax_rows(out, mode, r, c)
    for mode in ("fp32", "bf16"):
        for r, c in shape_table("reduction", "column_sums_narrow"):
            _colsum(out, mode, r, c)
    for mode in ("fp32", "bf16"):
        for batch, branches, c, hw in shape_table("reduction", "branch_sums"):
            for last in (False, True):
                _branch_sum(out, mode, batch, branches, c, hw, last)


def _branch_sum(out: list[Benchmark], mode: str, batch: int, branches: int, c: int, hw: int, last: bool) -> None:
    """The sum over the branches of a split-attention block: a (batch, branches * c, hw, hw) activation viewed
    as (batch, branches, c, hw, hw) and summed over dim 1 (a row of `branches` elements a plane or, on
    channels-last data, c elements apart)."""
    dt = DTYPES[mode]
    shape = (batch, branches * c, hw, hw)

    def build(device: torch.device, seed: int) -> Built:
        b, k, ch, side = (_d(v, device) for v in (batch, branches, c, hw))
        return _simple(lambda x: x.reshape(b, k, ch, side, side).sum(1), [(b, k * ch, side, side)], [dt])(device, seed)
    numel = batch * branches * c * hw * hw
    out.append(Benchmark(f"branchsum_{mode}_{'x'.join(map(str, shape))}_k{branches}" + ("_nhwc" if last else ""),
                         "reduction", {"op": "sum", "dtype": mode, "shape": list(shape), "branches": branches,
                                       **({"memory_format": "channels_last"} if last else {})},
                         _channels_last(build, (0,)) if last else build,
                         est_ms=_est(numel, dt.itemsize * numel * (1 + 1 / branches))))


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
