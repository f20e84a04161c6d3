"""Kernel facts: a convolution whose activation is NCHW while its weight is channels-last (a channels-last model
after an op that returns NCHW, such as group norm), against both layouts matched. Prints each case's CUDA kernels
and device time from the profiler, and the output's memory format.

    python3 benchmarks/mixed_layout_conv.py     (on a GPU)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

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
            kernels, _ = profile_kernels(lambda: F.conv2d(x, w, padding=pad), iters=5)
            y = F.conv2d(x, w, padding=pad)
            print(f"x {xs} w {ws} {label}: {sum(k['us_per_iter'] for k in kernels):8.1f} us/call, output "
                  f"channels_last={y.is_contiguous(memory_format=cl) and not y.is_contiguous()}")
            for k in kernels:
                print(f"    {k['us_per_iter']:8.1f} us  {k['name'][:90]}")


if __name__ == "__main__":
    main()
