"""Kernel facts: the CUDA kernels and device time of the linears and attention of batch-1 transformer inference
(a few dozen to a few hundred tokens), in fp32 and bf16. Prints, per case, every kernel the call launched and
its device time from the profiler, averaged over calls.

    python3 benchmarks/small_gemm_kernels.py     (on a GPU)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

TOKENS = (1, 50, 128, 197, 512)
LINEARS = ((768, 2304), (768, 768), (768, 3072), (3072, 768))     # (in, out) of ViT-B / BERT-base
ATTENTION = ((12, 50, 64), (12, 128, 64), (12, 197, 64))          # (heads, tokens, head dim), batch 1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CALLS = 20
NAME_CHARS = 100    # kernel names printed up to this length


def show(label: str, fn) -> None:
    """Print `fn()`'s kernels (profiled over CALLS calls) and their device time per call."""
    kernels, _ = profile_kernels(fn, iters=CALLS)
    print(f"{label}: {sum(k['us_per_iter'] for k in kernels):8.2f} us/call, {len(kernels)} kernel(s)")
    for k in kernels:
        print(f"    {k['us_per_iter']:8.2f} us  {k['name'][:NAME_CHARS]}")


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} matmul.allow_tf32="
          f"{torch.backends.cuda.matmul.allow_tf32}")
    for dname, dtype in DTYPES.items():
        for t in TOKENS:
            for k, n in LINEARS:
                x = torch.randn(1, t, k, device="cuda", dtype=dtype)
                w = torch.randn(n, k, device="cuda", dtype=dtype)
                b = torch.randn(n, device="cuda", dtype=dtype)
                with torch.no_grad():
                    show(f"linear {dname} tokens {t} in {k} out {n}", lambda: F.linear(x, w, b))
        for h, s, d in ATTENTION:
            q, k_, v = (torch.randn(1, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
            with torch.no_grad():
                show(f"sdpa {dname} heads {h} tokens {s} dim {d}", lambda: F.scaled_dot_product_attention(q, k_, v))


if __name__ == "__main__":
    main()
