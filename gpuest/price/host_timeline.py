"""The host side of eager PyTorch: every op costs CPU time to dispatch before its kernel can start.

Each node's kernels start at max(time the host issued the first of them, end of the previous node)
on one stream. A node that synchronises with the host (`.item()`, an output sized by the data) holds
the host until the device has finished it. A node that launches its kernels from a host loop (a cuDNN
RNN: a few per time step) pays a host cost per launch after the first, and its device work overlaps
those launches: it ends no earlier than its own device time after it started, and no earlier than the
host's last launch plus one kernel's share of that time. The simulation is vectorised with a running
maximum, segment by segment between synchronising nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


def launch_cost(table: NodeTable, host_op_s: Mapping[str, float]) -> np.ndarray:
    """Host seconds per unit of each node's host work after its first (later_host_work: a kernel launch, or
    a multi-tensor op's tensor): `launch_<category>` where the calibration measured that category's ops
    working from a host loop, else the generic `launch`."""
    generic = host_op_s.get("launch", 0.0)
    per_launch = {c: host_op_s.get(f"launch_{c}", generic) for c in np.unique(table.category)}
    return table.map_category(per_launch, generic)


def later_host_work(table: NodeTable) -> np.ndarray:
    """Per node, the units of host work after its first that each cost a launch_cost: a multi-tensor op's
    tensors after the first (Cost.list_tensors: its host side works per tensor), else its kernel launches
    after the first."""
    return np.where(table.list_tensors > 0, table.list_tensors - 1, np.maximum(table.kernels - 1, 0))


def launch_costs(table: NodeTable, host_op_s: Mapping[str, float]) -> np.ndarray:
    """Host seconds per node for its host work after the first (later_host_work, launch_cost each)."""
    return np.where(table.free, 0.0, launch_cost(table, host_op_s) * later_host_work(table))


def host_parts(table: NodeTable, profile: Profile, launch: str, host_scale: float = 1.0) \
        -> tuple[np.ndarray, np.ndarray]:
    """CPU seconds per node before its first kernel can start, and spent on its later launches."""
    if launch == "graph":  # one replay dispatches everything
        cost = np.zeros(len(table))
        if len(table):
            # Replaying a captured graph is one dispatch from the host.
            cost[0] = profile.host_op_s.get("graph_launch", profile.host_op_s["default"])
        return cost * host_scale, np.zeros(len(table))
    base = table.map_category(profile.host_op_s, profile.host_op_s["default"])
    lead = np.where(table.free | table.host_only, profile.host_only_op_s, base)
    # A copy an op makes of its own input is launched from inside that op's C++ call: one more launch,
    # no Python or dispatcher work of its own.
    lead = np.where(table.staged, launch_cost(table, profile.host_op_s), lead)
    spread = launch_costs(table, profile.host_op_s)
    backward = np.where(table.phase == "backward", profile.host_backward_factor, 1.0)
    dispatched = ~(table.free | table.host_only | table.staged)
    lead = (lead * backward + table.module_calls * profile.host_op_s.get("module_call", 0.0)
            + (table.autocast & dispatched) * profile.host_op_s.get("autocast", 0.0))
    return lead * host_scale, spread * backward * host_scale


def simulate(device_s: np.ndarray, host_s: np.ndarray, spread_s: np.ndarray | None = None,
             kernels: np.ndarray | None = None, syncs: np.ndarray | None = None) -> Timeline:
    """Node i's kernels start at max(first launch_i, end_{i-1}); returns the whole timeline.

    host_s: each node's whole host cost; spread_s: the part of it spent launching kernels after the
    first (default none), during which the device already runs the node; kernels: launches per node;
    syncs: host synchronisations per node (default none): after such a node the host waits until the
    device has finished it before it dispatches anything else.
    """
    if len(device_s) == 0:
        z = np.zeros(0)
        return Timeline(z, z, z, z, z, 0.0, 0.0, 0.0)
    spread = np.zeros_like(device_s) if spread_s is None else spread_s
    per_kernel = device_s / np.maximum(kernels, 1) if kernels is not None else device_s
    issue = np.empty_like(device_s)
    end = np.empty_like(device_s)
    barriers = np.flatnonzero(syncs > 0) + 1 if syncs is not None else np.zeros(0, dtype=int)
    host_at = free_at = 0.0
    for lo, hi in zip(np.concatenate([[0], barriers]), np.concatenate([barriers, [len(device_s)]])):
        if lo >= hi:
            continue
        seg = slice(lo, hi)
        issue[seg] = host_at + np.cumsum(host_s[seg])
        busy = np.cumsum(device_s[seg])
        # A node ends at the latest of: previous end + its time, first launch + its time, last launch +
        # its last kernel. end_i = max(end_{i-1} + d_i, c_i) unrolls to busy_i + max_{j<=i}(c_j - busy_j),
        # clipped at busy_i + free_at (the device is free from free_at on).
        ready = np.maximum(issue[seg] - spread[seg] + device_s[seg], issue[seg] + per_kernel[seg])
        end[seg] = busy + np.maximum(np.maximum.accumulate(ready - busy), free_at)
        free_at = float(end[hi - 1])
        # After a synchronising node the host resumes once the device has caught up with it.
        host_at = max(float(issue[hi - 1]), free_at) if hi in barriers else float(issue[hi - 1])
    start = end - device_s
    prev_end = np.concatenate([[0.0], end[:-1]])
    wait = np.maximum(start - prev_end, 0.0)
    return Timeline(host_s, issue, start, end, wait, float(max(end[-1], host_at)), float(np.sum(host_s)),
                    float(np.sum(device_s)))
