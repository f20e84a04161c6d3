"""Device probe: how batch norm's time scales with the elements each channel reduces, at few and many channels.

The non-test per-op rows show training-mode batch norms of 16-32 channels over batch-256 112x112 planes
(LCNet-100, fp32) priced at 0.66-0.78 of their time, while the suite's batch norms reach at most 0.8 M elements
per channel. Here every channel count of CHANNELS runs over batches and planes of 0.2-3.2 M elements per
channel, in fp32 NCHW, bf16 NCHW and bf16 channels-last: the training forward (cudnn_batch_norm), its backward
and the eval-mode forward, the profiler's kernel time per call and the kernels chosen.

Usage (on a GPU): python3 benchmarks/batch_norm_scaling_probe.py --out OUT.jsonl
One row per (channels, batch, plane, dtype, layout, direction): device time per call (us) and each kernel's
name and time. Clocks are left as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_reuse_probe import probe_setup, write_timed_rows  # noqa: E402
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

CHANNELS = (16, 32, 64, 256)
BATCH_PLANE = ((16, 112), (64, 112), (256, 112), (256, 56), (64, 56))   # (N, H = W)
VARIANTS = ((torch.float32, "nchw"), (torch.bfloat16, "nchw"), (torch.bfloat16, "nhwc"))


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
    out, dev, _ = probe_setup(__doc__)
    rows = []
    for c in CHANNELS:
        for n, hw in BATCH_PLANE:
            for dtype, layout in VARIANTS:
                rows += _rows(c, n, hw, dtype, layout, dev)
    write_timed_rows(out, rows, dev, cudnn_version=torch.backends.cudnn.version())
    for r in rows:
        print(f"c{r['channels']:<4d} n{r['batch']:<4d} hw{r['plane']:<4d} {r['dtype']:8s} {r['layout']:5s} "
              f"{r['direction']:15s} {r['us']:9.1f} us")


if __name__ == "__main__":
    main()
