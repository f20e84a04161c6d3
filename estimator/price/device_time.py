"""Per-node device time: PALEO-style roofline at an SM clock, corrected by the fitted residual.

t_node = kernels * kernel_latency + host_syncs * host_sync + grid_syncs * grid_sync + max(flops / peak(mode, clock), bytes / bandwidth)
         * exp(x . beta)
where x are the node's residual features (those the profile names) and beta the profile's most specific
fit for the node: its ATen op in its math mode, the op, its category in its math mode, the category,
then the profile's default; x . beta is then corrected by the residuals of the calibration benchmarks
of the node's op nearest to it (local_correction).
Memory bandwidth does not depend on the SM clock; compute peaks scale with it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..annotate.registry import LAYOUT_SENSITIVE_CATEGORIES
from ..catalog import GPUSpec
from ..profile import RESIDUAL_FEATURES, Profile, ResidualFit, mode_key, op_keys, seconds_or_prior
from .local_correction import local_corrections
from .node_table import NodeTable, map_values
from .reduce_launch import NodeLaunches, reduce_launches

# What a GPU without a hardware path for a math mode runs instead (cuBLAS/cuDNN fall back).
MATH_MODE_FALLBACK = {"fp8": "fp16", "int8": "fp16", "bf16": "fp32", "fp16": "fp32", "tf32": "fp32",
                      "int": "fp32", "fp64": "fp32"}
# Bytes per element of a math mode's operands, and the bytes of one filter tap's input channels from
# which a tensor-core convolution's gather stops mattering (chosen by 5-fold cross-validation: 512 B
# did best, 128, 256, 768 B and 1 KB 0.4-1.4 points worse in the conv median).
MODE_ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}
TAP_BYTES_REF = 512.0
GEMM_TILE = 128                       # output tile edge of the tensor-core GEMM kernels that dominate
# An op's size enters the fit as log_size. A tiled op (a GEMM, a convolution, attention) approaches its
# steady-state rate as its output tiles fill more waves of the SMs (the first wave's ramp and the last
# one's tail are shared by more work), so its size is log10(tiles / SMs), which means the same on every
# GPU, up to TILE_WAVES_STEADY waves; any other op's is log10(roofline / 1 us). Tiled ops had their
# roofline time there before, which made a batch-32 convolution's backward slower per FLOP than its
# batch-128 one, as smaller ones are, where both run many waves at the same rate. 5-fold
# cross-validation (benchmarks/cross_validate.py) chose 10 waves over 3 and 30, and the one column over
# a column of its own for the waves (mean of the category medians
# H100/H200 8.02/8.29 -> 7.78/8.09 %: attention 8.1/6.8 -> 6.9/5.4 %, matmul 8.7/7.8 -> 7.3/7.8 %, conv
# 10.2/11.3 -> 10.2/10.6 %; 3 waves gave 7.90/8.35 %, 30 waves 7.84/8.33 %, a column of its own 7.87/8.24 %).
TILE_WAVES_STEADY = 10.0
TILED_CATEGORIES = ("matmul", "conv", "attention")
# cuBLAS splits a GEMM with fewer output tiles than SMs and a deep K along K over more CTAs (split-K and
# stream-K kernels), each slice keeping at least SPLIT_K_DEPTH of K: a weight gradient over 400k tokens
# (96 x 384 outputs, 3 tiles) runs near its roofline, not at 3/132 of the GPU (the suite's mm_*_k401408;
# ConvNeXt-T's by-op profile). Matmul ops only: cuDNN picks its own convolution kernels.
SPLIT_K_DEPTH = 1024
# Causal attention (see executed_flops): the fixed work of one query tile in key tiles, and the query
# tiles resident per SM. Chosen against the suite's causal / non-causal SDPA pairs, whose time ratios are
# 0.57 at 64 key tiles, 0.64 at 16 and ~1.0 at 2 (and ~0.9 for 256 query tiles, which one wave holds);
# benchmarks/kernel_facts.py recomputes them.
ATTENTION_TILE_OVERHEAD = 3.0
ATTENTION_CTAS_PER_SM = 2
HEAD_DIM_REF = 128                    # log_head_dim = log2(attention head dim / this)
ALIGN_ELEMENTS = {"fp32": 4, "tf32": 4, "bf16": 8, "fp16": 8, "fp8": 16, "int8": 16}
# Scale of the fixed cost every kernel pays beyond latency (prologue, tail, partial last wave): the
# log_overhead feature is log(1 + OVERHEAD_SCALE_S / roofline), ~0 for long kernels.
OVERHEAD_SCALE_S = 1e-6
# GEMM-shaped ops whose smaller inner dimension (N or K per group) is below this cannot fill a
# tensor-core tile (depthwise convolutions, skinny projections): log_narrow = log2(min(N, K) / this).
NARROW_DIM = 64
# Row-wise ops (norms, softmax, reductions): log_row_len = log2(elements per row / ROW_LEN_REF) says how
# much fixed per-row work (a block's setup, a cross-warp reduction) each byte carries; log_row_fill =
# log2(rows / (SMs * ROW_BLOCKS_PER_SM)), capped at 0, says how much of the GPU too few rows leave idle.
# A norm kernel gives each row (a channel, a token) a block of its own and needs several resident blocks
# per SM to keep enough loads in flight: batch norm over 128 channels takes 1.9x the time of 256
# channels of the same bytes (ResNet-50's by-op kernel profile). TensorIterator's reductions split few,
# long rows over several blocks, so their rows are counted against the SMs alone. 4 was chosen by
# benchmarks/cross_validate.py (norm 13.7/13.4 % -> 10.4/11.3 % with log_row_segment, H100/H200).
# log_row_segment = log2(contiguous run / ROW_SEGMENT_REF), capped at 0, is for rows made of strided
# runs: batch norm over NCHW planes reads 7x7 planes at about a third of the bandwidth of 14x14, and a
# column reduction (dim 0) runs another kernel strategy than a row reduction of the same shape.
# log_row_overhead = log(1 + ceil(rows / SMs) * ROW_OVERHEAD_S / (roofline + OVERHEAD_SCALE_S)) is the fixed
# cost of each row against the time the bytes and the kernel's own fixed cost take (a 16384 x 64 layer norm
# runs at a tenth of the bandwidth). A norm gives each row a block; a TensorIterator reduction of short
# contiguous rows gives each a warp (a 1048576 x 32 sum takes 5.4x its roofline on the H100, a 65536 x 49
# mean 4.6x: benchmarks/kernel_facts.py; benchmarks/cross_validate.py: reduction 11.3/11.6 -> 9.0/10.3 %, norm
# 9.8/10.0 -> 9.6/9.9 %, H100/H200).
ROW_LEN_REF = 1024
ROW_BLOCKS_PER_SM = {"norm": 4.0}
ROW_SEGMENT_REF = 256
BROADCAST_RUN_REF = 256
ROW_OVERHEAD_S = {"norm": 1e-7, "reduction": 3e-8}
# One serial step: a round trip to memory that a kernel waits on before its next (a split reduction's
# global-memory finish adds partial results in turn; Cost.serial_steps); log_serial_steps =
# log(1 + steps * SERIAL_STEP_S / (roofline + OVERHEAD_SCALE_S)). benchmarks/cross_validate.py with the
# launch features (fill, memset, tail): reduction 9.0/10.3 -> 7.4/8.5 %, H100/H200.
SERIAL_STEP_S = 2.5e-7
# A persistent recurrent kernel (Cost.grid_syncs > 0) holds its recurrent weights in the registers of
# the SMs it occupies, up to PERSISTENT_REGISTER_STEPS serial steps' worth per step (49152 fp32 weights,
# 192 KB); the rest it re-reads every step. On the H100 a step took 0.66 us at 16384 weights, 1.16-1.21
# at 49152 (GRU, hidden 128), 1.88-2.34 at 65536 (LSTM, 128), 3.84 at 76800 and 7.66 at 147456
# (python3 benchmarks/kernel_facts.py): beyond the knee each weight costs about six times as much (the
# profiles' fitted persistent_step_s + spilled_step_s over persistent_step_s). The fit prices both
# shares per serial step.
PERSISTENT_REGISTER_STEPS = 0.75
# A table lookup (Cost.table_lookup) moves one element per thread and finds each element's source row:
# GATHER_ELEMENT_S per element and GATHER_ROW_S per looked-up row, per SM, bound it where its bytes do
# not (short rows, or a table that stays in cache: 17 MB looked up from a 100-row table take longer than
# from a 30522-row one, and 128-wide fp32 rows go at 1.6 G rows/s on the H100; benchmarks/kernel_facts.py).
# log_gather_bound = log(max(that bound, dram_floor_s) / roofline). benchmarks/cross_validate.py, with the
# serial chunks of the direct embedding backward (Cost.serial_steps): embedding 16.5/15.1 -> 10.4/12.0 %.
GATHER_ELEMENT_S = 1.2e-10
GATHER_ROW_S = 6e-8
ROW_VECTOR = 4
# The fitted correction never makes an op faster than its roofline at catalogue peaks (a physical
# bound for DRAM-resident data), nor more than 500x slower (a one-row layer norm of a few KB takes ~100x its
# roofline; fits stay inside their data's feature range in any case). The one exception to the first:
# an output of at most L2_ABSORBED_SHARE of the L2 cache stays there for its consumer instead of reaching
# DRAM while the op runs (an embedding lookup of 4096 x 1600 bf16 rows on the H100 moves its 26 MB at
# 3.8 TB/s, above the DRAM's 3.35; benchmarks/kernel_facts.py), so an op's floor is the time of its other
# bytes (dram_floor_s).
RESIDUAL_CLIP = (0.0, np.log(500.0))
EXTRAPOLATION_TOL = 1e-6              # feature units / log time by which clipping counts as extrapolating
L2_ABSORBED_SHARE = 0.5
Z90 = 1.6449                          # two-sided 90 % interval
MAX_LOG_SD = 2.0                      # std of log time beyond which an interval is capped


@dataclass(frozen=True)
class DeviceTimes:
    """Per-node arrays (seconds unless named otherwise)."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    roofline_s: np.ndarray
    latency_s: np.ndarray
    device_s: np.ndarray
    log_sd: np.ndarray                # std of log(device_s) from the fit (coefficients + residual)
    coef_sd: np.ndarray               # the part from coefficient uncertainty (correlated across nodes)
    peak_flops: np.ndarray            # FLOP/s used per node
    effective_mode: np.ndarray        # math mode priced (after fallbacks)
    work_flops: np.ndarray            # FLOP the kernels spend time on (see executed_flops)
    bound: np.ndarray                 # "compute" | "memory" | "latency" | "none"
    kernels: np.ndarray               # device operations per node: its kernels and a split reduction's memset
    features: np.ndarray              # (n, len(RESIDUAL_FEATURES)) residual regressors, all of them
    extrapolated: np.ndarray          # priced outside its fit's data: a feature or the correction clipped


