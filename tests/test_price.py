"""Closed-form and monotonicity properties of the pricing model (no GPU)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest
import torch

import gpuest
from gpuest.catalog import get_gpu
from gpuest.errors import GraphNotAnnotatedError
from gpuest.annotate.formulas.rnn import PERSISTENT_STEP_WEIGHTS
from gpuest.price.device_time import device_times, persistent_steps
from gpuest.price.features import OVERHEAD_SCALE_S
from gpuest.price.host_timeline import simulate
from gpuest.price.node_table import NodeTable
from gpuest.profile import mode_key, prior_profile


ROOT = Path(__file__).resolve().parents[1]


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def graph_of(module, *shapes, dtype=torch.bfloat16, **kw):
    inputs = tuple(torch.empty(s, dtype=dtype, device="meta") for s in shapes)
    return gpuest.trace(module, inputs, **kw)


@pytest.fixture(scope="module")
def big_matmul():
    return graph_of(MatMul(), (8192, 8192), (8192, 8192))


@pytest.fixture(scope="module")
def big_add():
    return graph_of(Add(), (1 << 28,), (1 << 28,))


@pytest.fixture(scope="module")
def tiny_add():
    return graph_of(Add(), (16,), (16,))


def test_large_matmul_is_compute_bound_and_scales_with_clock(big_matmul):
    # Clocks low enough that the power limit does not throttle either run.
    hi = gpuest.estimate(big_matmul, "H100", clock=1200, launch="graph")
    lo = gpuest.estimate(big_matmul, "H100", clock=600, launch="graph")
    assert hi.effective_clock_mhz == pytest.approx(1200) and lo.effective_clock_mhz == pytest.approx(600)
    assert hi.bound == "compute"
    # Device time is latency + compute; the compute part doubles at half the clock.
    lat = hi.per_node["latency_s"].sum()
    assert (lo.device_time_s - lat) / (hi.device_time_s - lat) == pytest.approx(2.0, rel=1e-6)
    flops = 2 * 8192 ** 3
    assert hi.per_node["flops"].sum() == flops
    # No faster than the datasheet peak allows.
    assert hi.device_time_s >= flops / get_gpu("H100").peak_flops_per_s("bf16", 1200)


def test_large_elementwise_is_memory_bound_and_clock_independent(big_add):
    gpu = get_gpu("A100")
    hi = gpuest.estimate(big_add, "A100", launch="graph")
    lo = gpuest.estimate(big_add, "A100", clock=gpu.max_clock_mhz / 2, launch="graph")
    assert hi.bound == "memory"
    assert lo.device_time_s == pytest.approx(hi.device_time_s, rel=1e-9)
    moved = 3 * (1 << 28) * 2  # two bf16 inputs read, one output written
    assert hi.per_node["bytes"].sum() == moved
    assert hi.device_time_s >= moved / gpu.memory_bandwidth_bytes_per_s


def test_a_transferred_correction_keeps_a_memory_op_s_time_beyond_dram_and_scales_compute_bound_ones():
    """The H100's fits pricing the H200 (the same SMs, clocks and peaks, 1.43x the DRAM bandwidth): a
    memory-bound node keeps the time it takes beyond its DRAM roofline on the H100, only the roofline
    shrinks; a compute-bound GEMM keeps its correction as a share of the same roofline, so the H100's time."""
    from gpuest.price.device_time import transferred
    from gpuest.profile import shipped_profiles
    h100 = shipped_profiles()["H100-SXM"]
    a, b = get_gpu("H100-SXM"), get_gpu("H200")
    norm = gpuest.trace(torch.nn.LayerNorm(1024), (torch.empty(65536, 1024, device="meta"),))
    mm = graph_of(MatMul(), (8192, 8192), (8192, 8192))
    table = NodeTable.from_records(d for g in (norm, mm) for _, d in g.nodes(data=True) if not d["free"])
    own, _ = device_times(table, a, a.max_clock_mhz, h100)
    moved, _ = device_times(table, b, b.max_clock_mhz, h100)
    beyond = lambda t: t.device_s - t.latency_s - t.memory_s  # noqa: E731
    memory = own.bound == "memory"
    assert memory.any() and np.all(beyond(own)[memory] > 0.2 * own.memory_s[memory])
    assert beyond(moved)[memory] == pytest.approx(beyond(own)[memory], rel=1e-9)
    assert np.all(moved.memory_s[memory] < own.memory_s[memory])
    gemm = own.bound == "compute"
    assert gemm.any() and moved.device_s[gemm] == pytest.approx(own.device_s[gemm], rel=1e-9)
    log_c = np.array([math.log(3.0), math.log(1.2), 0.0, math.log(0.8), -np.inf, np.inf])
    out = transferred(log_c, 1.5)
    assert np.exp(out[:2]) - 1 == pytest.approx((np.exp(log_c[:2]) - 1) * 1.5)   # the excess, per roofline
    assert out[2:5].tolist() == log_c[2:5].tolist() and out[5] == np.inf


def test_tiny_op_is_host_or_latency_bound(tiny_add):
    eager = gpuest.estimate(tiny_add, "H100")
    graph = gpuest.estimate(tiny_add, "H100", launch="graph")
    assert eager.bound == "host"
    assert graph.bound in ("latency", "host")
    assert eager.time_s > graph.time_s


def test_device_busy_time_leaves_out_the_queued_gap_after_latency_bound_kernels(tiny_add, big_add):
    """A queued tiny kernel occupies the device for the profile's kernel latency but runs QUEUED_KERNEL_GAP_S
    less of it (device-busy time is the union of kernel intervals); a memory-bound kernel keeps its time."""
    from gpuest.price.device_time import QUEUED_KERNEL_GAP_S
    tiny = gpuest.estimate(tiny_add, "H100-SXM").per_node
    tiny = tiny[~tiny["free"]]
    removed = tiny["latency_s"] - tiny["time_s"]
    assert len(tiny) and (removed > 0).all() and (removed <= tiny["kernels"] * QUEUED_KERNEL_GAP_S * (1 + 1e-9)).all()
    big = gpuest.estimate(big_add, "H100-SXM").per_node
    big = big[~big["free"]]
    assert (big["time_s"] > 100 * big["latency_s"]).all()   # memory-bound: priced by its bytes


def test_wall_time_holds_the_gap_after_each_queued_kernel_and_busy_time_does_not(big_add):
    """A memory-bound kernel leaves INTERKERNEL_GAP_S after it in wall time (its queue time), not in its busy
    time; a CUDA graph's gap is shorter, and the plain roofline baseline, which has no launch costs, none."""
    from gpuest.price.device_time import INTERKERNEL_GAP_S
    for launch in ("eager", "graph"):
        est = gpuest.estimate(big_add, "H100-SXM", launch=launch)
        nodes = est.per_node[~est.per_node["free"]]
        gap = nodes["queue_s"] - nodes["time_s"]
        assert len(nodes) and gap.to_numpy() == pytest.approx(nodes["kernels"].to_numpy() * INTERKERNEL_GAP_S[launch])
        assert est.device_time_s == pytest.approx(float(nodes["time_s"].sum()))
    assert INTERKERNEL_GAP_S["graph"] < INTERKERNEL_GAP_S["eager"]
    plain = gpuest.estimate(big_add, "H100-SXM", profile="roofline").per_node
    assert (plain["queue_s"] == plain["time_s"]).all()


def test_energy_charges_the_gaps_between_queued_kernels_at_the_nodes_power():
    class TwoAdds(torch.nn.Module):
        def forward(self, a, b):
            return (a + b) + b
    est = gpuest.estimate(graph_of(TwoAdds(), (1 << 26,), (1 << 26,)), "H100-SXM")
    nodes = est.per_node[~est.per_node["free"] & (est.per_node["wait_s"] == 0)]
    assert len(nodes) and (nodes["queue_s"] > nodes["time_s"]).all()
    assert nodes["energy_j"].to_numpy() == pytest.approx((nodes["power_w"] * nodes["queue_s"]).to_numpy())


def test_a_streaming_ops_size_stops_growing_past_its_steady_roofline_time():
    """log_size of a non-tiled op is log10(roofline / 1 us) up to STREAM_STEADY_S, then constant, so a fit's size
    slope cannot price an op larger than its data any faster per byte."""
    from gpuest.price.features import RESIDUAL_FEATURES, STREAM_STEADY_S
    from gpuest.price.node_table import node_table
    j = RESIDUAL_FEATURES.index("log_size")
    sizes = {}
    for n in (1 << 14, 1 << 26, 1 << 28):
        table = node_table(graph_of(Add(), (n,), (n,)))
        times, _ = device_times(table, get_gpu("H100-SXM"), 1980, prior_profile())
        node = int(np.argmax(times.roofline_s))
        sizes[n] = (times.features[node, j], times.roofline_s[node])
    assert sizes[1 << 14][1] < STREAM_STEADY_S < sizes[1 << 26][1] < sizes[1 << 28][1]
    assert sizes[1 << 14][0] == pytest.approx(math.log10(sizes[1 << 14][1] / 1e-6))
    assert sizes[1 << 26][0] == sizes[1 << 28][0] == pytest.approx(math.log10(STREAM_STEADY_S / 1e-6))


def test_monotone_in_clock_and_batch():
    net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    times = []
    for b in (1, 8, 64, 512):
        g = gpuest.trace(net, (torch.empty(b, 512, device="meta"),), mode="training", batch=b)
        clocks = np.linspace(400, 1980, 5)
        ts = [gpuest.estimate(g, "H100", clock=c).time_s for c in clocks]
        assert all(a >= b_ - 1e-15 for a, b_ in zip(ts, ts[1:])), "time must not rise with clock"
        times.append(ts[-1])
    # a host-bound step takes the same time at every batch: equal up to summation rounding
    assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:])), "time must not fall with batch"


def test_host_timeline_matches_loop():
    rng = np.random.default_rng(0)
    d, h = rng.exponential(1e-5, 200), rng.exponential(1e-5, 200)
    tl = simulate(d, h)
    end, issue = 0.0, 0.0
    for i in range(200):
        issue += h[i]
        start = max(issue, end)
        end = start + d[i]
        assert tl.end_s[i] == pytest.approx(end, rel=1e-12, abs=1e-15)
    assert tl.wall_s == pytest.approx(max(end, issue))


def test_unknown_gpu_and_bad_clock(big_add):
    with pytest.raises(ValueError, match="closest"):
        gpuest.estimate(big_add, "A1OO")
    with pytest.raises(ValueError, match="range"):
        gpuest.estimate(big_add, "A100", clock=0)
    with pytest.raises(ValueError, match="range"):
        gpuest.estimate(big_add, "A100", clock=5000)
    with pytest.raises(ValueError, match="range"):
        gpuest.estimate(big_add, "A100", power_limit=5)


def test_graph_not_from_trace_is_rejected():
    g = nx.DiGraph()
    g.add_node(0, op="aten.mm.default")
    with pytest.raises(GraphNotAnnotatedError, match="gpuest.trace"):
        gpuest.estimate(g, "A100")


def test_missing_math_mode_priced_as_fallback_with_warning(big_matmul):
    with pytest.warns(UserWarning, match="no bf16"):
        est = gpuest.estimate(big_matmul, "V100")
    assert set(est.per_node.loc[~est.per_node["free"], "math_mode"]) == {"fp32"}


def test_unsupported_op_is_priced_by_bytes_and_reported():
    # a namespace of its own: tests/test_trace.py registers gpuest_test::mystery when it is collected
    lib = torch.library.Library("gpuest_test_price", "DEF")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x.clone(), "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.gpuest_test_price.mystery(x)

    g = gpuest.trace(M(), (torch.empty(1024, 1024, device="meta"),))
    est = gpuest.estimate(g, "H100")
    assert est.unsupported_ops() == {"gpuest_test_price.mystery.default": 1}
    row = est.per_node[est.per_node["op"] == "gpuest_test_price.mystery.default"].iloc[0]
    assert row["bytes"] == 2 * 1024 * 1024 * 4 and row["time_s"] > 0
    assert any("no cost formula" in n for n in est.notes)


def test_power_and_energy_are_physical(big_matmul, big_add):
    for g in (big_matmul, big_add):
        gpu = get_gpu("H100")
        hi = gpuest.estimate(g, "H100")
        lo = gpuest.estimate(g, "H100", clock=1000)
        assert lo.avg_power_w <= hi.avg_power_w + 1e-9
        assert hi.avg_power_w <= gpu.tdp_w + 1e-6
        assert hi.energy_j == pytest.approx(hi.per_node["energy_j"].sum(), rel=0.05)
        assert hi.edp_js == pytest.approx(hi.energy_j * hi.time_s)


