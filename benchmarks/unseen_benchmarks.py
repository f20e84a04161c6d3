"""How well a profile from a partial calibration prices the suite's benchmarks that run did not measure.

The full calibration data of a GPU holds every benchmark of the suite; a fresh run measured a subset. This
prices every device benchmark of the full data with the fresh profile and with the shipped one and prints,
per (category, dtype) stratum and over all, the median absolute percentage error of the benchmarks the
fresh run did not measure (the shipped profile's figure is in-sample: it was fitted on all of them).

    python3 benchmarks/unseen_benchmarks.py data/calibration/fresh/H100-SXM-quick.run4.profile.json \\
        data/calibration/fresh/H100-SXM-quick.run4.jsonl
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuest.calibrate.fit import load_raw, measured_device_s, rows_node_table  # noqa: E402
from gpuest.catalog import get_gpu  # noqa: E402
from gpuest.jsonl import read_jsonl  # noqa: E402
from gpuest.price.device_time import device_times  # noqa: E402
from gpuest.profile import Profile, load_profile, shipped_profiles  # noqa: E402


def per_row_s(rows: list[dict], gpu: str, profile: Profile) -> np.ndarray:
    """Priced device time (s) of each calibration row: the sum of its nodes at the GPU's max clock."""
    table, owner = rows_node_table(rows)
    spec = get_gpu(gpu)
    times, _ = device_times(table, spec, spec.max_clock_mhz, profile)
    return np.bincount(owner, weights=times.device_s, minlength=len(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", help="the fresh run's profile (gpuest fit of it)")
    p.add_argument("run", help="the fresh run's calibration JSONL: its benchmarks count as seen")
    p.add_argument("--data", default=None, help="full calibration JSONL (default: data/calibration/<GPU>.jsonl)")
    a = p.parse_args(argv)
    fresh = load_profile(a.profile)
    data = Path(a.data) if a.data else ROOT / "data" / "calibration" / f"{fresh.gpu}.jsonl"
    rows = [r for r in load_raw(data).rows if r["kind"] == "device" and r.get("nodes")]
    seen = {r["name"] for r in read_jsonl(a.run)}
    measured = np.array([measured_device_s(r) for r in rows])
    shipped, priced = per_row_s(rows, fresh.gpu, shipped_profiles()[fresh.gpu]), per_row_s(rows, fresh.gpu, fresh)
    unseen = np.array([r["name"] not in seen for r in rows]) & (measured > 0)
    stratum = np.array([f"{r['category']}:{r['params'].get('dtype', '')}" for r in rows])
    ape = lambda pred, m: 100 * np.median(np.abs(pred[m] / measured[m] - 1))  # noqa: E731
    print(f"{fresh.gpu}: {int(unseen.sum())} of {len(rows)} benchmarks not measured by {a.run}")
    print(f"{'stratum':24s} {'unseen':>6s} {'shipped (in-sample)':>20s} {'fresh':>8s}")
    for s in sorted(set(stratum)):
        m = unseen & (stratum == s)
        if m.sum() >= 3:
            print(f"{s:24s} {int(m.sum()):6d} {ape(shipped, m):19.1f}% {ape(priced, m):7.1f}%")
    print(f"{'all':24s} {int(unseen.sum()):6d} {ape(shipped, unseen):19.1f}% {ape(priced, unseen):7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
