"""Does the spin ahead of each queued timing group change what it measures? A/B on the GPU.

Times the same calibration benchmarks with each spin sizing below, interleaved, twice each, and writes one
JSON row per benchmark ([median_ms, inner, discarded groups, samples] per variant and repeat):

    python3 benchmarks/spin_sizing_ab.py --names names.txt --out spin_ab.jsonl    # on the GPU
    python3 benchmarks/spin_sizing_ab.py --summary data/calibration/experiments/spin_ab.H100-SXM.jsonl

"fixed" is the spin used before (inner x HOST_US_PER_CALL_BOUND + 100 us); the others size it by the
enqueue time the timing measures itself (SPIN_HOST_MARGIN x enqueue + SPIN_FLOOR_S).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# (SPIN_HOST_MARGIN, SPIN_FLOOR_S): a margin above HOST_US_PER_CALL_BOUND / enqueue picks the fixed bound.
VARIANTS = {"fixed": (1e9, 1e-4), "enqueue_x2": (2.0, 2e-5), "enqueue_x4": (4.0, 5e-5),
            "enqueue_x2_floor100us": (2.0, 1e-4)}


def measure(names: list[str], out: Path) -> None:
    import torch
    from gpuest.calibrate import timing
    from gpuest.calibrate.runner import input_sets
    from gpuest.calibrate.suite import all_benchmarks
    by_name = {b.name: b for b in all_benchmarks()}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"not calibration benchmarks: {', '.join(unknown[:5])}")
    dev = torch.device("cuda", 0)
    l2 = timing.l2_cache_bytes(dev)
    with open(out, "w", encoding="utf-8") as fh:
        for name in names:
            built = by_name[name].build(dev, 0)
            sets, _ = input_sets(built, by_name[name].kind, l2)
            rotate = len(sets)
            row: dict[str, object] = {"name": name, "gpu": torch.cuda.get_device_name(dev)}
            with torch.no_grad():
                for _ in range(2):
                    for variant, (margin, floor_s) in VARIANTS.items():
                        timing.SPIN_HOST_MARGIN, timing.SPIN_FLOOR_S = margin, floor_s
                        r = timing.time_op(built.fn, sets, rotate=rotate, device=dev, warmup=3, repeats=10,
                                           target_total_ms=30.0)
                        row.setdefault(variant, []).append([r.median_ms, r.inner, r.discarded, r.n])
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            sets.clear()
            torch.cuda.empty_cache()


def summary(path: Path) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    lines = [f"{len(rows)} benchmarks ({rows[0].get('gpu', '?')}): each variant's median over 2 repeats / fixed's"]
    for variant in VARIANTS:
        r = np.log([np.median([x[0] for x in row[variant]]) / np.median([x[0] for x in row["fixed"]]) for row in rows])
        rep = np.log([row[variant][1][0] / row[variant][0][0] for row in rows])
        lines.append(f"  {variant:22s} median {np.exp(np.median(r)):.4f}  p10 {np.exp(np.percentile(r, 10)):.4f}  "
                     f"p90 {np.exp(np.percentile(r, 90)):.4f}  repeat-to-repeat {np.exp(np.mean(np.abs(rep))) - 1:.2%}  "
                     f"discarded groups {sum(x[2] for row in rows for x in row[variant])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", type=Path, help="file of benchmark names, one per line (measure on the GPU)")
    p.add_argument("--out", type=Path, help="JSONL to write")
    p.add_argument("--summary", type=Path, help="print the comparison of a measured file")
    a = p.parse_args(argv)
    if a.summary:
        print(summary(a.summary))
        return 0
    if not (a.names and a.out):
        p.error("give --names and --out to measure, or --summary FILE")
    measure(Path(a.names).read_text().split(), a.out)
    print(summary(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