def test_memory_power_counts_cudnn_layout_transposes():
    """A tensor-core convolution of NCHW data moves its activations through cuDNN's NHWC transposes as
    well: its memory utilisation is (1 + RELAYOUT_TRAFFIC) times that of the same convolution on NHWC
    data at the same time, and its power higher."""
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import NodeTable
    from gpuest.price.power import RELAYOUT_TRAFFIC, node_power
    from gpuest.price.profile_choice import roofline_profile
    from gpuest.profile import prior_profile
    gpu = get_gpu("H100")
    conv = {"op": "aten.convolution.default", "category": "conv", "math_mode": "bf16", "flops": 1e10,
            "bytes_read": 2e6, "bytes_written": 2e6, "gemm_m": 4096, "gemm_n": 64, "gemm_k": 576, "window": 9}
    table = NodeTable.from_records([conv, {**conv, "channels_last": True}])   # compute-bound: both < 1
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())
    assert times.device_s[0] == times.device_s[1]
    power = node_power(table, times, gpu, gpu.max_clock_mhz, prior_profile().power)
    assert power.util_memory[0] == pytest.approx((1 + RELAYOUT_TRAFFIC) * power.util_memory[1])
    assert power.power_w[0] > power.power_w[1]


def test_full_fp32_gemms_draw_simt_power_and_tensor_core_gemms_tensor_power():
    """A GEMM in full fp32 runs on the SIMT FMA pipes: its dynamic power is simt_w per unit of its
    utilisation, a bf16 GEMM's is tensor_w and an elementwise node's vector_w; a profile fitted before
    simt_w existed (None) prices fp32 GEMMs with tensor_w as it always did."""
    from dataclasses import replace
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import NodeTable
    from gpuest.price.power import clock_scale, node_power
    from gpuest.price.profile_choice import roofline_profile
    gpu = get_gpu("H100")
    gemm = {"op": "aten.mm.default", "category": "matmul", "flops": 2 * 4096 ** 3, "bytes_read": 6.7e7,
            "bytes_written": 3.4e7, "gemm_m": 4096, "gemm_n": 4096, "gemm_k": 4096}
    add = {"op": "aten.add.Tensor", "category": "elementwise", "math_mode": "fp32", "flops": 1e9,
           "bytes_read": 8e9, "bytes_written": 4e9}
    table = NodeTable.from_records([{**gemm, "math_mode": "fp32"}, {**gemm, "math_mode": "bf16"}, add])
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())
    fit = replace(prior_profile().power, tensor_w=500.0, simt_w=200.0, vector_w=300.0)
    power = node_power(table, times, gpu, gpu.max_clock_mhz, fit)
    util = power.util_tensor + power.util_vector
    assert util[:2].min() > 0.5     # both GEMMs near their own roof
    base = power.power_w - fit.memory_w * power.util_memory
    scale = float(clock_scale(gpu, gpu.max_clock_mhz, fit))
    for i, unit_w in enumerate((fit.simt_w, fit.tensor_w, fit.vector_w)):
        assert base[i] - base[0] + scale * fit.simt_w * util[0] == pytest.approx(scale * unit_w * util[i])
    legacy = node_power(table, times, gpu, gpu.max_clock_mhz, replace(fit, simt_w=None))
    assert legacy.power_w[0] == pytest.approx(power.power_w[0] + scale * (fit.tensor_w - fit.simt_w) * util[0])
    assert legacy.power_w[1:] == pytest.approx(power.power_w[1:])


def test_power_fit_splits_simt_from_tensor_cores_only_with_windows_that_load_them():
    """The shipped H100 calibration has power windows of full-fp32 GEMMs, so its fit has a simt_w of its
    own; without those windows the coefficient is unidentified and left to tensor_w (None)."""
    from gpuest.calibrate.calibration_rows import device_nodes
    from gpuest.calibrate.fit import load_raw, usable
    from gpuest.calibrate.fit_power import MIN_UNIT_WINDOWS, fit_power
    from gpuest.price.power import compute_units

    def simt_gemm(row):
        table = NodeTable.from_records(device_nodes(row))
        return bool(compute_units(table, table.math_mode)["simt"].any())

    power = [r for r in usable(load_raw(ROOT / "data" / "calibration" / "H100-SXM.jsonl").rows)
             if r.get("avg_power_w")]
    gpu = get_gpu("H100")
    fp32_gemm = [r for r in power if simt_gemm(r)]
    assert len(fp32_gemm) >= MIN_UNIT_WINDOWS
    with_simt = fit_power(power, gpu, 70.0, 0.7)
    assert with_simt.simt_w is not None and 0.0 <= with_simt.simt_w <= gpu.tdp_w - 70.0
    without = fit_power([r for r in power if r not in fp32_gemm], gpu, 70.0, 0.7)
    assert without.simt_w is None


def test_power_limit_caps_power_and_slows_compute_bound(big_matmul):
    gpu = get_gpu("H100")
    free = gpuest.estimate(big_matmul, "H100")
    capped = gpuest.estimate(big_matmul, "H100", power_limit=gpu.power_limit_min_w)
    assert capped.avg_power_w <= gpu.power_limit_min_w * 1.01
    assert capped.time_s >= free.time_s
    assert capped.effective_clock_mhz < free.effective_clock_mhz


def test_memory_bound_loses_little_at_lower_clock(big_add, big_matmul):
    slow_mem = gpuest.estimate(big_add, "H100", clock=990).time_s / gpuest.estimate(big_add, "H100").time_s
    slow_mm = (gpuest.estimate(big_matmul, "H100", clock=990).time_s
               / gpuest.estimate(big_matmul, "H100").time_s)
    assert slow_mem < 1.05
    assert slow_mm > 1.6


def test_compare_ranks_gpus(big_matmul):
    df = gpuest.compare(big_matmul, ["H100", "A100", "T4"])
    assert list(df["gpu"])[0] == "H100-SXM"
    assert df["time_s"].is_monotonic_increasing
    by_energy = gpuest.compare(big_matmul, ["H100", "A100", "T4"], by="energy",
                                  price_per_hour={"H100": 3.0, "A100": 1.5, "T4": 0.3})
    assert by_energy["energy_j"].is_monotonic_increasing
    assert (by_energy["cost_per_step"] > 0).all()


def test_optimal_respects_max_slowdown(big_matmul):
    fastest = gpuest.optimal(big_matmul, "A100", "time")
    best = gpuest.optimal(big_matmul, "A100", "energy", max_slowdown=0.1)
    assert best["time_s"] <= fastest["time_s"] * 1.1 + 1e-12
    unconstrained = gpuest.optimal(big_matmul, "A100", "energy")
    assert unconstrained["energy_j"] <= best["energy_j"] + 1e-12