def effective_math_modes(table: NodeTable, gpu: GPUSpec) -> tuple[np.ndarray, list[str]]:
    """The math mode each node runs in on `gpu` and warnings for modes the GPU lacks."""
    available = set(gpu.available_math_modes)
    modes = np.where(table.tensor_core, table.math_mode, np.where(table.math_mode == "fp64", "fp64", "fp32"))
    out = modes.copy()
    notes = []
    for mode in set(modes.tolist()):
        chosen = mode
        while chosen not in available and chosen in MATH_MODE_FALLBACK:
            chosen = MATH_MODE_FALLBACK[chosen]
        if chosen != mode:
            if mode not in ("int",):
                notes.append(f"{gpu.name} has no {mode} hardware path; {int((modes == mode).sum())} ops priced "
                             f"as {chosen}, as the GPU would run them")
            out[modes == mode] = chosen
    return out, notes


def executed_flops(table: NodeTable, gpu: GPUSpec, mode: np.ndarray) -> np.ndarray:
    """FLOPs each node's time is priced on (FLOP) in math modes `mode` (effective_math_modes): the counted
    FLOPs, with what kernels really compute.

    A dense tensor-core convolution pads its input and output channels to the tensor-core alignment of
    its math mode (ALIGN_ELEMENTS): an RGB stem's 3 channels run as 8 in bf16, as 4 in TF32 (the suite's
    3-channel stems take the same time in both, at twice the bf16 peak). The implicit GEMM of a node
    has one channel count as N and the other times the window as K, whichever gradient it is, so the
    factor is symmetric in the two. Grouped convolutions are left as counted.

    A causal attention kernel skips the key tiles above the diagonal, but every query tile still pays a
    fixed part (loading Q, the softmax epilogue, writing O: ATTENTION_TILE_OVERHEAD key tiles' worth),
    and the kernel cannot finish before its longest query tile, which sees every key: when one wave
    holds all query tiles the skipping saves nothing."""
    m, n, k, heads = table.gemm.T
    flops = table.flops
    dense = (table.category == "conv") & table.tensor_core & (heads <= 1) & (n > 0) & (k > 0)
    if dense.any():
        align = map_values(mode, ALIGN_ELEMENTS, 1.0)
        a = np.maximum(n, 1.0)
        b = np.maximum(k / np.maximum(table.window, 1.0), 1.0)
        pad = (np.ceil(a / align) * align / a) * (np.ceil(b / align) * align / b)
        flops = np.where(dense, flops * pad, flops)
    skipped = table.flops_skipped > 0
    if not skipped.any():
        return flops
    q_tiles = np.ceil(np.maximum(m, 1) / GEMM_TILE)
    k_tiles = np.ceil(np.maximum(n, 1) / GEMM_TILE)
    kept = 1.0 - table.flops_skipped / np.maximum(table.flops, 1.0)
    c = ATTENTION_TILE_OVERHEAD
    longest = c + k_tiles
    tiles = np.maximum(heads, 1) * q_tiles
    slots = ATTENTION_CTAS_PER_SM * gpu.sm_count
    causal = np.maximum(tiles * (c + kept * k_tiles) / slots, longest)
    full = np.maximum(tiles * (c + k_tiles) / slots, longest)
    return np.where(skipped, flops * causal / full, flops)


