"""Kernel facts: what an accumulating index_put costs as the number of indices grows, for a fixed target.

The backward of a token gather (an MoE expert's `hidden[token_idx]`) is `zeros(rows, width).index_put_(
[idx], grad, accumulate=True)` with from a handful to thousands of indices into a table of rows. CUDA sorts
the indices and walks each run of equal ones; the calibration suite's benchmarks all have at least one
index per target row. This prints the device time per call (CUDA events, gpuest.calibrate.timing) of
in-place and out-of-place accumulating index_put over a range of index counts, with the main kernels of
one call (torch.profiler):

    python3 benchmarks/index_put_facts.py      (on a GPU)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402
from gpuest.calibrate.timing import time_op  # noqa: E402

ROWS, WIDTH = 1024, 1024
COUNTS = (1, 3, 16, 64, 256, 1024, 4096, 16384, 65536)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, dt in DTYPES.items():
        for n in COUNTS:
            idx = torch.randint(0, ROWS, (n,), device=dev, generator=gen)
            values = torch.randn(n, WIDTH, device=dev, dtype=dt, generator=gen)
            base = torch.zeros(ROWS, WIDTH, device=dev, dtype=dt)
            inplace = time_op(lambda b, i, v: b.index_put_([i], v, True), [(base, idx, values)], device=dev)
            outplace = time_op(lambda b, i, v: torch.ops.aten.index_put(b, [i], v, True), [(base, idx, values)],
                               device=dev)
            kernels, _ = profile_kernels(lambda: base.index_put_([idx], values, True))
            top = ", ".join(f"{k['name'][:48]} {k['us_per_iter']:.1f}" for k in kernels[:4])
            print(f"{name} rows {ROWS} width {WIDTH} indices {n:6d}: in-place {inplace.median_ms * 1e3:8.1f} us, "
                  f"out-of-place {outplace.median_ms * 1e3:8.1f} us | {len(kernels)} kernels: {top}", flush=True)


if __name__ == "__main__":
    main()
