"""Device probe: how much slower a GEMM runs when one of its dimensions is not a whole number of 16-byte
vectors, against the aligned shape next to it, by which operand's rows it sets, size and math mode. The
residual fit's `misaligned` feature (gpuest/price/features.py) is one flag for any of M, N and K; which of
them matter, and whether the slowdown is a constant factor or shrinks with size, decides what it should be.

The `row_bytes` series adds widths whose 16-bit rows are aligned to 8 bytes (30524, 50260, 2052: whole
16-byte vectors in fp32) and fp16 beside bf16, at three token counts: how the slowdown steps with the row
alignment in bytes, and whether fp16 shares bf16's.

Usage (on a GPU): python3 benchmarks/misaligned_gemm_probe.py [--series row_bytes] --out OUT.jsonl
One row per (mode, pass, tokens, width pair): the median time of a linear layer's forward (addmm, M = tokens,
N = out, K = in), its data gradient (mm, M = tokens, N = in, K = out) and its weight gradient (mm of the
transposed output gradient, M = out, N = in, K = tokens), each on the misaligned shape and on the aligned one
beside it, timed alone between CUDA events queued behind a spin; the GPU's clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

TOKENS = (197, 200, 4095, 4096, 16383, 16384)      # odd and even token counts, in pairs
WIDTHS = ((768, 30522, 30528), (768, 50257, 50304), (2048, 2049, 2048))   # (in, out misaligned, out aligned)
MODES = ("bf16", "fp32", "tf32")
ROW_BYTES_WIDTHS = WIDTHS + ((768, 30524, 30528), (768, 50260, 50304), (2048, 2052, 2048))
SERIES = {"widths": (TOKENS, WIDTHS, MODES),
          "row_bytes": ((200, 4096, 16384), ROW_BYTES_WIDTHS, ("bf16", "fp16", "tf32", "fp32"))}
REPEATS = 20


def _time_ms(fn) -> float:
    """Median ms of fn() alone; every call is queued before one synchronisation behind a spin."""
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPEATS)]
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _passes(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> dict:
    """A linear layer's three GEMMs on input x, weight w, bias b and output gradient g."""
    return {"forward": lambda: F.linear(x, w, b), "data_grad": lambda: g @ w, "weight_grad": lambda: g.t() @ x}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", choices=sorted(SERIES), default="widths")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    token_counts, widths, modes = SERIES[args.series]
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
    rows = []
    for mode in modes:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        dtype = dtypes[mode]
        for tokens in token_counts:
            for fin, out_mis, out_al in widths:
                times = {}
                for out in (out_mis, out_al):
                    x = torch.randn(tokens, fin, device=dev, dtype=dtype)
                    w = torch.randn(out, fin, device=dev, dtype=dtype)
                    b = torch.randn(out, device=dev, dtype=dtype)
                    g = torch.randn(tokens, out, device=dev, dtype=dtype)
                    times[out] = {p: _time_ms(fn) for p, fn in _passes(x, w, b, g).items()}
                    del x, w, b, g
                for p in times[out_mis]:
                    rows.append({"mode": mode, "pass": p, "tokens": tokens, "in": fin, "out": out_mis,
                                 "out_aligned": out_al, "misaligned_us": times[out_mis][p] * 1e3,
                                 "aligned_us": times[out_al][p] * 1e3,
                                 "ratio": times[out_mis][p] / times[out_al][p]})
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "repeats": REPEATS,
            "series": args.series,
            "command": f"python3 benchmarks/misaligned_gemm_probe.py --series {args.series} --out OUT.jsonl"}
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps({**meta, **r}) + "\n")
    for r in rows:
        print(f"{r['mode']:5s} {r['pass']:12s} t{r['tokens']:6d} in{r['in']:5d} "
              f"out{r['out']:6d}/{r['out_aligned']:6d}  "
              f"{r['misaligned_us']:9.1f} / {r['aligned_us']:9.1f} us  {r['ratio']:.2f}")


if __name__ == "__main__":
    main()
