"""GEMMs: torch.mm over square, awkward, skinny, prefill-sized and rectangular shapes, linear layers' weight
gradients and shapes with a tiny inner dimension, nn.Linear (addmm with bias), and batched GEMMs, each in bf16,
fp16, tf32 and fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _simple
from .shape_tables import shape_column, shape_table


def _matmul(out: list[Benchmark]) -> None:
    mm_shapes = ([(s, s, s) for s in shape_column("matmul", "square")]
                 + shape_table("matmul", "awkward", "skinny", "prefill", "rectangular", "weight_gradients",
                               "tiny_inner")
                 + [(tokens, fin, fout) for tokens, fin, fout in shape_table("matmul", "misaligned_widths")])
    # fp32 (SIMT) GEMMs of prefill size reach a median 65 % of peak where weight gradients filling as many
    # tiles per SM reach 74 % (python3 benchmarks/kernel_facts.py); the fit's features cannot tell them apart
    # yet, and with them it priced fp32 weight gradients slower (data/calibration/experiments/prefill_fp32.*).
    tensor_core_only = set(shape_table("matmul", "prefill"))
    for mode in ("bf16", "fp16", "tf32", "fp32"):
        dt = DTYPES[mode]
        shapes = mm_shapes
        if mode == "fp32":  # slow fp32 FMA: skip the largest
            shapes = [s for s in shapes if s[0] * s[1] * s[2] <= 2 * 4096 ** 3 and s not in tensor_core_only]
        for m, n, k in shapes:
            fl = 2.0 * m * n * k
            nb = (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, m=m, n=n, k=k, dt=dt) -> Built:
                a_shape, b_shape = (_d(m, device), _d(k, device)), (_d(k, device), _d(n, device))
                return _simple(torch.mm, [a_shape, b_shape], [dt, dt])(device, seed)
            out.append(Benchmark(f"mm_{mode}_m{m}_n{n}_k{k}", "matmul", {"op": "mm", "dtype": mode, "m": m, "n": n,
                                                                          "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        for tokens, fin, fout in shape_table("matmul", "linear", "tiny_linear", "misaligned_widths",
                                                 "short_sequence_linear"):
            fl = 2.0 * tokens * fin * fout
            nb = (tokens * fin + fin * fout + tokens * fout) * dt.itemsize

            def build(device: torch.device, seed: int, t=tokens, fi=fin, fo=fout, dt=dt) -> Built:
                shapes = [(_d(t, device), _d(fi, device)), (_d(fo, device), _d(fi, device)), (_d(fo, device),)]
                return _simple(F.linear, shapes, [dt] * 3)(device, seed)
            out.append(Benchmark(f"linear_{mode}_t{tokens}_in{fin}_out{fout}", "matmul",
                                 {"op": "linear", "dtype": mode, "tokens": tokens, "in": fin, "out": fout}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        for b, m, n, k in shape_table("matmul", "batched", "batched_linear", "tiny_batched", "explicit_attention"):
            fl = 2.0 * b * m * n * k
            nb = b * (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, b=b, m=m, n=n, k=k, dt=dt) -> Built:
                shapes = [(_d(b, device, 4), _d(m, device), _d(k, device)),
                          (_d(b, device, 4), _d(k, device), _d(n, device))]
                return _simple(torch.bmm, shapes, [dt, dt])(device, seed)
            out.append(Benchmark(f"bmm_{mode}_b{b}_m{m}_n{n}_k{k}", "matmul",
                                 {"op": "bmm", "dtype": mode, "batch": b, "m": m, "n": n, "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
