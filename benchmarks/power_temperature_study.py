"""Study: does board temperature explain what the power fit leaves over, and would a thermal feedback widen
networks' predicted power as their measurements are wide?

    python3 benchmarks/power_temperature_study.py [--gpu H100-SXM] [--accuracy docs/ACCURACY.md]

Prints, for the calibration windows the power fit uses (gpuest.calibrate.fit_power.window_utilisations):
1. the residual of the shipped power fit by the window's recorded temperature;
2. the same least squares with a temperature term added (W per degree C) and its rmse beside the shipped
   form's;
3. temperature against power over the windows (degrees C per W), and the steady-state gain
   1 / (1 - k R) that a feedback with both slopes would put on a network's power about a pivot;
4. from the accuracy report's per-config rows, non-test GPU-bound configs' measured against predicted
   average power (energy over wall time): slope and intercept of a least-squares line.

A window's temperature follows from the power of the windows before it as much as it sets its own, so
the fitted slope mixes leakage with that history: a study, not a fit the profiles use.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuest.calibrate.fit import load_raw, usable  # noqa: E402
from gpuest.calibrate.fit_power import power_design, power_window_rows, window_utilisations  # noqa: E402
from gpuest.catalog import get_gpu  # noqa: E402
from gpuest.jsonl import read_jsonl  # noqa: E402
from gpuest.price.power import COMPUTE_UNITS, unit_coefficients_w  # noqa: E402
from gpuest.profile import load_profile as _load_profile  # noqa: E402

REFERENCE_C = 50.0   # temperature the temperature term is centred on (degrees C)
PROFILES = Path("gpuest/profiles")


def load_profile(gpu_name: str):
    return _load_profile(PROFILES / f"{gpu_name}.json")


def _test_keys() -> set[str]:
    """Config keys the validation rows mark as of the frozen test split."""
    return {r["key"] for path in sorted(Path("data/validation").glob("*.jsonl*")) for r in read_jsonl(path)
            if r.get("split") == "test" and r.get("key")}


UNIT_SUFFIX = {"s": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "kJ": 1e3, "J": 1.0, "mJ": 1e-3}


def _windows(gpu_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Utilisations, clock scale, measured power (W) and temperature (C) of the windows the fit uses."""
    gpu, power = get_gpu(gpu_name), load_profile(gpu_name).power
    rows = usable(load_raw(Path("data/calibration") / f"{gpu_name}.jsonl").rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u, scale, y = window_utilisations(rows, gpu, power.v_min_ratio)
    temp = np.array([r.get("temperature_c") if isinstance(r.get("temperature_c"), (int, float)) else np.nan
                     for r in power_window_rows(rows)])
    return u, scale, y, temp


def _shipped_power_w(gpu_name: str, u: np.ndarray, scale: np.ndarray) -> np.ndarray:
    gpu, p = get_gpu(gpu_name), load_profile(gpu_name).power
    units = unit_coefficients_w(p)
    coef = np.array([p.static_w, *(units[name] for name in COMPUTE_UNITS), p.memory_w])
    return np.minimum(power_design(u, scale, p.utilisation_exponent) @ coef, gpu.tdp_w)


def _network_power(accuracy_md: Path, gpu_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) average power (W) of the non-test GPU-bound configs of `gpu_name` in the
    accuracy report's per-config table."""
    test = _test_keys()

    def value(cell: str) -> float:
        number, unit = cell.split()
        return float(number) * UNIT_SUFFIX[unit]
    pred, meas = [], []
    for line in accuracy_md.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) < 12 or cells[1] != gpu_name or cells[11] != "yes":
            continue
        if cells[0].strip("`").replace("\\|", "|") in test:
            continue
        try:
            wall_m, wall_p, e_m, e_p = (value(cells[i]) for i in (5, 6, 8, 9))
        except (ValueError, KeyError):
            continue
        pred.append(e_p / wall_p * 1e3)
        meas.append(e_m / wall_m * 1e3)
    return np.array(pred), np.array(meas)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H100-SXM")
    ap.add_argument("--accuracy", default="docs/ACCURACY.md")
    args = ap.parse_args(argv)
    u, scale, y, temp = _windows(args.gpu)
    resid = y - _shipped_power_w(args.gpu, u, scale)
    ok = ~np.isnan(temp)
    print(f"{args.gpu}: {len(y)} windows, {int(ok.sum())} with a temperature; shipped fit rmse "
          f"{np.sqrt((resid ** 2).mean()):.1f} W")
    print("1. shipped fit's residual (measured - predicted) by the window's temperature")
    for lo in range(20, 90, 10):
        band = ok & (temp >= lo) & (temp < lo + 10)
        if band.any():
            print(f"   {lo}-{lo + 10} C: n={int(band.sum()):4d} mean {resid[band].mean():+6.1f} W")
    e = load_profile(args.gpu).power.utilisation_exponent
    x = power_design(u, scale, e)[ok]
    plain = np.linalg.lstsq(x, y[ok], rcond=None)[0]
    with_t = np.linalg.lstsq(np.column_stack([x, temp[ok] - REFERENCE_C]), y[ok], rcond=None)[0]
    rmse = lambda a, c: float(np.sqrt(((y[ok] - a @ c) ** 2).mean()))  # noqa: E731
    k_w_per_c = float(with_t[-1])
    print(f"2. least squares at exponent {e}: rmse {rmse(x, plain):.1f} W without a temperature term, "
          f"{rmse(np.column_stack([x, temp[ok] - REFERENCE_C]), with_t):.1f} W with one of {k_w_per_c:.1f} W/C "
          f"(static {with_t[0]:.0f} W, units {', '.join(f'{c:.0f}' for c in with_t[1:-1])} W)")
    r_c_per_w, ambient_c = np.polyfit(y[ok], temp[ok], 1)
    gain = 1.0 / (1.0 - k_w_per_c * r_c_per_w)
    pivot_w = (REFERENCE_C - ambient_c) / r_c_per_w
    print(f"3. temperature = {ambient_c:.1f} C + {r_c_per_w:.4f} C/W x power; steady-state gain "
          f"1 / (1 - k R) = {gain:.2f} about {pivot_w:.0f} W")
    pred, meas = _network_power(Path(args.accuracy), args.gpu)
    if len(pred) >= 3:
        slope, intercept = np.polyfit(pred, meas, 1)
        print(f"4. non-test GPU-bound configs (n={len(pred)}): measured = {intercept:.0f} W + {slope:.2f} x predicted "
              f"average power; predicted {pred.min():.0f}-{pred.max():.0f} W, measured {meas.min():.0f}-{meas.max():.0f} W")


if __name__ == "__main__":
    main()
