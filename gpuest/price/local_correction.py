"""Local correction of the residual fit: what the calibration benchmarks nearest to a node say the
regression gets wrong there.

A linear fit of log(measured / roofline) cannot express every shape effect: which kernel cuDNN picks
for a convolution, which tile a GEMM gets, where a reduction switches strategy. Those effects hold for
the shapes around a measured one. The correction of a node is a Nadaraya-Watson mean of the residuals
of the NEIGHBOURS benchmarks of its op's pool nearest to it (distance in the pool's feature scales, Gaussian
kernel of width BANDWIDTH), shrunk toward zero by PRIOR_WEIGHT: a node far from every benchmark keeps
the plain regression, one that sits on a measured shape gets most of that shape's residual.

The three constants were chosen by 5-fold cross-validation over both shipped GPUs' suites (mean of
the per-category median errors); docs/DESIGN.md gives the command.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from scipy.spatial.distance import cdist

from ..profile import ResidualPoints, op_keys

NEIGHBOURS = 5                 # benchmarks averaged per node (the module docstring gives the estimator)
BANDWIDTH = 0.5
PRIOR_WEIGHT = 0.1


def pool_key(op: str, mode: str, pools: Mapping[str, ResidualPoints]) -> str | None:
    """The residual pool a node of ATen `op` priced in math `mode` draws on: its op in that mode, else its
    op, else the same for its out-of-place form (op_keys), else none (an op the suite never measured keeps
    the plain regression)."""
    for key in op_keys(op, mode):
        if key in pools:
            return key
    return None


def correction(x: np.ndarray, points: ResidualPoints) -> np.ndarray:
    """Log-time correction (n,) for nodes with residual features `x` (n, features) from one pool."""
    scale = np.asarray(points.scale)
    residual = np.asarray(points.residual)
    # A graph repeats its layers: distances are computed once per distinct feature row, pairwise (a
    # training graph's thousands of nodes against a pool of hundreds, never an n x pool x features array).
    unique, inverse = np.unique(x, axis=0, return_inverse=True)
    d = cdist(unique / scale, np.asarray(points.x) / scale)
    k = min(NEIGHBOURS, len(residual))
    nearest = np.argpartition(d, k - 1, axis=1)[:, :k]
    dn = np.take_along_axis(d, nearest, axis=1)
    w = np.exp(-0.5 * (dn / BANDWIDTH) ** 2)
    per_row = (w * residual[nearest]).sum(axis=1) / (w.sum(axis=1) + PRIOR_WEIGHT)
    return per_row[inverse.reshape(-1)]


def local_corrections(x: np.ndarray, op: np.ndarray, mode: np.ndarray,
                      pools: Mapping[str, ResidualPoints]) -> np.ndarray:
    """Log-time correction per node (0 where the profile has no pool for the node's op)."""
    out = np.zeros(len(x))
    if not pools:
        return out
    keys = np.array([pool_key(o, m, pools) or "" for o, m in zip(op.tolist(), mode.tolist())], dtype=object)
    for key in set(keys.tolist()) - {""}:
        sel = keys == key
        out[sel] = correction(x[sel], pools[key])
    return out
