"""Leave-one-GPU-out on the public kernel timings: how well the other GPUs' time-only profiles price a GPU.

    PYTHONPATH=. python3 benchmarks/cross_gpu.py --out docs/CROSS_GPU.md

For each GPU with imported public data (data/calibration/external/), its device-bound kernels are priced on
that GPU's catalogue spec, at the clock its TDP holds each benchmark to, with (a) each other external GPU's
shipped profile, combined as the geometric mean of their predictions ("others"), (b) the profile automatic
transfer picks today for an uncalibrated GPU ("default"), and (c) its own profile (in-sample, a floor).
Error: |predicted / measured - 1| of the device time, measured = the source's time less the row's host overhead (gpuest.calibrate.import_kernels).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from gpuest.calibrate.fit import load_raw, measured_device_s, row_capped_clocks, rows_node_table
from gpuest.catalog import get_gpu
from gpuest.price.device_time import correction_sources, device_times, effective_math_modes
from gpuest.price.node_table import NodeTable
from gpuest.price.profile_choice import _choose_profile
from gpuest.profile import shipped_profiles
from gpuest.report.document import write_or_print

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ROOT / "data" / "calibration" / "external"


@lru_cache(maxsize=None)   # both tables read every GPU's rows
def device_rows(gpu: str) -> tuple[list[dict], NodeTable, np.ndarray, np.ndarray]:
    """The device-kind rows of a GPU's imported data, one node table of all their nodes, the row index of each
    node and each row's measured device time (s)."""
    rows = [r for r in load_raw(EXTERNAL / f"{gpu}.jsonl.gz").rows if r["kind"] == "device"]
    table, owner = rows_node_table(rows)
    return rows, table, owner, np.array([measured_device_s(r) for r in rows])


def predicted_s(table: NodeTable, owner: np.ndarray, n_rows: int, gpu: str, profile, donors=()) -> np.ndarray:
    """Device time (s) of each row priced on `gpu` with `profile` (and its `donors`) at the clock its TDP holds the
    row's repeated kernel to (gpuest.calibrate.fit.row_capped_clocks; its max clock where it fits), as an
    estimate prices a step."""
    spec = get_gpu(gpu)
    clocks = row_capped_clocks(table, owner, spec, profile, tuple(donors))
    times, _ = device_times(table, spec, clocks, profile, donors=donors)
    return np.bincount(owner, weights=times.device_s, minlength=n_rows)


def correcting_gpus(table: NodeTable, gpu: str, profile, donors) -> list[str]:
    """Per node, the GPUs whose profiles correct it (device_time.correction_sources), joined by '+'."""
    sources = (profile, *donors)
    use = correction_sources(table, effective_math_modes(table, get_gpu(gpu))[0], sources, get_gpu(gpu))
    return ["+".join(p.gpu for p, u in zip(sources, col) if u) for col in use.T]


