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
import weakref
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..catalog import GPUSpec, get_gpu
from ..errors import UnknownGPUError
from ..profile import Profile, ResidualFit, mode_key, op_keys, seconds_or_prior
from .features import (ALIGN_ELEMENTS, GEMM_TILE, RESIDUAL_FEATURES, FeatureInputs,  # noqa: F401 (re-exported)
                       channel_wave_factor, layout_time_factor, misaligned_peak_share,
                       residual_features)
from .local_correction import local_corrections
from ..annotate.formulas.pool import INTERPOLATE_BLOCK_THREADS
from .arrays import map_values
from .node_table import NodeTable
from .reduce_launch import NodeLaunches, reduce_launches

# What a GPU without a hardware path for a math mode runs instead (cuBLAS/cuDNN fall back).
MATH_MODE_FALLBACK = {"fp8": "fp16", "int8": "fp16", "bf16": "fp32", "fp16": "fp32", "tf32": "fp32",
                      "int": "fp32", "fp64": "fp32"}
# Causal attention (see executed_flops): the fixed work of one query tile in key tiles, and the query
# tiles resident per SM. Chosen against the suite's causal / non-causal SDPA pairs, whose time ratios are
# 0.57 at 64 key tiles, 0.64 at 16 and ~1.0 at 2 (and ~0.9 for 256 query tiles, which one wave holds);
# benchmarks/kernel_facts.py recomputes them.
ATTENTION_TILE_OVERHEAD = 3.0
ATTENTION_CTAS_PER_SM = 2
# A persistent recurrent kernel (Cost.grid_syncs > 0) holds its recurrent weights in the registers of
# the SMs it occupies, up to PERSISTENT_REGISTER_STEPS serial steps' worth per step (49152 fp32 weights,
# 192 KB); the rest it re-reads every step. On the H100 a step took 0.66 us at 16384 weights, 1.16-1.21
# at 49152 (GRU, hidden 128), 1.88-2.34 at 65536 (LSTM, 128), 3.84 at 76800 and 7.66 at 147456
# (python3 benchmarks/kernel_facts.py): beyond the knee each weight costs about six times as much (the
# profiles' fitted persistent_step_s + spilled_step_s over persistent_step_s). The fit prices both
# shares per serial step.
PERSISTENT_REGISTER_STEPS = 0.75
# An accumulating index_put walks each run of equal indices in turn, every update reading the row the
# last one wrote (Cost.dependent_updates): on the H100 0.67 us per update in fp32 and 1.00 in bf16 over
# run lengths 3-2047 (python3 benchmarks/kernel_facts.py), 10-20x an MoE expert bias's bytes.
ACCUMULATE_UPDATE_S = {"32-bit": 6.7e-7, "16-bit": 1.0e-6}
# A multi-tensor (foreach) launch gives each block one chunk of up to 65536 elements, which it walks 2048 at
# a time, each step waiting on its loads (Cost.chunk_walks). On the H200 a 32-step walk took 0.67 us per
# step beyond the kernel latency from DRAM (median of 36 calls of six ops, fp32 and bf16; 0.48-1.34) and
# 0.31 us from L2, where the kernel before had just written every list it reads (0.26-0.60): 20-36 us and
# 11-22 us where their bytes take 1-10 us (python3 benchmarks/kernel_facts.py, `foreach walk probe`; the
# suite's walk benchmarks, DRAM-cold, 0.83). A small model's optimizer step is such launches, priced by its
# bytes well under its foreach ops' per-op times. The walk bounds the launch from below.
CHUNK_WALK_STEP_S = {"dram": 6.7e-7, "l2": 3.1e-7}
# An NCHW interpolation kernel's thread walks every (sample, channel) plane in turn, each step waiting on its
# loads (Cost.plane_walks): on the H200 a bilinear step took 0.38 us from DRAM (median of 15 calls of one
# wave, 4096-32768 planes, fp32 and bf16; 0.33-0.42) and 0.20 us where the input was just written and fits
# half the L2 (0.18-0.34); bicubic and 1-D linear steps 0.38-0.66 us (python3 benchmarks/kernel_facts.py,
# `plane walk probe`). Blocks beyond the SMs' resident 1024-thread blocks walk again.
PLANE_WALK_STEP_S = {"dram": 3.8e-7, "l2": 2.0e-7}
# A kernel queued behind another starts this long after it ends: the profile's kernel_latency_s (the
# events_queued time per tiny kernel) holds it, device-busy time (the union of kernel intervals) does not.
# 0.90 us on the H100, 0.99 on the H200 (python3 benchmarks/kernel_facts.py); the smaller is kept.
QUEUED_KERNEL_GAP_S = 9.0e-7
# In a network each kernel not bound by launch latency leaves the device idle this long before the next,
# already queued one starts: wall less busy less host-starved time per kernel in networks whose trace shows the
# host ahead, 1.27-1.35 us on the H200; a CUDA graph's back-to-back kernels leave 0.13-0.17 us (python3
# benchmarks/kernel_facts.py, 'kernel gaps'). Calibration's back-to-back timings fold their own gap into the
# op's time, which networks' busy time matches, so this gap adds to wall time only.
INTERKERNEL_GAP_S = {"eager": 1.34e-6, "graph": 1.4e-7}
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
# The suite times every op on DRAM-cold inputs; in a network an elementwise op often reads what the kernel
# right before it wrote, and an output of at most L2_ABSORBED_SHARE of L2 is still there. Each such byte saves
# this share of a DRAM byte's time (data/kernels/H100-SXM-l2-reuse.jsonl, 8-24 MB tensors: a warm in-place ReLU
# takes 0.63-0.71 of its cold time with half its bytes warm, a warm scalar multiply 0.77-0.90; the H200's give
# 0.48 and 0.29, the H100's are kept; python3 benchmarks/kernel_facts.py prints both).
L2_WARM_SAVING = {"in_place": 0.69, "out_of_place": 0.34}
# The kinds of op the probe measured: elementwise ops, and copies (casts and clones on the H200 save 0.28-0.49
# of a DRAM byte's time per warm byte, data/kernels/H200-l2-reuse-copies.jsonl; kernel_facts prints them).
L2_WARM_CATEGORIES = ("elementwise", "copy")


