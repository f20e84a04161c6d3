"""The power model's fit: bounded least squares of calibration windows' average power on the utilisation of
each compute unit and of memory (gpuest.price.power), and what a partial run borrows of its shape prior's."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from gpuest.catalog import GPUSpec
from gpuest.price.device_time import device_times
from gpuest.price.node_table import NodeTable
from gpuest.price.power import COMPUTE_UNITS, compute_units, dram_bytes, voltage_ratio
from gpuest.price.profile_choice import roofline_profile
from gpuest.profile import PowerFit, Profile

from .calibration_rows import device_nodes, row_clock

UNIT_LOADED_SHARE = 0.1         # a power window loads a compute unit when it reaches this share of its roof
MIN_UNIT_WINDOWS = 4            # loaded windows a compute unit's own power coefficient needs
POWER_BUSY_FRACTION = 0.8       # device-busy share of a power window's benchmark below which it is host-paced


def busy_through_window(row: dict[str, Any]) -> bool:
    """Whether a benchmark kept the GPU busy through its power window: not one whose host paces it (its
    device-busy time under POWER_BUSY_FRACTION of its elapsed time: cuDNN's RNNs, foreach optimizer
    steps) or whose nodes wait for the host (an output sized by the data). Their windows average busy
    and idle power over gaps the regression on utilisation cannot see."""
    busy, elapsed = row.get("busy_ms"), row.get("time_ms_median")
    if isinstance(busy, (int, float)) and isinstance(elapsed, (int, float)) and busy < POWER_BUSY_FRACTION * elapsed:
        return False
    return not any(n.get("host_syncs", 0) for n in device_nodes(row))


EXPONENT_GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(15))   # utilisation exponents tried, 0.3-1.0


def power_window_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calibration rows whose power windows the fit uses, in order: a reliable, positive average power over
    a window in which the GPU was busy throughout (busy_through_window), of a benchmark with device nodes."""
    return [r for r in rows if r.get("reliable") and isinstance(r.get("avg_power_w"), (int, float))
            and r["avg_power_w"] > 0 and busy_through_window(r) and device_nodes(r)]


def power_design(u: np.ndarray, scale: np.ndarray, exponent: float) -> np.ndarray:
    """The fit's regressors per window: 1 (static power), s(f) * u ** exponent per compute unit (all columns of
    `u` but the last) and memory's utilisation (the last column), linear."""
    return np.column_stack([np.ones(len(u)), scale[:, None] * u[:, :-1] ** exponent, u[:, -1]])


def window_utilisations(rows: list[dict[str, Any]], gpu: GPUSpec, v_min_ratio: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the windows the fit uses (power_window_rows): each one's achieved share of each compute unit's roof
    (columns COMPUTE_UNITS) and of DRAM bandwidth (last column), its dynamic-power clock scale s(f), and its
    measured average power (W)."""
    plain = roofline_profile()
    us, scales, ys = [], [], []
    for r in power_window_rows(rows):
        p = r["avg_power_w"]
        table = NodeTable.from_records(device_nodes(r))
        clock = row_clock(r, gpu)
        times, _ = device_times(table, gpu, clock, plain)
        t = r["time_ms_median"] * 1e-3
        units = compute_units(table, times.effective_mode)
        u = [min(float((times.work_flops[m] / times.peak_flops[m]).sum()) / t, 1.0) for m in units.values()]
        u_mem = min(float(dram_bytes(table, times, gpu).sum()) / gpu.memory_bandwidth_bytes_per_s / t, 1.0)
        us.append(np.clip(np.nan_to_num([*u, u_mem]), 0.0, 1.0))
        scales.append(clock / gpu.max_clock_mhz * float(voltage_ratio(gpu, clock, v_min_ratio)) ** 2)
        ys.append(p)
    return np.array(us).reshape(-1, len(COMPUTE_UNITS) + 1), np.array(scales), np.array(ys)


def fit_power(rows: list[dict[str, Any]], gpu: GPUSpec, idle_w: float, v_min_ratio: float, *,
              split_simt: bool = True, exponents: tuple[float, ...] = EXPONENT_GRID) -> PowerFit | None:
    """Bounded least squares of window power on (1, s(f)*g(u) per compute unit (COMPUTE_UNITS), u_memory),
    g(u) = u ** e, from measured utilisations over the windows in which the GPU was busy throughout
    (busy_through_window), at the exponent e of `exponents` that leaves the least squared error.
    split_simt=False prices full-fp32 GEMMs with tensor_w (simt_w None), as fits before the split did."""
    u, scale, y = window_utilisations(rows, gpu, v_min_ratio)
    if len(y) < 6:
        return None
    units = list(COMPUTE_UNITS)
    simt = units.index("simt")
    # Too few windows that load the SIMT pipes leave simt_w unidentified: their load counts as tensor cores'.
    if not (split_simt and int((u[:, simt] >= UNIT_LOADED_SHARE).sum()) >= MIN_UNIT_WINDOWS):
        u = u.copy()
        u[:, units.index("tensor")] = np.minimum(u[:, units.index("tensor")] + u[:, simt], 1.0)
        u = np.delete(u, simt, axis=1)
        units.remove("simt")
    # Bounded least squares keeps every term physical: static power between idle and TDP, and no
    # activity term able to exceed the board's dynamic range on its own.
    span = gpu.tdp_w - idle_w
    terms = u.shape[1]
    bounds = ([idle_w] + [0.0] * terms, [gpu.tdp_w] + [span] * terms)
    fits = []
    for e in exponents:
        x = power_design(u, scale, e)
        coef = lsq_linear(x, y, bounds=bounds).x
        fits.append((e, coef, y - x @ coef))
    e, coef, resid = min(fits, key=lambda fit: float((fit[2] ** 2).sum()))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0
    unit_w = {name: float(c) for name, c in zip(units, coef[1:-1])}
    return PowerFit(static_w=float(coef[0]), idle_w=float(idle_w), tensor_w=unit_w["tensor"],
                    simt_w=unit_w.get("simt"), vector_w=unit_w["vector"], memory_w=float(coef[-1]),
                    sigma_w=float(math.sqrt((resid ** 2).mean())), r2=r2, n=len(y), v_min_ratio=v_min_ratio,
                    utilisation_exponent=float(e))


def simt_from_prior(power: PowerFit | None, shape_prior: Profile | None) -> PowerFit | None:
    """A partial run's power fit whose windows left simt_w unidentified takes the shape prior's ratio of
    simt_w to tensor_w, as its residual fits take the prior's finer fits; unchanged otherwise."""
    lent = shape_prior.power if shape_prior is not None else None
    if power is None or power.simt_w is not None or lent is None or lent.simt_w is None or lent.tensor_w <= 0:
        return power
    return replace(power, simt_w=power.tensor_w * lent.simt_w / lent.tensor_w)
