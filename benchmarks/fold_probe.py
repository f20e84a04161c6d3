"""Device probe: how long ATen's im2col (F.unfold) and col2im (F.fold) kernels take by shape, window and
dtype, against the bytes they move: col2im gives each image element a thread that sums every window
position covering it, reading columns strided by the column count.

Usage (on a GPU): python3 benchmarks/fold_probe.py --out OUT.jsonl
One row per (op, batch, channels, side, kernel, stride, dtype): the median time of the call alone on cold
inputs (one of several sets together at least 3x L2), timed between CUDA events queued behind a spin, and
the bytes it reads and writes. Clocks are left as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from l2_reuse_probe import _time_ms, probe_setup, write_timed_rows  # noqa: E402  (the same timing: alone, behind a spin)

# (batch, channels, side, kernel, stride, padding): outlook-attention-like 3x3 s1 windows, patch-like 2x2 s2
CASES = [(n, c, side, k, s, p) for n in (8, 64) for c in (64, 192) for side in (14, 28, 56)
         for k, s, p in ((3, 1, 1), (2, 2, 0))]


def main() -> None:
    out, dev, l2 = probe_setup(__doc__)
    rows = []
    for n, c, side, k, s, p in CASES:
        for dtype in ("float32", "bfloat16"):
            dt = getattr(torch, dtype)
            image = (n, c, side, side)
            cols = F.unfold(torch.empty(image, device=dev, dtype=dt), k, padding=p, stride=s).shape
            for op, shape, call in (("im2col", image, lambda x: F.unfold(x, k, padding=p, stride=s)),
                                    ("col2im", cols, lambda x: F.fold(x, (side, side), k, padding=p, stride=s))):
                in_bytes = torch.Size(shape).numel() * dt.itemsize
                count = max(2, -(-3 * l2 // in_bytes) + 1)
                sets = [torch.rand(shape, device=dev, dtype=dt) for _ in range(count)]
                out_bytes = torch.Size(cols if op == "im2col" else image).numel() * dt.itemsize
                rows.append({"op": op, "batch": n, "channels": c, "side": side, "kernel": k, "stride": s,
                             "padding": p, "dtype": dtype, "read_mb": in_bytes / 2 ** 20,
                             "written_mb": out_bytes / 2 ** 20, "cold_us": _time_ms(lambda x: None, call, sets) * 1e3})
                del sets
    write_timed_rows(out, rows, dev)
    for r in rows:
        print(f"{r['op']:6s} n{r['batch']:<3d} c{r['channels']:<4d} {r['side']:3d}px k{r['kernel']}s{r['stride']} "
              f"{r['dtype']:8s} {r['read_mb']:8.1f} MB -> {r['written_mb']:8.1f} MB: {r['cold_us']:9.1f} us")


if __name__ == "__main__":
    main()
