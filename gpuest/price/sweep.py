"""What-ifs over GPUs, SM clocks and power limits: rank, sweep and pick the best setting."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import networkx as nx
import numpy as np
import pandas as pd

from ..catalog import get_gpu, list_gpus
from .estimate import Estimate, as_graph, estimate_graph
from .generation import GenerationGraphs, compare_generation

OBJECTIVES = {"time": "time_s", "energy": "energy_j", "edp": "edp_js"}
DEFAULT_SWEEP_POINTS = 16


def _row(est: Estimate) -> dict[str, Any]:
    return {"gpu": est.gpu, "clock_mhz": est.clock_mhz, "effective_clock_mhz": est.effective_clock_mhz,
            "power_limit_w": est.power_limit_w, "time_s": est.time_s, "device_time_s": est.device_time_s,
            "energy_j": est.energy_j, "avg_power_w": est.avg_power_w, "edp_js": est.edp_js, "bound": est.bound,
            "profile": est.profile_source, "peak_memory_bytes": est.peak_memory_bytes, "fits": est.fits}


def compare(graph: nx.DiGraph | Any, gpus: Iterable[str] | None = None, clock: float | None = None, *,
            by: str = "time", price_per_hour: Mapping[str, float] | None = None, launch: str = "eager",
            profile: Any = None, **trace_kwargs: Any) -> pd.DataFrame:
    """One row per GPU (each at `clock` or its max boost), ranked by `by` ("time", "energy" or "edp").

    Columns include the predicted peak memory (`peak_memory_bytes`) and `fits`; GPUs where the step runs
    out of memory get no rank (NaN) and are listed after those where it fits.
    price_per_hour: optional {gpu name: $/hour} adds `cost_per_step` ($).
    A generate() call traced by `trace_generation` is ranked by `by` "time" (the whole call: the same order
    as "tokens_per_s"), "tokens_per_s", "energy_per_token" or "ttft" (`compare_generation`)."""
    if isinstance(graph, GenerationGraphs):
        return compare_generation(graph, gpus, clock, by=by, launch=launch, profile=profile)
    if by not in OBJECTIVES:
        raise ValueError(f"unknown ranking {by!r}; accepted: {', '.join(OBJECTIVES)}")
    graph = as_graph(graph, **trace_kwargs)
    names = list(gpus) if gpus is not None else [g.name for g in list_gpus()]
    rows = []
    for name in names:
        spec = get_gpu(name)
        clk = None if clock is None else min(max(clock, spec.min_clock_mhz), spec.max_clock_mhz)
        rows.append(_row(estimate_graph(graph, spec, clk, launch=launch, profile=profile, warn=False)))
    df = pd.DataFrame(rows)
    if price_per_hour:
        prices = {get_gpu(k).name: float(v) for k, v in price_per_hour.items()}
        df["cost_per_step"] = df["gpu"].map(prices) * df["time_s"] / 3600.0
    runs = df["fits"].map(lambda f: f is not False)   # None: memory not predicted, so not excluded
    for name, col in OBJECTIVES.items():
        df[f"rank_{name}"] = df[col].where(runs).rank(method="min").astype("Int64")
    df["_oom"] = ~runs
    return df.sort_values(["_oom", OBJECTIVES[by]]).drop(columns="_oom").reset_index(drop=True)


def sweep(graph: nx.DiGraph | Any, gpu: str, clocks: Iterable[float] | None = None,
          power_limits: Iterable[float] | None = None, *, launch: str = "eager", profile: Any = None,
          **trace_kwargs: Any) -> pd.DataFrame:
    """Time, energy, average power and EDP over SM clocks (at the default power limit) and/or power
    limits (at max clock). With neither given, sweeps 16 clocks from the GPU's min to max."""
    graph = as_graph(graph, **trace_kwargs)
    spec = get_gpu(gpu)
    if clocks is None and power_limits is None:
        clocks = np.linspace(spec.min_clock_mhz, spec.max_clock_mhz, DEFAULT_SWEEP_POINTS)
    rows = []
    for c in [] if clocks is None else clocks:
        rows.append({"setting": "clock", **_row(estimate_graph(graph, spec, float(c), launch=launch,
                                                                profile=profile, warn=False))})
    for w in [] if power_limits is None else power_limits:
        rows.append({"setting": "power_limit", **_row(estimate_graph(graph, spec, None, power_limit=float(w),
                                                                      launch=launch, profile=profile, warn=False))})
    return pd.DataFrame(rows)


def optimal(graph: nx.DiGraph | Any, gpu: str, objective: str = "energy", max_slowdown: float | None = None, *,
            launch: str = "eager", profile: Any = None, **trace_kwargs: Any) -> pd.Series:
    """The clock or power-limit setting minimising `objective` ("energy", "edp" or "time"), optionally
    no more than `max_slowdown` (e.g. 0.1 = 10 %) slower than the fastest setting."""
    _check_objective(objective, max_slowdown)
    spec = get_gpu(gpu)
    df = sweep(graph, gpu, clocks=np.linspace(spec.min_clock_mhz, spec.max_clock_mhz, 2 * DEFAULT_SWEEP_POINTS),
               power_limits=np.linspace(spec.power_limit_min_w, spec.power_limit_max_w, DEFAULT_SWEEP_POINTS),
               launch=launch, profile=profile, **trace_kwargs)
    return best_setting(df, objective, max_slowdown)


def best_setting(df: pd.DataFrame, objective: str = "energy", max_slowdown: float | None = None) -> pd.Series:
    """The row of a `sweep` table minimising `objective` ("energy", "edp" or "time"), among the rows no more than
    `max_slowdown` (a fraction: 0.1 = 10 %) slower than its fastest when given."""
    _check_objective(objective, max_slowdown)
    if max_slowdown is not None:
        df = df[df["time_s"] <= df["time_s"].min() * (1.0 + max_slowdown)]
    return df.loc[df[OBJECTIVES[objective]].idxmin()]


def _check_objective(objective: str, max_slowdown: float | None) -> None:
    """Raises ValueError for an unknown objective or a max_slowdown that is not a number >= 0."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; accepted: {', '.join(OBJECTIVES)}")
    if max_slowdown is not None and not max_slowdown >= 0:
        raise ValueError(f"max_slowdown must be >= 0 (a fraction, 0.1 = 10 %), got {max_slowdown!r}")