def resident_threads(gpu: GPUSpec) -> float:
    """Threads the GPU keeps resident at once: by Little's law, what bounds the bytes a latency-bound
    memory op has in flight, so its throughput (moved_correction)."""
    return float(gpu.sm_count * gpu.max_threads_per_sm)

Z90 = 1.6449                          # two-sided 90 % interval
MAX_LOG_SD = 2.0                      # std of log time beyond which an interval is capped


@dataclass(frozen=True)
class DeviceTimes:
    """Per-node arrays (seconds unless named otherwise)."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    walk_s: np.ndarray                # serial walks, a floor under the corrected roofline (walk_floor_s)
    roofline_s: np.ndarray
    latency_s: np.ndarray
    device_s: np.ndarray              # time the node holds the device's queue: its kernels and the gaps after them
    busy_s: np.ndarray                # the part its kernels run (device_s less the queued gaps)
    interkernel_gap_s: np.ndarray     # idle after its kernels in a network, beyond device_s (wall, not busy)
    log_sd: np.ndarray                # std of log(device_s) from the fit (coefficients + residual)
    coef_sd: np.ndarray               # the part from coefficient uncertainty (correlated across nodes)
    peak_flops: np.ndarray            # FLOP/s used per node
    effective_mode: np.ndarray        # math mode priced (after fallbacks)
    work_flops: np.ndarray            # FLOP the kernels spend time on (see executed_flops)
    bound: np.ndarray                 # "compute" | "memory" | "latency" | "none"
    kernels: np.ndarray               # device operations per node: its kernels and a split reduction's memset
    features: np.ndarray              # (n, len(RESIDUAL_FEATURES)) residual regressors, all of them
    extrapolated: np.ndarray          # priced outside its fit's data: a feature or the correction clipped

    @property
    def queue_s(self) -> np.ndarray:
        """Time (s) each node holds the device's queue in a network: device_s and the gap after its kernels."""
        return self.device_s + self.interkernel_gap_s


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


