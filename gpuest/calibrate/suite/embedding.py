"""Embedding lookups (`F.embedding`) and their backward (`aten.embedding_dense_backward`) over many
vocabularies, widths and token counts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _gen, _randn
from .shape_tables import shape_table


def _embedding(out: list[Benchmark]) -> None:
    for vocab, dim, tokens, mode in shape_table("embedding", "lookups", "lookups_more", "position_and_short"):
        dt = DTYPES[mode]
        nb = tokens * dim * dt.itemsize * 2

        def build_fwd(device: torch.device, seed: int, vocab=vocab, dim=dim, tokens=tokens, dt=dt) -> Built:
            v, d = _d(vocab, device, 64), _d(dim, device)

            def make_set(i: int) -> tuple:
                idx = torch.randint(0, v, (_d(tokens, device),), device=device, generator=_gen(device, seed, i))
                return idx, _randn((v, d), dt, device, seed, 100 + i)
            return Built(F.embedding, make_set)

        def build_bwd(device: torch.device, seed: int, vocab=vocab, dim=dim, tokens=tokens, dt=dt) -> Built:
            v, d = _d(vocab, device, 64), _d(dim, device)

            def make_set(i: int) -> tuple:
                t = _d(tokens, device)
                idx = torch.randint(0, v, (t,), device=device, generator=_gen(device, seed, i))
                return _randn((t, d), dt, device, seed, 100 + i), idx

            def fn(grad: torch.Tensor, idx: torch.Tensor, v=v) -> torch.Tensor:
                return torch.ops.aten.embedding_dense_backward(grad, idx, v, -1, False)
            return Built(fn, make_set)
        params = {"dtype": mode, "vocab": vocab, "dim": dim, "tokens": tokens}
        tag = f"{mode}_v{vocab}_d{dim}_t{tokens}"
        out.append(Benchmark(f"embedding_fwd_{tag}", "embedding", {"op": "embedding", **params}, build_fwd,
                             est_ms=_est(0, nb)))
        out.append(Benchmark(f"embedding_bwd_{tag}", "embedding", {"op": "embedding_dense_backward", **params},
                             build_bwd, est_ms=_est(0, nb + vocab * dim * 4.0)))
