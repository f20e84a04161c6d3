"""How the shipped profile prices measured rows it was not fitted on (a device run not yet merged and refitted).

    PYTHONPATH=. python3 benchmarks/unfitted_rows.py data/calibration/pending/H100-SXM.session50.jsonl.gz \
        data/calibration/H100-SXM.jsonl

Rows of the first file whose benchmark names the second (the data the shipped profile of the same GPU was
fitted on) lacks are priced at their measured clock; printed: the median and range of predicted / measured device
time per benchmark family (the name's first two words).
"""
from __future__ import annotations

import argparse

import numpy as np

from gpuest.calibrate.calibration_rows import row_clock
from gpuest.calibrate.fit import load_raw, measured_device_s, rows_node_table, usable
from gpuest.catalog import get_gpu
from gpuest.price.device_time import device_times
from gpuest.profile import shipped_profiles


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 benchmarks/unfitted_rows.py", description=__doc__.split("\n")[0])
    ap.add_argument("new", help="calibration JSONL (.gz) with the new rows")
    ap.add_argument("fitted", help="the calibration JSONL the shipped profile was fitted on")
    args = ap.parse_args(argv)
    new = load_raw(args.new)
    gpu = get_gpu(str(new.meta.get("catalog_gpu") or new.meta.get("gpu_name")))
    seen = {r.get("name") for r in load_raw(args.fitted).rows}
    rows = [r for r in usable(new.rows) if r.get("name") not in seen]
    profile = shipped_profiles()[gpu.name]
    ratios: dict[str, list[float]] = {}
    for r in rows:
        table, _ = rows_node_table([r])
        times, _ = device_times(table, gpu, row_clock(r, gpu), profile)
        family = "_".join(str(r["name"]).split("_")[:2])
        ratios.setdefault(family, []).append(float(times.device_s.sum()) / measured_device_s(r))
    print(f"{gpu.name}: {len(rows)} rows the shipped profile was not fitted on")
    for family, v in sorted(ratios.items()):
        a = np.array(v)
        print(f"{family:16s} n={len(a):3d}  predicted/measured median {np.median(a):.2f}, range {a.min():.2f}-{a.max():.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
