"""K-fold cross-validation of the device-time fit on committed calibration data.

The held-out shapes of the suite (docs/ACCURACY.md) are a few per category; cross-validation scores
every benchmark once, as a benchmark the fit did not see, so it measures the fit's design (features,
pooling, the local correction) on ten times the rows. Folds are fixed by a hash of the benchmark name.

    python3 benchmarks/cross_validate.py                       # both shipped GPUs, 5 folds
    python3 benchmarks/cross_validate.py data/calibration/H200.jsonl --folds 10

Prints the median and 90th-percentile absolute error per category, with the local correction
(estimator.price.local_correction) and without it, and the mean over categories of the medians.
"""
from __future__ import annotations

import argparse
import sys
import warnings
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.fit import (calibration_samples, fit_profile, fit_residual_points,  # noqa: E402
                             fit_residuals, holdout_errors, load_raw)

DEFAULT_DATA = [ROOT / "data/calibration/H100-SXM.jsonl", ROOT / "data/calibration/H200.jsonl"]
MIN_ROWS_SCORED = 5              # categories with fewer cross-validated rows are listed, not averaged


def cross_validate(path: Path, folds: int) -> dict[str, dict[str, list[float]]]:
    """Absolute % errors per category, for the fit with the local correction ("local") and without
    ("regression"), every benchmark scored by the fit of the folds it is not in."""
    raw = load_raw(path)
    cal = calibration_samples(raw)
    base = fit_profile(raw, calibration=cal)
    out: dict[str, dict[str, list[float]]] = {"regression": {}, "local": {}}
    for k in range(folds):
        fold = [replace(s, holdout=zlib.crc32(s.row["name"].encode()) % folds == k) for s in cal.samples]
        residuals = fit_residuals(fold)
        points = fit_residual_points(fold, residuals)
        for name, pts in (("regression", {}), ("local", points)):
            profile = replace(base, residuals=residuals, residual_points=pts)
            errs = holdout_errors(profile, fold, cal.gpu, by_fit=False)
            for cat, e in errs.items():
                out[name].setdefault(cat, []).extend(e)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="*", type=Path, default=DEFAULT_DATA, help="calibration JSONL files")
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    means: dict[str, list[float]] = {"regression": [], "local": []}
    for path in args.data:
        result = cross_validate(path, args.folds)
        print(f"{path.name}: {args.folds}-fold cross-validation, median / p90 absolute error (%)")
        cats = sorted(result["local"])
        print(f"  {'category':12s} {'n':>5s} {'regression':>14s} {'+ local':>14s}")
        for cat in cats:
            cells = []
            for name in ("regression", "local"):
                e = result[name][cat]
                cells.append(f"{np.median(e):5.1f} / {np.percentile(e, 90):5.0f}")
                if len(e) >= MIN_ROWS_SCORED:
                    means[name].append(float(np.median(e)))
            print(f"  {cat:12s} {len(result['local'][cat]):5d} {cells[0]:>14s} {cells[1]:>14s}")
    print(f"mean of category medians (categories with >= {MIN_ROWS_SCORED} rows, all files): "
          f"regression {np.mean(means['regression']):.2f} %, with local correction {np.mean(means['local']):.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