def persistent_steps(table: NodeTable) -> tuple[np.ndarray, np.ndarray]:
    """(serial steps, spilled serial steps) per node of the persistent kernels (grid_syncs > 0; 0
    elsewhere): Cost.serial_steps, and the share of them beyond PERSISTENT_REGISTER_STEPS per barrier."""
    persistent = table.grid_syncs > 0
    per_barrier = np.divide(table.serial_steps, table.grid_syncs, out=np.zeros(len(table)), where=persistent)
    spilled = table.grid_syncs * np.maximum(per_barrier - PERSISTENT_REGISTER_STEPS, 0.0)
    return np.where(persistent, table.serial_steps, 0.0), np.where(persistent, spilled, 0.0)


def persistent_step_time_s(table: NodeTable, grid_sync_s: float, step_s: float, spilled_s: float) -> np.ndarray:
    """Fixed device time per node of its persistent kernels' steps (s): grid_sync_s per barrier, step_s
    per serial step and spilled_s more per spilled one (persistent_steps)."""
    serial, spilled = persistent_steps(table)
    return table.grid_syncs * grid_sync_s + serial * step_s + spilled * spilled_s


def dram_floor_s(table: NodeTable, gpu: GPUSpec) -> np.ndarray:
    """Seconds per node for the bytes that must cross the DRAM interface at catalogue bandwidth: all
    but an output small enough to stay in L2 (L2_ABSORBED_SHARE of it)."""
    absorbed = table.bytes_written <= gpu.l2_cache_bytes * L2_ABSORBED_SHARE
    return np.where(absorbed, table.bytes - table.bytes_written, table.bytes) / gpu.memory_bandwidth_bytes_per_s


