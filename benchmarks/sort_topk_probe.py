"""Device probe: the kernels and time of CUDA's sort and top-k over the lengths and dtypes that routers,
samplers and index bookkeeping give them.

The non-test per-op rows of Qwen2-MoE-0.5B (fp32 inference, data/validation/H200-nontest-perop.run2.jsonl.gz)
show each aten::sort at 67 us and each aten::topk at 13 us, priced as one-pass reductions at 3 and 2.5 us.
Here torch.sort runs over one row of 1 k-4 M elements and over many rows of 8-8192, in int64, int32, fp32 and
bf16, and torch.topk over (rows, experts) router logits and over long rows; the profiler's kernel time per call
and each kernel's name (how many launches the sort takes, and which path: one in-place block sort per row
or a radix sort of several passes).

Usage (on a GPU): python3 benchmarks/sort_topk_probe.py --out OUT.jsonl
One row per (op, rows, length, dtype, k): device time per call (us), launches per call, each kernel's name,
time and launches.
Clocks are left as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_reuse_probe import probe_setup, write_timed_rows  # noqa: E402
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

SORT_ROWS_LENGTHS = ((1, 1024), (1, 4096), (1, 8192), (1, 32768), (1, 262144), (1, 4194304),
                     (2048, 8), (2048, 64), (512, 1024), (64, 4096), (64, 8192), (8, 65536))
SORT_DTYPES = (torch.int64, torch.int32, torch.float32, torch.bfloat16)
TOPK_ROWS_LENGTHS = ((2048, 8), (2048, 60), (8192, 64), (8192, 128), (64, 32000), (1, 1048576))
TOPK_K = (1, 2, 4, 8)


def _sample(rows: int, length: int, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(rows, length, device=dev, dtype=dtype).squeeze(0)
    return torch.randint(0, 64, (rows, length), device=dev, dtype=dtype).squeeze(0)


def _row(op: str, rows: int, length: int, dtype: torch.dtype, k: int, step) -> dict:
    kernels, _ = profile_kernels(step, iters=5)
    return {"op": op, "rows": rows, "length": length, "dtype": str(dtype).split(".")[-1], "k": k,
            "us": round(sum(kn["us_per_iter"] for kn in kernels), 2), "launches": round(sum(kn["calls_per_iter"] for kn in kernels), 2),
            "kernels": [[kn["name"][:120], kn["us_per_iter"], kn["calls_per_iter"]] for kn in kernels[:16]]}


def main() -> None:
    out, dev, _ = probe_setup(__doc__)
    rows = []
    for n_rows, length in SORT_ROWS_LENGTHS:
        for dtype in SORT_DTYPES:
            x = _sample(n_rows, length, dtype, dev)
            rows.append(_row("sort", n_rows, length, dtype, 0, lambda x=x: torch.sort(x, dim=-1)))
            if dtype == torch.int64:
                rows.append(_row("sort_stable", n_rows, length, dtype, 0,
                                 lambda x=x: torch.sort(x, dim=-1, stable=True)))
    for n_rows, length in TOPK_ROWS_LENGTHS:
        for dtype in (torch.float32, torch.bfloat16):
            x = _sample(n_rows, length, dtype, dev)
            for k in TOPK_K:
                rows.append(_row("topk", n_rows, length, dtype, k, lambda x=x, k=k: torch.topk(x, k, dim=-1)))
    write_timed_rows(out, rows, dev)
    for r in rows:
        print(f"{r['op']:12s} {r['rows']:6d} x {r['length']:8d} {r['dtype']:9s} k{r['k']:<2d} "
              f"{r['us']:9.1f} us  {r['launches']:5.1f} launches")


if __name__ == "__main__":
    main()
