"""The launch model of ATen's generic reduction kernel (gpuest.price.reduce_launch) and what it adds
to a reduction's price: a memset and a serial finish where rows are split over blocks."""
import numpy as np
import pytest

from gpuest.catalog import get_gpu
from gpuest.price.device_time import device_times
from gpuest.price.node_table import NodeTable
from gpuest.price.profile_choice import roofline_profile
from gpuest.price.reduce_launch import reduce_launch, reduce_launches

H100 = get_gpu("H100")


def _launch(rows, row_len, segment=0, gpu=H100):
    return reduce_launch(rows, row_len, segment, gpu.sm_count, gpu.max_threads_per_sm)


def test_a_full_reduction_is_split_over_blocks_and_finished_in_global_memory():
    small, large = _launch(1, 1 << 20), _launch(1, 1 << 27)
    assert small.global_reduce and large.global_reduce
    # More elements per output, more blocks (up to the grid the GPU holds), never fewer than the minimum
    # of values per thread allows.
    assert small.blocks < large.blocks
    assert large.fill(H100.sm_count, H100.max_threads_per_sm) == 1.0
    assert small.fill(H100.sm_count, H100.max_threads_per_sm) < 0.5
    # Its finishing block reduces the partials with all its threads: few serial steps.
    assert large.final_steps <= 2


def test_many_short_rows_fill_the_gpu_without_a_global_finish():
    launch = _launch(1 << 20, 32)
    assert not launch.global_reduce and launch.final_steps == 0
    assert launch.fill(H100.sm_count, H100.max_threads_per_sm) == 1.0


def test_a_column_sum_over_few_long_columns_finishes_serially():
    few, many = _launch(64, 131072, segment=1), _launch(8192, 8192, segment=1)
    assert few.global_reduce and few.final_steps > many.final_steps
    # Lanes map to outputs: a block's height, not all its threads, adds up one output's partials.
    assert few.final_steps > _launch(64, 131072).final_steps


def test_launch_depends_on_the_gpus_thread_slots():
    big, small = get_gpu("H100"), get_gpu("L4")
    assert small.max_threads_per_sm < big.max_threads_per_sm
    a = _launch(4096, 64, 1, big).fill(big.sm_count, big.max_threads_per_sm)
    b = _launch(4096, 64, 1, small).fill(small.sm_count, small.max_threads_per_sm)
    assert a != b


def _table(**extra):
    node = {"op": "aten.sum.default", "category": "reduction", "math_mode": "fp32", "flops": 1 << 20,
            "bytes_read": 4 << 20, "bytes_written": 4, "row_count": 1, "row_len": 1 << 20, "kernels": 1}
    return NodeTable.from_records([{**node, **extra}])


def test_a_split_reduction_pays_a_memset_and_only_reduce_kernels_do():
    profile = roofline_profile()
    with_memset = device_times(_table(reduce_kernel=True), H100, 1980, profile)[0]
    without = device_times(_table(), H100, 1980, profile)[0]   # a softmax or loss: kernels of its own
    assert list(with_memset.kernels) == [2.0]
    assert list(without.kernels) == [1.0]
    assert with_memset.latency_s[0] == pytest.approx(2 * without.latency_s[0])


def test_reduce_launches_leaves_other_nodes_alone():
    table = NodeTable.from_records([
        {"op": "aten.add.Tensor", "category": "elementwise", "flops": 1, "bytes_read": 8, "bytes_written": 4},
        {"op": "aten.sum.dim_IntList", "category": "reduction", "flops": 1 << 20, "bytes_read": 4 << 20,
         "bytes_written": 256, "row_count": 64, "row_len": 16384, "row_segment": 1, "reduce_kernel": True}])
    fill, memsets, steps = reduce_launches(table, H100)
    assert fill[0] == 1.0 and memsets[0] == 0.0 and steps[0] == 0.0
    assert 0.0 < fill[1] <= 1.0 and memsets[1] == 1.0 and steps[1] > 0
    assert np.all(np.isfinite(fill))


def _layer_norm_backward_table(rows: int, width: int) -> NodeTable:
    """The node table of a training step of one affine LayerNorm over `rows` rows of `width`."""
    import torch

    from gpuest import trace
    from gpuest.price.node_table import node_table
    graph = trace(torch.nn.LayerNorm(width), (torch.empty(rows, width, device="meta"),), mode="training")
    return node_table(graph)


def test_a_layer_norm_backward_walks_its_rows_until_there_are_enough_to_split():
    from gpuest.price.reduce_launch import GAMMA_BETA_ROWS_PER_STEP, GAMMA_BETA_SPLIT_ROWS, column_walk_steps
    walked = column_walk_steps(GAMMA_BETA_SPLIT_ROWS, 192, H100.sm_count)
    assert walked == GAMMA_BETA_SPLIT_ROWS // GAMMA_BETA_ROWS_PER_STEP
    assert column_walk_steps(GAMMA_BETA_SPLIT_ROWS + 1, 192, H100.sm_count) == 0
    # Column blocks that would fill half the SMs keep walking whatever the rows.
    assert column_walk_steps(4 * GAMMA_BETA_SPLIT_ROWS, 32 * H100.sm_count, H100.sm_count) > 0
    # The traced backward of an affine layer norm carries the walk into its launch; its forward none.
    for rows, expect_steps in ((GAMMA_BETA_SPLIT_ROWS, True), (2 * GAMMA_BETA_SPLIT_ROWS, False)):
        table = _layer_norm_backward_table(rows, 96)
        backward = np.flatnonzero(table.sums_columns)
        assert len(backward) == 1 and "layer_norm_backward" in table.op[backward[0]]
        steps = reduce_launches(table, H100).final_steps
        assert (steps[backward[0]] > 0) == expect_steps
        assert not steps[np.flatnonzero(np.char.find(table.op.astype(str), "native_layer_norm.") >= 0)].any()
