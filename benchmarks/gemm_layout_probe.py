"""Device probe: how a GEMM's speed depends on which of its operands are stored with the reduction
dimension (K) contiguous, by math mode and by how many waves its output tiles fill.

A linear layer's three GEMMs store their operands differently: the forward multiplies x by w.t() (both
operands K-major), the data gradient g by w (w is N-major), the weight gradient g.t() by x (both M/N-major).
Hopper's wgmma reads tf32 operands from shared memory K-major only (16-bit ones either way), so which
kernels cuBLAS can run, and how they fill the SMs, may depend on the layout. Here each layout is timed on the
same (M, N, K) at output tile counts around whole waves of the SMs, so that a layout's peak share and its
wave quantisation can be told apart.

Usage (on a GPU): python3 benchmarks/gemm_layout_probe.py --out OUT.jsonl
One row per (mode, layout, M, N, K): the median time of the GEMM alone (misaligned_gemm_probe._time_ms);
the GPU's clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

import torch

from misaligned_gemm_probe import REPEATS, _time_ms

# (M, N): 128-wide output tiles 36, 132, 144 (two shapes), 256, 264, 576 and 1024 of them
OUTPUTS = ((768, 768), (1408, 1536), (768, 3072), (1536, 1536), (2048, 2048), (1024, 4224), (3072, 3072),
           (4096, 4096))
DEPTHS = (16384, 65536)
MODES = ("tf32", "bf16")
# layout: (A stored transposed, B stored transposed); A is M x K, B is K x N
LAYOUTS = {"forward": (False, True), "data_grad": (False, False), "a_transposed": (True, True),
           "weight_grad": (True, False)}


def operands(m: int, n: int, k: int, layout: str, dtype: torch.dtype, dev: torch.device):
    """A (m x k) and B (k x n) stored as `layout` says (a transposed operand is the .t() of a contiguous one)."""
    a_t, b_t = LAYOUTS[layout]
    a = torch.randn(k, m, device=dev, dtype=dtype).t() if a_t else torch.randn(m, k, device=dev, dtype=dtype)
    b = torch.randn(n, k, device=dev, dtype=dtype).t() if b_t else torch.randn(k, n, device=dev, dtype=dtype)
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    dtypes = {"bf16": torch.bfloat16, "tf32": torch.float32}
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "repeats": REPEATS,
            "command": "python3 benchmarks/gemm_layout_probe.py --out OUT.jsonl"}
    with open(args.out, "w") as f:
        for mode in MODES:
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            for m, n in OUTPUTS:
                for k in DEPTHS:
                    for layout in LAYOUTS:
                        a, b = operands(m, n, k, layout, dtypes[mode], dev)
                        us = _time_ms(lambda: torch.mm(a, b)) * 1e3
                        del a, b
                        row = {**meta, "mode": mode, "layout": layout, "m": m, "n": n, "k": k, "us": us,
                               "tflops": 2.0 * m * n * k / us / 1e6}
                        f.write(json.dumps(row) + "\n")
                        print(f"{mode} {layout:12s} {m:5d} {n:5d} {k:6d} {us:9.1f} us {row['tflops']:6.0f} TFLOP/s")
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
