"""GEMMs: torch.mm over square, awkward, skinny and rectangular shapes and linear layers' weight
gradients, nn.Linear (addmm with bias), and batched GEMMs, each in bf16, fp16, tf32 and fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _simple


def _matmul(out: list[Benchmark]) -> None:
    square = [256, 512, 1024, 2048, 4096, 8192]
    awkward = [(1000, 1000, 1000), (1023, 1023, 1023), (4097, 4097, 4097), (3000, 5000, 2000)]
    skinny = [(1, 4096, 4096), (8, 4096, 4096), (32, 4096, 4096), (1, 11008, 4096), (8, 4096, 11008),
              (32, 1024, 1024), (128, 4096, 4096), (512, 768, 768)]
    rect = [(8192, 1024, 4096), (16384, 4096, 1024), (4096, 50257, 768), (2048, 8192, 8192), (65536, 256, 256)]
    # weight gradients of linear layers (M x N = the weight, K = the tokens): few output tiles, deep K
    wgrad = [(96, 384, 401408), (192, 768, 100352), (384, 1536, 25088), (768, 3072, 6272), (768, 768, 16384),
             (1024, 4096, 8192)]
    for mode in ("bf16", "fp16", "tf32", "fp32"):
        dt = DTYPES[mode]
        shapes = [(s, s, s) for s in square] + awkward + skinny + rect + wgrad
        if mode == "fp32":  # slow fp32 FMA: skip the largest
            shapes = [s for s in shapes if s[0] * s[1] * s[2] <= 2 * 4096 ** 3]
        for m, n, k in shapes:
            fl = 2.0 * m * n * k
            nb = (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, m=m, n=n, k=k, dt=dt) -> Built:
                a_shape, b_shape = (_d(m, device), _d(k, device)), (_d(k, device), _d(n, device))
                return _simple(torch.mm, [a_shape, b_shape], [dt, dt])(device, seed)
            out.append(Benchmark(f"mm_{mode}_m{m}_n{n}_k{k}", "matmul", {"op": "mm", "dtype": mode, "m": m, "n": n,
                                                                          "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        # nn.Linear: addmm with bias, weight transposed (x @ W^T + b).
        # ... and the token-heavy, narrow projections of ConvNeXt-style blocks and large-batch MLPs
        for tokens, fin, fout in [(1, 4096, 4096), (32, 768, 3072), (2048, 768, 3072), (8192, 4096, 4096),
                                  (4096, 1024, 1000), (512, 2048, 2049), (401408, 96, 384), (401408, 384, 96),
                                  (100352, 192, 768), (25088, 1536, 384), (6272, 768, 3072)]:
            fl = 2.0 * tokens * fin * fout
            nb = (tokens * fin + fin * fout + tokens * fout) * dt.itemsize

            def build(device: torch.device, seed: int, t=tokens, fi=fin, fo=fout, dt=dt) -> Built:
                shapes = [(_d(t, device), _d(fi, device)), (_d(fo, device), _d(fi, device)), (_d(fo, device),)]
                return _simple(F.linear, shapes, [dt] * 3)(device, seed)
            out.append(Benchmark(f"linear_{mode}_t{tokens}_in{fin}_out{fout}", "matmul",
                                 {"op": "linear", "dtype": mode, "tokens": tokens, "in": fin, "out": fout}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        for b, m, n, k in [(8, 512, 512, 64), (96, 128, 128, 64), (32, 1024, 1024, 128), (4, 2048, 2048, 2048),
                           (64, 197, 197, 64), (256, 64, 64, 32),
                           # a linear layer on a 3-D activation traces as a batched GEMM against the expanded
                           # weight: a recurrent LM's vocabulary head, sequence-first attention projections
                           (256, 64, 10000, 512), (50, 256, 2304, 768), (197, 64, 2304, 768)]:
            fl = 2.0 * b * m * n * k
            nb = b * (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, b=b, m=m, n=n, k=k, dt=dt) -> Built:
                shapes = [(_d(b, device, 4), _d(m, device), _d(k, device)),
                          (_d(b, device, 4), _d(k, device), _d(n, device))]
                return _simple(torch.bmm, shapes, [dt, dt])(device, seed)
            out.append(Benchmark(f"bmm_{mode}_b{b}_m{m}_n{n}_k{k}", "matmul",
                                 {"op": "bmm", "dtype": mode, "batch": b, "m": m, "n": n, "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
