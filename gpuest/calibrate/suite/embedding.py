"""Embedding lookups (`F.embedding`) and their backward (`aten.embedding_dense_backward`) over many
vocabularies, widths and token counts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _gen, _randn


def _embedding(out: list[Benchmark]) -> None:
    for vocab, dim, tokens, mode in [(50257, 768, 8192, "fp32"), (32000, 4096, 8192, "bf16"), (1000, 64, 4096, "fp32"),
                                     (250000, 1024, 2048, "bf16"), (30522, 768, 512 * 32, "fp32"),
                                     (50257, 768, 1, "fp32"),
                                     # more widths, token counts and vocabularies, incl. a tiny vocabulary
                                     # whose backward accumulates many tokens into each row
                                     (30522, 1024, 8192, "bf16"), (50257, 1600, 4096, "bf16"),
                                     (128256, 2048, 4096, "bf16"), (1000, 256, 65536, "fp32"),
                                     (50257, 768, 512, "fp32"), (100, 512, 16384, "bf16"),
                                     (8192, 128, 262144, "fp32"), (32000, 4096, 2048, "fp32"),
                                     # position and token-type tables, short batches (the direct
                                     # backward, <= 3072 indices) and more vocabularies and widths
                                     (512, 768, 8192, "fp32"), (2, 768, 8192, "fp32"), (50257, 768, 16384, "bf16"),
                                     (32000, 4096, 512, "bf16"), (151936, 896, 4096, "bf16"),
                                     (30522, 768, 128, "fp32"), (50257, 1024, 1024, "fp32"),
                                     (10000, 300, 32768, "fp32"), (256000, 2048, 1024, "bf16"),
                                     (1000, 64, 1024, "fp32"), (49408, 512, 77 * 64, "fp32"),
                                     (65024, 4544, 2048, "bf16")]:
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
