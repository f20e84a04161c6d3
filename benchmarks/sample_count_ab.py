"""Does stopping the timing once the median is known (MEDIAN_REL_PRECISION) change what it measures? A/B on the GPU.

Times a seeded random sample of calibration benchmarks with the sampling that stops at the precision
("adaptive") and with the fixed maximum of samples used before ("max"), interleaved, twice each, and writes
one JSON row per benchmark ([median_ms, samples, wall seconds of the timing] per variant and repeat):

    python3 benchmarks/sample_count_ab.py --sample 160 --out sample_ab.jsonl      # on the GPU
    python3 benchmarks/sample_count_ab.py --summary data/calibration/experiments/sample_ab.H100-SXM.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("max", "adaptive")


def measure(sample: int, seed: int, out: Path) -> None:
    import torch
    from gpuest.calibrate import timing
    from gpuest.calibrate.runner import input_sets
    from gpuest.calibrate.suite import all_benchmarks
    device_benchmarks = sorted((b for b in all_benchmarks() if b.kind == "device"), key=lambda b: b.name)
    chosen = random.Random(seed).sample(device_benchmarks, min(sample, len(device_benchmarks)))
    dev = torch.device("cuda", 0)
    l2 = timing.l2_cache_bytes(dev)
    with open(out, "w", encoding="utf-8") as fh:
        for b in chosen:
            built = b.build(dev, 0)
            sets, _ = input_sets(built, b.kind, l2)
            rotate = len(sets)
            row: dict[str, object] = {"name": b.name, "category": b.category, "gpu": torch.cuda.get_device_name(dev)}
            with torch.no_grad():
                for _ in range(2):
                    for variant in VARIANTS:
                        precision = None if variant == "max" else timing.MEDIAN_REL_PRECISION
                        t0 = time.perf_counter()
                        # the runner's arguments (gpuest.calibrate.runner.measure_benchmark)
                        r = timing.time_op(built.fn, sets, rotate=rotate, device=dev, warmup=3, repeats=10,
                                           target_total_ms=30.0, rel_precision=precision)
                        row.setdefault(variant, []).append([r.median_ms, r.n, round(time.perf_counter() - t0, 5)])
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            sets.clear()
            torch.cuda.empty_cache()


def summary(path: Path) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    med = lambda row, v: np.median([x[0] for x in row[v]])  # noqa: E731
    ratio = np.log([med(row, "adaptive") / med(row, "max") for row in rows])
    lines = [f"{len(rows)} benchmarks ({rows[0].get('gpu', '?')}): adaptive median over 2 repeats / max's: "
             f"median {np.exp(np.median(ratio)):.4f}, p10 {np.exp(np.percentile(ratio, 10)):.4f}, "
             f"p90 {np.exp(np.percentile(ratio, 90)):.4f}, mean |log| {np.mean(np.abs(ratio)):.4f}"]
    for v in VARIANTS:
        rep = np.log([row[v][1][0] / row[v][0][0] for row in rows])
        lines.append(f"  {v:9s} repeat-to-repeat mean |log| {np.mean(np.abs(rep)):.4f}, "
                     f"p90 {np.percentile(np.abs(rep), 90):.4f}; samples median {np.median([x[1] for r in rows for x in r[v]]):.0f}; "
                     f"timing wall {sum(x[2] for r in rows for x in r[v]) / 2:.1f} s per pass")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=160, help="benchmarks drawn from the suite's device benchmarks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSONL to write (measure on the GPU)")
    p.add_argument("--summary", type=Path, help="print the comparison of a measured file")
    a = p.parse_args(argv)
    if a.summary:
        print(summary(a.summary))
        return 0
    if not a.out:
        p.error("give --out to measure, or --summary FILE")
    measure(a.sample, a.seed, a.out)
    print(summary(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