def log_floor(compute_s: np.ndarray, dram_s: np.ndarray, roofline_s: np.ndarray) -> np.ndarray:
    """The lowest log correction per node: log(max(compute, dram_s) / roofline), at most 0 (dram_s:
    dram_floor_s)."""
    floor = np.maximum(compute_s, dram_s)
    return np.minimum(np.log(np.maximum(floor, 1e-15) / np.maximum(roofline_s, 1e-15)), RESIDUAL_CLIP[0])


def residual_features(table: NodeTable, gpu: GPUSpec, mode: np.ndarray, peak: np.ndarray,
                      roofline_s: np.ndarray, work_flops: np.ndarray, launches: NodeLaunches,
                      dram_s: np.ndarray) -> np.ndarray:
    """Feature matrix (n, len(RESIDUAL_FEATURES)), columns in RESIDUAL_FEATURES order; every feature is
    normalised to the GPU so a fit transfers between GPUs (intensity relative to the ridge point,
    waves relative to the SM count). dram_s: dram_floor_s of the table."""
    n = len(table)
    bw = gpu.memory_bandwidth_bytes_per_s
    intensity = work_flops / np.maximum(table.bytes, 1.0)
    ridge = peak / bw
    r = np.log2(np.maximum(intensity, 1e-6) / ridge)
    r = np.clip(r, -12.0, 8.0)
    m, nn, k, batch = table.gemm.T
    is_gemm = (m > 0) & (nn > 0)
    tiles = np.ceil(np.maximum(m, 1) / GEMM_TILE) * np.ceil(np.maximum(nn, 1) / GEMM_TILE) * np.maximum(batch, 1)
    split = np.clip(np.floor(gpu.sm_count / tiles), 1.0, np.maximum(np.floor(np.maximum(k, 1) / SPLIT_K_DEPTH), 1.0))
    tiles = np.where(table.category == "matmul", tiles * split, tiles)
    waves = np.ceil(tiles / gpu.sm_count)
    wave_eff = np.where(is_gemm, tiles / (waves * gpu.sm_count), 1.0)
    align = map_values(mode, ALIGN_ELEMENTS, 1.0)
    misaligned = is_gemm & ((np.mod(m, align) != 0) | (np.mod(nn, align) != 0) | (np.mod(k, align) != 0))
    rows, row_len = table.rowwise.T
    rowwise = (rows > 0) & (row_len > 0)
    row_waves = np.ceil(np.maximum(rows, 1.0) / gpu.sm_count)     # rows each SM takes in turn
    f: dict[str, np.ndarray] = {}
    f["const"] = np.ones(n)
    f["ridge_pos"] = np.maximum(r, 0.0)
    f["ridge_neg"] = np.minimum(r, 0.0)
    f["log_wave_eff"] = np.log(np.clip(wave_eff, 1e-3, 1.0))
    tiled = is_gemm & np.isin(table.category, TILED_CATEGORIES)
    f["log_size"] = np.where(tiled, np.clip(np.log10(np.maximum(tiles / gpu.sm_count, 1e-6)), -3.0,
                                            np.log10(TILE_WAVES_STEADY)),
                             np.clip(np.log10(np.maximum(roofline_s, 1e-12) / 1e-6), -3.0, 6.0))
    f["misaligned"] = misaligned.astype(float)
    lowp_data = np.isin(table.math_mode, ["bf16", "fp16", "fp8"])
    simt_conv = (table.category == "conv") & ~table.tensor_core
    # 16-bit tensor-core math, or 16-bit data through a CUDA-core convolution (depthwise)
    f["lowp"] = (np.isin(mode, ["bf16", "fp16", "fp8", "int8"]) & table.tensor_core) | (simt_conv & lowp_data)
    f["tf32"] = (mode == "tf32") & table.tensor_core
    f["log_overhead"] = np.clip(np.log1p(OVERHEAD_SCALE_S / np.maximum(roofline_s, 1e-12)), 0.0, 10.0)
    inner = np.maximum(np.minimum(nn, k), 1.0)
    f["log_narrow"] = np.where(is_gemm, np.minimum(np.log2(inner / NARROW_DIM), 0.0), 0.0)
    row_len_rel = np.clip(np.log2(np.maximum(row_len, 1.0) / ROW_LEN_REF), -10.0, 10.0)
    # ATen's reduction kernel splits a long row over warps and blocks (its launch fill and global finish
    # are features of their own), so only a short row's fixed work per byte is left to this feature.
    f["log_row_len"] = np.where(rowwise, np.where(table.reduce_kernel, np.minimum(row_len_rel, 0.0), row_len_rel),
                                0.0)
    blocks = gpu.sm_count * table.map_category(ROW_BLOCKS_PER_SM, 1.0)
    # ATen's reduction kernel fills the GPU as its launch says (it splits few rows over many blocks).
    row_fill = np.where(table.reduce_kernel, np.log2(np.maximum(launches.fill, 1e-6)),
                        np.minimum(np.log2(np.maximum(rows, 1.0) / blocks), 0.0))
    f["log_row_fill"] = np.where(rowwise, row_fill, 0.0)
    segmented = rowwise & (table.row_segment > 0)
    f["log_row_segment"] = np.where(segmented, np.clip(np.log2(np.maximum(table.row_segment, 1.0) / ROW_SEGMENT_REF),
                                                       -4.0, 0.0), 0.0)
    f["permuted"] = table.permuted & ~table.tensor_core
    # A permuted copy cannot vectorise: each lane moves one element, so 16-bit elements take nearly the
    # time of 32-bit ones (one direct_copy_kernel either way; a 4096x4096 transpose took 123 us in bf16,
    # 138 us in fp32, data/kernels/H100-SXM-benchmarks.jsonl): its bytes understate a 16-bit one's time.
    f["permuted_lowp"] = f["permuted"] & lowp_data
    # Which permutation: a transpose's blocks use a sliver of every sector they read and fetch it again
    # for each block that needs the rest; a head transpose moves whole rows (benchmarks/kernel_facts.py).
    f["log_read_amplification"] = np.where(f["permuted"], np.log2(np.maximum(table.read_amplification, 1.0)), 0.0)
    # How much of the counted work a causal kernel is priced to skip: per skipped FLOP a kernel saves less
    # than a FLOP's time (diagonal tiles are computed whole, each query tile pays a fixed epilogue).
    kept = np.divide(work_flops, table.flops, out=np.ones(n), where=table.flops > 0)
    f["log_work_kept"] = np.log(np.clip(kept, 1e-3, 1.0))
    f["log_window"] = np.log2(np.maximum(table.window, 1.0))
    # An implicit-GEMM convolution gathers its K operand one filter tap at a time, each tap's slice the
    # input channels of a group: a stem's 3 or 16 channels fill little of a K-block, which the window
    # size alone mistook for a cost of large windows (5-fold cross-validation on the session-13 suite,
    # conv median H100/H200: 11.2/11.3 -> 9.4/9.8 %; benchmarks/cross_validate.py). Saturates at
    # TAP_BYTES_REF.
    tap_bytes = k / np.maximum(table.window, 1.0) * map_values(mode, MODE_ELEMENT_BYTES, 4.0)
    gathers_taps = (table.category == "conv") & table.tensor_core & is_gemm & (k > 0)
    f["log_tap_bytes"] = np.where(gathers_taps,
                                  np.clip(np.log2(np.maximum(tap_bytes, 1.0) / TAP_BYTES_REF), -8.0, 0.0), 0.0)
    # cuDNN's NHWC depthwise kernels beat PyTorch's NCHW ones by ~4x in 16-bit but by a shape-dependent
    # 0.3-3.4x in tf32 (benchmarks/kernel_facts.py), so the memory format enters per data precision.
    f["nhwc_lowp"] = table.channels_last & lowp_data
    f["nhwc_fp32"] = table.channels_last & ~lowp_data
    # A flash-attention tile's work per byte loaded grows with the head dimension (its GEMMs' K).
    attention = table.category == "attention"
    f["log_head_dim"] = np.where(attention, np.clip(np.log2(np.maximum(k, 1.0) / HEAD_DIM_REF), -3.0, 1.0), 0.0)
    row_time = row_waves * table.map_category(ROW_OVERHEAD_S, 0.0)
    # A column reduction (strided rows) maps outputs to lanes and pays no per-row reduction.
    per_row = rowwise & ((table.category == "norm") | (table.row_segment == 0))
    fixed_and_bytes = roofline_s + OVERHEAD_SCALE_S
    f["log_row_overhead"] = np.where(per_row, np.clip(np.log1p(row_time / fixed_and_bytes), 0.0, 10.0), 0.0)
    # The block that finishes a split reduction adds the partial results in turn, each a round trip to L2:
    # column sums over 64 or 96 long columns take 4.5-5.9x their roofline (benchmarks/kernel_facts.py).
    # A persistent kernel's serial steps are priced as fixed time (persistent_step_time_s).
    serial_s = (launches.final_steps + np.where(table.grid_syncs > 0, 0.0, table.serial_steps)) * SERIAL_STEP_S
    f["log_serial_steps"] = np.clip(np.log1p(serial_s / fixed_and_bytes), 0.0, 10.0)
    lookup_s = row_waves * GATHER_ROW_S + np.ceil(np.maximum(rows * row_len, 1.0) / gpu.sm_count) * GATHER_ELEMENT_S
    gather_s = np.maximum(dram_s, lookup_s)
    f["log_gather_bound"] = np.where(rowwise & table.table_lookup,
                                     np.clip(np.log(gather_s / np.maximum(roofline_s, 1e-12)), -5.0, 5.0), 0.0)
    # 16-bit atomic adds run as compare-and-swap loops or paired adds: a scatter of bf16 gradients takes
    # about twice its fp32 time (Cost.atomic_adds).
    f["atomic_lowp"] = table.atomic_adds & lowp_data
    f["mixed_dtypes"] = table.mixed_dtypes & ~table.tensor_core
    f["broadcast"] = table.broadcast & ~table.tensor_core
    # A broadcast op re-reads the expanded value at every run of it: a per-channel scale over 7x7 planes
    # (batch norm in eval, squeeze-excite) runs slower per byte than over 56x56 planes, and runs of
    # BROADCAST_RUN_REF elements or more stream alike. The penalty is on the streaming time, not on an
    # op's fixed cost, so it is weighted by the streaming share roof / (roof + OVERHEAD_SCALE_S): a
    # batch-1 op of a few hundred KB is mostly fixed cost whatever its runs (benchmarks/cross_validate.py:
    # elementwise median 9.5/8.0 -> 8.9/7.3 %, P90 42/43 -> 31/32 %, H100/H200).
    expanded = table.broadcast & (table.broadcast_run > 0) & ~table.tensor_core
    streaming_share = roofline_s / (roofline_s + OVERHEAD_SCALE_S)
    f["log_broadcast_run"] = streaming_share * np.where(
        expanded, np.clip(np.log2(np.maximum(table.broadcast_run, 1.0) / BROADCAST_RUN_REF), -8.0, 0.0), 0.0)
    # PyTorch's row kernels (layer norm, softmax) load a row ROW_VECTOR elements at a time; other row
    # lengths take unvectorised kernels, 4.5-5.6x the time per element (benchmarks/kernel_facts.py). Set for every
    # row-wise node; fits whose rows never have it (batch norm) give it no coefficient.
    f["odd_rows"] = rowwise & (np.mod(row_len, ROW_VECTOR) != 0)
    # DRAM writes cost more than reads: a bf16 -> fp32 cast (2 bytes read, 4 written per element) takes
    # 1.3-2.0x as long as fp32 -> bf16 (4 read, 2 written; benchmarks/kernel_facts.py). 0 for read = write.
    streaming = np.isin(table.category, list(LAYOUT_SENSITIVE_CATEGORIES))
    f["write_share"] = np.where(streaming, table.bytes_written / np.maximum(table.bytes, 1.0) - 0.5, 0.0)
    # cuDNN runs a tensor-core convolution of NCHW data in NHWC, transposing its operands on the way in
    # and out, unless it is a GEMM over the planes as stored (1x1, stride 1) whose planes are a whole
    # number of tensor-core loads (on the H100 the suite's bf16 1x1 convolutions over 28x28 and 56x56
    # planes take 1.3-3.1x their memory roofline, over 14x14 and 7x7 planes 3.9-11.8x; kernel_facts.py).
    in_place = (table.gemm_plane > 0) & (np.mod(table.gemm_plane, align) == 0)
    tensor_core_conv = (table.category == "conv") & table.tensor_core & (mode != "fp32")
    f["relayout"] = tensor_core_conv & ~table.channels_last & ~in_place
    return np.column_stack([np.broadcast_to(np.asarray(f[name], dtype=float), (n,)) for name in RESIDUAL_FEATURES])


