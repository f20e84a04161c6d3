"""Board power per node: static power plus dynamic power from the node's compute and memory use.

P = min(static(f) + s(f) * (tensor_w * g(u_tc) + simt_w * g(u_simt) + vector_w * g(u_vec)) + memory_w * u_mem, TDP),
g(u) = u ** utilisation_exponent: concave in a compute unit's utilisation (the first share of a roof switches most
of what draws power), linear in memory's (a DRAM byte costs the same energy at any rate:
data/kernels/H200-power-curve.jsonl)
s(f) = (f / f_max) * (V(f) / V(f_max))^2, V linear in f between v_min_ratio and 1 (P_dyn ~ f V^2);
static(f) = idle_w + (static_w - idle_w) * s(f): above idle, the power of a busy but unloaded GPU is
clock-tree and uncore switching power, which scales like dynamic power.
Memory power does not scale with the SM clock. Host-bound gaps draw gap(f), built the same way
from gap_w (static(f) when the profile has no measured gap power).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..catalog import GPUSpec
from ..catalog.chips import full_load_power_w
from ..profile import PowerFit
from .features import RESIDUAL_FEATURES
from .device_time import DeviceTimes, reads_from_l2
from .node_table import NodeTable


HW_SLOWDOWN_FLOOR = 0.25  # fraction of the lowest supported clock that hardware slowdown can reach
CLOCK_SEARCH_STEPS = 14   # bisection steps for a power-capped clock: (max-min)/2^14 < 0.1 MHz

# cuDNN's NCHW -> NHWC transpose of a convolution's input and the transpose of its output back each
# read and write the activation once more: about twice the convolution's own first-touch traffic.
RELAYOUT_TRAFFIC = 2.0
# A byte the kernel right before left in L2 draws this share of a DRAM byte's power: an in-place ReLU on
# 1-16 MB fp32 tensors draws 45-53 W per TB/s above a busy idle GPU from L2 and 111-114 W from DRAM on the H200
# (data/kernels/H200-power-curve.jsonl; python3 benchmarks/kernel_facts.py prints 'power curve').
L2_BYTE_POWER_SHARE = 0.42


def dram_bytes(table: NodeTable, times: DeviceTimes, gpu: GPUSpec) -> np.ndarray:
    """DRAM traffic (bytes) of each node for its memory power: the bytes it reads and writes, plus the
    layout transposes cuDNN runs around a convolution of NCHW data (the `relayout` feature), less the
    reads the kernel right before left in L2 (reads_from_l2) counted at L2_BYTE_POWER_SHARE of a DRAM byte."""
    relayout = times.features[:, RESIDUAL_FEATURES.index("relayout")]
    warm = np.where(reads_from_l2(table, gpu), np.minimum(table.warm_read_bytes, table.bytes), 0.0)
    return (table.bytes - (1.0 - L2_BYTE_POWER_SHARE) * warm) * (1.0 + RELAYOUT_TRAFFIC * relayout)


# Compute units whose utilisation each power term weighs: GEMM-like nodes on tensor cores, GEMM-like
# nodes in full fp32 (SIMT FMA pipes) and everything else (vector).
COMPUTE_UNITS = ("tensor", "simt", "vector")


def compute_units(table: NodeTable, effective_mode: np.ndarray) -> dict[str, np.ndarray]:
    """A boolean mask per COMPUTE_UNITS entry: the unit each node's compute runs on."""
    gemm_like = table.tensor_core
    simt = gemm_like & (effective_mode == "fp32")
    return {"tensor": gemm_like & ~simt, "simt": simt, "vector": ~gemm_like}


def unit_coefficients_w(fit: PowerFit) -> dict[str, float]:
    """The power (W) each compute unit draws at its full roof, by COMPUTE_UNITS name."""
    return {"tensor": fit.tensor_w, "simt": fit.tensor_w if fit.simt_w is None else fit.simt_w,
            "vector": fit.vector_w}


def voltage_ratio(gpu: GPUSpec, clock_mhz: np.ndarray | float, v_min_ratio: float) -> np.ndarray:
    span = max(gpu.max_clock_mhz - gpu.min_clock_mhz, 1.0)
    frac = np.clip((np.asarray(clock_mhz, dtype=float) - gpu.min_clock_mhz) / span, 0.0, 1.0)
    return v_min_ratio + (1.0 - v_min_ratio) * frac


