"""Every committed validation config priced with the shipped profiles: the numbers a behaviour-preserving
change must leave alone (tests/test_predictions_unchanged.py checks a sample of them; regenerate the file
when a change is meant to move predictions, e.g. a refit).

    python3 -m gpuest.evaluate.fingerprint -o tests/data/prediction_fingerprint.json [-j 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ..price.estimate import estimate
from .accuracy import load_results, trace_config, trace_key

ROOT = Path(__file__).resolve().parents[2]

FILES = ["data/validation/H100-SXM-full.jsonl", "data/validation/H100-SXM-busy-recheck.jsonl",
         "data/validation/H100-SXM-train-b1.jsonl", "data/validation/H200-full.jsonl",
         "data/validation/H200-train-b1.jsonl", "data/validation/H100-SXM-generalisation.jsonl",
         "data/validation/H200-generalisation.jsonl", "data/validation/H100-SXM-moe.jsonl.gz",
         "data/validation/H100-SXM-recipes.jsonl", "data/validation/H200-recipes.jsonl"]
FIELDS = ("device_time_s", "time_s", "energy_j", "avg_power_w", "peak_memory_bytes")


def fingerprint(tkey: tuple, gpus: list[str]) -> dict[str, dict[str, Any]]:
    """{gpu: {field: value}} of one traced config priced on each GPU with its shipped profile."""
    graph = trace_config(*tkey)
    out = {}
    for gpu in gpus:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = estimate(graph, gpu=gpu)
        out[gpu] = {f: getattr(est, f) for f in FIELDS}
    return out


def config_name(tkey: tuple) -> str:
    """model|batch|seq|image_size|mode|precision|optimizer|memory_format, then the measured routing if any."""
    return "|".join(map(str, tkey if tkey[-1] is not None else tkey[:-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="config names (as in the output) to price, else all")
    args = ap.parse_args(argv)
    rows, _ = load_results(ROOT / f for f in FILES)
    groups: dict[tuple, set[str]] = {}
    for row in rows:
        groups.setdefault(trace_key(row), set()).add(row["gpu_canonical"])
    keys = sorted(groups, key=config_name)
    if args.only:
        keys = [k for k in keys if config_name(k) in set(args.only)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(fingerprint, keys, [sorted(groups[k]) for k in keys]))
    args.out.write_text(json.dumps({config_name(k): r for k, r in zip(keys, results)}, indent=1, sort_keys=True)
                        + "\n")
    print(f"{len(keys)} configs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