def test_cli_sweep_names_the_setting_its_objective_picks(tmp_path, capsys):
    from gpuest.cli import main
    from gpuest.price.sweep import best_setting
    src = tmp_path / "gemm.py"
    src.write_text("import torch\ndef make():\n    return torch.nn.Linear(4096, 4096), (torch.empty(4096, 4096),)\n")
    words = ["sweep", f"{src}:make", "--gpu", "A100", "--clocks", "600,1000,1410", "--power-limits", "150,400"]
    assert main([*words, "--optimal", "energy", "--max-slowdown", "0.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    table = pd.DataFrame(out["settings"])
    expected = best_setting(table, "energy", 0.1)
    assert out["optimal"]["energy_j"] == pytest.approx(expected["energy_j"])
    assert out["optimal"]["time_s"] <= table["time_s"].min() * 1.1
    # the bound binds: the lowest energy overall is a setting more than 10 % slower than the fastest
    assert table["energy_j"].idxmin() != expected.name
    assert main([*words, "--optimal", "edp"]) == 0
    best = best_setting(table, "edp")
    setting = f"SM clock {best['clock_mhz']:.0f} MHz" if best["setting"] == "clock" else \
        f"power limit {best['power_limit_w']:.0f} W"
    assert f"lowest edp: {setting}" in capsys.readouterr().out
    assert main([*words, "--max-slowdown", "0.1"]) == 2
    assert "give --optimal" in capsys.readouterr().err


def test_interval_brackets_prediction(big_matmul):
    est = gpuest.estimate(big_matmul, "H100")
    assert est.time_low_s <= est.time_s <= est.time_high_s
    assert math.isfinite(est.time_high_s)


def test_str_is_summary_table(big_matmul):
    text = str(gpuest.estimate(big_matmul, "A100", clock=1410))
    assert "A100" in text and "1410 MHz" in text and "wall time" in text and "mm" in text


def test_infeasible_power_limit_is_reported(big_matmul):
    """A limit below the power the model predicts even fully throttled is not silently 'met'."""
    import dataclasses
    from gpuest.profile import prior_profile
    prior = prior_profile()
    hot = dataclasses.replace(prior, power=dataclasses.replace(prior.power, idle_w=450.0, static_w=500.0))
    est = gpuest.estimate(big_matmul, "H100", power_limit=200, profile=hot)
    assert any("cannot be met" in n for n in est.notes)
    assert est.avg_power_w > 200


def _profile_with(residuals: dict, features=None):
    """The prior with chosen residual fits: constant log-efficiency per key (synthetic, not measured)."""
    from dataclasses import replace

    from gpuest.profile import ResidualFit, prior_profile
    prior = prior_profile()
    names = tuple(features or prior.residual_features)
    zero = tuple(tuple(0.0 for _ in names) for _ in names)
    fits = {k: ResidualFit((float(v),) + (0.0,) * (len(names) - 1), zero, 0.1, 0.0, 20)
            for k, v in residuals.items()}
    return replace(prior, residual_features=names, residuals=fits)


def test_fp16_and_bf16_share_their_fits_and_fp32_does_not():
    from gpuest.price.device_time import fit_key
    op, fits = "aten.mm.default", {mode_key("aten.mm.default", "bf16"), "matmul"}
    assert fit_key(op, "matmul", "fp16", fits) == fit_key(op, "matmul", "bf16", fits) == mode_key(op, "fp16")
    assert fit_key(op, "matmul", "fp32", fits) == "matmul"


def test_most_specific_residual_fit_prices_each_node(big_matmul):
    """op@mode beats op beats category@mode beats category beats default."""
    op = "aten.mm.default"
    keys = [mode_key(op, "bf16"), op, mode_key("matmul", "bf16"), "matmul", "default"]
    times = []
    for i in range(len(keys)):
        # key i gets log-efficiency log(2); the less specific ones log(4), the more specific are absent
        prof = _profile_with({k: (math.log(2.0) if j == i else math.log(4.0)) for j, k in enumerate(keys) if j >= i})
        times.append(gpuest.estimate(big_matmul, "H100", profile=prof).device_time_s)
    plain = gpuest.estimate(big_matmul, "H100", profile=_profile_with({"default": 0.0})).device_time_s
    for t in times:
        assert t == pytest.approx(2.0 * plain, rel=0.02)


def test_only_16_bit_atomic_accumulation_sets_the_atomic_lowp_feature():
    from gpuest.price.features import RESIDUAL_FEATURES
    base = {"op": "aten.upsample_bilinear2d_backward.default", "category": "pool", "flops": 1e6,
            "bytes_read": 4e6, "bytes_written": 1e6}
    table = NodeTable.from_records([{**base, "math_mode": "bf16", "atomic_adds": True},
                                    {**base, "math_mode": "fp32", "atomic_adds": True},
                                    {**base, "math_mode": "bf16", "atomic_adds": False}])
    times, _ = device_times(table, get_gpu("H100"), 1980.0, prior_profile())
    assert times.features[:, RESIDUAL_FEATURES.index("atomic_lowp")].tolist() == [1.0, 0.0, 0.0]


def test_only_a_16_bit_broadcast_of_one_dtype_sets_the_broadcast_lowp_feature():
    """TensorIterator's non-vectorised loop over an expanded operand: a 16-bit op of one dtype, not an fp32
    one, not a plain one, and not one of two dtypes (mixed_dtypes prices that loop already)."""
    from gpuest.price.features import RESIDUAL_FEATURES
    base = {"op": "aten.mul.Tensor", "category": "elementwise", "flops": 1e6, "bytes_read": 4e6,
            "bytes_written": 4e6}
    table = NodeTable.from_records([{**base, "math_mode": "bf16", "dtype": "bfloat16", "broadcast": True},
                                    {**base, "math_mode": "fp32", "dtype": "float32", "broadcast": True},
                                    {**base, "math_mode": "bf16", "dtype": "bfloat16", "broadcast": False},
                                    {**base, "math_mode": "bf16", "dtype": "bfloat16", "broadcast": True,
                                     "mixed_dtypes": True}])
    times, _ = device_times(table, get_gpu("H100"), 1980.0, prior_profile())
    assert times.features[:, RESIDUAL_FEATURES.index("broadcast_lowp")].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_partial_last_wave_of_channel_blocks_costs_more_than_its_bytes():
    """NCHW batch norm runs a block per channel, ROW_BLOCKS_PER_SM resident per SM: past the first wave, a
    partial last wave is timed as more channels than it has (channel_wave_factor), never as a whole wave;
    channels-last batch norm, one wave or less, and other categories keep their bytes."""
    from gpuest.price.features import ROW_BLOCKS_PER_SM, channel_wave_factor
    gpu = get_gpu("H100")
    wave = int(gpu.sm_count * ROW_BLOCKS_PER_SM["norm"])
    base = {"op": "aten.native_batch_norm_backward.default", "category": "norm", "flops": 1e6,
            "bytes_read": 4e6, "bytes_written": 2e6, "row_len": 50176, "row_segment": 196}
    rows = [wave // 2, wave, wave + wave // 4, 2 * wave]
    table = NodeTable.from_records([{**base, "row_count": r} for r in rows]
                                   + [{**base, "row_count": wave + wave // 4, "row_segment": 0},
                                      {**base, "row_count": wave + wave // 4, "category": "reduction"}])
    factor = channel_wave_factor(table, gpu)
    assert factor[[0, 1, 3, 4, 5]].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
    assert 1.0 < factor[2] < 2 * wave / (wave + wave // 4)


def test_a_kernel_variant_has_its_own_fit_and_falls_back_to_its_ops():
    """A transposed convolution is priced by the fits of its variant where the profile has them, else by
    its op's (in its math mode first), never by a sibling variant's."""
    from gpuest.price.device_time import fit_key
    from gpuest.profile import variant_op
    op = variant_op("aten.convolution.default", "transposed")
    have = {mode_key(op, "bf16"), "aten.convolution.default@tf32", "aten.convolution.default",
            variant_op("aten.convolution.default", "1d"), "conv"}
    assert fit_key(op, "conv", "bf16", have) == mode_key(op, "bf16")
    assert fit_key(op, "conv", "tf32", have) == "aten.convolution.default@tf32"
    assert fit_key(variant_op("aten.convolution.default", "3d"), "conv", "fp32", have) == "aten.convolution.default"
    assert variant_op("aten.convolution.default", "") == "aten.convolution.default"


def test_in_place_op_falls_back_to_its_out_of_place_fit_and_pool():
    """An op the suite never measured in place (add_) is priced by its out-of-place form's fit and
    residual pool (add), ahead of the category's fit; an op measured in place keeps its own."""
    from gpuest.price.device_time import fit_key
    from gpuest.price.local_correction import local_corrections, pool_key
    from gpuest.profile import ResidualPoints
    have = {"aten.add.Tensor@fp32", "aten.add.Tensor", "aten.relu_.default", "aten.relu.default", "elementwise"}
    assert fit_key("aten.add_.Tensor", "elementwise", "fp32", have) == "aten.add.Tensor@fp32"
    assert fit_key("aten.add_.Tensor", "elementwise", "bf16", have) == "aten.add.Tensor"
    assert fit_key("aten.relu_.default", "elementwise", "fp32", have) == "aten.relu_.default"
    assert fit_key("aten.mul_.Tensor", "elementwise", "fp32", have) == "elementwise"
    points = ResidualPoints(scale=(1.0,), x=((0.0,),), residual=(0.3,))
    assert pool_key("aten.add_.Tensor", "fp32", {"aten.add.Tensor": points}) == "aten.add.Tensor"
    out = local_corrections(np.zeros((2, 1)), np.array(["aten.add_.Tensor", "aten.mul_.Tensor"]),
                            np.array(["fp32", "fp32"]), {"aten.add.Tensor": points})
    assert out[0] > 0.0 and out[1] == 0.0


def test_profile_with_fewer_features_still_prices(big_matmul):
    """A profile names the features its fit used; one fitted before a feature existed keeps working."""
    import json

    from gpuest.price.features import RESIDUAL_FEATURES
    from gpuest.profile import profile_from_json
    old = _profile_with({"default": math.log(1.5)}, features=RESIDUAL_FEATURES[:8])
    loaded = profile_from_json(json.loads(json.dumps(old.to_json())))
    assert loaded.residual_features == RESIDUAL_FEATURES[:8]
    plain = gpuest.estimate(big_matmul, "H100", profile=_profile_with({"default": 0.0})).device_time_s
    assert gpuest.estimate(big_matmul, "H100", profile=loaded).device_time_s == pytest.approx(1.5 * plain, rel=0.02)
    with pytest.raises(gpuest.errors.ProfileError, match="unknown"):
        profile_from_json({**json.loads(json.dumps(old.to_json())), "residual_features": ["const", "made_up"]})


def test_eval_batch_norm_is_an_affine_pass_not_a_statistics_kernel():
    """With running statistics batch norm is one elementwise pass; in training it reduces first."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    x = (torch.empty(2, 3, 16, 16, device="meta"),)
    inference = gpuest.trace(model, x, mode="inference")
    training = gpuest.trace(model, x, mode="training")
    bn_eval = [d for _, d in inference.nodes(data=True) if "batch_norm" in d["op"]]
    bn_train = [d for _, d in training.nodes(data=True) if d["op"] == "aten.cudnn_batch_norm.default"]
    assert [(d["op"], d["category"]) for d in bn_eval] == [
        ("aten._native_batch_norm_legit_no_training.default", "elementwise")]
    assert [d["category"] for d in bn_train] == ["norm"]


def _features_of(records, gpu_name="H100"):
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import NodeTable
    from gpuest.price.profile_choice import roofline_profile
    from gpuest.price.features import RESIDUAL_FEATURES
    gpu = get_gpu(gpu_name)
    times, _ = device_times(NodeTable.from_records(records), gpu, gpu.max_clock_mhz, roofline_profile())
    return {name: times.features[:, i] for i, name in enumerate(RESIDUAL_FEATURES)}


def test_deep_gemm_with_few_output_tiles_is_split_along_k():
    """A weight gradient over many tokens (96 x 384 outputs: 3 tiles on 132 SMs) is split along K and
    fills the GPU; the same output with a shallow K cannot be split and leaves most SMs idle."""
    from gpuest.price.features import GEMM_TILE, SPLIT_K_DEPTH
    mm = {"op": "aten.mm.default", "category": "matmul", "math_mode": "bf16", "flops": 1e9, "bytes_read": 1e6,
          "bytes_written": 1e6, "gemm_m": 96, "gemm_n": 384}
    f = _features_of([{**mm, "gemm_k": 401408}, {**mm, "gemm_k": SPLIT_K_DEPTH // 2},
                      {**mm, "gemm_k": 2 * SPLIT_K_DEPTH}])
    sms, tiles = get_gpu("H100").sm_count, math.ceil(96 / GEMM_TILE) * math.ceil(384 / GEMM_TILE)
    assert f["log_wave_eff"][0] == pytest.approx(math.log(tiles * (sms // tiles) / sms))
    assert f["log_wave_eff"][1] == pytest.approx(math.log(tiles / sms))       # no K to split
    assert f["log_wave_eff"][2] == pytest.approx(math.log(2 * tiles / sms))   # two slices of the least depth


def test_row_features_follow_rows_and_row_length():
    from gpuest.price.features import ROW_BLOCKS_PER_SM
    gpu = get_gpu("H100")
    base = {"op": "aten.native_layer_norm.default", "category": "norm", "math_mode": "fp32", "flops": 1e6,
            "bytes_read": 1e6, "bytes_written": 1e6}
    f = _features_of([{**base, "row_count": 16384, "row_len": 64}, {**base, "row_count": 16, "row_len": 65536},
                      {**base, "op": "aten.add.Tensor", "category": "elementwise"}])
    assert f["log_row_len"][0] == pytest.approx(math.log2(64 / 1024))
    assert f["log_row_fill"][0] == 0.0                               # plenty of rows for every SM
    assert f["log_row_fill"][1] == pytest.approx(math.log2(16 / (gpu.sm_count * ROW_BLOCKS_PER_SM["norm"])))
    assert f["log_row_len"][2] == 0.0 and f["log_row_fill"][2] == 0.0  # not a row-wise op


def test_norm_rows_fill_the_gpu_only_with_several_blocks_per_sm():
    """A norm gives each row a block: one row per SM still leaves it short of loads in flight, while a
    reduction splits few long rows over blocks and is counted against the SMs alone."""
    from gpuest.price.features import ROW_BLOCKS_PER_SM
    sms = get_gpu("H100").sm_count
    norm = {"op": "aten.cudnn_batch_norm.default", "category": "norm", "math_mode": "bf16", "flops": 1e6,
            "bytes_read": 1e6, "bytes_written": 1e6, "row_len": 50176}
    f = _features_of([{**norm, "row_count": sms}, {**norm, "row_count": 2 * sms},
                      {**norm, "op": "aten.sum.dim_IntList", "category": "reduction", "row_count": sms}])
    assert f["log_row_fill"][0] == pytest.approx(-math.log2(ROW_BLOCKS_PER_SM["norm"]))
    assert f["log_row_fill"][1] == pytest.approx(f["log_row_fill"][0] + 1.0)
    assert f["log_row_fill"][2] == 0.0


def test_row_segment_feature_prices_short_strided_runs():
    from gpuest.price.features import ROW_SEGMENT_REF
    norm = {"op": "aten.cudnn_batch_norm.default", "category": "norm", "math_mode": "bf16", "flops": 1e6,
            "bytes_read": 1e6, "bytes_written": 1e6, "row_count": 512, "row_len": 128 * 49}
    f = _features_of([{**norm, "row_segment": 49}, {**norm, "row_segment": 56 * 56}, {**norm, "row_segment": 1},
                      {**norm, "row_segment": 0}])
    assert f["log_row_segment"][0] == pytest.approx(math.log2(49 / ROW_SEGMENT_REF))
    assert f["log_row_segment"][1] == 0.0             # a run of several transactions reads at full width
    assert f["log_row_segment"][2] == -4.0            # capped: the fits never see shorter runs priced apart
    assert f["log_row_segment"][3] == 0.0             # contiguous rows


def _times_of(records, gpu_name="H100"):
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import NodeTable
    from gpuest.price.profile_choice import roofline_profile
    gpu = get_gpu(gpu_name)
    table = NodeTable.from_records(records)
    return table, device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())[0]



def test_a_dilated_channels_last_depthwise_layer_is_priced_as_the_h200_measured_it():
    """The H200's suite measured MobileNetV3's dilated 5x5 depthwise layer 5.4-6.4x slower on channels-last
    data than on NCHW data (shapes/conv.json dilated); its isolated `dilated` fit prices it so, where the
    undilated fits priced the channels-last layer as the fast one."""
    def priced_s(channels_last: bool) -> float:
        conv = torch.nn.Conv2d(960, 960, 5, padding=4, dilation=2, groups=960, bias=False)
        x = torch.empty(32, 960, 32, 32)
        if channels_last:
            conv, x = conv.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        return gpuest.estimate(gpuest.trace(conv, (x,), precision="bf16"), gpu="H200").device_time_s
    assert priced_s(channels_last=True) > 2.0 * priced_s(channels_last=False)

def test_grouped_pointwise_backwards_are_priced_near_what_the_h200_measured():
    """The H200's suite measured the backward of grouped 1x1 layers (EfficientViT's and ShuffleNet-style;
    shapes/conv.json grouped_pointwise) at tens to hundreds of times their roofline, and erratically, as cuDNN
    picks its kernels per shape (384 channels in 24 groups at 14 px, bf16: 0.26 ms at batch 32, 1.14 ms at
    batch 128; channels-last, 1.25 and 0.62 ms). Their isolated fit prices the bf16 rows within 2x at the
    median (no smooth fit follows that scatter closer), where the dense fits had priced them at their roofline."""
    import json
    import re
    ratios, over_roofline = [], []
    for line in (ROOT / "data" / "calibration" / "H200.jsonl").read_text().splitlines():
        row = json.loads(line)
        shape = re.fullmatch(r"conv2d_bwd_bf16_c(\d+)_(\d+)_hw(\d+)_k1_s1_g(\d+)_n(\d+)(_nhwc)?", row.get("name", ""))
        if not shape or not row.get("time_ms_median") or shape.group(4) == "1":
            continue
        cin, cout, hw, groups, batch = map(int, shape.groups()[:5])
        # after a dense layer, as in a network: the grouped layer's backward computes both gradients
        model = torch.nn.Sequential(torch.nn.Conv2d(cin, cin, 1, bias=False),
                                    torch.nn.Conv2d(cin, cout, 1, groups=groups, bias=False))
        x = torch.empty(batch, cin, hw, hw)
        if shape.group(6):
            model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        est = gpuest.estimate(gpuest.trace(model, (x,), mode="training", precision="bf16"), gpu="H200")
        backward = est.per_node[(est.per_node["op"] == "aten.convolution_backward.default")
                                & (est.per_node["module"] == "1")]
        over_roofline.append(backward["time_s"].sum() / (backward["compute_s"] + backward["memory_s"]).sum())
        ratios.append(backward["time_s"].sum() / (row["time_ms_median"] * 1e-3))
    assert len(ratios) >= 16
    assert np.median(np.abs(np.log(ratios))) < np.log(2.0)
    assert np.median(over_roofline) > 20


def test_depthwise_convolution_runs_on_cuda_cores():
    """A grouped convolution narrower per group than a tensor-core MMA is priced at the fp32 SIMT peak
    (cuDNN's depthwise kernels); a dense one at its math mode's tensor-core peak."""
    base = {"op": "aten.convolution.default", "category": "conv", "math_mode": "bf16", "flops": 1e12,
            "bytes_read": 1e6, "bytes_written": 1e6}
    table, times = _times_of([{**base, "gemm_m": 4096, "gemm_n": 1, "gemm_k": 9, "gemm_batch": 384},
                              {**base, "gemm_m": 4096, "gemm_n": 256, "gemm_k": 2304, "gemm_batch": 1},
                              {**base, "gemm_m": 4096, "gemm_n": 3, "gemm_k": 3136, "gemm_batch": 1}])
    gpu = get_gpu("H100")
    assert list(table.tensor_core) == [False, True, True]   # a 3-channel stem is dense, not depthwise
    assert list(times.effective_mode) == ["fp32", "bf16", "bf16"]
    assert times.peak_flops[0] == pytest.approx(gpu.peak_flops_per_s("fp32"))
    assert times.compute_s[0] > 5 * times.compute_s[1]


def test_causal_skipping_saves_time_only_with_waves_to_spare():
    """A causal kernel cannot finish before its longest query tile: when one wave holds every query tile
    it takes the full time; with many waves it saves the skipped key tiles, but not the fixed part each
    query tile pays."""
    from gpuest.price.device_time import ATTENTION_CTAS_PER_SM, ATTENTION_TILE_OVERHEAD
    base = {"op": "aten._scaled_dot_product_flash_attention.default", "category": "attention",
            "math_mode": "bf16", "flops": 1e12, "flops_skipped": 0.45e12, "bytes_read": 1e6, "bytes_written": 1e6,
            "gemm_n": 2048, "gemm_k": 64}
    gpu = get_gpu("H100")
    few, many = 4, 64 * ATTENTION_CTAS_PER_SM * gpu.sm_count  # query tiles: batch*heads * ceil(seq/128)
    table, times = _times_of([{**base, "gemm_m": 128, "gemm_batch": few},
                              {**base, "gemm_m": 128, "gemm_batch": many},
                              {**base, "flops_skipped": 0.0, "gemm_m": 128, "gemm_batch": many}])
    assert times.work_flops[0] == pytest.approx(1e12)
    key_tiles, c = 2048 / 128, ATTENTION_TILE_OVERHEAD
    assert times.work_flops[1] == pytest.approx(1e12 * (c + 0.55 * key_tiles) / (c + key_tiles))
    assert times.work_flops[1] < 0.7e12
    assert times.work_flops[2] == pytest.approx(1e12)
    assert table.flops[1] == 1e12  # the reported FLOPs stay torch's count


def test_layout_and_window_features():
    base = {"op": "aten.clone.default", "category": "copy", "math_mode": "fp32", "flops": 0.0,
            "bytes_read": 1e6, "bytes_written": 1e6}
    conv = {"op": "aten.convolution.default", "category": "conv", "math_mode": "bf16", "flops": 1e9,
            "bytes_read": 1e6, "bytes_written": 1e6, "gemm_m": 4096, "gemm_n": 64, "gemm_k": 576}
    f = _features_of([{**base, "permuted": True}, base, {**conv, "window": 9, "channels_last": True},
                      {**conv, "math_mode": "tf32", "window": 1, "channels_last": True}])
    assert list(f["permuted"]) == [1.0, 0.0, 0.0, 0.0]
    assert f["log_window"][2] == pytest.approx(math.log2(9)) and f["log_window"][3] == 0.0
    assert list(f["nhwc_lowp"]) == [0.0, 0.0, 1.0, 0.0]
    assert list(f["nhwc_fp32"]) == [0.0, 0.0, 0.0, 1.0]
    assert list(f["log_work_kept"]) == [0.0] * 4
    g = _features_of([{**base, "op": "aten.add_.Tensor", "category": "elementwise", "broadcast": True,
                       "mixed_dtypes": True}, {**conv, "mixed_dtypes": True}])
    assert list(g["broadcast"]) == [1.0, 0.0] and list(g["mixed_dtypes"]) == [1.0, 0.0]  # tensor-core ops: no
    from gpuest.price.features import BROADCAST_RUN_REF
    # eval batch norm's per-channel kernel walks the planes it records as its row segment (no rows)
    big = {**base, "op": "aten._native_batch_norm_legit_no_training.default", "category": "elementwise",
           "broadcast": True, "bytes_read": 4e9}
    r = _features_of([{**big, "broadcast_run": 49, "row_segment": 49},
                      {**big, "broadcast_run": 3136, "row_segment": 3136}, {**big, "broadcast_run": 1},
                      {**big, "broadcast": False, "broadcast_run": 0},
                      {**big, "broadcast_run": 49, "row_segment": 49, "bytes_read": 1e3, "bytes_written": 1e3},
                      {**big, "broadcast_run": 2, "row_segment": 2},
                      {**big, "op": "aten.mul.Tensor", "broadcast_run": 49}])
    assert r["log_broadcast_run"][0] == pytest.approx(math.log2(49 / BROADCAST_RUN_REF), rel=1e-3)
    # TensorIterator's flat loop over a per-channel value (no row segment) streams short planes as fast
    assert r["log_broadcast_run"][6] == 0.0
    # streams; a value per element (channels-last, a last-dim bias) is read as a vector: no run; none
    assert list(r["log_broadcast_run"][1:4]) == [0.0, 0.0, 0.0]
    assert r["log_broadcast_run"][5] == pytest.approx(-7.0, rel=1e-3)    # the shortest run: log2(2 / 256)
    # an op of a few KB is fixed cost, not streaming: its runs hardly matter
    assert r["log_broadcast_run"][0] < 100 * r["log_broadcast_run"][4] < 0.0
    # bytes written over bytes moved, centred, for streaming ops only: a widening cast writes more
    h = _features_of([{**base, "op": "aten._to_copy.default", "bytes_read": 2e6, "bytes_written": 4e6}, base,
                      {**conv, "bytes_read": 1e6, "bytes_written": 3e6}])
    assert h["write_share"][0] == pytest.approx(4 / 6 - 0.5) and list(h["write_share"][1:]) == [0.0, 0.0]


def test_relayout_feature_marks_nchw_tensor_core_convs_cudnn_transposes():
    conv = {"op": "aten.convolution.default", "category": "conv", "math_mode": "bf16", "flops": 1e9,
            "bytes_read": 1e6, "bytes_written": 1e6, "gemm_m": 4096, "gemm_n": 64, "gemm_k": 64, "window": 1}
    f = _features_of([{**conv, "gemm_plane": 28 * 28},                       # bf16 loads 8 elements: in place
                      {**conv, "gemm_plane": 14 * 14},                       # 196 % 8 != 0: transposed
                      {**conv, "math_mode": "tf32", "gemm_plane": 14 * 14},  # tf32 loads 4: in place
                      {**conv, "gemm_k": 576, "window": 9},                  # 3x3: always transposed
                      {**conv, "window": 9, "channels_last": True},          # NHWC already
                      {**conv, "math_mode": "fp32", "window": 9}])           # CUDA cores: no tensor-core path
    assert list(f["relayout"]) == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_head_dim_and_row_overhead_features():
    gpu = get_gpu("H100")
    attn = {"op": "aten._scaled_dot_product_flash_attention.default", "category": "attention", "math_mode": "bf16",
            "flops": 1e9, "bytes_read": 1e6, "bytes_written": 1e6, "gemm_m": 1024, "gemm_n": 1024}
    norm = {"op": "aten.native_layer_norm.default", "category": "norm", "math_mode": "fp32", "flops": 1e6,
            "bytes_read": 4e6, "bytes_written": 4e6}
    f = _features_of([{**attn, "gemm_k": 64}, {**attn, "gemm_k": 128},
                      {**norm, "row_count": 16384, "row_len": 64}, {**norm, "row_count": 64, "row_len": 16384},
                      {**norm, "category": "reduction", "op": "aten.sum.dim_IntList", "row_count": 16384,
                       "row_len": 64, "reduce_kernel": True},
                      {**norm, "category": "reduction", "op": "aten.sum.dim_IntList", "row_count": 16384,
                       "row_len": 64, "row_segment": 1, "reduce_kernel": True}])
    assert list(f["log_head_dim"][:2]) == [-1.0, 0.0] and not f["log_head_dim"][2:].any()
    many, few = f["log_row_overhead"][2], f["log_row_overhead"][3]
    assert many > few > 0.0          # same bytes, 256x the rows: more fixed per-row work per byte
    # A reduction's warp per row costs less than a norm's block per row; a column sum has lanes for outputs.
    assert many > f["log_row_overhead"][4] > 0.0 and f["log_row_overhead"][5] == 0.0
    assert not f["log_row_overhead"][:2].any()
    roof = 8e6 / gpu.memory_bandwidth_bytes_per_s
    assert few == pytest.approx(math.log1p(1e-7 / (roof + OVERHEAD_SCALE_S)))


def test_host_paced_node_overlaps_its_launches():
    # One node that launches 100 kernels from a host loop: 2 ms of host, 1 ms of device work.
    d, h, spread, k = np.array([1e-3]), np.array([2e-3]), np.array([1.9e-3]), np.array([100])
    paced = simulate(d, h, spread, k)
    # The device runs while the host launches: done one kernel after the last launch, not after 3 ms.
    assert paced.wall_s == pytest.approx(2e-3 + 1e-5)
    assert simulate(d, h).wall_s == pytest.approx(3e-3)  # all host cost before the first kernel
    # Device-bound instead (0.5 ms of launches): the device time after the first launch decides.
    fast = simulate(np.array([5e-3]), np.array([0.6e-3]), np.array([0.5e-3]), k)
    assert fast.wall_s == pytest.approx(0.1e-3 + 5e-3)
    # A later node still waits for the earlier one's device work.
    two = simulate(np.array([1e-3, 1e-4]), np.array([2e-3, 1e-5]), np.array([1.9e-3, 0.0]), np.array([100, 1]))
    assert two.end_s[1] == pytest.approx(2e-3 + 1e-5 + 1e-4)


def test_odd_row_lengths_are_flagged_for_row_kernels():
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import node_table
    from gpuest.price.features import RESIDUAL_FEATURES
    from gpuest.profile import prior_profile
    gpu = get_gpu("H100")
    col = RESIDUAL_FEATURES.index("odd_rows")
    for dim, odd in [(50, 1.0), (75, 1.0), (64, 0.0), (1024, 0.0)]:
        ln = torch.nn.LayerNorm(dim, device="meta")
        g = gpuest.trace(ln, (torch.empty(4096, dim, device="meta"),))
        t = node_table(g)
        times, _ = device_times(t, gpu, gpu.max_clock_mhz, prior_profile())
        norm = t.category == "norm"
        assert norm.any() and (times.features[norm, col] == odd).all(), dim


def test_lstm_steps_run_one_after_another():
    T, B, H, I = 32, 8, 256, 64
    g = gpuest.trace(torch.nn.LSTM(I, H, device="meta"), (torch.empty(T, B, I, device="meta"),), mode="training")
    rnn = {d["op"]: d for _, d in g.nodes(data=True) if d.get("category") == "rnn"}
    fwd, bwd = rnn["aten._cudnn_rnn.default"], rnn["aten._cudnn_rnn_backward.default"]
    # a recurrent GEMM and a gate kernel per step (priced as RNN_STEP_LAUNCHES launches), plus the input
    # GEMM over all steps (cuDNN)
    from gpuest.annotate.formulas.rnn import RNN_STEP_LAUNCHES
    assert fwd["kernels"] == round(RNN_STEP_LAUNCHES * T) + 1 and bwd["kernels"] == fwd["kernels"] + 1
    assert fwd["grid_syncs"] == bwd["grid_syncs"] == 0
    # one step's GEMM fills the GPU, not all steps' at once
    assert fwd["gemm_batch"] == 1 and fwd["gemm_m"] == B and fwd["gemm_n"] == 4 * H
    # each step's GEMM is a kernel of its own and reads the recurrent weights again; the backward does
    # twice the forward's GEMM work (data and weight gradients) whatever path the CPU trace took
    w_hh = 4 * H * H * 4
    for node in (fwd, bwd):
        assert (T - 1) * w_hh <= node["bytes_read"] < (T + 1) * w_hh + 4 * T * B * (I + 4 * H) * 4
    gemm_flops = 2.0 * T * B * 4 * H * (I + H)
    assert fwd["flops"] == pytest.approx(gemm_flops, rel=0.02)
    assert bwd["flops"] == pytest.approx(2 * gemm_flops, rel=0.02)


def test_a_wide_rnn_step_waits_on_its_gemm_main_loop():
    """A per-step recurrent GEMM over a small batch is a chain of dependent loads: its serial steps grow
    with the steps and the hidden size, forward and backward alike."""
    from gpuest.annotate.formulas.rnn import PERSISTENT_RNN_MAX_HIDDEN, RNN_STEP_K_DEPTH

    def serial(T, H):
        g = gpuest.trace(torch.nn.LSTM(64, H, device="meta"), (torch.empty(T, 4, 64, device="meta"),),
                            mode="training")
        rnn = {d["op"]: d for _, d in g.nodes(data=True) if d.get("category") == "rnn"}
        return rnn["aten._cudnn_rnn.default"]["serial_steps"], rnn["aten._cudnn_rnn_backward.default"]["serial_steps"]

    H = 4 * RNN_STEP_K_DEPTH
    assert H > PERSISTENT_RNN_MAX_HIDDEN
    fwd, bwd = serial(20, H)
    assert fwd == 20 * H / RNN_STEP_K_DEPTH and bwd == fwd
    assert serial(40, H)[0] == 2 * fwd and serial(20, 2 * H)[0] == 2 * fwd


@pytest.mark.parametrize("how", ["bf16 weights", "autocast"])
def test_a_narrow_rnn_in_16_bits_runs_per_step_kernels(how):
    """cuDNN keeps a narrow layer in one persistent kernel only in fp32: in 16 bits (bf16 weights, or
    CUDA autocast, which runs cuDNN's RNNs in fp16 whatever its own dtype) it launches a GEMM and a cell
    kernel per step, as the session-15 kernel profiles show."""
    from gpuest.annotate.formulas.rnn import PERSISTENT_RNN_MAX_HIDDEN, cudnn_rnn_kernels
    T, B, H = 30, 4, 64
    assert H <= PERSISTENT_RNN_MAX_HIDDEN
    lstm = torch.nn.LSTM(H, H, device="meta", dtype=torch.bfloat16 if how == "bf16 weights" else torch.float32)
    x = torch.empty(T, B, H, device="meta", dtype=torch.bfloat16 if how == "bf16 weights" else torch.float32)
    g = gpuest.trace(lstm, (x,), mode="training", precision="bf16-mixed" if how == "autocast" else "fp32")
    rnn = {d["op"]: d for _, d in g.nodes(data=True) if d.get("category") == "rnn"}
    fwd, bwd = rnn["aten._cudnn_rnn.default"], rnn["aten._cudnn_rnn_backward.default"]
    assert fwd["grid_syncs"] == bwd["grid_syncs"] == 0
    assert fwd["kernels"] == cudnn_rnn_kernels(T) and bwd["kernels"] == cudnn_rnn_kernels(T, backward=True)
    expected = {"bf16 weights": ("bfloat16", "bf16"), "autocast": ("float16", "fp16")}[how]
    assert (fwd["dtype"], fwd["math_mode"]) == (bwd["dtype"], bwd["math_mode"]) == expected


@pytest.mark.parametrize("cell, gates", [(torch.nn.LSTM, 4), (torch.nn.GRU, 3), (torch.nn.RNN, 1)])
def test_a_recurrent_call_costs_what_cudnn_computes_whatever_the_cpu_path(cell, gates):
    """The CPU runs an LSTM as mkldnn layers but a GRU or an Elman RNN as per-step GEMMs and cell ops;
    cuDNN runs all of them as one call whose FLOPs and GEMM shape follow from the module, so the three
    cells' nodes differ by their gate counts alone (a GRU's backward once counted 1.5x its forward)."""
    T, B, H, I, layers = 12, 16, 320, 48, 2
    g = gpuest.trace(cell(I, H, layers, batch_first=True, device="meta"), (torch.empty(B, T, I, device="meta"),),
                        mode="training")
    rnn = {d["op"]: d for _, d in g.nodes(data=True) if d.get("category") == "rnn"}
    fwd, bwd = rnn["aten._cudnn_rnn.default"], rnn["aten._cudnn_rnn_backward.default"]
    gemm_flops = sum(2.0 * T * B * gates * H * (width + H) for width in (I, H))
    assert fwd["flops"] == pytest.approx(gemm_flops, rel=0.05)
    assert bwd["flops"] == pytest.approx(2 * gemm_flops, rel=0.05)
    assert (fwd["gemm_m"], fwd["gemm_n"], fwd["gemm_k"]) == (B, gates * H, I + H)
    assert (bwd["gemm_m"], bwd["gemm_n"], bwd["gemm_k"]) == (B, gates * H, I + H)
    assert fwd["bytes_read"] >= layers * (T - 1) * gates * H * H * 4


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
def test_a_narrow_rnn_runs_its_steps_inside_one_persistent_kernel(cell):
    """cuDNN runs hidden sizes up to PERSISTENT_RNN_MAX_HIDDEN as one persistent kernel per layer and
    direction whose blocks meet once per step: a few launches whatever the length, a grid barrier per
    step that the profile prices at grid_sync_s each, and serial work per step that grows with the
    recurrent weights (gates x hidden^2)."""
    from gpuest.annotate.formulas.rnn import PERSISTENT_RNN_MAX_HIDDEN
    from gpuest.price.device_time import PERSISTENT_REGISTER_STEPS
    T, B, H, I, layers = 40, 4, 128, 32, 2
    g = gpuest.trace(cell(I, H, layers, bidirectional=True, device="meta"),
                        (torch.empty(T, B, I, device="meta"),), mode="training")
    rnn = {d["op"]: d for _, d in g.nodes(data=True) if d.get("category") == "rnn"}
    fwd, bwd = rnn["aten._cudnn_rnn.default"], rnn["aten._cudnn_rnn_backward.default"]
    chains = layers * 2
    assert fwd["grid_syncs"] == bwd["grid_syncs"] == chains * T
    assert fwd["kernels"] < chains * T and bwd["kernels"] < chains * T   # not a launch per step
    gates = 4 if cell is torch.nn.LSTM else 3
    assert fwd["serial_steps"] == bwd["serial_steps"] == pytest.approx(chains * T * gates * H * H
                                                                       / PERSISTENT_STEP_WEIGHTS)
    assert H <= PERSISTENT_RNN_MAX_HIDDEN
    # The persistent kernel multiplies its fp32 weights with FMAs, not on tensor cores, whatever TF32
    # allows; a wide layer's per-step GEMMs take TF32 where cuDNN may (torch's default).
    assert torch.backends.cudnn.allow_tf32
    assert fwd["math_mode"] == bwd["math_mode"] == "fp32"
    wide = gpuest.trace(cell(I, 2 * PERSISTENT_RNN_MAX_HIDDEN, device="meta"), (torch.empty(T, B, I, device="meta"),))
    assert [d["math_mode"] for _, d in wide.nodes(data=True) if d.get("category") == "rnn"] == ["tf32"]
    # Each step costs a barrier, its serial work, and more for weights beyond those kept in registers;
    # the same node without barriers is no persistent kernel and pays none of it.
    prof = prior_profile()
    table = NodeTable.from_records([fwd, {**fwd, "grid_syncs": 0}])
    times, _ = device_times(table, get_gpu("H100"), 1980.0, prof)
    per_step = gates * H * H / PERSISTENT_STEP_WEIGHTS
    spilled = max(per_step - PERSISTENT_REGISTER_STEPS, 0.0)
    assert times.latency_s[0] - times.latency_s[1] == pytest.approx(
        chains * T * (prof.grid_sync_s + per_step * prof.persistent_step_s + spilled * prof.spilled_step_s))


def test_a_persistent_step_pays_more_per_weight_beyond_those_its_registers_hold():
    """Past PERSISTENT_REGISTER_STEPS serial steps per barrier a persistent kernel re-reads its weights every
    step: its step time grows faster with the weights, by the profile's spilled_step_s."""
    T, B = 50, 4
    prof, gpu = prior_profile(), get_gpu("H100")

    def step_s(hidden: int) -> tuple[float, float]:
        g = gpuest.trace(torch.nn.LSTM(32, hidden, device="meta"), (torch.empty(T, B, 32, device="meta"),))
        table = NodeTable.from_records([d for _, d in g.nodes(data=True) if d.get("category") == "rnn"])
        serial, spilled = persistent_steps(table)
        times, _ = device_times(table, gpu, 1980.0, prof)
        assert float(serial.sum()) == pytest.approx(T * 4 * hidden * hidden / PERSISTENT_STEP_WEIGHTS)
        return float(times.latency_s.sum()), float(spilled.sum())

    (t64, spill64), (t96, spill96), (t192, spill192) = step_s(64), step_s(96), step_s(192)
    assert spill64 == spill96 == 0.0 < spill192     # 4 x 96^2 = 36864 weights fit, 4 x 192^2 do not
    narrow_slope = (t96 - t64) / (4 * (96 ** 2 - 64 ** 2))
    wide_slope = (t192 - t96) / (4 * (192 ** 2 - 96 ** 2))
    assert wide_slope > 2 * narrow_slope


def test_local_correction_is_a_shrunk_kernel_mean_of_the_nearest_residuals():
    from gpuest.price.local_correction import BANDWIDTH, PRIOR_WEIGHT, correction, local_corrections
    from gpuest.profile import ResidualPoints
    points = ResidualPoints(scale=(1.0, 1.0), x=((0.0, 0.0), (0.0, 10.0)), residual=(0.4, -0.4))
    on_point, far = correction(np.array([[0.0, 0.0], [50.0, 50.0]]), points)
    far_weight = math.exp(-0.5 * (10.0 / BANDWIDTH) ** 2)
    assert on_point == pytest.approx((0.4 - 0.4 * far_weight) / (1.0 + far_weight + PRIOR_WEIGHT))
    assert abs(far) < 1e-12                     # nothing measured near it: the plain regression
    between = correction(np.array([[0.0, BANDWIDTH]]), points)[0]
    assert 0.0 < between < on_point             # fades with distance
    pools = {"aten.mm.default": points}
    out = local_corrections(np.zeros((3, 2)), np.array(["aten.mm.default", "aten.add.Tensor", "aten.mm.default"]),
                            np.array(["bf16", "bf16", "fp32"]), pools)
    assert out[0] == out[2] == pytest.approx(on_point) and out[1] == 0.0   # no pool for add: untouched


def test_dense_tensor_core_convolution_pays_for_padded_channels():
    """An RGB stem's 3 input channels run as 8 in bf16 and as 4 in TF32 (the tensor-core alignment);
    aligned channels cost nothing extra, and grouped and CUDA-core convolutions are priced as counted."""
    def stem(dtype, cin=3, groups=1, cout=64):
        conv = torch.nn.Conv2d(cin, cout, 7, 2, 3, groups=groups, bias=False, device="meta", dtype=dtype)
        g = graph_of(conv, (32, cin, 224, 224), dtype=dtype)
        return next(d for _, d in g.nodes(data=True) if d["op"] == "aten.convolution.default")

    for dtype, factor in ((torch.bfloat16, 8 / 3), (torch.float32, 4 / 3)):
        node = stem(dtype)
        table, times = _times_of([node])
        assert times.work_flops[0] == pytest.approx(node["flops"] * factor)
    aligned = stem(torch.bfloat16, cin=16)
    assert _times_of([aligned])[1].work_flops[0] == pytest.approx(aligned["flops"])
    grouped = stem(torch.bfloat16, cin=96, groups=32, cout=96)          # 3 channels per group
    assert _times_of([grouped])[1].work_flops[0] == pytest.approx(grouped["flops"])


class Linear(torch.nn.Module):
    """x @ w^T as nn.Linear without a bias traces it (mm against the transposed weight)."""
    def forward(self, x, w):
        return x @ w.t()


class WeightGrad(torch.nn.Module):
    """A linear layer's weight gradient, g^T @ x: its first operand's rows run along the output width."""
    def forward(self, g, x):
        return g.t() @ x


def _matmul_node(module, *shapes, dtype=torch.bfloat16):
    g = graph_of(module, *shapes, dtype=dtype)
    return next(d for _, d in g.nodes(data=True) if d["op"] == "aten.mm.default")


@pytest.mark.parametrize("width, dtype, row_bytes", [(50257, torch.bfloat16, 2), (30522, torch.bfloat16, 4),
                                                     (50260, torch.bfloat16, 8), (50304, torch.bfloat16, 16),
                                                     (50257, torch.float32, 4), (50260, torch.float32, 16)])
def test_a_matmul_records_the_byte_alignment_of_its_rows(width, dtype, row_bytes):
    """The forward's output rows, and the weight gradient's transposed operand, run along the width."""
    assert _matmul_node(Linear(), (4096, 768), (width, 768), dtype=dtype)["gemm_row_bytes"] == row_bytes
    assert _matmul_node(WeightGrad(), (4096, width), (4096, 768), dtype=dtype)["gemm_row_bytes"] == row_bytes


def test_an_odd_token_count_leaves_every_row_aligned():
    """No stored matrix's rows run along the tokens (the probe: odd token counts cost nothing)."""
    assert _matmul_node(Linear(), (4095, 768), (3072, 768))["gemm_row_bytes"] == 16
    assert _matmul_node(WeightGrad(), (4095, 3072), (4095, 768))["gemm_row_bytes"] == 16


class DataGrad(torch.nn.Module):
    """A linear layer's data gradient, g @ w: the weight is read N-major."""
    def forward(self, g, w):
        return g @ w


class BatchedWeightGrad(torch.nn.Module):
    """A batched product in the weight gradient's layout, a^T @ b: both operands read with K strided."""
    def forward(self, a, b):
        return torch.bmm(a.transpose(1, 2), b)


def test_a_matmul_records_how_many_operands_are_not_k_major():
    """The forward x @ w.t() reads both operands along K, the data gradient g @ w one, the weight gradient
    g.t() @ x none, and so does its batched form; a vector operand counts as K-major."""
    assert _matmul_node(Linear(), (4096, 768), (3072, 768))["gemm_mn_major"] == 0
    assert _matmul_node(DataGrad(), (4096, 3072), (3072, 768))["gemm_mn_major"] == 1
    assert _matmul_node(WeightGrad(), (4096, 3072), (4096, 768))["gemm_mn_major"] == 2
    assert _matmul_node(WeightGrad(), (4096, 1), (4096, 768))["gemm_mn_major"] == 1
    g = graph_of(BatchedWeightGrad(), (8, 64, 128), (8, 64, 32))
    assert next(d for _, d in g.nodes(data=True) if d["op"] == "aten.bmm.default")["gemm_mn_major"] == 2


class BiasedLinear(torch.nn.Module):
    """nn.Linear with a bias: addmm adding the bias vector in its epilogue."""
    def forward(self, x, w, b):
        return torch.nn.functional.linear(x, w, b)


def test_a_tensor_core_matmul_with_misaligned_rows_is_held_to_its_share_of_the_peak():
    """The analytic roofline itself carries the slowdown: 2-byte-aligned 16-bit rows reach
    MISALIGNED_GEMM_PEAK_SHARE of the peak, less with a bias epilogue, and lose the SMs a partial last wave
    of tiles leaves idle; fp32 (SIMT) GEMMs lose nothing."""
    from gpuest.price.features import MISALIGNED_GEMM_PEAK_SHARE, gemm_tiles
    sms = get_gpu("H100").sm_count
    for dtype, mode in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for module, kind, op in ((Linear(), "plain", "aten.mm.default"), (BiasedLinear(), "bias", "aten.addmm.default")):
            def node(width):
                shapes = [(4096, 768), (width, 768)] + ([(width,)] if kind == "bias" else [])
                g = graph_of(module, *shapes, dtype=dtype)
                return next(d for _, d in g.nodes(data=True) if d["op"] == op)
            odd, even = node(50257), node(50264)
            assert odd["gemm_bias"] == even["gemm_bias"] == (kind == "bias")
            (table, t_odd), (_, t_even) = _times_of([odd]), _times_of([even])
            per_flop = (t_odd.compute_s[0] / odd["flops"]) / (t_even.compute_s[0] / even["flops"])
            share = MISALIGNED_GEMM_PEAK_SHARE[kind].get(mode, {}).get(odd["gemm_row_bytes"], 1.0)
            tiles = gemm_tiles(table, get_gpu("H100"))[0]
            busy = tiles / (math.ceil(tiles / sms) * sms) if share < 1 else 1.0
            assert per_flop == pytest.approx(1 / (share * busy))
    assert MISALIGNED_GEMM_PEAK_SHARE["bias"]["bf16"][2] < MISALIGNED_GEMM_PEAK_SHARE["plain"]["bf16"][2] < 0.5
    # 64 tiles keep 64 of the H100's 132 SMs busy, 264 tiles two full waves: 2.06x the time per FLOP.
    small, full = (_matmul_node(Linear(), (1024, 1024), (w, 1024)) for w in (1023, 4223))
    (_, t_small), (_, t_full) = _times_of([small]), _times_of([full])
    assert (t_small.compute_s[0] / small["flops"]) / (t_full.compute_s[0] / full["flops"]) == pytest.approx(
        sms / 64, rel=0.05)


def _tf32_matmul_node(module, *shapes):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        return _matmul_node(module, *shapes, dtype=torch.float32)
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("m, n", [(1536, 1408), (768, 3072)])
def test_a_tf32_matmul_on_hopper_is_priced_by_its_operand_layout(m, n):
    """Hopper reads tf32 operands K-major only: on the H100 a weight gradient g.t() @ x (both operands
    strided along K) takes GEMM_LAYOUT_TIME of the data-gradient layout's time per FLOP on the same shape,
    whether the tiles fill their last wave or not, and x @ w.t() (none) the same time as the data gradient,
    as the probe measured. 16-bit GEMMs and other architectures keep one price for every layout."""
    from gpuest.price.features import GEMM_LAYOUT_TIME
    k = 16384
    layouts = {0: (Linear(), (m, k), (n, k)), 1: (DataGrad(), (m, k), (k, n)), 2: (WeightGrad(), (k, m), (k, n))}
    nodes = {count: _tf32_matmul_node(module, *shapes) for count, (module, *shapes) in layouts.items()}
    assert {count: (node["gemm_mn_major"], node["math_mode"]) for count, node in nodes.items()} == {
        count: (count, "tf32") for count in layouts}

    def per_flop(node, gpu="H100"):
        return _times_of([node], gpu)[1].compute_s[0] / node["flops"]
    time_ratio = GEMM_LAYOUT_TIME["hopper"]["tf32"]
    assert per_flop(nodes[2]) / per_flop(nodes[1]) == pytest.approx(time_ratio[2])
    assert per_flop(nodes[0]) == pytest.approx(per_flop(nodes[1]))
    assert time_ratio[2] > 1.0
    assert per_flop(nodes[2], "A100-SXM4-80GB") == pytest.approx(per_flop(nodes[1], "A100-SXM4-80GB"))
    bf16 = [_matmul_node(module, *shapes) for module, *shapes in layouts.values()]
    assert [node["gemm_mn_major"] for node in bf16] == [0, 1, 2]
    assert len({round(per_flop(node) / 1e-18, 6) for node in bf16}) == 1


def test_only_a_tensor_core_matmul_is_flagged_misaligned_by_its_rows():
    """The misaligned feature follows the probe: 4-byte fp32 rows (SIMT kernels) lose nothing, so an fp32
    matmul of 17-wide rows keeps the aligned fit (EfficientViT's fp32 linear attention was priced 4x over
    when the 16-bit slowdown carried over to it)."""
    from gpuest.price.device_time import roofline_on
    from gpuest.price.features import RESIDUAL_FEATURES
    col = RESIDUAL_FEATURES.index("misaligned")
    flags = {}
    for dtype in (torch.bfloat16, torch.float32):
        node = _matmul_node(Linear(), (4096, 768), (50257, 768), dtype=dtype)
        here, _ = roofline_on(NodeTable.from_records([node]), get_gpu("H100"))
        flags[dtype] = here.x[0, col]
    assert flags == {torch.bfloat16: 1.0, torch.float32: 0.0}


def test_host_synchronisation_stops_the_host_running_ahead():
    # Node 0: 1 ms of device work queued in 10 us; node 1 reads a GPU value on the host (.item());
    # node 2: 10 us of host, 1 us of device.
    d, h = np.array([1e-3, 0.0, 1e-6]), np.array([1e-5, 2e-6, 1e-5])
    ahead = simulate(d, h)
    assert ahead.issue_s[2] == pytest.approx(2.2e-5)        # the host ran ahead of the device
    synced = simulate(d, h, syncs=np.array([0, 1, 0]))
    assert synced.issue_s[2] == pytest.approx(1e-5 + 1e-3 + 1e-5)   # waited for node 0's end, then dispatched
    assert synced.wait_s[2] == pytest.approx(1e-5)           # the device idles while the host dispatches
    assert synced.wall_s == pytest.approx(synced.end_s[2]) and synced.wall_s > ahead.wall_s
    assert synced.host_total_s == ahead.host_total_s and synced.device_busy_s == ahead.device_busy_s


def test_an_op_that_synchronises_pays_the_profiles_stall_per_sync():
    base = {"op": "aten.nonzero.default", "category": "copy", "phase": "forward", "flops": 0.0,
            "bytes_read": 1e3, "bytes_written": 1e3, "math_mode": "fp32", "kernels": 2, "free": False,
            "host_only": False}
    table = NodeTable.from_records([base, {**base, "host_syncs": 1}])
    prof = prior_profile()
    times, _ = device_times(table, get_gpu("H100"), 1980.0, prof)
    assert times.latency_s[1] - times.latency_s[0] == pytest.approx(prof.host_sync_s)
    assert prof.host_sync_s > 0
    # The plain-roofline baseline has no fixed costs at all, a sync's included.
    from gpuest.price.profile_choice import roofline_profile
    plain, _ = device_times(table, get_gpu("H100"), 1980.0, roofline_profile())
    assert not plain.latency_s.any()


def test_autocast_dispatch_costs_host_time_per_op():
    from dataclasses import replace
    from gpuest.price.host_timeline import host_parts
    base = {"op": "aten.mm.default", "category": "matmul", "phase": "forward", "flops": 1.0, "bytes_read": 1.0,
            "bytes_written": 1.0, "math_mode": "bf16", "kernels": 1, "free": False, "host_only": False}
    table = NodeTable.from_records([base, {**base, "autocast": True}, {**base, "autocast": True, "free": True}])
    prof = prior_profile()
    prof = replace(prof, host_op_s={**prof.host_op_s, "autocast": 4e-6})
    lead, _ = host_parts(table, prof, "eager")
    assert lead[1] - lead[0] == pytest.approx(4e-6)
    assert lead[2] == pytest.approx(prof.host_only_op_s)     # a view dispatches no autocast wrapper


def test_a_copy_an_op_makes_of_its_input_costs_the_host_one_launch():
    from dataclasses import replace
    from gpuest.price.host_timeline import host_parts
    copy = {"op": "aten.clone.default", "category": "copy", "phase": "forward", "flops": 0.0, "bytes_read": 1e6,
            "bytes_written": 1e6, "math_mode": "fp32", "kernels": 1, "free": False, "host_only": False,
            "autocast": True}
    table = NodeTable.from_records([copy, {**copy, "staged_for": "aten.native_layer_norm.default"}])
    prof = prior_profile()
    prof = replace(prof, host_op_s={**prof.host_op_s, "copy": 9e-6, "launch_copy": 2e-6, "autocast": 4e-6})
    lead, _ = host_parts(table, prof, "eager")
    assert lead[0] == pytest.approx(9e-6 + 4e-6)             # dispatched by the model: the op's cost
    assert lead[1] == pytest.approx(2e-6)                    # launched inside its owner's C++ call


def _lookup(rows: int, width: int, tokens: int) -> NodeTable:
    out = tokens * width * 4
    return NodeTable.from_records([{"op": "aten.embedding.default", "category": "embedding", "math_mode": "fp32",
                                    "flops": 0, "bytes_read": min(rows, tokens) * width * 4 + tokens * 8,
                                    "bytes_written": out, "row_count": tokens, "row_len": width,
                                    "table_lookup": True}])


def test_an_output_that_stays_in_l2_lowers_the_floor_and_a_large_one_does_not():
    """A fit may price an op below its roofline only by the bytes of an output small enough to stay in
    L2; the rest must still cross DRAM."""
    fast = _profile_with({"embedding": -3.0})   # a fit that would make every lookup 20x faster
    gpu = get_gpu("H100")
    small = _lookup(50_000, 1024, 1024)          # 4 MB out, well inside the 50 MB L2
    large = _lookup(50_000, 1024, 65536)         # 268 MB out
    for table, floor_share in ((small, 0.5), (large, 1.0)):
        t = device_times(table, gpu, 1980, fast)[0]
        corrected = t.device_s[0] - t.latency_s[0]
        assert corrected < t.roofline_s[0] or floor_share == 1.0
        reads = (table.bytes[0] - table.bytes_written[0]) / gpu.memory_bandwidth_bytes_per_s
        assert corrected >= (reads if floor_share < 1 else t.roofline_s[0]) * (1 - 1e-9)
    prior = device_times(small, gpu, 1980, prior_profile())[0]
    assert prior.device_s[0] - prior.latency_s[0] >= prior.roofline_s[0] * (1 - 1e-9)


def test_lookups_of_short_rows_are_priced_by_rows_not_bytes():
    from gpuest.price.features import RESIDUAL_FEATURES
    gpu = get_gpu("H100")
    col = RESIDUAL_FEATURES.index("log_gather_bound")
    # The same bytes as 262144 rows of 128 elements or 32768 rows of 1024, from a table that stays in cache.
    short = device_times(_lookup(8192, 128, 262144), gpu, 1980, prior_profile())[0].features[0, col]
    wide = device_times(_lookup(8192, 1024, 32768), gpu, 1980, prior_profile())[0].features[0, col]
    assert short > 0.5                     # rows of 512 bytes: their count, not their bytes, bounds the lookup
    assert wide == pytest.approx(0.0)      # rows of 4 KB stream at the roofline
    # An index_select of the same shape is not a table lookup and gets no such term.
    table = _lookup(8192, 128, 262144)
    plain = NodeTable.from_records([{"op": "aten.index_select.default", "category": "copy", "math_mode": "fp32",
                                     "flops": 0, "bytes_read": float(table.bytes[0] - table.bytes_written[0]),
                                     "bytes_written": float(table.bytes_written[0]), "row_count": 262144,
                                     "row_len": 128}])
    assert device_times(plain, gpu, 1980, prior_profile())[0].features[0, col] == 0


def test_a_gpu_name_or_alias_as_profile_prices_with_that_gpus_shipped_profile(big_matmul):
    """profile="H100" means the H100's shipped calibration, not a file named H100."""
    from gpuest.errors import ProfileError
    by_alias = gpuest.estimate(big_matmul, gpu="H100", profile="H100")
    assert by_alias.profile_source == "measured" and by_alias.time_s == gpuest.estimate(big_matmul, gpu="H100").time_s
    moved = gpuest.estimate(big_matmul, gpu="A100", profile="H100")
    assert moved.profile_source == "transferred" and "H100-SXM" in moved.profile_note
    with pytest.raises(ProfileError, match="accepted: a profile JSON path, 'prior', 'roofline'"):
        gpuest.estimate(big_matmul, gpu="H100", profile="not-a-gpu")


def test_export_is_on_the_package_face(big_matmul, tmp_path):
    path = gpuest.export(gpuest.estimate(big_matmul, gpu="H100"), tmp_path / "e.json")
    assert "export" in gpuest.__all__ and path.exists() and path.stat().st_size > 0


def _conv_nodes() -> NodeTable:
    """An fp32 and an fp16 convolution forward (NCHW, 3x3, ResNet-like) and an fp32 ReLU."""
    conv = {"op": "aten.convolution.default", "category": "conv", "flops": 2 * 64 * 56 * 56 * 64 * 64 * 9,
            "bytes_read": 4 * 64 * 64 * 56 * 56, "bytes_written": 4 * 64 * 64 * 56 * 56, "kernels": 1}
    relu = {"op": "aten.relu.default", "category": "elementwise", "math_mode": "fp32", "flops": 1e7,
            "bytes_read": 4e7, "bytes_written": 4e7, "kernels": 1}
    return NodeTable.from_records([{**conv, "math_mode": "fp32", "dtype": "float32"},
                                   {**conv, "math_mode": "fp16", "dtype": "float16"}, relu])


def _correcting_gpus(gpu_name: str) -> tuple[object, list[set[str]]]:
    """The profile choice of a GPU and, per node of _conv_nodes, the GPUs whose profiles correct it."""
    from gpuest.price.device_time import correction_sources, effective_math_modes
    from gpuest.price.profile_choice import choose_profile
    gpu = get_gpu(gpu_name)
    choice = choose_profile(gpu)
    sources = (choice.profile, *choice.donors)
    table = _conv_nodes()
    use = correction_sources(table, effective_math_modes(table, gpu)[0], sources, gpu)
    return choice, [{p.gpu for p, u in zip(sources, col) if u} for col in use.T]


def test_a_gpu_without_profile_takes_each_correction_from_the_nearest_gpus_that_measured_the_like():
    """A V100-SXM2 has no profile: its latencies and power come from the nearest GPU measured with power, and
    each node's correction from the GPUs whose profiles saw that op or category in that math mode, those of
    its own compute capability first: the FP32 convolution and the ReLU from the V100-PCIe alone (the same
    GV100 chip), the fp16 convolution, which no public profile has, averaged over the Hopper profiles. A
    GPU whose compute capability nobody measured averages over every GPU that measured the like."""
    choice, by_node = _correcting_gpus("V100-SXM2-16GB")
    assert choice.source == "transferred"
    assert by_node == [{"V100-PCIe-32GB"}, {"H100-SXM", "H200"}, {"V100-PCIe-32GB"}]
    _, by_node = _correcting_gpus("L4")
    # The Hopper profiles measured FP32 convolutions only in depthwise layers, CUDA-core kernels of their own.
    assert {"A100-PCIe-40GB", "H100-SXM", "H200"}.isdisjoint(by_node[0]) and {"V100-PCIe-32GB", "T4"} <= by_node[0]
    assert by_node[1] == {"H100-SXM", "H200"}
    assert {"V100-PCIe-32GB", "A100-PCIe-40GB", "H100-SXM"} <= by_node[2]


def test_a_gpu_with_its_own_profile_borrows_only_what_its_profile_never_measured():
    """Its own fits correct every op they saw in its math mode; a T4's public FP32 profile has no tensor-core
    rows, so its fp16 convolution takes the Hopper profiles' corrections, as a GPU without a profile would. The
    H100 measured FP32 convolutions only in depthwise layers (CUDA-core kernels of their own): a dense FP32
    (TF32 off) convolution takes the corrections of the public profiles that measured dense ones."""
    public_fp32 = {"P100-PCIe-16GB", "P4", "T4", "V100-PCIe-32GB"}
    choice, by_node = _correcting_gpus("H100")
    assert choice.source == "measured" and by_node == [public_fp32, {"H100-SXM"}, {"H100-SXM"}]
    choice, by_node = _correcting_gpus("T4")
    assert choice.source == "measured"
    assert by_node == [{"T4"}, {"H100-SXM", "H200"}, {"T4"}]


def test_boards_of_one_chip_price_alike():
    """An SXM board of a chip whose PCIe board is calibrated is priced from that board's corrections: never
    slower than it where its clocks and bandwidth are at least as high (before, the A100-SXM4 averaged every
    GPU's FP32 fits and came out 1.4x slower than the A100-PCIe)."""
    import torch
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(64 * 28 * 28, 1024))
    graph = gpuest.trace(model, (torch.empty(32, 64, 28, 28, device="meta"),))
    for sxm, pcie in (("A100-SXM4-80GB", "A100-PCIe-40GB"), ("V100-SXM2-32GB", "V100-PCIe-32GB")):
        assert get_gpu(sxm).max_clock_mhz >= get_gpu(pcie).max_clock_mhz
        fast, slow = gpuest.estimate(graph, gpu=sxm), gpuest.estimate(graph, gpu=pcie)
        assert fast.device_time_s <= slow.device_time_s * 1.02, (sxm, fast.device_time_s, slow.device_time_s)


def test_a_stem_over_the_image_computes_only_its_weight_gradient_as_that_gemm():
    """The first convolution of a training step gets no input gradient (the image needs none): its
    backward is the "weight_grad" variant, a GEMM with the weight as output and K over the batch's output
    positions; a later convolution's backward computes both gradients and keeps the op's usual kernels."""
    import torch
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 96, 4, stride=4), torch.nn.Conv2d(96, 96, 3, padding=1))
    graph = gpuest.trace(model, (torch.empty(8, 3, 64, 64, device="meta"),), mode="training")
    backward = [a for _, a in graph.nodes(data=True) if a["op"] == "aten.convolution_backward.default"]
    stem = next(a for a in backward if a["module"] == "0")
    later = next(a for a in backward if a["module"] == "1")
    assert stem["variant"] == "weight_grad" and later["variant"] == ""
    assert (stem["gemm_m"], stem["gemm_n"], stem["gemm_k"]) == (96, 3 * 4 * 4, 8 * 16 * 16)
    assert stem["flops"] == pytest.approx(2.0 * 96 * 3 * 4 * 4 * 8 * 16 * 16)


def test_read_waste_is_the_share_of_fetched_sectors_a_permuted_op_leaves_unused():
    from gpuest.price.features import RESIDUAL_FEATURES
    base = {"op": "aten.add.Tensor", "category": "elementwise", "math_mode": "fp32", "flops": 1e6,
            "bytes_read": 8e6, "bytes_written": 4e6}
    table = NodeTable.from_records([{**base, "permuted": True, "read_amplification": 1.0},
                                    {**base, "permuted": True, "read_amplification": 2.0},
                                    {**base, "permuted": True, "read_amplification": 16.0},
                                    {**base, "permuted": False, "read_amplification": 1.0}])
    times, _ = device_times(table, get_gpu("H100"), 1980.0, prior_profile())
    assert times.features[:, RESIDUAL_FEATURES.index("read_waste")].tolist() == [0.0, 0.5, 0.9375, 0.0]


def test_multi_tensor_launches_pack_as_aten_does():
    """MultiTensorApply closes a launch at its tensor limit (after that tensor's last chunk) or at
    FOREACH_BLOCKS_PER_LAUNCH chunks (a tensor split there counts in both launches); each launch walks its
    longest chunk in steps of FOREACH_STEP_ELEMENTS; empty tensors take no place."""
    from gpuest.annotate.formulas.optimizer import (FOREACH_BLOCKS_PER_LAUNCH, FOREACH_CHUNK_ELEMENTS,
                                                    FOREACH_STEP_ELEMENTS, foreach_launches)
    chunk, steps = FOREACH_CHUNK_ELEMENTS, FOREACH_CHUNK_ELEMENTS // FOREACH_STEP_ELEMENTS
    assert foreach_launches([chunk] * 96, 48) == (2, 2 * steps)
    assert foreach_launches([chunk] * 48 + [0] * 5 + [100], 48) == (2, steps + 1)
    # 200 tensors of 16 chunks: 3200 blocks, 320 to a launch
    assert foreach_launches([16 * chunk] * 200, 48) == (3200 // FOREACH_BLOCKS_PER_LAUNCH, 10 * steps)
    assert foreach_launches([FOREACH_STEP_ELEMENTS + 1] * 10, 110) == (1, 2)
    assert foreach_launches([], 48) == (0, 0)


def test_a_foreach_launch_lasts_at_least_its_chunk_walk_faster_from_l2():
    """A small model's optimizer step: each foreach node is priced at least its launches' chunk walks, a
    step from DRAM for one reading state the step has not touched yet, from L2 for one reading only what
    the kernel right before wrote (AdamW's sqrt of the second moments its addcmul_ just updated)."""
    from gpuest.price.device_time import CHUNK_WALK_STEP_S
    from gpuest.price.node_table import node_table
    from gpuest.price.profile_choice import choose_profile
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(8)])
    graph = gpuest.trace(model, (torch.empty(4, 256, device="meta"),), mode="training", optimizer="adamw")
    table = node_table(graph)
    gpu = get_gpu("H100")
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, choose_profile(gpu).profile)
    ops = table.op.tolist()
    sqrt, lerp = ops.index("aten._foreach_sqrt.default"), ops.index("aten._foreach_lerp_.Scalar")
    assert table.chunk_walks[sqrt] == table.chunk_walks[lerp] == 32    # 8 tensors of one whole chunk
    assert times.roofline_s[lerp] == pytest.approx(32 * CHUNK_WALK_STEP_S["dram"])
    assert times.roofline_s[sqrt] == pytest.approx(32 * CHUNK_WALK_STEP_S["l2"])
    assert times.memory_s[lerp] < times.roofline_s[lerp] / 5    # its bytes alone would price it far faster
    assert (times.device_s >= np.where(table.chunk_walks > 0, times.roofline_s, 0.0)).all()


@pytest.mark.parametrize("mode,dims", [("bilinear", 2), ("bicubic", 2), ("linear", 1), ("trilinear", 3)])
def test_an_nchw_interpolation_lasts_at_least_its_plane_walk_and_channels_last_does_not_walk(mode, dims):
    """NCHW interpolation gives each output position a thread that walks the batch x channels planes in turn:
    far more planes than the suite's upsamplings (128 x 1024 of 14x14) are priced at least planes x step, a
    GPU holding fewer blocks at once walks again per wave, and channels-last data walks nothing."""
    from gpuest.price.device_time import PLANE_WALK_STEP_S
    from gpuest.price.node_table import node_table
    from gpuest.price.profile_choice import choose_profile

    def priced(shape, gpu_name, channels_last=False):
        x = torch.empty(shape, device="meta")
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        up = torch.nn.Upsample(scale_factor=2, mode=mode)
        table = node_table(gpuest.trace(up, (x,), precision="bf16"))
        gpu = get_gpu(gpu_name)
        times, _ = device_times(table, gpu, gpu.max_clock_mhz, choose_profile(gpu).profile)
        k = [i for i, op in enumerate(table.op.tolist()) if "upsample" in op]
        assert len(k) == 1
        return table, times, k[0]
    table, times, k = priced((128, 1024, *[14] * dims), "H100")
    assert table.plane_walks[k] == 128 * 1024
    assert times.device_s[k] >= 128 * 1024 * PLANE_WALK_STEP_S["dram"]
    assert times.memory_s[k] < times.device_s[k] / 20    # its bytes alone would price it far faster
    if dims == 2:
        # 512x512 outputs make 256 blocks: one wave on the H100's 132 SMs, seven on the T4's 40 (one block each)
        table, h100, k = priced((1, 64, 256, 256), "H100")
        assert table.walk_blocks[k] == 256 and h100.roofline_s[k] >= 64 * PLANE_WALK_STEP_S["l2"]
        _, t4, k = priced((1, 64, 256, 256), "T4")
        assert t4.roofline_s[k] >= 4 * 64 * PLANE_WALK_STEP_S["l2"]
        table, _, k = priced((128, 1024, 14, 14), "H100", channels_last=True)
        assert table.plane_walks[k] == 0


def test_a_multi_tensor_ops_host_time_follows_its_tensors_not_its_launches():
    """ATen launches a foreach op over huge tensors many times (320 chunks a launch) and one over as many
    small tensors once, but its host side works per tensor: both cost the host alike, while the device
    pays the launches. The calibration fit splits host time into the same units (fit.host_costs)."""
    from gpuest.price.host_timeline import host_parts, later_host_work
    from gpuest.price.node_table import node_table
    from gpuest.price.profile_choice import choose_profile

    def optimizer_nodes(numel: int) -> NodeTable:
        model = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(numel, device="meta")) for _ in range(4)])
        module = torch.nn.Module()
        module.ps = model
        module.forward = lambda x: sum(p.sum() for p in module.ps) * x
        graph = gpuest.trace(module, (torch.ones((), device="meta"),), mode="training", optimizer="adamw")
        return node_table(graph)
    small, huge = optimizer_nodes(1024), optimizer_nodes(64 * 2 ** 20)
    addcdiv = "aten._foreach_addcdiv_.ScalarList"
    i, j = small.op.tolist().index(addcdiv), huge.op.tolist().index(addcdiv)
    assert small.kernels[i] == 1 and huge.kernels[j] == 4 * 1024 // 320 + 1    # 4 x 1024 chunks
    assert later_host_work(small)[i] == later_host_work(huge)[j] == 3
    profile = choose_profile(get_gpu("H100")).profile
    (lead_small, spread_small), (lead_huge, spread_huge) = (host_parts(t, profile, "eager") for t in (small, huge))
    assert lead_small[i] + spread_small[i] == pytest.approx(lead_huge[j] + spread_huge[j])


