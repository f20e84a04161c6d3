"""Local correction of the residual fit: what the calibration benchmarks nearest to a node say the
regression gets wrong there.

A linear fit of log(measured / roofline) cannot express every shape effect: which kernel cuDNN picks
for a convolution, which tile a GEMM gets, where a reduction switches strategy. Those effects hold for
the shapes around a measured one. The correction of a node is a Nadaraya-Watson mean of the residuals
of the NEIGHBOURS benchmarks of its pool nearest to it (distance in the pool's feature scales, Gaussian
kernel of width BANDWIDTH), shrunk toward zero by PRIOR_WEIGHT: a node far from every benchmark keeps
the plain regression, one that sits on a measured shape gets most of that shape's residual.

The three constants were chosen by 5-fold cross-validation over both shipped GPUs' suites (mean of
the per-category median errors); docs/DESIGN.md gives the command.
"""
from __future__ import annotations

import numpy as np

from ..profile import ResidualPoints, mode_key

NEIGHBOURS = 5
BANDWIDTH = 0.5
PRIOR_WEIGHT = 0.5


def pool_key(category: str, mode: str, pools: dict[str, ResidualPoints] | object) -> str | None:
    """The residual pool a node of `category` priced in math `mode` draws on: its category in that mode,
    else its category, else none."""
    for key in (mode_key(category, mode), category):
        if key in pools:
            return key
    return None


def correction(x: np.ndarray, points: ResidualPoints) -> np.ndarray:
    """Log-time correction (n,) for nodes with residual features `x` (n, features) from one pool."""
    px = np.asarray(points.x)
    scale = np.asarray(points.scale)
    residual = np.asarray(points.residual)
    d = np.sqrt((((x[:, None, :] - px[None, :, :]) / scale) ** 2).sum(axis=2))
    k = min(NEIGHBOURS, len(residual))
    nearest = np.argpartition(d, k - 1, axis=1)[:, :k]
    dn = np.take_along_axis(d, nearest, axis=1)
    w = np.exp(-0.5 * (dn / BANDWIDTH) ** 2)
    return (w * residual[nearest]).sum(axis=1) / (w.sum(axis=1) + PRIOR_WEIGHT)


def local_corrections(x: np.ndarray, category: np.ndarray, mode: np.ndarray,
                      pools: dict[str, ResidualPoints]) -> np.ndarray:
    """Log-time correction per node (0 where the profile has no pool for the node's category)."""
    out = np.zeros(len(x))
    if not pools:
        return out
    keys = np.array([pool_key(c, m, pools) or "" for c, m in zip(category.tolist(), mode.tolist())], dtype=object)
    for key in set(keys.tolist()) - {""}:
        sel = keys == key
        out[sel] = correction(x[sel], pools[key])
    return out
