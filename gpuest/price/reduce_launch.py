"""How ATen's generic reduction kernel (ATen/native/cuda/Reduce.cuh: sum, mean, amax, var, norm, ...)
spreads a reduction over a GPU: the launch that setReduceConfig picks from the shape alone.

Three things about that launch cost time that bytes do not show. Few or short rows can leave most of
the GPU's thread slots empty. A row long enough to be split over several blocks (always for a full
reduction) is finished through global memory: its semaphores are zeroed by a memset before the kernel,
a second device operation with its own latency (a sum of 1M elements takes 7.6-7.9 us on an H100
whatever its dtype; benchmarks/kernel_facts.py). And the block that finishes it adds the partial
results in turn (final_steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ..catalog.gpu_spec import GPUSpec
    from .node_table import NodeTable

MAX_THREADS = 512             # mnt_wrapper<T>::MAX_NUM_THREADS for real dtypes
WARP = 32
INPUT_VEC = 4                 # vt0: elements a thread loads at once along a contiguous row
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
MAX_OUTPUT_VEC = 4


@dataclass(frozen=True)
class ReduceLaunch:
    threads: int              # per block
    blocks: int               # in the grid
    global_reduce: bool       # rows split over blocks, finished through global memory (plus a memset)
    final_steps: int = 0      # partial results each thread of the block finishing an output adds in turn

    def fill(self, sm_count: int, threads_per_sm: int) -> float:
        """Share of the GPU's resident-thread slots the grid occupies (at most 1)."""
        return min(1.0, self.blocks * self.threads / (sm_count * threads_per_sm))


def _last_pow2(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _div_up(a: int, b: int) -> int:
    return -(-int(a) // max(int(b), 1))


@lru_cache(maxsize=4096)
def reduce_launch(rows: int, row_len: int, row_segment: int, sm_count: int, threads_per_sm: int) -> ReduceLaunch:
    """setReduceConfig for a reduction of `rows` outputs over `row_len` inputs each; `row_segment` as in
    gpuest.annotate.registry.Cost (0: each row contiguous, 1: the innermost dimension is kept, a
    column reduction, else the contiguous run of a row made of several runs)."""
    rows, row_len = max(int(rows), 1), max(int(row_len), 1)
    along_rows = row_segment != 1         # reduction_on_fastest_striding_dimension
    out_vec = 1
    if along_rows:
        dim0, dim1 = row_len, rows
        if row_segment == 0 and dim0 >= 128:
            dim0 //= INPUT_VEC            # "vectorize along input"
    else:
        dim0, dim1 = rows, row_len
        out_vec = next(v for v in (MAX_OUTPUT_VEC, 2, 1) if rows % v == 0)
        dim0 //= out_vec                  # "vectorize along output"
    max_threads = MAX_THREADS // out_vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(d0, WARP)
    height = min(d1, max_threads // width)
    width = min(d0, max_threads // height)
    threads = width * height
    step_in = step_out = 1
    if along_rows:
        step_in *= width
    else:
        step_out *= width
    split_warps = _div_up(row_len, step_in) >= min(height * 16, MAX_VALUES_PER_THREAD)
    if split_warps:
        step_in *= height
    else:
        step_out *= height
    target = sm_count * max(threads_per_sm // threads, 1)
    grid = _div_up(rows // out_vec, step_out)
    values = _div_up(row_len, step_in)
    ctas = 1
    if split_warps and values >= MAX_VALUES_PER_THREAD and grid <= target:
        lo, hi = _div_up(values, MAX_VALUES_PER_THREAD), _div_up(values, MIN_VALUES_PER_THREAD)
        ctas = min(max(_div_up(target, grid), lo), hi)
    # The last block to finish an output adds up its ctas partial results: all its threads at once when
    # they reduce along the row, only the block's height when its lanes are other outputs (a column sum).
    per_output = threads if along_rows else height
    return ReduceLaunch(threads, grid * ctas, ctas > 1, _div_up(ctas, per_output) if ctas > 1 else 0)


# Layer/RMS norm's weight and bias gradients (LaunchGammaBetaBackwardCUDAKernel): each 32 columns get one
# block that walks every row in 256-row tiles, one tile after another, unless there are more than
# GAMMA_BETA_SPLIT_ROWS rows and the column blocks fill under half the SMs, when the rows are split over
# blocks and summed by a second pass. A walking block covers GAMMA_BETA_ROWS_PER_STEP rows in the time of
# one serial step (4.0-5.1 ns a row against 1.0-1.6 split; `python3 benchmarks/kernel_facts.py`).
GAMMA_BETA_SPLIT_ROWS = 64 * 1024
GAMMA_BETA_COLUMNS = 32
GAMMA_BETA_ROWS_PER_STEP = 64


def column_walk_steps(rows: int, cols: int, sm_count: int) -> int:
    """Serial steps of the block that sums `rows` rows of one column group of a norm's weight gradient
    on a GPU of `sm_count` SMs: rows / GAMMA_BETA_ROWS_PER_STEP while it walks them, 0 once split."""
    split = rows > GAMMA_BETA_SPLIT_ROWS and cols // GAMMA_BETA_COLUMNS < sm_count // 2
    return 0 if split else _div_up(rows, GAMMA_BETA_ROWS_PER_STEP)


class NodeLaunches(NamedTuple):
    """Per-node arrays of a table's reduction launches (reduce_launches)."""

    fill: np.ndarray          # share of the GPU's thread slots the grid fills; 1 for other nodes
    memsets: np.ndarray       # memsets before the kernel (0 or 1)
    final_steps: np.ndarray   # serial steps one block takes in turn: a split reduction's global-memory
                              # finish (ReduceLaunch.final_steps), a norm's weight-gradient row walk


def reduce_launches(table: "NodeTable", gpu: "GPUSpec") -> NodeLaunches:
    """The launch on `gpu` of every node of `table` that runs the generic reduction kernel, and the row
    walk of every norm backward that sums its gradient's columns (column_walk_steps); any other node
    counts as filling the GPU and adds no memset and no serial steps."""
    fill = np.ones(len(table))
    memsets = np.zeros(len(table))
    steps = np.zeros(len(table))
    for i in np.flatnonzero(table.reduce_kernel):
        rows, row_len = table.rowwise[i]
        launch = reduce_launch(int(rows), int(row_len), int(table.row_segment[i]), gpu.sm_count,
                               gpu.max_threads_per_sm)
        fill[i] = launch.fill(gpu.sm_count, gpu.max_threads_per_sm)
        memsets[i] = float(launch.global_reduce)
        steps[i] = float(launch.final_steps)
    for i in np.flatnonzero(table.sums_columns):
        rows, cols = table.rowwise[i]
        steps[i] += float(column_walk_steps(int(rows), int(cols), gpu.sm_count))
    return NodeLaunches(fill, memsets, steps)
