"""In-sample error of a time-only profile by refit pass at power-capped clocks (gpuest.calibrate.fit).

    PYTHONPATH=. python3 benchmarks/power_clock_passes.py T4 P4

For each GPU with imported public data (data/calibration/external/), the median |predicted / measured - 1| per
category of its own profile fitted with 0 (the max clock), 1, 2, 3 and 5 passes, each priced as
benchmarks/cross_gpu.py prices it (at the clock the TDP holds each benchmark to); and the static power at its
max clock of the power model it borrows, against its TDP.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import gpuest.calibrate.fit as fit
from gpuest.catalog import get_gpu
from gpuest.price.profile_choice import ProfileChoice, with_power

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cross_gpu import EXTERNAL, device_rows, predicted_s  # noqa: E402

PASSES = (0, 1, 2, 3, 5)


def pass_errors(gpu: str) -> list[str]:
    """One line per pass count: the median in-sample error (%) of each category."""
    raw = fit.load_raw(EXTERNAL / f"{gpu}.jsonl.gz")
    rows, table, owner, measured = device_rows(gpu)
    cats = np.array([r["category"] for r in rows])
    borrowed = with_power(ProfileChoice(fit.fit_profile(raw, passes=0), "measured", "")).profile.power
    spec = get_gpu(gpu)
    lines = [f"{gpu}: the borrowed power model's static power at its max clock is {borrowed.static_w:.0f} W "
             f"(TDP {spec.tdp_w:.0f} W)"]
    for passes in PASSES:
        profile = fit.fit_profile(raw, passes=passes)
        err = np.abs(predicted_s(table, owner, len(rows), gpu, profile) / measured - 1) * 100
        cells = ", ".join(f"{c} {np.median(err[cats == c]):.1f} %" for c in sorted(set(cats)))
        lines.append(f"{gpu} passes {passes}: {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 benchmarks/power_clock_passes.py", description=__doc__.split("\n")[0])
    ap.add_argument("gpus", nargs="+", help="GPUs with data/calibration/external/<GPU>.jsonl.gz")
    for gpu in ap.parse_args(argv).gpus:
        print("\n".join(pass_errors(gpu)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