def test_power_fit_finds_the_utilisation_exponent_of_a_concave_curve():
    """Windows whose power rises as the square root of their tensor-core utilisation (a concave curve, as the
    calibration windows' is) are fitted with utilisation_exponent 0.5 and the curve's own coefficients; a
    straight line through the same windows leaves a larger error."""
    from gpuest.calibrate.fit_power import fit_power
    from gpuest.price.power import clock_scale
    from gpuest.price.profile_choice import roofline_profile
    gpu = get_gpu("H100")
    node = {"op": "aten.mm.default", "category": "matmul", "math_mode": "bf16", "flops": 2 * 4096 ** 3,
            "bytes_read": 6.7e7, "bytes_written": 3.4e7, "gemm_m": 4096, "gemm_n": 4096, "gemm_k": 4096}
    times, _ = device_times(NodeTable.from_records([node]), gpu, gpu.max_clock_mhz, roofline_profile())
    ideal_s = float(times.work_flops[0] / times.peak_flops[0])
    prior = prior_profile().power
    scale = float(clock_scale(gpu, gpu.max_clock_mhz, prior))
    rows = [{"name": f"w{i}", "reliable": True, "nodes": [node], "time_ms_median": ideal_s / u * 1e3,
             "avg_power_w": 150.0 + scale * 400.0 * u ** 0.5} for i, u in enumerate(np.linspace(0.02, 0.95, 24))]
    fit = fit_power(rows, gpu, 70.0, prior.v_min_ratio)
    assert fit.utilisation_exponent == pytest.approx(0.5)
    assert fit.static_w == pytest.approx(150.0, abs=1.0) and fit.tensor_w == pytest.approx(400.0, abs=2.0)
    line = fit_power(rows, gpu, 70.0, prior.v_min_ratio, exponents=(1.0,))
    assert line.utilisation_exponent == 1.0 and line.sigma_w > 5 * fit.sigma_w