def fit_key(op: str, category: str, mode: str, available: Iterable[str]) -> str:
    """The residual fit a node uses: the most specific of op@mode, op (or its out-of-place form, see
    op_keys), category@mode, category that the profile has, else "default"."""
    return next((c for c in (*op_keys(op, mode), mode_key(category, mode), category) if c in available),
                "default")


def fit_keys(table: NodeTable, mode: np.ndarray, available: Iterable[str]) -> np.ndarray:
    """fit_key of every node of `table` priced in math modes `mode`."""
    have = set(available)
    resolved: dict[tuple[str, str, str], str] = {}
    keys = np.empty(len(table), dtype=object)
    for i, triple in enumerate(zip(table.fit_op.tolist(), table.category.tolist(), mode.tolist())):
        key = resolved.get(triple)
        if key is None:
            key = resolved[triple] = fit_key(*triple, have)
        keys[i] = key
    return keys


def within_fit_range(fit: ResidualFit, x: np.ndarray) -> np.ndarray:
    """Features clipped to the range `fit` was fitted on: a fit is used, never extrapolated."""
    if fit.x_lo is None or fit.x_hi is None:
        return x
    return np.clip(x, np.asarray(fit.x_lo), np.asarray(fit.x_hi))


def device_times(table: NodeTable, gpu: GPUSpec, clock_mhz: float | np.ndarray, profile: Profile,
                 launch: str = "eager") -> tuple[DeviceTimes, list[str]]:
    """Price every node of `table` on `gpu` at `clock_mhz` (MHz; a scalar or one clock per node).

    The caller range-checks clocks; compute peaks scale linearly with the SM clock."""
    mode, notes = effective_math_modes(table, gpu)
    peaks = {m: gpu.peak_flops_per_s(m) for m in set(mode.tolist())}
    peak_ref = map_values(mode, peaks, 0.0)
    peak = peak_ref * (np.asarray(clock_mhz, dtype=float) / gpu.peak_tflops_clock_mhz)
    work = executed_flops(table, gpu, mode)
    compute = work / peak
    memory = table.bytes / gpu.memory_bandwidth_bytes_per_s
    roof = np.maximum(compute, memory)
    # An op's efficiency relative to its roofline is a property of its shape, not of the clock it
    # runs at: features use the roofline at the catalogue's reference clock, so compute-bound ops
    # scale exactly 1/f.
    roof_ref = np.maximum(work / np.where(peak_ref > 0, peak_ref, np.inf), memory)
    launches = reduce_launches(table, gpu)
    dram_s = dram_floor_s(table, gpu)
    x = residual_features(table, gpu, mode, peak_ref, roof_ref, work, launches, dram_s)
    cols = [RESIDUAL_FEATURES.index(f) for f in profile.residual_features]
    log_eff = np.zeros(len(table))
    coef_var = np.zeros(len(table))
    resid_var = np.zeros(len(table))
    log_lo, log_hi = np.full(len(table), -np.inf), np.full(len(table), np.inf)
    extrapolated = np.zeros(len(table), dtype=bool)
    fit_key = fit_keys(table, mode, profile.residuals)
    for key in set(fit_key.tolist()):
        sel = fit_key == key
        fit = profile.residuals[key]
        beta = np.asarray(fit.coef)
        cov = np.asarray(fit.cov)
        raw = x[np.ix_(sel, cols)]
        xs = within_fit_range(fit, raw)
        extrapolated[sel] = (np.abs(xs - raw) > EXTRAPOLATION_TOL).any(axis=1)
        if fit.log_lo is not None and fit.log_hi is not None:
            log_lo[sel], log_hi[sel] = fit.log_lo, fit.log_hi
        log_eff[sel] = xs @ beta
        # A robust fit's covariance of a near-singular design need not be PSD (clip tiny negatives),
        # and a 90 % interval wider than e^(Z90*MAX_LOG_SD) says "unknown" as well as a wider one would.
        coef_var[sel] = np.clip(np.einsum("ij,jk,ik->i", xs, cov, xs), 0.0, MAX_LOG_SD ** 2)
        resid_var[sel] = fit.sigma ** 2
    if profile.residual_points:
        log_eff += local_corrections(x[:, cols], table.fit_op, mode, profile.residual_points)
    # The learned part corrects the analytic time only as far as its calibration data did.
    bounded = np.clip(log_eff, log_lo, log_hi)
    extrapolated |= np.abs(bounded - log_eff) > EXTRAPOLATION_TOL
    # Outside its data a fit says little: the interval spans at least half the range its data showed.
    half_range = np.where(np.isfinite(log_hi - log_lo), (log_hi - log_lo) / 2, MAX_LOG_SD)
    resid_var = np.minimum(np.where(extrapolated, np.maximum(resid_var, half_range ** 2), resid_var), MAX_LOG_SD ** 2)
    log_eff = np.clip(bounded, log_floor(compute, dram_s, roof), RESIDUAL_CLIP[1])
    active = ~(table.free | table.host_only)
    lat_per_kernel = profile.graph_kernel_latency_s if launch == "graph" else profile.kernel_latency_s
    sync_s, grid_s, step_s, spilled_s = (seconds_or_prior(profile, key) for key in (
        "host_sync_s", "grid_sync_s", "persistent_step_s", "spilled_step_s"))
    kernels = table.kernels + launches.memsets
    latency = np.where(active, kernels * lat_per_kernel + table.host_syncs * sync_s
                       + persistent_step_time_s(table, grid_s, step_s, spilled_s), 0.0)
    corrected = np.where(active, roof * np.exp(log_eff), 0.0)
    device = latency + corrected
    bound = np.where(~active, "none", np.where(latency > corrected, "latency",
                                                np.where(compute >= memory, "compute", "memory")))
    share = np.divide(corrected, device, out=np.zeros_like(device), where=device > 0)
    times = DeviceTimes(compute, memory, roof, latency, device,
                        log_sd=share * np.sqrt(coef_var + resid_var), coef_sd=share * np.sqrt(coef_var),
                        peak_flops=peak, effective_mode=mode, work_flops=work, bound=bound, kernels=kernels,
                        features=x, extrapolated=extrapolated & active)
    return times, notes


def warn_notes(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(note, stacklevel=3)
