"""Device probe: how long one multi-tensor (foreach) launch's chunk walk takes per step when its inputs come
from DRAM and when the kernel before it just wrote them (still in L2), as an optimizer step's chain of
foreach ops over a small model's tensors reads them.

Usage (on a GPU): python3 benchmarks/foreach_walk_probe.py --out OUT.jsonl
One row per (op, tensors, elements, dtype): the median time of the foreach call alone on cold inputs (one of
several sets together at least 3x L2, untouched since last used) and on warm ones (every list it reads
written by a foreach multiply right before it), each timed between CUDA events queued behind a spin; the
launches and walk steps gpuest prices for the call (formulas.optimizer.foreach_launches). Clocks are left
as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuest.annotate.formulas.optimizer import foreach_launches, tensors_per_launch  # noqa: E402
from l2_reuse_probe import _time_ms, probe_setup, write_timed_rows  # noqa: E402  (the same timing: alone, behind a spin)
# op: (tensor lists it reads, lists it touches: those read and a new one it writes, whether it takes one
# scalar per tensor, the call)
OPS = {
    "add_scalar": (1, 1, False, lambda a: torch._foreach_add_(a, 1e-8)),
    "mul_scalar": (1, 1, False, lambda a: torch._foreach_mul_(a, 0.999)),
    "sqrt": (1, 2, False, lambda a: torch._foreach_sqrt(a)),
    "lerp": (2, 2, False, lambda a, b: torch._foreach_lerp_(a, b, 0.1)),
    "addcmul": (3, 3, False, lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.001)),
    "addcdiv": (3, 3, True, lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [-1e-3] * len(a))),
}
CASES = [(op, n, numel, dtype) for op in OPS for n, numel in ((8, 65536), (48, 65536), (48, 16384), (24, 262144))
         for dtype in ("float32", "bfloat16")]


def main() -> None:
    out, dev, l2 = probe_setup(__doc__)
    rows = []
    for name, n, numel, dtype in CASES:
        lists, depth, scalar_list, call = OPS[name]
        dt = getattr(torch, dtype)
        set_bytes = lists * n * numel * dt.itemsize
        count = max(2, -(-3 * l2 // set_bytes) + 1)
        sets = [tuple([torch.rand(numel, device=dev, dtype=dt) + 0.5 for _ in range(n)] for _ in range(lists))
                for _ in range(count)]
        packed = foreach_launches([numel] * n, tensors_per_launch(depth, scalar_list))
        cold = _time_ms(lambda s: None, lambda s: call(*s), sets) * 1e3
        warm = _time_ms(lambda s: [torch._foreach_mul_(x, 1.0) for x in s], lambda s: call(*s), sets[:1]) * 1e3
        rows.append({"op": name, "tensors": n, "numel": numel, "dtype": dtype, "set_mb": set_bytes / 2 ** 20,
                     "l2_mb": l2 / 2 ** 20, "launches": packed.launches, "walk_steps": packed.chunk_walks,
                     "cold_us": cold, "warm_us": warm})
        del sets
    write_timed_rows(out, rows, dev)
    for r in rows:
        print(f"{r['op']:10s} {r['tensors']:3d}x{r['numel']:<7d} {r['dtype']:8s} {r['set_mb']:6.1f} MB "
              f"{r['launches']} launches {r['walk_steps']:3d} steps: cold {r['cold_us']:6.1f} us, "
              f"warm {r['warm_us']:6.1f} us")


if __name__ == "__main__":
    main()
