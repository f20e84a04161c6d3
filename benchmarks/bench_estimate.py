"""Speed targets of the estimator (issue: estimate <= 50 ms on a traced resnet50 training graph,
compare over 15 GPUs <= 0.5 s). Run: python3 benchmarks/bench_estimate.py"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torchvision

import gpuest

TARGET_ESTIMATE_S = 0.050
TARGET_COMPARE_S = 0.5


def best_of(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> int:
    with torch.device("meta"):
        model = torchvision.models.resnet50()
    t0 = time.perf_counter()
    g = gpuest.trace(model, (torch.empty(64, 3, 224, 224, device="meta"),), mode="training",
                        precision="bf16-mixed", name="resnet50", batch=64)
    trace_s = time.perf_counter() - t0
    gpuest.estimate(g, "H100")  # first call builds the node table (cached per graph)
    est_best, est_med = best_of(lambda: gpuest.estimate(g, "H100"))
    gpus = [s.name for s in gpuest.list_gpus()][:15]
    cmp_best, cmp_med = best_of(lambda: gpuest.compare(g, gpus), repeats=3)
    print(f"trace resnet50 training b64 (bf16-mixed): {trace_s * 1e3:.0f} ms, {g.number_of_nodes()} nodes")
    print(f"estimate on H100: best {est_best * 1e3:.1f} ms, median {est_med * 1e3:.1f} ms "
          f"(target <= {TARGET_ESTIMATE_S * 1e3:.0f} ms)")
    print(f"compare over {len(gpus)} GPUs: best {cmp_best * 1e3:.0f} ms, median {cmp_med * 1e3:.0f} ms "
          f"(target <= {TARGET_COMPARE_S * 1e3:.0f} ms)")
    ok = est_med <= TARGET_ESTIMATE_S and cmp_med <= TARGET_COMPARE_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