def transfer_power(fit: PowerFit, source: GPUSpec, target: GPUSpec) -> PowerFit:
    """Scale a power fit measured on `source` to `target`: the chip's terms by their dynamic ranges, full-load
    power (unlimited, catalog.chips.full_load_power_w) less idle, and memory power by DRAM bandwidth (a byte
    costs the same energy at any rate, so memory_w, the power at full bandwidth, moves with it). A board whose
    chip draws more than its TDP allows is then throttled by the limit (node_power's demand_w against it), as
    its driver does."""
    if source.name == target.name:
        return fit
    ratio = ((full_load_power_w(target) - target.idle_power_w)
             / max(full_load_power_w(source) - source.idle_power_w, 1.0))
    bandwidth = target.memory_bandwidth_gb_s / source.memory_bandwidth_gb_s
    gap = None if fit.gap_w is None else target.idle_power_w + (fit.gap_w - fit.idle_w) * ratio
    return replace(fit, idle_w=target.idle_power_w, gap_w=gap,
                   static_w=target.idle_power_w + (fit.static_w - fit.idle_w) * ratio,
                   tensor_w=fit.tensor_w * ratio, vector_w=fit.vector_w * ratio,
                   simt_w=None if fit.simt_w is None else fit.simt_w * ratio,
                   memory_w=fit.memory_w * bandwidth, sigma_w=fit.sigma_w * ratio)


def clock_scale(gpu: GPUSpec, clock_mhz: np.ndarray | float, fit: PowerFit) -> np.ndarray:
    """s(f) = (f / f_max) * (V(f) / V(f_max))^2: how dynamic power scales with the SM clock."""
    v = voltage_ratio(gpu, clock_mhz, fit.v_min_ratio)
    return np.asarray(clock_mhz, dtype=float) / gpu.max_clock_mhz * v ** 2


def waiting_power_w(gpu: GPUSpec, clock_mhz: np.ndarray | float, fit: PowerFit) -> np.ndarray:
    """Board power (W) while the device waits for the host at `clock_mhz`: gap(f), else static(f)."""
    above_idle = fit.static_w if fit.gap_w is None else fit.gap_w
    return fit.idle_w + (above_idle - fit.idle_w) * clock_scale(gpu, clock_mhz, fit)


@dataclass(frozen=True)
class NodePower:
    power_w: np.ndarray        # average power while the node runs, at most the board's TDP
    demand_w: np.ndarray       # what it would draw unlimited (at most full load): what throttles its phase
    static_w: np.ndarray       # power while idle-waiting for the host at that node's clock
    util_tensor: np.ndarray
    util_vector: np.ndarray
    util_memory: np.ndarray


def node_power(table: NodeTable, times: DeviceTimes, gpu: GPUSpec, clock_mhz: np.ndarray | float,
               fit: PowerFit) -> NodePower:
    """Power (W) of each node at its clock, from its achieved fraction of the compute and memory roofs."""
    t = np.maximum(times.device_s, 1e-12)
    util_compute = np.clip(times.work_flops / (times.peak_flops * t), 0.0, 1.0)
    util_mem = np.clip(dram_bytes(table, times, gpu) / (gpu.memory_bandwidth_bytes_per_s * t), 0.0, 1.0)
    tc = table.tensor_core
    units = compute_units(table, times.effective_mode)
    coefs = unit_coefficients_w(fit)
    unit_w = sum(np.where(mask, coefs[name], 0.0) for name, mask in units.items())
    scale = clock_scale(gpu, clock_mhz, fit)
    # Above idle, a busy-but-unloaded GPU burns mostly clock-distribution and uncore switching power,
    # which scales like dynamic power (f * V^2), not like leakage.
    static = fit.idle_w + (fit.static_w - fit.idle_w) * scale
    waiting = waiting_power_w(gpu, clock_mhz, fit)
    g = fit.utilisation_exponent
    dyn = scale * unit_w * util_compute ** g
    active = times.device_s > 0
    # No board draws more than its chip flat out: on a chip's reference board (full load = TDP) a fit's draw
    # above TDP is extrapolation past the capped windows it was fitted on, and its measured times hold the cap.
    demand = np.where(active, np.minimum(static + dyn + fit.memory_w * util_mem, full_load_power_w(gpu)), waiting)
    # The board's limit holds a node at TDP by lowering its clock (the estimate's phase throttling).
    power = np.minimum(demand, gpu.tdp_w)
    n = len(table)
    return NodePower(np.broadcast_to(power, (n,)).astype(float), np.broadcast_to(demand, (n,)).astype(float),
                     np.broadcast_to(waiting, (n,)).astype(float),
                     np.where(tc, util_compute, 0.0), np.where(tc, 0.0, util_compute), util_mem)