def errors_table(gpus: list[str]) -> list[str]:
    shipped = shipped_profiles()
    lines = ["| left-out GPU | category | rows | others: median | others: P90 | default transfer | "
             "default: median | own (in-sample): median |", "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    summary, transferred = [], []
    for gpu in gpus:
        rows, table, owner, measured = device_rows(gpu)
        n = len(rows)
        donors = [g for g in gpus if g != gpu]
        logs = np.mean([np.log(predicted_s(table, owner, n, gpu, shipped[d])) for d in donors], axis=0)
        others = np.exp(logs)
        # The same spec under another name: what a GPU without its own profile would get.
        default = _choose_profile(replace(get_gpu(gpu), name=gpu + " (uncalibrated)", aliases=()))
        lenders = tuple(p for p in default.donors if p.gpu != gpu)    # never its own profile
        default_pred = predicted_s(table, owner, n, gpu, default.profile, lenders)
        lender_of_node = np.array(correcting_gpus(table, gpu, default.profile, lenders))
        own = predicted_s(table, owner, n, gpu, shipped[gpu])
        cats = np.array([r["category"] for r in rows])
        for cat in sorted(set(cats)):
            m = cats == cat
            e = lambda pred: np.abs(pred[m] / measured[m] - 1) * 100  # noqa: E731
            used = Counter(lender_of_node[m[owner]].tolist()).most_common(1)[0][0]
            lines.append(f"| {gpu} | {cat} | {int(m.sum())} | {np.median(e(others)):.1f} % | "
                         f"{np.percentile(e(others), 90):.1f} % | {default.profile.gpu}; corrections: {used} | "
                         f"{np.median(e(default_pred)):.1f} % | {np.median(e(own)):.1f} % |")
            summary.append(np.median(e(others)))
            transferred.append(np.median(e(default_pred)))
    lines.append("")
    lines.append(f"Categories at or under the issue's 12 % median aim (others): "
                 f"{sum(s <= 12 for s in summary)} of {len(summary)}; default: {sum(s <= 12 for s in transferred)} of "
                 f"{len(transferred)}. Mean of the per-category medians: others {np.mean(summary):.1f} %, default "
                 f"{np.mean(transferred):.1f} %.")
    return lines


DURATION_BINS_S = (0.03, 0.3)   # kernel time bins of the throttling table: < 30 ms, 30-300 ms, > 300 ms
BIG_GEMM_FLOPS = 2e10           # GEMMs this large run at their sustained rate, past any launch or tail cost


def throttling_table(gpus: list[str]) -> list[str]:
    """Share of the catalogue's fp32 peak that each GPU's large GEMMs reach, by how long one call runs: a card
    that sustains its clock reaches the same share whatever the duration (the source times 25 back-to-back
    calls of each kernel, so a long one loads the card for tens of seconds)."""
    lines = ["| GPU | TDP | GEMMs | share of fp32 peak: < 30 ms | 30-300 ms | > 300 ms |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for gpu in gpus:
        rows, table, owner, measured = device_rows(gpu)
        spec = get_gpu(gpu)
        flops = np.bincount(owner, weights=np.asarray(table.flops, dtype=float), minlength=len(rows))
        big = np.array([r["category"] == "matmul" for r in rows]) & (flops > BIG_GEMM_FLOPS)
        share = flops[big] / measured[big] / (spec.peak_tflops["fp32"] * 1e12)
        bins = np.digitize(measured[big], DURATION_BINS_S)
        cells = [f"{np.median(share[bins == b]):.2f} (n={int((bins == b).sum())})" if (bins == b).any() else "-"
                 for b in range(len(DURATION_BINS_S) + 1)]
        lines.append(f"| {gpu} | {spec.tdp_w:.0f} W | {int(big.sum())} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="markdown file to write (default: print)")
    args = parser.parse_args(argv)
    gpus = sorted(p.name.removesuffix(".jsonl.gz") for p in EXTERNAL.glob("*.jsonl.gz")
                  if p.name.removesuffix(".jsonl.gz") in shipped_profiles())
    text = "\n".join([
        "# Leave-one-GPU-out on public kernel timings", "",
        "Generated by `PYTHONPATH=. python3 benchmarks/cross_gpu.py --out docs/CROSS_GPU.md`; do not edit by hand.", "",
        "Each GPU's imported device-bound fp32 kernels (data/calibration/external/, NeuSight; launch-bound rows "
        "excluded) priced on its catalogue spec at the clock its TDP holds each benchmark to (its max clock where the "
        "benchmark fits; power from the nearest GPU calibrated with power, scaled by full-load power). *others*: geometric mean of the predictions of the "
        "other external GPUs' time-only profiles (none of the left-out GPU's data is used); *default*: what "
        "automatic transfer gives a GPU without calibration: latencies from the nearest GPU calibrated with power, "
        "each node's correction averaged over every other GPU whose profile saw its op or category in its math "
        "mode (the set correcting most of the category's kernels is named); *own*: the GPU's own profile, in-sample, as a "
        "floor. Error = |predicted / measured - 1| of device time (measured = source time less the row's host "
        "overhead).", "",
        *errors_table(gpus), "",
        "Not covered: 16-bit and TF32 tensor-core paths (the public data is fp32 only), backward kernels, power.", "",
        "## Sustained clocks: long kernels run slower on some cards", "",
        "Median share of the catalogue fp32 peak reached by each GPU's large fp32 GEMMs (over "
        f"{BIG_GEMM_FLOPS:.0e} FLOPs), by the time one call takes. A card that holds its clock reaches the same "
        "share at every duration; one whose clock falls under sustained load (power or temperature) reaches "
        "less on long calls, and one capped from the first call reaches little at any duration. Time-only "
        "profiles are fitted at the clocks the TDP holds each benchmark to (gpuest.calibrate.fit.fit_profile), "
        "so what their corrections carry of their own cards' throttling is what the power model misses.", "",
        *throttling_table(gpus),
    ]) + "\n"
    write_or_print(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