def test_memory_power_is_linear_in_bandwidth():
    """A DRAM byte costs the same energy at any rate (data/kernels/H200-power-curve.jsonl): whatever the fit's
    utilisation exponent, a memory-bound node's memory power is memory_w times its utilisation."""
    from dataclasses import replace
    from gpuest.price.power import node_power
    from gpuest.price.profile_choice import roofline_profile
    gpu = get_gpu("H100")
    add = {"op": "aten.add.Tensor", "category": "elementwise", "math_mode": "bf16", "flops": 0.0,
           "bytes_read": 8e9, "bytes_written": 4e9}
    table = NodeTable.from_records([add])
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())
    times = replace(times, device_s=times.device_s * 2.5)       # at 40 % of the DRAM roof
    power = [node_power(table, times, gpu, gpu.max_clock_mhz, replace(prior_profile().power, utilisation_exponent=e))
             for e in (1.0, 0.5)]
    fit = prior_profile().power
    assert power[0].util_memory[0] == pytest.approx(0.4)
    assert power[0].power_w[0] == pytest.approx(power[1].power_w[0])
    assert power[0].power_w[0] - fit.static_w == pytest.approx(fit.memory_w * power[0].util_memory[0], rel=1e-6)


def test_reads_left_in_l2_count_a_share_of_a_dram_byte_for_memory_power():
    """An op reading what the kernel right before it wrote (and small enough to stay in L2) is charged
    L2_BYTE_POWER_SHARE of a DRAM byte's memory power for those reads; one whose producer overflowed L2 is not."""
    from dataclasses import replace
    from gpuest.price.device_time import L2_ABSORBED_SHARE
    from gpuest.price.power import L2_BYTE_POWER_SHARE, dram_bytes
    from gpuest.price.profile_choice import roofline_profile
    gpu = get_gpu("H100")
    add = {"op": "aten.add.Tensor", "category": "elementwise", "math_mode": "bf16", "flops": 1e6,
           "bytes_read": 4e6, "bytes_written": 2e6}
    table = NodeTable.from_records([add, add, add])
    small, big = gpu.l2_cache_bytes * L2_ABSORBED_SHARE / 2, gpu.l2_cache_bytes * 2
    table = replace(table, warm_read_bytes=np.array([0.0, 2e6, 2e6]),
                    warm_producer_bytes=np.array([0.0, small, big]))
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())
    moved = dram_bytes(table, times, gpu)
    assert moved[0] == pytest.approx(6e6) and moved[2] == pytest.approx(6e6)
    assert moved[1] == pytest.approx(6e6 - (1.0 - L2_BYTE_POWER_SHARE) * 2e6)


