"""The residual features: what the fitted correction regresses log(measured / roofline) on.

Each feature is one `@feature(name)` function of a node table's FeatureInputs, registered in the order
profiles list their coefficients; its docstring gives the reason it exists. Every feature is normalised
to the GPU (intensity relative to the ridge point, waves relative to the SM count) so a fit transfers
between GPUs. RESIDUAL_FEATURES, the names profiles may use, is the registry's keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..annotate.formulas.conv import CUDNN_DEPTHWISE_VARIANT
from ..annotate.registry import LAYOUT_SENSITIVE_CATEGORIES, ROW_VECTOR_BYTES
from ..catalog import GPUSpec
from .arrays import map_values

if TYPE_CHECKING:
    from .node_table import NodeTable
    from .reduce_launch import NodeLaunches

# Bytes per element of a math mode's operands, and the bytes of one filter tap's input channels from
# which a tensor-core convolution's gather stops mattering (chosen by 5-fold cross-validation,
# benchmarks/cross_validate.py; the figures of that choice: docs/CV_HISTORY.md).
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
# a column of its own for the waves (docs/CV_HISTORY.md).
TILE_WAVES_STEADY = 10.0
TILED_CATEGORIES = ("matmul", "conv", "attention")
# Any other op streams at its steady rate once its roofline time passes STREAM_STEADY_S (tens of waves of
# blocks): its log_size stops there, so a larger op is priced no faster per byte. Without it, a fit whose size
# slope is negative priced LCNet-100's batch-256 batch norms of 16-32 channels under their time
# (data/validation/H200-nontest-perop.jsonl.gz), while 4x the elements per channel take 3.6-5.6x the time
# (python3 benchmarks/kernel_facts.py, 'batch norm scaling'). 5-fold cross-validation chose 30 us over 10 and
# 100 us and no cap (docs/CV_HISTORY.md).
STREAM_STEADY_S = 3e-5
# cuBLAS splits a GEMM with fewer output tiles than SMs and a deep K along K over more CTAs (split-K and
# stream-K kernels), each slice keeping at least SPLIT_K_DEPTH of K: a weight gradient over 400k tokens
# (96 x 384 outputs, 3 tiles) runs near its roofline, not at 3/132 of the GPU (the suite's mm_*_k401408;
# ConvNeXt-T's by-op profile). Matmul ops only: cuDNN picks its own convolution kernels.
SPLIT_K_DEPTH = 1024
HEAD_DIM_REF = 128                    # log_head_dim = log2(attention head dim / this)
ALIGN_ELEMENTS = {"fp32": 4, "tf32": 4, "bf16": 8, "fp16": 8, "fp8": 16, "int8": 16}
# A tensor-core matmul whose rows are not whole 16-byte vectors (Cost.gemm_row_bytes below 16) runs kernels
# that load them in smaller pieces, and at large sizes reaches this share of its math mode's dense peak, by
# the rows' alignment in bytes ("plain": mm, bmm; "bias": addmm adding a bias vector in cublasLt's
# epilogue, whose 2-byte kernels are slower still): 16-bit rows aligned to 2 bytes (an odd vocabulary) about
# 0.14 (0.09 with a bias), to 4 or 8 bytes about 0.25; TF32's to 4 or 8 bytes about 0.25. fp32 (SIMT) loses
# nothing. Medians over H100 and H200 GEMMs of 4096-16384 tokens, as printed by python3
# benchmarks/kernel_facts.py ("misaligned GEMMs' share of the dense peak"); measured on Hopper only.
MISALIGNED_GEMM_PEAK_SHARE = {
    "plain": {"bf16": {2: 0.143, 4: 0.251, 8: 0.250}, "fp16": {2: 0.143, 4: 0.245, 8: 0.246},
              "tf32": {4: 0.251, 8: 0.253}},
    "bias": {"bf16": {2: 0.088, 4: 0.240, 8: 0.238}, "fp16": {2: 0.086, 4: 0.242, 8: 0.238},
             "tf32": {4: 0.250, 8: 0.258}}}
MISALIGNED_GEMM_MODES = sorted({mode for by_mode in MISALIGNED_GEMM_PEAK_SHARE.values() for mode in by_mode})
# Hopper's wgmma reads 32-bit (tf32) operands from shared memory K-major only, so a tf32 matmul's kernels
# depend on how many of its operands are stored with K not contiguous (Cost.gemm_mn_major). Its time over that
# of the same shape with one such operand (the data-gradient layout g @ w, in which the suite times every mm
# and bmm), by architecture, mode and count: two (a weight gradient g.t() @ x) 1.50, the median over shapes
# whose tiles fill their waves (1.45-1.64 over partial waves); none (x @ w.t()) 0.99, so no entry; bf16
# 1.00 for every layout. Measured on the H100 (data/kernels/H100-SXM-gemm-layouts.jsonl, as printed by
# python3 benchmarks/kernel_facts.py, "GEMM layouts"); no other architecture is measured.
GEMM_LAYOUT_TIME = {"hopper": {"tf32": {2: 1.50}}}
# The fits (Cost.variant-qualified ops) whose suite rows have gemm_mn_major 1; tiny-inner GEMMs fit apart.
LAYOUT_TIMED_OPS = frozenset({"aten.mm.default", "aten.bmm.default"})
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
# benchmarks/cross_validate.py (docs/CV_HISTORY.md).
# log_row_segment = log2(contiguous run / ROW_SEGMENT_REF), capped at 0, is for rows made of strided
# runs: batch norm over NCHW planes reads 7x7 planes at about a third of the bandwidth of 14x14, and a
# column reduction (dim 0) runs another kernel strategy than a row reduction of the same shape.
# log_row_overhead = log(1 + ceil(rows / SMs) * ROW_OVERHEAD_S / (roofline + OVERHEAD_SCALE_S)) is the fixed
# cost of each row against the time the bytes and the kernel's own fixed cost take (a 16384 x 64 layer norm
# runs at a tenth of the bandwidth). A norm gives each row a block; a TensorIterator reduction of short
# contiguous rows gives each a warp (a 1048576 x 32 sum takes 5.4x its roofline on the H100, a 65536 x 49
# mean 4.6x: benchmarks/kernel_facts.py; kept by benchmarks/cross_validate.py, docs/CV_HISTORY.md).
ROW_LEN_REF = 1024
ROW_BLOCKS_PER_SM = {"norm": 4.0}
# A batch norm backward over NCHW data with a partial last wave of channel blocks takes a full wave's time
# times (its share of a wave's blocks) ** this, as a first wave that few blocks fill: 672 channels of
# 256x14x14 take 1.55-1.63x the time of 528, where bytes alone say 1.27x (the median over fp32 and bf16 at
# 7x7-56x56 planes, 0.16-1.04; benchmarks/kernel_facts.py, batch_norm_channels).
PARTIAL_WAVE_EXPONENT = 0.45
ROW_SEGMENT_REF = 256
BROADCAST_RUN_REF = 256
ROW_OVERHEAD_S = {"norm": 1e-7, "reduction": 3e-8}
KEPT_RUN_REF = 4096   # kept elements from which a column-style reduction's vector stops mattering
# One serial step: a round trip to memory that a kernel waits on before its next (a split reduction's
# global-memory finish adds partial results in turn; Cost.serial_steps); log_serial_steps =
# log(1 + steps * SERIAL_STEP_S / (roofline + OVERHEAD_SCALE_S)), kept with the launch features (fill,
# memset, tail) by benchmarks/cross_validate.py (docs/CV_HISTORY.md).
SERIAL_STEP_S = 2.5e-7
# A table lookup (Cost.table_lookup) moves one element per thread and finds each element's source row:
# GATHER_ELEMENT_S per element and GATHER_ROW_S per looked-up row, per SM, bound it where its bytes do
# not (short rows, or a table that stays in cache: 17 MB looked up from a 100-row table take longer than
# from a 30522-row one, and 128-wide fp32 rows go at 1.6 G rows/s on the H100; benchmarks/kernel_facts.py).
# log_gather_bound = log(max(that bound, dram_floor_s) / roofline), kept with the serial chunks of the
# direct embedding backward (Cost.serial_steps) by benchmarks/cross_validate.py (docs/CV_HISTORY.md).
GATHER_ELEMENT_S = 1.2e-10
GATHER_ROW_S = 6e-8
ROW_VECTOR = 4


@dataclass(frozen=True)
class FeatureInputs:
    """A node table priced on one GPU, and the quantities several features share (per-node arrays)."""

    table: "NodeTable"
    gpu: GPUSpec
    mode: np.ndarray                  # math mode priced (after fallbacks)
    peak: np.ndarray                  # FLOP/s at the node's clock and mode
    roofline_s: np.ndarray
    work_flops: np.ndarray            # FLOP the kernels spend time on (executed_flops)
    launches: "NodeLaunches"
    dram_s: np.ndarray                # dram_floor_s of the table

    @cached_property
    def n(self) -> int:
        return len(self.table)

    @cached_property
    def ridge_log2(self) -> np.ndarray:
        """log2(arithmetic intensity / the GPU's ridge point), within [-12, 8]."""
        intensity = self.work_flops / np.maximum(self.table.bytes, 1.0)
        ridge = self.peak / self.gpu.memory_bandwidth_bytes_per_s
        return np.clip(np.log2(np.maximum(intensity, 1e-6) / ridge), -12.0, 8.0)

    @cached_property
    def gemm(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self.table.gemm.T)

    @cached_property
    def is_gemm(self) -> np.ndarray:
        m, nn, _, _ = self.gemm
        return (m > 0) & (nn > 0)

    @cached_property
    def tiles(self) -> np.ndarray:
        """Output tiles of a GEMM-shaped node, times the K-splits cuBLAS adds to fill the SMs (matmul)."""
        return gemm_tiles(self.table, self.gpu)

    @cached_property
    def align(self) -> np.ndarray:
        return map_values(self.mode, ALIGN_ELEMENTS, 1.0)

    @cached_property
    def rowwise(self) -> np.ndarray:
        rows, row_len = self.table.rowwise.T
        return (rows > 0) & (row_len > 0)

    @cached_property
    def row_waves(self) -> np.ndarray:
        """Rows each SM takes in turn."""
        return np.ceil(np.maximum(self.table.rowwise[:, 0], 1.0) / self.gpu.sm_count)

    @cached_property
    def lowp_data(self) -> np.ndarray:
        return self.table.low_precision()

    @cached_property
    def permuted(self) -> np.ndarray:
        return self.table.permuted & ~self.table.tensor_core

    @cached_property
    def fixed_and_bytes(self) -> np.ndarray:
        """The time a node's bytes and its kernel's own fixed cost take."""
        return self.roofline_s + OVERHEAD_SCALE_S


Feature = Callable[[FeatureInputs], np.ndarray]


@dataclass(frozen=True)
class RegisteredFeature:
    """A residual feature: its function, the range its values are clipped to, the largest coefficient a fit
    may give it (None: unbounded), and why it exists."""

    fn: Feature
    clip: tuple[float, float] | None
    max_coef: float | None = None

    @property
    def reason(self) -> str:
        return (self.fn.__doc__ or "").strip()

    def __call__(self, inputs: FeatureInputs) -> np.ndarray:
        values = self.fn(inputs)
        return values if self.clip is None else np.clip(values, *self.clip)


FEATURES: dict[str, RegisteredFeature] = {}


def feature(name: str, clip: tuple[float, float] | None = None,
            max_coef: float | None = None) -> Callable[[Feature], Feature]:
    """Register `fn` as the residual feature `name` (clipped to `clip`; a fit gives it a coefficient of at
    most `max_coef`). Names are unique and each feature says why it exists: registration fails otherwise."""
    def register(fn: Feature) -> Feature:
        if name in FEATURES:
            raise ValueError(f"residual feature {name!r} is registered twice")
        if not (fn.__doc__ or "").strip():
            raise ValueError(f"residual feature {name!r} has no docstring giving its reason")
        FEATURES[name] = RegisteredFeature(fn, clip, max_coef)
        return fn
    return register


@feature("const")
def _const(x: FeatureInputs) -> np.ndarray:
    """The fit's intercept: the op family's efficiency at the reference of every other feature."""
    return np.ones(x.n)


@feature("ridge_pos")
def _ridge_pos(x: FeatureInputs) -> np.ndarray:
    """How far above the ridge point a node's intensity lies: compute-bound kernels approach their peak
    at their own rate."""
    return np.maximum(x.ridge_log2, 0.0)


@feature("ridge_neg")
def _ridge_neg(x: FeatureInputs) -> np.ndarray:
    """How far below the ridge point: memory-bound kernels approach the bandwidth at their own rate."""
    return np.minimum(x.ridge_log2, 0.0)


@feature("log_size")
def _log_size(x: FeatureInputs) -> np.ndarray:
    """An op's size: a tiled op (GEMM, convolution, attention) approaches its steady rate as its output
    tiles fill more waves of the SMs, up to TILE_WAVES_STEADY waves (log10(tiles / SMs)); any other op's
    is log10(roofline / 1 us), up to STREAM_STEADY_S."""
    tiled = x.is_gemm & np.isin(x.table.category, TILED_CATEGORIES)
    return np.where(tiled, np.clip(np.log10(np.maximum(x.tiles / x.gpu.sm_count, 1e-6)), -3.0,
                                   np.log10(TILE_WAVES_STEADY)),
                    np.clip(np.log10(np.clip(x.roofline_s, 1e-12, STREAM_STEADY_S) / 1e-6), -3.0, 6.0))


@feature("log_wave_eff")
def _log_wave_eff(x: FeatureInputs) -> np.ndarray:
    """The share of the last wave of tiles that keeps SMs busy: a partial wave idles the rest."""
    wave_eff = np.where(x.is_gemm, wave_busy_share(x.tiles, x.gpu.sm_count), 1.0)
    return np.log(np.clip(wave_eff, 1e-3, 1.0))


def gemm_tiles(table: "NodeTable", gpu: GPUSpec) -> np.ndarray:
    """Output tiles of each GEMM-shaped node, times the K-splits cuBLAS adds to fill the SMs (matmul)."""
    m, nn, k, batch = table.gemm.T
    tiles = np.ceil(np.maximum(m, 1) / GEMM_TILE) * np.ceil(np.maximum(nn, 1) / GEMM_TILE) * np.maximum(batch, 1)
    split = np.clip(np.floor(gpu.sm_count / tiles), 1.0, np.maximum(np.floor(np.maximum(k, 1) / SPLIT_K_DEPTH), 1.0))
    return np.where(table.category == "matmul", tiles * split, tiles)


def misaligned_matmuls(table: "NodeTable", mode: np.ndarray) -> np.ndarray:
    """bool per node: a tensor-core matmul whose row strides are not 16-byte aligned (Cost.gemm_row_bytes), in a
    math mode (`mode`, effective_math_modes) whose kernels lose by it (MISALIGNED_GEMM_MODES; fp32's do not)."""
    return ((table.category == "matmul") & table.tensor_core & (table.gemm_row_bytes < ROW_VECTOR_BYTES)
            & np.isin(mode, MISALIGNED_GEMM_MODES))


def misaligned_peak_share(table: "NodeTable", gpu: GPUSpec, mode: np.ndarray) -> np.ndarray:
    """The share of its math mode's peak (`mode`, effective_math_modes) each node can reach on `gpu`: below 1
    for a tensor-core matmul whose rows are not 16-byte aligned (MISALIGNED_GEMM_PEAK_SHARE), times the share
    of SMs its waves of tiles keep busy (those kernels are bound by each SM's loads, so an idle SM's share
    is lost), 1 elsewhere."""
    share = np.ones(len(table.op))
    misaligned = misaligned_matmuls(table, mode)
    for kind, by_mode in MISALIGNED_GEMM_PEAK_SHARE.items():
        of_kind = misaligned & (table.gemm_bias == (kind == "bias"))
        for m, by_bytes in by_mode.items():
            for row_bytes, s in by_bytes.items():
                share[of_kind & (mode == m) & (table.gemm_row_bytes == row_bytes)] = s
    return np.where(share < 1.0, share * wave_busy_share(gemm_tiles(table, gpu), gpu.sm_count), share)


def wave_busy_share(tiles: np.ndarray | float, sm_count: int) -> np.ndarray | float:
    """The share of `sm_count` SMs that waves of `tiles` output tiles keep busy, averaged over the waves."""
    return tiles / (np.ceil(tiles / sm_count) * sm_count)


def layout_time_factor(table: "NodeTable", gpu: GPUSpec, mode: np.ndarray) -> np.ndarray:
    """Per node, its compute time over that of the same GEMM in the operand layout its fit's suite rows ran
    in (GEMM_LAYOUT_TIME, on the architectures measured), 1 elsewhere. A multiplier beside the features: the
    fit corrects the GEMM it knows (its wave fill included), and a profile moved to another GPU reads its
    features unchanged."""
    factor = np.ones(len(table.op))
    timed_layout = (table.category == "matmul") & np.isin(table.fit_op, list(LAYOUT_TIMED_OPS))
    for m, by_count in GEMM_LAYOUT_TIME.get(gpu.architecture, {}).items():
        for count, time_ratio in by_count.items():
            factor[timed_layout & (mode == m) & (table.gemm_mn_major == count)] = time_ratio
    return factor


@feature("misaligned")
def _misaligned(x: FeatureInputs) -> np.ndarray:
    """A GEMM that cannot load its rows in 16-byte vectors takes slower kernels: a misaligned tensor-core
    matmul (misaligned_matmuls; an fp32 matmul's SIMT kernels lose nothing), an implicit GEMM (convolution,
    attention) with a dimension that is not a whole number of vector loads (ALIGN_ELEMENTS)."""
    m, nn, k, _ = x.gemm
    odd_dim = (np.mod(m, x.align) != 0) | (np.mod(nn, x.align) != 0) | (np.mod(k, x.align) != 0)
    matmul = x.table.category == "matmul"
    return (x.is_gemm & np.where(matmul, misaligned_matmuls(x.table, x.mode), odd_dim)).astype(float)


@feature("lowp")
def _lowp(x: FeatureInputs) -> np.ndarray:
    """16-bit tensor-core math, or 16-bit data through a CUDA-core convolution (depthwise): other kernels,
    other distance from the peak."""
    simt_conv = (x.table.category == "conv") & ~x.table.tensor_core
    return (np.isin(x.mode, ["bf16", "fp16", "fp8", "int8"]) & x.table.tensor_core) | (simt_conv & x.lowp_data)


@feature("tf32")
def _tf32(x: FeatureInputs) -> np.ndarray:
    """TF32 tensor-core math runs at its own distance from its peak."""
    return (x.mode == "tf32") & x.table.tensor_core


# A fixed cost adds at most its own time: past a slope of 1, roofline * (1 + c / roofline)^slope grows as
# the roofline shrinks, and a fit of large kernels then prices a smaller one slower than a larger one.
@feature("log_overhead", clip=(0.0, 10.0), max_coef=1.0)
def _log_overhead(x: FeatureInputs) -> np.ndarray:
    """The fixed cost every kernel pays beyond latency (prologue, tail, partial last wave), against its
    roofline: ~0 for long kernels."""
    return np.log1p(OVERHEAD_SCALE_S / np.maximum(x.roofline_s, 1e-12))


@feature("log_narrow")
def _log_narrow(x: FeatureInputs) -> np.ndarray:
    """A GEMM whose smaller inner dimension is below NARROW_DIM cannot fill a tensor-core tile (depthwise
    convolutions, skinny projections)."""
    _, nn, k, _ = x.gemm
    inner = np.maximum(np.minimum(nn, k), 1.0)
    return np.where(x.is_gemm, np.minimum(np.log2(inner / NARROW_DIM), 0.0), 0.0)


@feature("log_row_len")
def _log_row_len(x: FeatureInputs) -> np.ndarray:
    """A row-wise op's fixed per-row work per byte. ATen's reduction kernel splits a long row over warps
    and blocks (its launch fill and global finish are features of their own), so only a short row counts."""
    row_len_rel = np.clip(np.log2(np.maximum(x.table.rowwise[:, 1], 1.0) / ROW_LEN_REF), -10.0, 10.0)
    return np.where(x.rowwise, np.where(x.table.reduce_kernel, np.minimum(row_len_rel, 0.0), row_len_rel), 0.0)


def channel_wave_factor(table: "NodeTable", gpu: GPUSpec) -> np.ndarray:
    """Per node, the channels a batch norm kernel over NCHW data is timed as (a block per channel,
    ROW_BLOCKS_PER_SM resident per SM) over its channels: each full wave of blocks, then a partial last wave
    that takes PARTIAL_WAVE_EXPONENT of a full one's time per its share of blocks, as a first wave with as
    few blocks does (log_row_fill prices a first wave). 1 for every other node and within the first wave."""
    per_wave = gpu.sm_count * ROW_BLOCKS_PER_SM["norm"]
    rows = np.maximum(table.rowwise[:, 0], 1.0)
    full = np.floor(rows / per_wave)
    last = (rows - full * per_wave) / per_wave
    timed_as = (full + np.power(last, PARTIAL_WAVE_EXPONENT)) * per_wave
    per_channel = (table.category == "norm") & (table.row_segment > 0) & (rows > per_wave)
    return np.where(per_channel, timed_as / rows, 1.0)


@feature("log_row_fill")
def _log_row_fill(x: FeatureInputs) -> np.ndarray:
    """How much of the GPU too few rows leave idle: a norm needs ROW_BLOCKS_PER_SM resident rows per SM;
    ATen's reduction kernel fills the GPU as its launch says (it splits few rows over many blocks)."""
    blocks = x.gpu.sm_count * x.table.map_category(ROW_BLOCKS_PER_SM, 1.0)
    row_fill = np.where(x.table.reduce_kernel, np.log2(np.maximum(x.launches.fill, 1e-6)),
                        np.minimum(np.log2(np.maximum(x.table.rowwise[:, 0], 1.0) / blocks), 0.0))
    return np.where(x.rowwise, row_fill, 0.0)


@feature("permuted")
def _permuted(x: FeatureInputs) -> np.ndarray:
    """A copy into another dimension order reads or writes strided, below the streaming bandwidth."""
    return x.permuted


@feature("log_work_kept")
def _log_work_kept(x: FeatureInputs) -> np.ndarray:
    """How much of the counted work a causal kernel is priced to skip: per skipped FLOP a kernel saves less
    than a FLOP's time (diagonal tiles are computed whole, each query tile pays a fixed epilogue)."""
    kept = np.divide(x.work_flops, x.table.flops, out=np.ones(x.n), where=x.table.flops > 0)
    return np.log(np.clip(kept, 1e-3, 1.0))


@feature("log_window")
def _log_window(x: FeatureInputs) -> np.ndarray:
    """A sliding window's area: a larger window gathers its operand (implicit im2col) and re-reads inputs."""
    return np.log2(np.maximum(x.table.window, 1.0))


@feature("nhwc_lowp")
def _nhwc_lowp(x: FeatureInputs) -> np.ndarray:
    """NHWC 16-bit data selects other kernels: cuDNN's NHWC depthwise kernels beat PyTorch's NCHW ones by
    ~4x in 16-bit (benchmarks/kernel_facts.py)."""
    return x.table.channels_last & x.lowp_data


@feature("nhwc_fp32")
def _nhwc_fp32(x: FeatureInputs) -> np.ndarray:
    """NHWC 32-bit data: the same kernels' gain is a shape-dependent 0.3-3.4x in tf32
    (benchmarks/kernel_facts.py), so the memory format enters per data precision."""
    return x.table.channels_last & ~x.lowp_data


@feature("cudnn_depthwise")
def _cudnn_depthwise(x: FeatureInputs) -> np.ndarray:
    """An fp16 depthwise convolution of NCHW data that PyTorch hands to cuDNN runs cuDNN's kernels, not its
    own: 1.6-3.8x faster than the same stride-1 layer in bf16 (benchmarks/kernel_facts.py, fp16_depthwise)."""
    return x.table.has_variant(CUDNN_DEPTHWISE_VARIANT)


@feature("log_head_dim")
def _log_head_dim(x: FeatureInputs) -> np.ndarray:
    """A flash-attention tile's work per byte loaded grows with the head dimension (its GEMMs' K)."""
    _, _, k, _ = x.gemm
    return np.where(x.table.category == "attention", np.clip(np.log2(np.maximum(k, 1.0) / HEAD_DIM_REF), -3.0, 1.0),
                    0.0)


@feature("log_row_overhead")
def _log_row_overhead(x: FeatureInputs) -> np.ndarray:
    """The fixed cost of each row (a block or warp's setup and cross-lane reduction) against the time of
    the bytes; a column reduction (strided rows) maps outputs to lanes and pays no per-row reduction."""
    row_time = x.row_waves * x.table.map_category(ROW_OVERHEAD_S, 0.0)
    per_row = x.rowwise & ((x.table.category == "norm") | (x.table.row_segment == 0))
    return np.where(per_row, np.clip(np.log1p(row_time / x.fixed_and_bytes), 0.0, 10.0), 0.0)


@feature("mixed_dtypes")
def _mixed_dtypes(x: FeatureInputs) -> np.ndarray:
    """Operands of two dtypes: TensorIterator casts per element on its non-vectorised path."""
    return x.table.mixed_dtypes & ~x.table.tensor_core


@feature("broadcast")
def _broadcast(x: FeatureInputs) -> np.ndarray:
    """An operand expanded to the output's shape is re-read from cache, not streamed."""
    return x.table.broadcast & ~x.table.tensor_core


@feature("odd_rows")
def _odd_rows(x: FeatureInputs) -> np.ndarray:
    """PyTorch's row kernels (layer norm, softmax) load a row ROW_VECTOR elements at a time; other row
    lengths take unvectorised kernels, 4.5-5.6x the time per element (benchmarks/kernel_facts.py). Fits
    whose rows never have it (batch norm) give it no coefficient."""
    return x.rowwise & (np.mod(x.table.rowwise[:, 1], ROW_VECTOR) != 0)


@feature("write_share")
def _write_share(x: FeatureInputs) -> np.ndarray:
    """DRAM writes cost more than reads: a bf16 -> fp32 cast takes 1.3-2.0x as long as fp32 -> bf16
    (benchmarks/kernel_facts.py). 0 where reads equal writes."""
    streaming = np.isin(x.table.category, list(LAYOUT_SENSITIVE_CATEGORIES))
    return np.where(streaming, x.table.bytes_written / np.maximum(x.table.bytes, 1.0) - 0.5, 0.0)


def cudnn_relayouts(table: "NodeTable", mode: np.ndarray) -> np.ndarray:
    """bool per node: cuDNN runs it, a tensor-core convolution of NCHW data in math modes `mode`
    (effective_math_modes), in NHWC, transposing its operands on the way in and out, unless it is a GEMM
    over the planes as stored (1x1, stride 1) whose planes are a whole number of tensor-core loads
    (benchmarks/kernel_facts.py). The transposed copies live in a workspace (Cost.relayout_bytes)."""
    in_place = (table.gemm_plane > 0) & (np.mod(table.gemm_plane, map_values(mode, ALIGN_ELEMENTS, 1.0)) == 0)
    tensor_core_conv = (table.category == "conv") & table.tensor_core & (mode != "fp32")
    return tensor_core_conv & ~table.channels_last & ~in_place


@feature("relayout")
def _relayout(x: FeatureInputs) -> np.ndarray:
    """The layout transposes cuDNN adds around a convolution of NCHW data (cudnn_relayouts)."""
    return cudnn_relayouts(x.table, x.mode)


@feature("log_row_segment")
def _log_row_segment(x: FeatureInputs) -> np.ndarray:
    """Rows made of strided runs: batch norm over NCHW planes reads 7x7 planes at about a third of the
    bandwidth of 14x14, and a column reduction runs another kernel strategy than a row reduction."""
    segmented = x.rowwise & (x.table.row_segment > 0)
    return np.where(segmented, np.clip(np.log2(np.maximum(x.table.row_segment, 1.0) / ROW_SEGMENT_REF), -4.0, 0.0),
                    0.0)


@feature("log_kept_run")
def _log_kept_run(x: FeatureInputs) -> np.ndarray:
    """A reduction that keeps the innermost dimension walks the kept elements between two reduced ones as
    its vector: a column sum 96 wide, or a sum over the branches of channels-last data, runs at a fraction
    of a wide one's bandwidth (benchmarks/kernel_facts.py, branch_sums)."""
    kept = x.rowwise & (x.table.kept_run > 0)
    return np.where(kept, np.clip(np.log2(np.maximum(x.table.kept_run, 1.0) / KEPT_RUN_REF), -8.0, 0.0), 0.0)


@feature("log_broadcast_run")
def _log_broadcast_run(x: FeatureInputs) -> np.ndarray:
    """A kernel that walks a broadcast value's runs (eval batch norm's per-channel kernel over NCHW planes,
    which records the plane as its row segment with no rows) runs slower per byte on short ones: 7x7 planes
    at about a third of the bandwidth of 56x56 ones. TensorIterator's flat loop over a broadcast (a
    per-channel mul) does not: 7x7 planes stream within 15 % of 56x56 ones (the suite's ew_channel_scale_*
    rows), and its `broadcast` flag prices that loop. Weighted by the streaming share
    roof / (roof + OVERHEAD_SCALE_S): a small op is mostly fixed cost whatever its runs."""
    table = x.table
    expanded = (table.broadcast & (table.broadcast_run > 1) & ~table.tensor_core & ~x.rowwise
                & (table.row_segment > 0))
    streaming_share = x.roofline_s / (x.roofline_s + OVERHEAD_SCALE_S)
    return streaming_share * np.where(
        expanded, np.clip(np.log2(np.maximum(table.broadcast_run, 1.0) / BROADCAST_RUN_REF), -8.0, 0.0), 0.0)


@feature("permuted_lowp")
def _permuted_lowp(x: FeatureInputs) -> np.ndarray:
    """A permuted copy cannot vectorise, so 16-bit elements take nearly the time of 32-bit ones (a
    4096x4096 transpose: 123 us bf16, 138 us fp32; data/kernels/H100-SXM-benchmarks.jsonl)."""
    return x.permuted & x.lowp_data


@feature("broadcast_lowp")
def _broadcast_lowp(x: FeatureInputs) -> np.ndarray:
    """An operand read expanded takes TensorIterator's non-vectorised loop, so 16-bit elements cost nearly
    what 32-bit ones do, as in a permuted op: over their memory roofline, the suite's bf16 elementwise ops
    with an expanded operand take 1.27x the time of plain ones, fp32 ones 0.97x (H200; H100 1.28x and
    1.00x; benchmarks/kernel_facts.py, broadcast_loops). Operands of two dtypes take that loop anyway
    (mixed_dtypes): a bf16 activation times an fp32 layer scale is not slowed twice."""
    return x.table.broadcast & ~x.table.tensor_core & x.lowp_data & ~x.table.mixed_dtypes


@feature("read_waste")
def _read_waste(x: FeatureInputs) -> np.ndarray:
    """Which permutation: the share of the sectors a permuted op's loop fetches that it does not use,
    1 - 1 / Cost.read_amplification. A transpose's blocks use a sliver of every sector and fetch it again
    for each block that needs the rest; a head transpose moves whole rows (0). Time per byte grows about
    exponentially with this share: the suite's mixed-layout adds take 1.2-2.4x a whole-row permuted add's
    as it goes from 0 to 0.94 (benchmarks/kernel_facts.py), where log2 of the amplification bends."""
    return np.where(x.permuted, 1.0 - 1.0 / np.maximum(x.table.read_amplification, 1.0), 0.0)


@feature("log_serial_steps", clip=(0.0, 10.0))
def _log_serial_steps(x: FeatureInputs) -> np.ndarray:
    """Round trips a kernel waits on in turn: the block finishing a split reduction adds partial results
    one by one (column sums over 64 long columns take 4.5-5.9x their roofline; kernel_facts.py). A
    persistent kernel's serial steps are priced as fixed time instead (persistent_step_time_s)."""
    serial_s = (x.launches.final_steps + np.where(x.table.grid_syncs > 0, 0.0, x.table.serial_steps)) * SERIAL_STEP_S
    return np.log1p(serial_s / x.fixed_and_bytes)


@feature("log_gather_bound")
def _log_gather_bound(x: FeatureInputs) -> np.ndarray:
    """A table lookup moves one element per thread and finds each element's source row: that bound
    (GATHER_ELEMENT_S, GATHER_ROW_S per SM) or its DRAM floor, against its roofline."""
    rows, row_len = x.table.rowwise.T
    lookup_s = x.row_waves * GATHER_ROW_S + np.ceil(np.maximum(rows * row_len, 1.0) / x.gpu.sm_count) * GATHER_ELEMENT_S
    gather_s = np.maximum(x.dram_s, lookup_s)
    return np.where(x.rowwise & x.table.table_lookup,
                    np.clip(np.log(gather_s / np.maximum(x.roofline_s, 1e-12)), -5.0, 5.0), 0.0)


@feature("log_tap_bytes")
def _log_tap_bytes(x: FeatureInputs) -> np.ndarray:
    """An implicit-GEMM convolution gathers its K operand one filter tap at a time, each tap's slice the
    input channels of a group: a stem's 3 or 16 channels fill little of a K-block. Saturates at
    TAP_BYTES_REF (benchmarks/cross_validate.py)."""
    _, _, k, _ = x.gemm
    tap_bytes = k / np.maximum(x.table.window, 1.0) * map_values(x.mode, MODE_ELEMENT_BYTES, 4.0)
    gathers_taps = (x.table.category == "conv") & x.table.tensor_core & x.is_gemm & (k > 0)
    return np.where(gathers_taps, np.clip(np.log2(np.maximum(tap_bytes, 1.0) / TAP_BYTES_REF), -8.0, 0.0), 0.0)


@feature("atomic_lowp")
def _atomic_lowp(x: FeatureInputs) -> np.ndarray:
    """16-bit atomic adds run as compare-and-swap loops or paired adds: a scatter of bf16 gradients takes
    about twice its fp32 time (Cost.atomic_adds)."""
    return x.table.atomic_adds & x.lowp_data


RESIDUAL_FEATURES = tuple(FEATURES)


def coefficient_ceilings(names: tuple[str, ...] = RESIDUAL_FEATURES) -> np.ndarray:
    """The largest coefficient a fit may give each of `names` (inf where the feature sets none)."""
    return np.array([np.inf if FEATURES[n].max_coef is None else FEATURES[n].max_coef for n in names])


def residual_features(inputs: FeatureInputs) -> np.ndarray:
    """Feature matrix (n, len(RESIDUAL_FEATURES)), columns in registry order."""
    return np.column_stack([np.broadcast_to(np.asarray(fn(inputs), dtype=float), (inputs.n,))
                            for fn in FEATURES.values()])
