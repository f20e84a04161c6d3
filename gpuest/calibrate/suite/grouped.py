"""Grouped GEMMs of mixture-of-experts layers (`torch._grouped_mm`, category "matmul"): the expert
projection forward, and its backward (the data gradient, rows grouped, and the weight gradient, grouped
along K), in bf16: CUDA's one grouped kernel on sm90+. fp32 and fp16 take the per-group fallback, one mm per
group, priced by the mm fits (annotate.formulas.moe); torch's meta kernel, which the backward benchmark's
build uses, takes no fp32."""
from __future__ import annotations

import torch

from .base import DTYPES, Benchmark, _d, _est, _fwd_bwd, _randn
from .shape_tables import shape_table


def _expert_projection(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x (rows, hidden) by each expert's (inter, hidden) weight, transposed as transformers passes it."""
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


def _grouped_gemm(out: list[Benchmark]) -> None:
    mode = "bf16"
    dt = DTYPES[mode]
    for groups, tokens, hidden, inter in shape_table("grouped", "grouped_gemm"):
        params = {"dtype": mode, "groups": groups, "tokens": tokens, "hidden": hidden, "inter": inter}
        fl = 2.0 * tokens * hidden * inter
        nb = (tokens * (hidden + inter) + groups * hidden * inter) * dt.itemsize

        def leaves(device: torch.device, seed: int, i: int, g=groups, t=tokens, h=hidden, n=inter) -> tuple:
            g, rows, h, n = _d(g, device, 2), _d(t // g, device, 8), _d(h, device), _d(n, device)
            offs = torch.arange(1, g + 1, dtype=torch.int32, device=device) * rows
            return (_randn((g * rows, h), dt, device, seed, i * 4), _randn((g, n, h), dt, device, seed, i * 4 + 1),
                    offs)
        _fwd_bwd(out, "grouped_mm", f"{mode}_g{groups}_t{tokens}_h{hidden}_n{inter}", "matmul", "grouped_mm",
                 params, _expert_projection, leaves, 2, _est(fl, nb, mode), _est(2 * fl, 2 * nb, mode))