def walk_floor_s(table: NodeTable, gpu: GPUSpec) -> np.ndarray:
    """Device time (s) of each node's serial walks, a floor under its roofline: a multi-tensor launch's chunk
    walks (Cost.chunk_walks) and an NCHW interpolation's plane walk (Cost.plane_walks, once per wave of its
    blocks); each step from L2 where the kernel right before wrote everything the node reads and that output
    stays in L2 (L2_ABSORBED_SHARE), else from DRAM."""
    all_warm = reads_from_l2(table, gpu) & (table.warm_read_bytes >= table.bytes - table.bytes_written)
    where = np.where(all_warm, "l2", "dram")
    resident = gpu.sm_count * max(gpu.max_threads_per_sm // INTERPOLATE_BLOCK_THREADS, 1)
    waves = np.maximum(np.ceil(table.walk_blocks / resident), 1.0)
    return (table.chunk_walks * map_values(where, CHUNK_WALK_STEP_S, 0.0)
            + table.plane_walks * waves * map_values(where, PLANE_WALK_STEP_S, 0.0))


def dependent_update_time_s(table: NodeTable) -> np.ndarray:
    """Device time (s) of each node's serial chain of read-modify-writes (Cost.dependent_updates)."""
    per_update = np.where(table.low_precision(),
                          ACCUMULATE_UPDATE_S["16-bit"], ACCUMULATE_UPDATE_S["32-bit"])
    return table.dependent_updates * per_update


def dram_floor_s(table: NodeTable, gpu: GPUSpec) -> np.ndarray:
    """Seconds per node for the bytes that must cross the DRAM interface at catalogue bandwidth: all
    but an output small enough to stay in L2 (L2_ABSORBED_SHARE of it)."""
    absorbed = table.bytes_written <= gpu.l2_cache_bytes * L2_ABSORBED_SHARE
    return np.where(absorbed, table.bytes - table.bytes_written, table.bytes) / gpu.memory_bandwidth_bytes_per_s


def reads_from_l2(table: NodeTable, gpu: GPUSpec) -> np.ndarray:
    """bool per node: it reads bytes the kernel right before it wrote, and that kernel's output, at most
    L2_ABSORBED_SHARE of the L2 cache, is still there."""
    return (table.warm_read_bytes > 0) & (table.warm_producer_bytes <= gpu.l2_cache_bytes * L2_ABSORBED_SHARE)


def l2_warm_factor(table: NodeTable, gpu: GPUSpec, memory_bound: np.ndarray) -> np.ndarray:
    """Per node, the share of its DRAM-cold time it keeps when the kernel right before it left what it
    reads in L2 (L2_WARM_SAVING): memory-bound elementwise nodes whose producer wrote at most
    L2_ABSORBED_SHARE of the L2 cache (reads_from_l2); 1 elsewhere."""
    hit = memory_bound & np.isin(table.category, L2_WARM_CATEGORIES) & reads_from_l2(table, gpu)
    per_byte = np.where(table.in_place, L2_WARM_SAVING["in_place"], L2_WARM_SAVING["out_of_place"])
    warm_share = np.divide(table.warm_read_bytes, table.bytes, out=np.zeros(len(table)), where=table.bytes > 0)
    return np.where(hit, 1.0 - per_byte * warm_share, 1.0)


def log_floor(compute_s: np.ndarray, dram_s: np.ndarray, roofline_s: np.ndarray) -> np.ndarray:
    """The lowest log correction per node: log(max(compute, dram_s) / roofline), at most 0 (dram_s:
    dram_floor_s)."""
    floor = np.maximum(compute_s, dram_s)
    return np.minimum(np.log(np.maximum(floor, 1e-15) / np.maximum(roofline_s, 1e-15)), RESIDUAL_CLIP[0])


def fit_key(op: str, category: str, mode: str, available: Iterable[str]) -> str:
    """The residual fit a node uses: the most specific of op@mode, op (or its out-of-place form, see
    op_keys), category@mode, category that the profile has, else "default"."""
    return next((c for c in (*op_keys(op, mode), mode_key(category, mode), category) if c in available),
                "default")


def fit_keys(table: NodeTable, mode: np.ndarray, available: Iterable[str]) -> np.ndarray:
    """fit_key of every node of `table` priced in math modes `mode`."""
    return _fit_keys(table.fit_op, table.category, mode, available)


def _fit_keys(fit_op: np.ndarray, category: np.ndarray, mode: np.ndarray, available: Iterable[str]) -> np.ndarray:
    have = set(available)
    resolved: dict[tuple[str, str, str], str] = {}
    keys = np.empty(len(fit_op), dtype=object)
    for i, triple in enumerate(zip(fit_op.tolist(), category.tolist(), mode.tolist())):
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


def _compute_capability(name: str) -> str | None:
    """The catalogue compute capability of the GPU a profile was fitted on; None for one not catalogued."""
    try:
        return get_gpu(name).compute_capability
    except UnknownGPUError:
        return None


def correction_sources(table: NodeTable, mode: np.ndarray, sources: tuple[Profile, ...],
                       gpu: GPUSpec | None = None) -> np.ndarray:
    """(sources x nodes) booleans: which of `sources` (the profile pricing `gpu`, then other GPUs' profiles,
    the donors) correct each node. A node takes the nearest tier of sources that saw any of its evidence_names
    (its op, its category) in its math mode: the profile itself where it is `gpu`'s own; else the donors of
    `gpu`'s compute capability (the same SM design, for which cuBLAS and cuDNN pick the same kernels); else
    every donor that saw it, their log corrections averaged; where none did, the profile alone (also the only
    source when there is one). A profile's own fits need not come from rows like the node's (public FP32
    timings hold no tensor-core rows; a Hopper's FP32 convolutions are all depthwise: CUDA_CORE_GROUPS_KEY),
    and averaging over every GPU that measured the like spreads one architecture's quirks thin."""
    out = np.zeros((len(sources), len(table)), dtype=bool)
    if len(sources) == 1:
        out[0] = True
        return out
    own = gpu is not None and sources[0].gpu == gpu.name
    same_chip = np.array([False] + [gpu is not None and _compute_capability(p.gpu) == gpu.compute_capability
                                    for p in sources[1:]])
    narrow = cuda_core_convolutions(table)
    chosen: dict[tuple[str, str, str, bool], np.ndarray] = {}
    for i, key in enumerate(zip(table.fit_op.tolist(), table.category.tolist(), mode.tolist(), narrow.tolist())):
        if key not in chosen:
            op, category, m, cuda_cores = key
            names = evidence_names(op, category, m, cuda_cores)
            saw = np.array([any(p.saw(n, m) for n in names) for p in sources])
            if own and saw[0]:
                saw[1:] = False
            else:
                saw[0] = False
                if (saw & same_chip).any():
                    saw &= same_chip
                saw[0] = not saw.any()
            chosen[key] = saw
        out[:, i] = chosen[key]
    return out


# A grouped convolution too narrow for tensor cores runs CUDA-core kernels (node_table.runs_on_tensor_cores)
# unlike any dense convolution of its math mode: profiles record what they measured of it under this key
# (calibrate.fit.fitted_modes) instead of its op's and category's, so that a Hopper's depthwise layers, its only
# FP32 convolutions, do not correct another GPU's dense FP32 (cuDNN's Winograd and GEMM) ones.
CUDA_CORE_GROUPS_KEY = "conv[cuda_core_groups]"


def cuda_core_convolutions(table: NodeTable) -> np.ndarray:
    """bool per node: a convolution that runs on CUDA cores for its narrow groups (CUDA_CORE_GROUPS_KEY)."""
    return (table.category == "conv") & ~table.tensor_core


def evidence_names(op: str, category: str, mode: str, cuda_cores: bool) -> tuple[str, ...]:
    """The names under which a profile's fitted_modes record what it measured of a node like this one: its
    op (with its variant, then without; in place, then out of place) and its category, and for a convolution
    run on CUDA cores, CUDA_CORE_GROUPS_KEY."""
    names = (*op_keys(op, mode)[1::2], category)   # the op, its variant-free and out-of-place forms
    return (CUDA_CORE_GROUPS_KEY, *names) if cuda_cores else names


@dataclass(frozen=True)
class Roofline:
    """A node table's roofline on one GPU (per-node arrays, seconds) and the residual features read off it."""

    mode: np.ndarray                  # math mode priced (after the GPU's fallbacks)
    peak_ref: np.ndarray              # FLOP/s at the catalogue's reference clock
    work: np.ndarray                  # executed_flops
    memory_s: np.ndarray              # bytes at catalogue DRAM bandwidth
    roof_ref_s: np.ndarray            # roofline at the reference clock
    launches: NodeLaunches
    dram_s: np.ndarray                # dram_floor_s
    x: np.ndarray                     # residual features, all of RESIDUAL_FEATURES

    @property
    def memory_bound(self) -> np.ndarray:
        """bool per node: its DRAM time is its roofline (it moves bytes)."""
        return (self.memory_s >= self.roof_ref_s) & (self.memory_s > 0)


def roofline_on(table: NodeTable, gpu: GPUSpec) -> tuple[Roofline, list[str]]:
    """`table` priced by the roofline of `gpu` at its reference clock, with its residual features (an op's
    efficiency relative to its roofline is a property of its shape, not of the clock it runs at: features use
    the roofline at the catalogue's reference clock, so compute-bound ops scale exactly 1/f)."""
    mode, notes = effective_math_modes(table, gpu)
    peaks = {m: gpu.peak_flops_per_s(m) for m in set(mode.tolist())}
    peak_ref = map_values(mode, peaks, 0.0) * misaligned_peak_share(table, gpu, mode)
    work = executed_flops(table, gpu, mode)
    memory = table.bytes / gpu.memory_bandwidth_bytes_per_s * channel_wave_factor(table, gpu)
    roof_ref = np.maximum(work / np.where(peak_ref > 0, peak_ref, np.inf), memory)
    launches = reduce_launches(table, gpu)
    dram_s = dram_floor_s(table, gpu)
    x = residual_features(FeatureInputs(table, gpu, mode, peak_ref, roof_ref, work, launches, dram_s))
    return Roofline(mode, peak_ref, work, memory, roof_ref, launches, dram_s, x), notes


# A table's roofline on each donor GPU, kept while the table lives: comparing GPUs prices one table on each,
# all with the same donors.
_SOURCE_ROOFLINES: "weakref.WeakKeyDictionary[NodeTable, dict[str, Roofline]]" = weakref.WeakKeyDictionary()


def _source_roofline(table: NodeTable, src: GPUSpec) -> Roofline:
    per_gpu = _SOURCE_ROOFLINES.setdefault(table, {})
    if src.name not in per_gpu:
        per_gpu[src.name] = roofline_on(table, src)[0]
    return per_gpu[src.name]


@dataclass(frozen=True)
class MovedCorrection:
    """How a profile fitted on another GPU corrects the nodes of this one (moved_correction)."""

    x: np.ndarray                     # the nodes' residual features on the profile's own GPU
    memory_bound: np.ndarray          # bool: memory-bound on both GPUs
    scale: float                      # excess over the DRAM roofline, per roofline, from there to here


def moved_correction(table: NodeTable, gpu: GPUSpec, here: Roofline, source: Profile) -> MovedCorrection | None:
    """How `source`'s corrections, fitted on another GPU, price the nodes of `table` on `gpu`; None where the
    source is `gpu`'s own or no measured GPU's profile. A node's correction is read at its features on the
    source's GPU (what the source's profile prices there), then moved.

    Only a streaming op near its DRAM roofline is bandwidth-bound; what a memory-bound op spends beyond it
    (latency-bound loads, too few bytes in flight) is bound by the threads the GPU holds, not by its DRAM:
    memory-bound suite ops run 1.40x faster on the H200 than on the H100 (same SMs, 1.43x the bandwidth)
    where the H100 reaches over 2.7 TB/s, 1.03x where it reaches under 1 TB/s; this transfer prices
    1.36x and 1.04x (python3 benchmarks/kernel_facts.py). So such a node's time beyond its DRAM roofline
    keeps its length, scaled by the ratio of resident threads (resident_threads). Any other node keeps
    its correction as a share of its roofline: the suite's compute-bound ops run a median 1.03x faster on
    the H200 than on the H100 (same SMs and peaks), where reading the correction at the H200's features (a
    lower ridge point) priced large GEMMs faster still."""
    if source.kind != "measured" or source.gpu == gpu.name:
        return None
    try:
        src = get_gpu(source.gpu)
    except UnknownGPUError:
        return None
    there = _source_roofline(table, src)
    scale = (resident_threads(src) / resident_threads(gpu)
             * gpu.memory_bandwidth_bytes_per_s / src.memory_bandwidth_bytes_per_s)
    return MovedCorrection(there.x, here.memory_bound & there.memory_bound, scale)


def transferred(log_c: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """Log corrections `log_c` (relative to a node's roofline) with their excess over it scaled by `scale`
    (MovedCorrection.scale); a correction at or under the roofline is kept."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.log1p(np.expm1(log_c) * scale)
    return np.where(log_c > 0, out, log_c)


def combined_correction(sources: tuple[Profile, ...], use: np.ndarray, fit_op: np.ndarray, category: np.ndarray,
                        x: np.ndarray, mode: np.ndarray,
                        moved: tuple[MovedCorrection | None, ...] | None = None) -> np.ndarray:
    """learned_correction's rows, per node averaged over the sources `use` marks (correction_sources): mean
    log correction, coefficient variance plus the sources' spread, mean residual variance, the widest
    log range any of them allows, extrapolated by any. moved: per source, how its corrections move to
    this GPU (moved_correction; None: they apply as fitted)."""
    n = len(fit_op)
    count = use.sum(axis=0)
    total = np.zeros((6, n))
    square = np.zeros(n)
    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
    for k, profile in enumerate(sources):
        sel = use[k]
        if not sel.any():
            continue
        move = moved[k] if moved is not None else None
        if move is None:
            rows = learned_correction(profile, fit_op[sel], category[sel], x[sel], mode[sel])
        else:
            mem = move.memory_bound[sel]
            rows = learned_correction(profile, fit_op[sel], category[sel], move.x[sel], mode[sel])
            for r in (0, 3, 4):
                rows[r] = np.where(mem, transferred(rows[r], move.scale), rows[r])
        total[:, sel] += rows
        square[sel] += rows[0] ** 2
        lo[sel] = np.minimum(lo[sel], rows[3])
        hi[sel] = np.maximum(hi[sel], rows[4])
    mean = total / count
    spread = np.maximum(square / count - mean[0] ** 2, 0.0)
    return np.stack([mean[0], mean[1] + spread, mean[2], lo, hi, (total[5] > 0).astype(float)])


def learned_correction(profile: Profile, fit_op: np.ndarray, category: np.ndarray, x: np.ndarray,
                       mode: np.ndarray) -> np.ndarray:
    """Rows (log correction, its coefficient variance, residual variance, lowest and highest log
    correction its data allows, extrapolated 0/1) for nodes of these fit ops, categories, features `x`
    (all of RESIDUAL_FEATURES) and math modes, from `profile`'s fits."""
    n = len(fit_op)
    cols = [RESIDUAL_FEATURES.index(f) for f in profile.residual_features]
    log_eff = np.zeros(n)
    coef_var = np.zeros(n)
    resid_var = np.zeros(n)
    log_lo, log_hi = np.full(n, -np.inf), np.full(n, np.inf)
    extrapolated = np.zeros(n, dtype=bool)
    fit_key = _fit_keys(fit_op, category, mode, profile.residuals)
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
        log_eff += local_corrections(x[:, cols], fit_op, mode, profile.residual_points)
    return np.stack([log_eff, coef_var, resid_var, log_lo, log_hi, extrapolated.astype(float)])


def device_times(table: NodeTable, gpu: GPUSpec, clock_mhz: float | np.ndarray, profile: Profile,
                 launch: str = "eager", donors: tuple[Profile, ...] = ()) -> tuple[DeviceTimes, list[str]]:
    """Price every node of `table` on `gpu` at `clock_mhz` (MHz; a scalar or one clock per node).

    donors: profiles of other GPUs, nearest first, whose fits correct the nodes `profile` cannot speak for
    (correction_sources); `profile` supplies everything else. The caller range-checks
    clocks; compute peaks scale linearly with the SM clock."""
    here, notes = roofline_on(table, gpu)
    mode, work, memory, launches, dram_s, x = here.mode, here.work, here.memory_s, here.launches, here.dram_s, here.x
    peak = here.peak_ref * (np.asarray(clock_mhz, dtype=float) / gpu.peak_tflops_clock_mhz)
    # An operand layout other than its fit's rows' scales the GEMM it knows (features.layout_time_factor).
    compute = work / peak * layout_time_factor(table, gpu, mode)
    walk = walk_floor_s(table, gpu)
    # The learned part corrects the bandwidth-or-compute roofline; a serial walk, measured directly, floors it.
    roof_bw = np.maximum(compute, memory)
    roof = np.maximum(roof_bw, walk)
    sources = (profile, *donors)
    use = correction_sources(table, mode, sources, gpu)
    # A donor that corrects no node here needs no roofline on its own GPU.
    moved = tuple(moved_correction(table, gpu, here, p) if u.any() else None for p, u in zip(sources, use))
    log_eff, coef_var, resid_var, log_lo, log_hi, extrapolated = combined_correction(
        sources, use, table.fit_op, table.category, x, mode, moved)
    extrapolated = extrapolated.astype(bool)
    # The learned part corrects the analytic time only as far as its calibration data did.
    bounded = np.clip(log_eff, log_lo, log_hi)
    extrapolated |= np.abs(bounded - log_eff) > EXTRAPOLATION_TOL
    # Outside its data a fit says little: the interval spans at least half the range its data showed.
    half_range = np.where(np.isfinite(log_hi - log_lo), (log_hi - log_lo) / 2, MAX_LOG_SD)
    resid_var = np.minimum(np.where(extrapolated, np.maximum(resid_var, half_range ** 2), resid_var), MAX_LOG_SD ** 2)
    log_eff = np.clip(bounded, log_floor(compute, dram_s, roof_bw), RESIDUAL_CLIP[1])
    active = ~(table.free | table.host_only)
    lat_per_kernel = profile.graph_kernel_latency_s if launch == "graph" else profile.kernel_latency_s
    sync_s, grid_s, step_s, spilled_s = (seconds_or_prior(profile, key) for key in (
        "host_sync_s", "grid_sync_s", "persistent_step_s", "spilled_step_s"))
    kernels = table.kernels + launches.memsets
    latency = np.where(active, kernels * lat_per_kernel + table.host_syncs * sync_s
                       + persistent_step_time_s(table, grid_s, step_s, spilled_s)
                       + dependent_update_time_s(table), 0.0)
    corrected = np.where(active, np.maximum(roof_bw * np.exp(log_eff) * l2_warm_factor(table, gpu, memory > compute),
                                            walk), 0.0)
    device = latency + corrected
    # Per kernel, busy time keeps at least the queued latency less the gap (a graph launch's shorter one stays).
    # Only latency-bound nodes: a longer kernel's tail overlaps its successor's start, so its gap hides (taken
    # from every node, whole networks' busy times came out low: the accuracy report's held-out aim failed).
    gap_per_kernel = lat_per_kernel - min(lat_per_kernel, max(profile.kernel_latency_s - QUEUED_KERNEL_GAP_S, 0.0))
    # The GPU idles while the host reads a value back and launches what depends on it: elapsed time, not busy.
    idle = table.host_syncs * sync_s + np.where(latency > corrected, kernels * gap_per_kernel, 0.0)
    busy = np.where(active, np.maximum(device - idle, 0.0), 0.0)
    # A profile without launch costs (the plain roofline baseline) leaves no gaps either.
    gap_s = INTERKERNEL_GAP_S[launch] if lat_per_kernel > 0 else 0.0
    interkernel_gap = np.where(active & (latency <= corrected), kernels * gap_s, 0.0)
    bound = np.where(~active, "none", np.where(latency > corrected, "latency",
                                                np.where(compute >= memory, "compute", "memory")))
    share = np.divide(corrected, device, out=np.zeros_like(device), where=device > 0)
    times = DeviceTimes(compute, memory, walk, roof, latency, device, busy, interkernel_gap,
                        log_sd=share * np.sqrt(coef_var + resid_var), coef_sd=share * np.sqrt(coef_var),
                        peak_flops=peak, effective_mode=mode, work_flops=work, bound=bound, kernels=kernels,
                        features=x, extrapolated=extrapolated & active)
    return times, notes


def warn_notes(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(note, stacklevel=3)
