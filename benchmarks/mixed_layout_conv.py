"""Kernel facts: a convolution whose activation is NCHW while its weight is channels-last (a channels-last model
after an op that returns NCHW, such as group norm), against both layouts matched. Prints each case's CUDA kernels
and device time from the profiler, and the output's memory format.

    python3 benchmarks/mixed_layout_conv.py     (on a GPU)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

CASES = [  # (activation shape, weight shape)
    ((128, 64, 56, 56), (256, 64, 1, 1)),
    ((128, 256, 56, 56), (64, 256, 1, 1)),
    ((128, 64, 56, 56), (64, 64, 3, 3)),
]
LAYOUTS = {"nchw x, nchw w": (False, False), "nhwc x, nhwc w": (True, True), "nchw x, nhwc w": (False, True),
           "nhwc x, nchw w": (True, False)}


def main() -> None:
    cl = torch.channels_last
    for xs, ws in CASES:
        for label, (x_last, w_last) in LAYOUTS.items():
            x = torch.randn(xs, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(ws, device="cuda", dtype=torch.bfloat16)
            x = x.contiguous(memory_format=cl) if x_last else x
            w = w.contiguous(memory_format=cl) if w_last else w
            pad = ws[-1] // 2
            for _ in range(3):
                y = F.conv2d(x, w, padding=pad)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    y = F.conv2d(x, w, padding=pad)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[e.name[:90]] = kernels.get(e.name[:90], 0.0) + e.device_time / 5
            total = sum(kernels.values())
            print(f"x {xs} w {ws} {label}: {total:8.1f} us/call, output channels_last="
                  f"{y.is_contiguous(memory_format=cl) and not y.is_contiguous()}")
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} us  {name}")


if __name__ == "__main__":
    main()