def test_a_node_never_draws_more_than_the_board_power_limit():
    """However large a fit's unit coefficient, the board's limit holds a node at TDP; what it would draw
    unlimited (demand_w, which throttles its phase) stops at its chip's full load: the TDP on the H100, whose
    board is its chip's reference, 351 W on the 150 W A10."""
    from dataclasses import replace
    from gpuest.catalog.chips import full_load_power_w
    for name in ("H100", "A10"):
        gpu = get_gpu(name)
        power = _giant_gemm_power(gpu, replace(prior_profile().power, tensor_w=5 * gpu.tdp_w))
        assert power.power_w[0] == pytest.approx(gpu.tdp_w)
        assert power.demand_w[0] == pytest.approx(full_load_power_w(gpu))
    assert full_load_power_w(get_gpu("A10")) > 2 * get_gpu("A10").tdp_w


def _giant_gemm_power(gpu, fit):
    """NodePower of one 8192^3 bf16 GEMM on `gpu` at its max clock under `fit` (roofline times)."""
    from gpuest.price.power import node_power
    from gpuest.price.profile_choice import roofline_profile
    gemm = {"op": "aten.mm.default", "category": "matmul", "math_mode": "bf16", "flops": 2 * 8192 ** 3,
            "bytes_read": 2.7e8, "bytes_written": 1.3e8, "gemm_m": 8192, "gemm_n": 8192, "gemm_k": 8192}
    table = NodeTable.from_records([gemm])
    times, _ = device_times(table, gpu, gpu.max_clock_mhz, roofline_profile())
    return node_power(table, times, gpu, gpu.max_clock_mhz, fit)


