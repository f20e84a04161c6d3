"""Device probe: how batch norm's time scales with the elements each channel reduces, at few and many channels.

The non-test per-op rows show training-mode batch norms of 16-32 channels over batch-256 112x112 planes
(LCNet-100, fp32) priced at 0.66-0.78 of their time, while the suite's batch norms reach at most 0.8 M elements
per channel. Here every channel count of CHANNELS runs over batches and planes of 0.2-3.2 M elements per
channel, in fp32 NCHW, bf16 NCHW and bf16 channels-last: the training forward (cudnn_batch_norm), its backward
and the eval-mode forward, the profiler's kernel time per call and the kernels chosen.

The `channels` series holds the elements per channel and sweeps the channel count instead (64-1024 channels
over 7x7-56x56 planes, fp32 and bf16 NCHW): the non-test bf16-mixed training rows price NCHW backward batch
norms of hundreds of channels over 14x14 and 28x28 planes at 0.5-0.8 of their time, and so does the suite's one
held-out row of that kind (512 channels, 28x28), while fewer channels are priced within 10 %.

Usage (on a GPU): python3 benchmarks/batch_norm_scaling_probe.py [--series channels] --out OUT.jsonl
One row per (channels, batch, plane, dtype, layout, direction): device time per call (us) and each kernel's
name and time. Clocks are left as found.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_reuse_probe import write_timed_rows  # noqa: E402
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

CHANNELS = (16, 32, 64, 256)
BATCH_PLANE = ((16, 112), (64, 112), (256, 112), (256, 56), (64, 56))   # (N, H = W)
VARIANTS = ((torch.float32, "nchw"), (torch.bfloat16, "nchw"), (torch.bfloat16, "nhwc"))
# The channels series: channel counts around 1-8 blocks per SM of a 132-SM GPU, at four (N, H = W).
CHANNEL_SWEEP = (64, 128, 192, 264, 396, 528, 672, 1024)
SWEEP_BATCH_PLANE = ((256, 7), (256, 14), (128, 28), (32, 56))
SWEEP_VARIANTS = ((torch.float32, "nchw"), (torch.bfloat16, "nchw"))
SERIES = {"planes": (CHANNELS, BATCH_PLANE, VARIANTS), "channels": (CHANNEL_SWEEP, SWEEP_BATCH_PLANE, SWEEP_VARIANTS)}


def _rows(c: int, n: int, hw: int, dtype: torch.dtype, layout: str, dev: torch.device) -> list[dict]:
    x = torch.randn(n, c, hw, hw, device=dev, dtype=dtype)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    bn = torch.nn.BatchNorm2d(c).to(dev)
    x.requires_grad_(True)
    y = bn.train()(x)
    gy = torch.randn_like(y)
    steps = {"train_forward": lambda: bn.train()(x),
             "train_backward": lambda: torch.autograd.grad(bn.train()(x), (x, bn.weight, bn.bias), gy),
             "eval_forward": lambda: bn.eval()(x.detach())}
    rows = []
    for direction, step in steps.items():
        kernels, _ = profile_kernels(step, iters=5)
        rows.append({"channels": c, "batch": n, "plane": hw, "elements_per_channel": n * hw * hw,
                     "dtype": str(dtype).split(".")[-1], "layout": layout, "direction": direction,
                     "us": round(sum(k["us_per_iter"] for k in kernels), 2),
                     "kernels": [[k["name"][:120], k["us_per_iter"]] for k in kernels[:6]]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", choices=sorted(SERIES), default="planes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    channels, batch_planes, variants = SERIES[args.series]
    rows = []
    for c in channels:
        for n, hw in batch_planes:
            for dtype, layout in variants:
                rows += _rows(c, n, hw, dtype, layout, dev)
    write_timed_rows(out=args.out, rows=rows, device=dev, cudnn_version=torch.backends.cudnn.version(),
                     series=args.series)
    for r in rows:
        print(f"c{r['channels']:<4d} n{r['batch']:<4d} hw{r['plane']:<4d} {r['dtype']:8s} {r['layout']:5s} "
              f"{r['direction']:15s} {r['us']:9.1f} us")


if __name__ == "__main__":
    main()
