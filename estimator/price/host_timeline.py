"""The host side of eager PyTorch: every op costs CPU time to dispatch before its kernel can start.

Each kernel starts at max(time the host issued it, end of the previous kernel) on one stream;
the simulation is vectorised with a running maximum instead of a Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..profile import Profile
from .node_table import NodeTable

LAUNCHES = ("eager", "graph")


@dataclass(frozen=True)
class Timeline:
    """Per-node arrays (s) and totals of one simulated iteration, starting from an idle GPU."""

    host_s: np.ndarray         # CPU time to dispatch each node
    issue_s: np.ndarray        # when the host has issued it
    start_s: np.ndarray        # when its kernels start on the device
    end_s: np.ndarray
    wait_s: np.ndarray         # device idle before this node because the host was late
    wall_s: float              # until the host is done and the device has drained
    host_total_s: float
    device_busy_s: float


def host_costs(table: NodeTable, profile: Profile, launch: str, host_scale: float = 1.0) -> np.ndarray:
    """CPU seconds to dispatch each node."""
    if launch == "graph":  # one replay dispatches everything
        cost = np.zeros(len(table))
        if len(table):
            # Replaying a captured graph is one dispatch from the host.
            cost[0] = profile.host_op_s.get("graph_launch", profile.host_op_s["default"])
        return cost * host_scale
    base = table.map_category(profile.host_op_s, profile.host_op_s["default"])
    cost = np.where(table.free | table.host_only, profile.host_only_op_s, base)
    extra_launch = profile.host_op_s.get("launch", 0.0) * np.maximum(table.kernels - 1, 0)
    cost = cost + np.where(table.free, 0.0, extra_launch)
    cost = np.where(table.phase == "backward", cost * profile.host_backward_factor, cost)
    cost = cost + table.module_calls * profile.host_op_s.get("module_call", 0.0)
    return cost * host_scale


def simulate(device_s: np.ndarray, host_s: np.ndarray) -> Timeline:
    """Kernel i starts at max(issue_i, end_{i-1}); returns the whole timeline."""
    if len(device_s) == 0:
        z = np.zeros(0)
        return Timeline(z, z, z, z, z, 0.0, 0.0, 0.0)
    issue = np.cumsum(host_s)
    busy = np.cumsum(device_s)
    before = busy - device_s
    # end_i = busy_i + max_{j<=i}(issue_j - before_j), clipped at 0 (the device is free at t=0).
    end = busy + np.maximum(np.maximum.accumulate(issue - before), 0.0)
    start = end - device_s
    prev_end = np.concatenate([[0.0], end[:-1]])
    wait = np.maximum(start - prev_end, 0.0)
    return Timeline(host_s, issue, start, end, wait, float(max(end[-1], issue[-1])), float(issue[-1]),
                    float(busy[-1]))
