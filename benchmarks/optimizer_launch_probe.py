"""Device probe: the same training step with each optimizer implementation `trace` offers (foreach and
for-loop AdamW and SGD), at small batches where the optimizer's host dispatch shows: wall time per step and
device-busy time, to check how gpuest prices the for-loop variants' per-parameter launches.

    PYTHONPATH=. python3 benchmarks/optimizer_launch_probe.py --out OUT.jsonl     (on a GPU)
    python3 benchmarks/optimizer_launch_probe.py --report data/published/H100-SXM.optimizer-launch*.jsonl
        (anywhere: the measured steps against gpuest's H100-SXM predictions, as a Markdown table)

The steps are docs/PUBLISHED.md's BERT-base SQuAD step (batch 8 at 128 tokens, TF32) and ResNet-50 (batch 32,
fp32), built as benchmarks/published.py traces them. Clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published  # noqa: E402
from published_step_probe import measure  # noqa: E402

OPTIMIZER_NAMES = ("adamw", "adamw-forloop", "sgd", "sgd-forloop")


def study_rows() -> list[published.PublishedRow]:
    """The probe's steps: each base row at a small batch, once per optimizer implementation."""
    lam = [r for r in published.ROWS if r.source == "lambda" and r.table.endswith(": H100 80GB SXM5")]
    bert = next(r for r in lam if r.model == "bert_base_squad" and r.precision == "fp32")
    rn50 = next(r for r in lam if r.model == "resnet50" and r.precision == "fp32")
    bases = (replace(bert, batch=8, seq=128), replace(rn50, batch=32))
    return [replace(b, optimizer=o, table=f"optimizer study {b.model} b{b.batch} {o}")
            for b in bases for o in OPTIMIZER_NAMES]


def report(paths: list[str], gpu: str = "H100-SXM") -> str:
    """Markdown: each step's measured wall and device-busy time (ms; median and range over the runs in `paths`)
    against gpuest's prediction on `gpu`."""
    import statistics
    import gpuest
    from gpuest.jsonl import read_jsonl
    measured: dict[str, list[dict]] = {}
    for path in paths:
        for m in read_jsonl(path):
            measured.setdefault(m["table"], []).append(m)
    lines = [f"| step | runs | measured wall ms: median (range) | predicted wall ms | error vs median % "
             "| measured busy ms: median (range) | predicted busy ms |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for row in study_rows():
        runs = measured.get(row.table)
        if not runs:
            continue
        walls = [1e3 * m["step_s"] for m in runs]
        busy = [1e3 * m["device_busy_s"] for m in runs]
        med = statistics.median(walls)
        est = gpuest.estimate(published.trace_row(row), gpu)
        lines.append(f"| {row.table.removeprefix('optimizer study ')} | {len(walls)} | {med:.1f} "
                     f"({min(walls):.1f}-{max(walls):.1f}) | {1e3 * est.time_s:.1f} | "
                     f"{100 * (1e3 * est.time_s / med - 1):+.1f} | "
                     f"{statistics.median(busy):.1f} ({min(busy):.2f}-{max(busy):.2f}) | {1e3 * est.device_time_s:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSONL file to append one row per measured step to (on a GPU)")
    ap.add_argument("--report", nargs="+", help="JSONL files this probe wrote (runs of the same steps): print them "
                    "against gpuest's predictions")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    if not args.out:
        ap.error("give --out (measure) or --report (compare)")
    with open(args.out, "a") as f:
        for row in study_rows():
            rec = {**measure(row), "seq": row.seq}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
