"""The `host_scale` of a host from its probe (gpuest.calibrate.host_probe), against a GPU's profile.

    gpuest host-probe --gpu H100 [-o probe.json]      # on the machine whose host you want priced

For each probe step, the host_scale at which the profile's estimate of that step equals its measured wall
time: the estimate grows monotonically with the scale, so it is evaluated on a log-spaced grid over
HOST_SCALE_RANGE and inverted. The host's scale is the geometric mean of its steps'. Pass it to `estimate`,
`estimate_generation` or the CLI's `--host-scale`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..errors import HostProbeError
from .host_probe import CONFIG_FIELDS, PROBE_SCHEMA

HOST_SCALE_RANGE = (0.1, 10.0)     # the scales a probe resolves; beyond, the step is not host-paced
SCALE_GRID_POINTS = 61


@dataclass(frozen=True)
class StepScale:
    """One probe step: its measured wall time, the profile's estimate at host_scale 1 (s) and the scale
    that makes the estimate match; `clipped` where that scale lies outside HOST_SCALE_RANGE."""

    config: str
    measured_s: float
    predicted_s: float
    host_scale: float
    clipped: bool


@dataclass(frozen=True)
class HostScale:
    """This host against the profile of `gpu`: pass `host_scale` to the estimators."""

    gpu: str
    host_scale: float
    steps: tuple[StepScale, ...]

    def __str__(self) -> str:
        lines = [f"host_scale {self.host_scale:.3f} against the {self.gpu} profile (geometric mean of "
                 f"{len(self.steps)} probe steps; > 1: this host dispatches slower than the calibration's)"]
        lines += [f"  {s.config}: measured {s.measured_s * 1e3:.3f} ms, profile {s.predicted_s * 1e3:.3f} ms "
                  f"-> {s.host_scale:.3f}" + (" (clipped)" if s.clipped else "") for s in self.steps]
        return "\n".join(lines)


def _config_key(config: Mapping[str, Any]) -> tuple:
    try:
        return tuple(config[f] for f in CONFIG_FIELDS)
    except KeyError as exc:
        raise HostProbeError(f"a probe step's config lacks {exc.args[0]!r}; accepted: a record written by "
                             "HostProbe.measure (fields " + ", ".join(CONFIG_FIELDS) + ")") from None


@lru_cache(maxsize=None)
def _curve(config: tuple, gpu: str, profile: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scales, predicted wall s) of a probe step on `gpu` with `profile` (a path or name as `estimate` takes;
    None: the GPU's own) over the log-spaced scale grid."""
    from ..evaluate.accuracy import trace_config
    from ..price.estimate import estimate_graph
    model, batch, seq, image_size, mode, precision, memory_format = config
    graph = trace_config(model, batch, seq, image_size, mode, precision, memory_format=memory_format)
    scales = np.geomspace(*HOST_SCALE_RANGE, SCALE_GRID_POINTS)
    walls = np.array([estimate_graph(graph, gpu, warn=False, profile=profile, host_scale=float(s)).time_s
                      for s in scales])
    return scales, np.maximum.accumulate(walls)


def probe_host_scale(probe: Mapping[str, Any], gpu: str, profile: str | None = None) -> HostScale:
    """The host_scale at which `gpu`'s profile (`profile`, a path or name as `estimate` takes; None: the one
    `estimate` would choose) reproduces the probe's measured steps (module docstring). Raises HostProbeError
    for a record of another schema, without steps, or with a step whose estimate does not grow with the
    host's speed (not host-paced on this GPU)."""
    from ..catalog import get_gpu
    if not isinstance(probe, Mapping) or probe.get("schema") != PROBE_SCHEMA:
        got = probe.get("schema") if isinstance(probe, Mapping) else type(probe).__name__
        raise HostProbeError(f"not a host probe record (schema {got!r}); accepted: schema {PROBE_SCHEMA!r}, "
                             "as written by `gpuest host-probe -o`")
    steps = probe.get("steps")
    if not steps:
        raise HostProbeError("the host probe record has no steps; accepted: a record of HostProbe.measure")
    name = get_gpu(gpu).name
    out = []
    for step in steps:
        key = _config_key(step.get("config") or {})
        measured = float(step.get("wall_s") or float("nan"))
        if not measured > 0:
            raise HostProbeError(f"probe step {key[0]} has wall_s {step.get('wall_s')!r}; accepted: seconds > 0")
        scales, walls = _curve(key, name, None if profile is None else str(profile))
        if not walls[-1] > walls[0] * 1.5:
            raise HostProbeError(f"probe step {key[0]} is not host-paced on {name} (its estimate moves from "
                                 f"{walls[0] * 1e3:.3f} to {walls[-1] * 1e3:.3f} ms over host scales "
                                 f"{HOST_SCALE_RANGE[0]:g}-{HOST_SCALE_RANGE[1]:g})")
        clipped = not walls[0] <= measured <= walls[-1]
        # exp(log(10)) is 10.000000000000002: clip back onto the grid the scale was read from.
        scale = float(np.clip(np.exp(np.interp(measured, walls, np.log(scales))), *HOST_SCALE_RANGE))
        out.append(StepScale(f"{key[0]} b{key[1]} {key[4]} {key[5]}", measured, float(np.interp(1.0, scales, walls)),
                             scale, clipped))
    mean = float(np.exp(np.mean([math.log(s.host_scale) for s in out])))
    return HostScale(name, float(np.clip(mean, *HOST_SCALE_RANGE)), tuple(out))
