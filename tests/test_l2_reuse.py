"""L2 reuse between adjacent kernels: which reads the kernel right before wrote (node_table.warm_reads), and
the share of its cold time an elementwise node keeps when they are still in L2 (l2_warm_factor)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gpuest
from gpuest.catalog import get_gpu
from gpuest.price.device_time import L2_ABSORBED_SHARE, L2_WARM_CATEGORIES, L2_WARM_SAVING, l2_warm_factor
from gpuest.price.node_table import node_table
from gpuest.profile import is_in_place


def _block(channels: int, size: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.BatchNorm2d(channels),
                               torch.nn.ReLU(inplace=True), torch.nn.Flatten(), torch.nn.Linear(channels * size * size, 8))


def _table(channels: int, size: int, batch: int = 8):
    model = _block(channels, size).eval()
    g = gpuest.trace(model, torch.randn(batch, channels, size, size), mode="inference", precision="bf16")
    return node_table(g)


@pytest.mark.parametrize("op, expected", [("aten.relu_.default", True), ("aten.add_.Tensor", True),
                                          ("aten._foreach_add_.List", True), ("aten.relu.default", False),
                                          ("aten.__iand__.Tensor", False), ("aten.add.Tensor", False)])
def test_in_place_ops_are_named_with_one_trailing_underscore(op, expected):
    assert is_in_place(op) is expected


def test_a_relu_after_its_batch_norm_reads_what_the_batch_norm_wrote():
    t = _table(16, 32)
    relu = int(np.flatnonzero(t.op == "aten.relu_.default")[0])
    kernels = np.flatnonzero(~(t.free | t.host_only))
    before = kernels[np.searchsorted(kernels, relu) - 1]
    assert t.op[before] == "aten._native_batch_norm_legit_no_training.default" and t.in_place[relu]
    assert t.warm_producer_bytes[relu] == t.bytes_written[before] > 0
    assert t.warm_read_bytes[relu] == pytest.approx(min(t.bytes_written[before], t.bytes[relu] - t.bytes_written[relu]))
    # the linear layer reads the ReLU's output through a view (flatten): still its producer
    linear = int(np.flatnonzero(t.category == "matmul")[-1])
    assert t.warm_producer_bytes[linear] == t.bytes_written[relu]
    # the first kernel has nothing before it
    assert t.warm_read_bytes[kernels[0]] == 0


def test_only_memory_bound_elementwise_and_copy_reads_of_an_l2_sized_output_are_cheaper():
    h100 = get_gpu("H100")
    small, large = _table(16, 32), _table(64, 256, batch=16)
    for t in (small, large):
        factor = l2_warm_factor(t, h100, np.ones(len(t), dtype=bool))
        relu = t.op == "aten.relu_.default"
        assert np.all(factor[~np.isin(t.category, L2_WARM_CATEGORIES)] == 1.0)
        fits = t.warm_producer_bytes[relu][0] <= h100.l2_cache_bytes * L2_ABSORBED_SHARE
        expected = 1 - L2_WARM_SAVING["in_place"] * t.warm_read_bytes[relu] / t.bytes[relu] if fits else 1.0
        assert factor[relu] == pytest.approx(expected)
        assert np.all(factor == l2_warm_factor(t, h100, np.zeros(len(t), dtype=bool)) + (factor < 1) * (factor - 1))
    assert l2_warm_factor(small, h100, np.ones(len(small), dtype=bool))[small.op == "aten.relu_.default"][0] < 1
    assert l2_warm_factor(large, h100, np.ones(len(large), dtype=bool))[large.op == "aten.relu_.default"][0] == 1.0
    # compute-bound nodes keep their time
    assert np.all(l2_warm_factor(small, h100, np.zeros(len(small), dtype=bool)) == 1.0)


def test_a_cast_of_what_the_kernel_before_wrote_is_cheaper_like_an_out_of_place_op():
    """Copies read warm bytes like elementwise ops (the H200's L2 probe of casts and clones): a bf16 cast of
    a ReLU's fresh output keeps 1 - L2_WARM_SAVING["out_of_place"] x its warm share of its cold time."""
    class ReluCast(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).to(torch.bfloat16)
    t = node_table(gpuest.trace(ReluCast(), (torch.empty(1024, 1024),)))
    cast = int(np.flatnonzero(t.op == "aten._to_copy.default")[0])
    assert t.category[cast] == "copy" and t.warm_read_bytes[cast] == 4 * 1024 * 1024
    factor = l2_warm_factor(t, get_gpu("H100"), np.ones(len(t), dtype=bool))[cast]
    assert factor == pytest.approx(1 - L2_WARM_SAVING["out_of_place"] * t.warm_read_bytes[cast] / t.bytes[cast])


def test_the_probe_refuses_an_op_it_does_not_define_before_looking_for_a_gpu(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "l2_reuse_probe.py"
    spec = importlib.util.spec_from_file_location("l2_reuse_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    with pytest.raises(SystemExit):
        probe.main(["--out", "x.jsonl", "--ops", "cast,memcpy"])
    err = capsys.readouterr().err
    assert "unknown --ops memcpy" in err and "accepted: relu_, mul_scalar, add_self, cast, clone" in err
