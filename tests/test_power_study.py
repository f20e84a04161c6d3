"""Physical properties of power capping on a V100 training ResNet-50 (the setting of docs/POWER.md).

No predicted number is hard-coded: only relations that must hold whatever the profiles say.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torchvision

import gpuest

GPU = "V100"
BATCH = 8                       # small, to stay fast; the doc uses 64 and 128
REL = 1e-9                      # numerical slack for exact monotonicity
LIMIT_SLACK = 1e-6              # relative slack on "power <= limit"


def _trace(precision: str):
    with torch.device("meta"):
        model = torchvision.models.resnet50()
    x = torch.empty(BATCH, 3, 224, 224, device="meta")
    return gpuest.trace(model, (x,), mode="training", precision=precision, name="resnet50", batch=BATCH)


@pytest.fixture(scope="module", params=["fp32", "fp16-mixed"])
def capped(request):
    """(spec, sweep over the catalogue's power limits from high to low, {limit: Estimate})."""
    spec = gpuest.get_gpu(GPU)
    graph = _trace(request.param)
    limits = np.arange(spec.power_limit_max_w, spec.power_limit_min_w - 1e-9, -25.0)
    df = gpuest.sweep(graph, GPU, power_limits=limits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # V100: no TF32 hardware path
        ests = {float(w): gpuest.estimate(graph, GPU, power_limit=float(w)) for w in limits}
    assert list(df["power_limit_w"]) == sorted(df["power_limit_w"], reverse=True)
    return spec, df.reset_index(drop=True), ests


def test_study_uses_a_power_model(capped):
    spec, df, ests = capped
    assert df["energy_j"].notna().all() and (df["energy_j"] > 0).all()
    assert spec.power_limit_min_w < spec.tdp_w <= spec.power_limit_max_w
    assert df["profile"].nunique() == 1


def test_lowest_limit_changes_energy(capped):
    spec, df, ests = capped
    default = ests[spec.tdp_w]
    lowest = ests[spec.power_limit_min_w]
    assert abs(lowest.energy_j - default.energy_j) > 1e-3 * default.energy_j
    assert lowest.effective_clock_mhz < default.effective_clock_mhz


def test_power_never_exceeds_the_limit(capped):
    """Each phase's average power fits the limit, unless the phase already runs at the minimum SM clock
    (no lower clock exists: the limit cannot be met, as on a real card); the step average fits whenever
    no phase is in that state."""
    spec, df, ests = capped
    for w, est in ests.items():
        floored = []
        for phase, nodes in est.per_node.groupby("phase"):
            # Power is drawn while a node holds the queue (its kernels and the gaps after them): queue_s.
            t = nodes["queue_s"].sum()
            if t <= 0:
                continue
            power = float((nodes["power_w"] * nodes["queue_s"]).sum() / t)
            if power > w * (1 + LIMIT_SLACK):
                assert np.allclose(nodes["clock_mhz"], spec.min_clock_mhz), (
                    f"{phase} draws {power:.1f} W > {w:.0f} W limit at {nodes['clock_mhz'].max():.0f} MHz, "
                    f"above the minimum clock {spec.min_clock_mhz:.0f} MHz")
                floored.append(phase)
        if not floored:
            assert est.avg_power_w <= w * (1 + LIMIT_SLACK), f"{est.avg_power_w:.2f} W > {w:.0f} W limit"
    # the sweep reports the same step averages
    assert np.allclose(df["avg_power_w"], [ests[float(w)].avg_power_w for w in df["power_limit_w"]], rtol=1e-9)


def test_step_never_faster_as_limit_falls(capped):
    spec, df, ests = capped
    t = df["time_s"].to_numpy()
    assert (np.diff(t) >= -REL * t[:-1]).all(), df[["power_limit_w", "time_s"]]
    clocks = df["effective_clock_mhz"].to_numpy()
    assert (np.diff(clocks) <= REL * clocks[:-1]).all(), df[["power_limit_w", "effective_clock_mhz"]]


def test_avg_power_non_increasing_as_limit_falls(capped):
    spec, df, ests = capped
    p = df["avg_power_w"].to_numpy()
    assert (np.diff(p) <= REL * p[:-1]).all(), df[["power_limit_w", "avg_power_w"]]


def test_phase_clocks_non_increasing_as_limit_falls(capped):
    spec, df, ests = capped
    limits = sorted(ests, reverse=True)
    for hi, lo in zip(limits, limits[1:]):
        for phase, clock in ests[lo].phase_clocks_mhz.items():
            assert clock <= ests[hi].phase_clocks_mhz[phase] * (1 + REL), (phase, hi, lo)
