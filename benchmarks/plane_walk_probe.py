"""Device probe: how long PyTorch's NCHW interpolation kernels take per (sample, channel) plane they walk.
Their CUDA kernel for contiguous (NCHW) data gives each thread one output position and loops over every
plane in turn, so a grid as small as the output's spatial size makes batch x channels dependent steps.

Usage (on a GPU): python3 benchmarks/plane_walk_probe.py --out OUT.jsonl
One row per (op, input shape, scale, dtype): the median time of the call alone on cold inputs (one of several
sets together at least 3x L2, untouched since last used) and on warm ones (the input written by a multiply
right before it), each timed between CUDA events queued behind a spin; the output positions (threads), the
1024-thread blocks they make and the planes walked. Clocks are left as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from l2_reuse_probe import _time_ms, probe_setup, write_timed_rows  # noqa: E402  (the same timing: alone, behind a spin)

THREADS_PER_BLOCK = 1024   # the kernels' launch: min(maxThreadsPerBlock, 1024)
MAX_SET_BYTES = 1 << 30    # input and output of one call
# mode: (F.interpolate mode, spatial dims)
MODES = {"bilinear": ("bilinear", 2), "bicubic": ("bicubic", 2), "linear": ("linear", 1),
         "trilinear": ("trilinear", 3)}
# (mode, planes as (batch, channels), input side, scale): 2-D sides 7-512 make 1-1024 blocks of positions;
# planes 64-32768 are the steps each thread walks.
CASES = ([("bilinear", planes, side, 2) for side in (7, 14, 32, 64, 128)
          for planes in ((1, 64), (8, 512), (32, 1024))]
         + [("bilinear", (1, 64), 512, 2), ("bilinear", (4, 64), 512, 2), ("bilinear", (16, 21), 64, 8),
            ("bicubic", (8, 512), 14, 2), ("bicubic", (8, 512), 64, 2),
            ("linear", (8, 512), 1024, 2), ("trilinear", (4, 64), 8, 2)])


def main() -> None:
    out, dev, l2 = probe_setup(__doc__)
    rows = []
    for mode, (n, c), side, scale in CASES:
        how, dims = MODES[mode]
        for dtype in ("float32", "bfloat16"):
            dt = getattr(torch, dtype)
            shape = (n, c, *[side] * dims)
            in_bytes = n * c * side ** dims * dt.itemsize
            if in_bytes * (1 + scale ** dims) > MAX_SET_BYTES:
                continue
            count = max(2, -(-3 * l2 // in_bytes) + 1) if in_bytes < 3 * l2 else 2
            sets = [torch.rand(shape, device=dev, dtype=dt) for _ in range(count)]

            def call(x, how=how, scale=scale):
                return F.interpolate(x, scale_factor=scale, mode=how, align_corners=False)
            cold = _time_ms(lambda x: None, call, sets) * 1e3
            warm = _time_ms(lambda x: x.mul_(1.0), call, sets[:1]) * 1e3
            positions = (side * scale) ** dims
            rows.append({"mode": mode, "shape": list(shape), "scale": scale, "dtype": dtype,
                         "input_mb": in_bytes / 2 ** 20, "output_mb": in_bytes * scale ** dims / 2 ** 20,
                         "l2_mb": l2 / 2 ** 20, "positions": positions,
                         "blocks": -(-positions // THREADS_PER_BLOCK), "planes": n * c,
                         "cold_us": cold, "warm_us": warm})
            del sets
    write_timed_rows(out, rows, dev, sm_count=torch.cuda.get_device_properties(dev).multi_processor_count)
    for r in rows:
        print(f"{r['mode']:9s} {str(r['shape']):22s} x{r['scale']} {r['dtype']:8s} {r['blocks']:5d} blocks "
              f"{r['planes']:6d} planes: cold {r['cold_us']:9.1f} us ({r['cold_us'] / r['planes']:.3f}/plane), "
              f"warm {r['warm_us']:9.1f} us ({r['warm_us'] / r['planes']:.3f}/plane)")


if __name__ == "__main__":
    main()