def test_power_moves_between_gpus_by_full_load_power_so_a_low_power_board_is_throttled_at_its_tdp(big_matmul):
    """A power model moves to another GPU by full-load power, not TDP, and its memory term by DRAM bandwidth:
    the two 40 GB A100s (one chip, SMs, clock and bandwidth) get the same coefficients but for their catalogued
    idle powers (35 and 50 W), and a board whose chip draws more than its TDP allows (A10: GA102 at 150 W) runs
    a long GEMM well below its max clock at the default limit, at its TDP. With no chip reference (full load =
    TDP) the same board is not throttled."""
    from dataclasses import replace
    from gpuest.price.power import transfer_power
    from gpuest.profile import shipped_profiles
    h100 = shipped_profiles()["H100-SXM"].power
    sxm, pcie = (transfer_power(h100, get_gpu("H100"), get_gpu(n)) for n in ("A100-SXM4-40GB", "A100-PCIe-40GB"))
    assert pcie.tensor_w == pytest.approx(sxm.tensor_w, rel=0.1) and pcie.memory_w == pytest.approx(sxm.memory_w)
    by_tdp = transfer_power(h100, get_gpu("H100"), replace(get_gpu("A100-PCIe-40GB"), chip=None))
    assert pcie.tensor_w > 1.4 * by_tdp.tensor_w
    h200 = transfer_power(h100, get_gpu("H100"), get_gpu("H200"))
    assert h200.memory_w / h100.memory_w == pytest.approx(4800 / 3350, rel=0.01)
    a10 = get_gpu("A10")
    est = gpuest.estimate(big_matmul, a10)
    assert est.effective_clock_mhz < 0.9 * a10.max_clock_mhz
    assert est.avg_power_w == pytest.approx(a10.tdp_w, rel=0.02)
    assert any("150 W limit throttles" in n and "351 W" in n for n in est.notes)
    unlimited = gpuest.estimate(big_matmul, replace(a10, chip=None))
    assert unlimited.effective_clock_mhz == pytest.approx(a10.max_clock_mhz)
    assert not any("throttles" in n for n in unlimited.notes)
    assert unlimited.time_s < est.time_s


def test_profile_power_exponent_is_checked():
    """A profile's utilisation_exponent must be a number in (0, 1]; one fitted before it existed reads as 1."""
    import json
    from gpuest.errors import ProfileError
    from gpuest.profile import profile_from_json
    good = json.loads((ROOT / "gpuest" / "profiles" / "H200.json").read_text())
    legacy = json.loads(json.dumps(good))
    legacy["power"].pop("utilisation_exponent", None)
    assert profile_from_json(legacy).power.utilisation_exponent == 1.0
    for bad in (1.5, 0.0, "steep", True):
        broken = json.loads(json.dumps(good))
        broken["power"]["utilisation_exponent"] = bad
        with pytest.raises(ProfileError, match=r"utilisation_exponent' should be a number in \(0, 1\]"):
            profile_from_json(broken)
