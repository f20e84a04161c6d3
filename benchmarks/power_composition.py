"""How the error of predicted average power follows what a step's time is made of: every non-test GPU-bound
validation config is traced and priced with its GPU's shipped profile, and log(predicted / measured average
power) is set against the share of its predicted device time in memory-bound, compute-bound and latency- or
host-bound nodes. Test-split models are left out (gpuest.evaluate.validation_set).

    python3 benchmarks/power_composition.py --out docs/POWER_COMPOSITION.md [-j 2]    (no GPU; about 8 min)
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuest.evaluate.accuracy import GPU_BOUND_FRACTION, load_results, trace_config, trace_key  # noqa: E402
from gpuest.evaluate.validation_set import test_split_models  # noqa: E402

VALIDATION = ["data/validation/H100-SXM-full.jsonl", "data/validation/H100-SXM-train-b1.jsonl",
              "data/validation/H200-full.jsonl", "data/validation/H200-train-b1.jsonl",
              "data/validation/H100-SXM-generalisation.jsonl", "data/validation/H200-generalisation.jsonl",
              "data/validation/H100-SXM-recipes.jsonl", "data/validation/H200-recipes.jsonl",
              "data/validation/H100-SXM-architectures.jsonl.gz", "data/validation/H200-architectures.jsonl.gz",
              "data/validation/H200-families.jsonl.gz", "data/validation/H200-families.run2.jsonl",
              "data/validation/H100-SXM-moe.jsonl.gz"]
SHARE_BINS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 1.01))


def _priced(item: tuple[tuple, list[tuple[str, str, float]]]) -> list[dict]:
    """(key, GPU, measured W, predicted W, time shares by bound) of each config of one trace."""
    from gpuest.price.estimate import estimate
    tkey, configs = item
    warnings.simplefilter("ignore")
    graph = trace_config(*tkey)
    out = []
    for key, gpu, measured_w in configs:
        est = estimate(graph, gpu=gpu)
        t = est.per_node["time_s"].astype(float)
        bound = est.per_node["bound"]
        total = max(float(t.sum()), 1e-12)
        out.append({"key": key, "gpu": gpu, "measured_w": measured_w, "predicted_w": est.avg_power_w,
                    "memory": float(t[bound == "memory"].sum()) / total,
                    "compute": float(t[bound == "compute"].sum()) / total,
                    "latency": float(t[bound.isin(["latency", "host"])].sum()) / total})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args()
    rows, _ = load_results([Path(p) for p in VALIDATION])
    test = test_split_models()
    by_trace: dict[tuple, list] = {}
    for r in rows:
        wall, busy, power = (r.get(k) for k in ("wall_s", "device_busy_s", "avg_power_w"))
        if r.get("model") in test or r.get("split") == "test" or not (wall and busy and power):
            continue
        if busy >= GPU_BOUND_FRACTION * wall:
            by_trace.setdefault(trace_key(r), []).append((r["key"], r["gpu_canonical"], float(power)))
    with ProcessPoolExecutor(args.jobs) as pool:
        priced = [c for group in pool.map(_priced, by_trace.items()) for c in group]
    err = np.array([math.log(c["predicted_w"] / c["measured_w"]) for c in priced])
    lines = ["# Predicted average power by what a step's time is made of", "",
             f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by "
             "`python3 benchmarks/power_composition.py --out docs/POWER_COMPOSITION.md`. Non-test GPU-bound "
             f"validation configs ({len(priced)}), each priced with its GPU's shipped profile. Error: "
             "log(predicted / measured average power); a share: the part of the predicted device time in nodes "
             "of that bound.", "",
             f"Mean error {err.mean():+.3f}, standard deviation {err.std():.3f}.", "",
             "| share of time | correlation with the error |", "|---|---|"]
    for name in ("memory", "compute", "latency"):
        share = np.array([c[name] for c in priced])
        lines.append(f"| {name}-bound | {np.corrcoef(share, err)[0, 1]:+.2f} |")
    lines += ["", "| memory-bound share | configs | mean error |", "|---|---|---|"]
    memory = np.array([c["memory"] for c in priced])
    for lo, hi in SHARE_BINS:
        sel = (memory >= lo) & (memory < hi)
        lines.append(f"| {lo:.1f}-{min(hi, 1.0):.1f} | {int(sel.sum())} | "
                     + (f"{err[sel].mean():+.3f} |" if sel.any() else "- |"))
    lines += ["", "| config | GPU | measured W | predicted W | memory-bound share |", "|---|---|---|---|---|"]
    for c in sorted(priced, key=lambda c: c["predicted_w"] / c["measured_w"]):
        lines.append(f"| `{c['key'].replace('|', chr(92) + '|')}` | {c['gpu']} | {c['measured_w']:.0f} | "
                     f"{c['predicted_w']:.0f} | {c['memory']:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({len(priced)} configs)")


if __name__ == "__main__":
    main()
