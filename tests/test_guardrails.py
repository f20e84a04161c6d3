"""The learned correction stays inside what its calibration data showed (issue 25): features are clipped to
the fitted range, the correction (regression + local) to the fitted log-time range, and a node priced
outside its fit's data is marked extrapolated, counted in the notes and given a wider interval."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gpuest
from gpuest.catalog import get_gpu
from gpuest.price.device_time import device_times, fit_keys
from gpuest.price.node_table import node_table
from gpuest.profile import shipped_profiles


class FarFromTheSuite(nn.Module):
    """Shapes and layouts the calibration suite never measured: a 1-channel 3x3 conv on a 2048x2048 image,
    batch norm over (N, C) and (N, C, L), a 7-wide linear layer, a huge flat add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.bn2d = nn.BatchNorm2d(3)
        self.bn1d_nc = nn.BatchNorm1d(7)
        self.bn1d_ncl = nn.BatchNorm1d(3)
        self.lin = nn.Linear(7, 7)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = self.bn2d(self.conv(image))
        seq = self.bn1d_ncl(x.flatten(2)[:, :, :4096])
        return self.lin(self.bn1d_nc(tokens)).sum() + seq.sum() + (x + 1).sum()


def _graph(mode: str, precision: str, channels_last: bool) -> object:
    model = FarFromTheSuite()
    image = torch.empty(4, 1, 2048, 2048)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        image = image.contiguous(memory_format=torch.channels_last)
    return gpuest.trace(model, (image, torch.empty(3, 7)), mode=mode, precision=precision)


CASES = [("inference", "fp32", False), ("inference", "fp16-mixed", True), ("training", "bf16-mixed", True),
         ("training", "fp32", False)]


@pytest.mark.parametrize("gpu", ["H100-SXM", "H200", "A100-SXM4-80GB"])
@pytest.mark.parametrize("mode, precision, channels_last", CASES)
def test_no_node_is_corrected_beyond_what_its_fit_saw(gpu, mode, precision, channels_last):
    profile = next(iter(shipped_profiles().values())) if gpu not in shipped_profiles() else shipped_profiles()[gpu]
    spec = get_gpu(gpu)
    table = node_table(_graph(mode, precision, channels_last))
    times, _ = device_times(table, spec, spec.max_clock_mhz, profile)
    active = ~(table.free | table.host_only)
    keys = fit_keys(table, times.effective_mode, profile.residuals)
    factor = (times.device_s - times.latency_s)[active] / times.roofline_s[active]
    lo = np.array([profile.residuals[k].log_lo for k in keys[active]])
    hi = np.array([profile.residuals[k].log_hi for k in keys[active]])
    # Never above what the data showed; below it only where the op's roofline floor is higher.
    assert np.all(np.log(factor) <= hi + 1e-9)
    assert np.all((np.log(factor) >= lo - 1e-9) | (np.log(factor) <= 1e-9))


def test_every_shipped_fit_stores_its_bounds():
    for profile in shipped_profiles().values():
        for key, fit in profile.residuals.items():
            assert fit.x_lo is not None and fit.x_hi is not None and np.all(np.less_equal(fit.x_lo, fit.x_hi)), key
            assert fit.log_lo is not None and fit.log_lo <= fit.log_hi, key


def test_no_shipped_fit_passes_a_feature_coefficient_ceiling():
    from gpuest.price.features import coefficient_ceilings
    for name, profile in shipped_profiles().items():
        ceilings = coefficient_ceilings(tuple(profile.residual_features))
        for key, fit in profile.residuals.items():
            assert np.all(np.asarray(fit.coef) <= ceilings + 1e-12), (name, key)


def test_a_node_outside_its_data_is_marked_counted_and_widened():
    est = gpuest.estimate(_graph("training", "bf16-mixed", True), gpu="H100")
    nodes = est.per_node[~est.per_node["free"]]
    assert nodes["extrapolated"].any() and any("outside the calibration data" in n for n in est.notes)
    priced = nodes[nodes["latency_s"] < 0.5 * nodes["time_s"]]   # the fit, not launch latency, sets the time
    out, inside = priced[priced["extrapolated"]], priced[~priced["extrapolated"]]
    width = lambda df: np.log(df["time_high_s"] / df["time_low_s"])  # noqa: E731
    assert width(out).median() > width(inside).median()
