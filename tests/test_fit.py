"""The profile fit recovers known efficiencies from synthetic measurements (labelled synthetic:
generated here from the roofline with chosen factors, not measured)."""
from __future__ import annotations

import json
from dataclasses import replace
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import gpuest
from gpuest.calibrate.fit import RawData, fit_profile, load_raw
from gpuest.catalog import get_gpu
from gpuest.errors import ProfileError
from gpuest.price.device_time import persistent_steps
from gpuest.price.node_table import NodeTable
from gpuest.profile import load_profile, prior_profile, profile_from_json

LATENCY_S = 3e-6
FACTORS = {"matmul": 1.4, "elementwise": 1.25}


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _nodes(fn, *shapes, dtype=torch.bfloat16):
    g = gpuest.trace(Fn(fn), tuple(torch.empty(s, dtype=dtype, device="meta") for s in shapes))
    return [d for _, d in g.nodes(data=True) if not d["free"]]


# What the runner records about the machine; a measured profile without it does not load.
SYNTHETIC_PROVENANCE = {"gpu_name": "synthetic H100", "driver_version": "0", "torch_cuda_version": "0",
                        "cudnn_version": 90100, "torch_version": torch.__version__, "date": "2026-01-01",
                        "command": "synthetic_rows()"}


def synthetic_rows(gpu_name: str = "H100", seed: int = 0) -> RawData:
    gpu = get_gpu(gpu_name)
    rng = np.random.default_rng(seed)
    rows = []
    specs = [("matmul", lambda a, b: a @ b, [(n, n), (n, n)]) for n in (256, 512, 1024, 2048, 4096, 6144, 8192)]
    specs += [("matmul", lambda a, b: a @ b, [(m, 4096), (4096, 4096)]) for m in (64, 128, 384, 768, 3072)]
    specs += [("elementwise", lambda a, b: a + b, [(n,), (n,)]) for n in (1 << 20, 1 << 22, 1 << 24, 1 << 26,
                                                                         3 << 22, 5 << 22, 7 << 22, 1 << 25, 3 << 24)]
    specs += [("latency", lambda a, b: a + b, [(1,), (1,)]) for _ in range(3)]
    for i, (cat, fn, shapes) in enumerate(specs):
        nodes = _nodes(fn, *shapes)
        flops = sum(n["flops"] for n in nodes)
        moved = sum(n["bytes_read"] + n["bytes_written"] for n in nodes)
        roof = max(flops / gpu.peak_flops_per_s("bf16"), moved / gpu.memory_bandwidth_bytes_per_s)
        t = LATENCY_S + roof * FACTORS.get(cat, 1.0) * math.exp(rng.normal(0, 0.02))
        rows.append({"name": f"{cat}{i}", "category": cat, "holdout": i % 5 == 4, "nodes": nodes,
                     "kind": "latency" if cat == "latency" else "device", "timing_method": "events_queued",
                     "time_ms_median": t * 1e3, "error": None, "dry_run": False})
    return RawData({"catalog_gpu": gpu.name, "idle_power_w": 70.0, **SYNTHETIC_PROVENANCE}, rows)


def test_fit_recovers_latency_and_efficiency(tmp_path):
    prof = fit_profile(synthetic_rows())
    assert prof.kernel_latency_s == pytest.approx(LATENCY_S, rel=0.05)
    assert prof.residuals["matmul"].n >= 8
    # Off-sample matmuls are predicted with the chosen efficiency factor, within a few percent.
    path = prof.save(tmp_path / "p.json")
    loaded = load_profile(path)
    for n in (3000, 5000):
        g = gpuest.trace(Fn(lambda a, b: a @ b), (torch.empty(n, n, dtype=torch.bfloat16, device="meta"),) * 2)
        est = gpuest.estimate(g, "H100", profile=loaded, launch="graph")
        gpu = get_gpu("H100")
        # At the clock the borrowed power model leaves under the power limit (peaks scale with the clock).
        clock_share = est.effective_clock_mhz / gpu.peak_tflops_clock_mhz
        expected = LATENCY_S + 2 * n ** 3 / (gpu.peak_flops_per_s("bf16") * clock_share) * FACTORS["matmul"]
        assert est.device_time_s == pytest.approx(expected, rel=0.08)


def test_fit_is_deterministic(tmp_path):
    a = fit_profile(synthetic_rows()).to_json()
    b = fit_profile(synthetic_rows()).to_json()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_corrupt_profiles_are_rejected(tmp_path):
    good = json.loads(json.dumps(fit_profile(synthetic_rows()).to_json()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(good)[:-40])
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="schema"):
        profile_from_json({**good, "schema": "gpuest.profile/0"})
    broken = json.loads(json.dumps(good))
    broken["residuals"]["matmul"]["coef"] = [1.0]
    with pytest.raises(ProfileError, match="coef"):
        profile_from_json(broken)
    no_gpu = dict(good)
    no_gpu.pop("gpu")
    with pytest.raises(ProfileError, match="'gpu'"):
        profile_from_json(no_gpu)
    # A fitted cost the profile may lack is None (the prior's) or a non-negative number of seconds.
    assert profile_from_json({**good, "spilled_step_s": None}).spilled_step_s is None
    with pytest.raises(ProfileError, match="spilled_step_s must be a non-negative number of seconds"):
        profile_from_json({**good, "spilled_step_s": -1e-6})
    with pytest.raises(ProfileError, match="'persistent_step_s' should be"):
        profile_from_json({**good, "persistent_step_s": "fast"})


def test_raw_file_skips_a_torn_last_line_and_names_a_corrupt_one(tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"name": "a", "nodes": []}\n{"name": "b", "no')
    with pytest.warns(RuntimeWarning, match=r"raw.jsonl:2: skipped a torn last line.*resume"):
        assert [r["name"] for r in load_raw(raw).rows] == ["a"]
    raw.write_text('{"name": "a", "nodes": []}\n{"name": "b", "no\n{"name": "c", "nodes": []}\n')
    with pytest.raises(ProfileError, match=r"raw.jsonl:2 is not a JSON row.*corrupt"):
        load_raw(raw)
    raw.write_text('{"name": "a", "nodes": []}\n[1, 2]\n{"name": "c", "nodes": []}\n')
    with pytest.raises(ProfileError, match=r"raw.jsonl:2 is list, not a JSON object"):
        load_raw(raw)


def test_fit_regresses_on_the_nodes_this_estimator_derives():
    """Rows of suite benchmarks get their nodes re-traced (meta device, real sizes); rows the suite
    does not know keep theirs."""
    from gpuest.calibrate.fit import with_current_nodes
    from gpuest.calibrate.suite import all_benchmarks
    name = next(b.name for b in all_benchmarks() if b.name.startswith("embedding_fwd_bf16_v250000"))
    stale = [{"op": "aten.embedding.default", "flops": 0.0, "bytes_read": 1e12, "bytes_written": 0.0}]
    other = {"name": "not_in_the_suite", "nodes": stale}
    rows, retraced = with_current_nodes([{"name": name, "nodes": stale}, other])
    assert retraced == 1 and rows[1] is other
    (node,) = rows[0]["nodes"]
    assert node["op"] == "aten.embedding.default"
    assert 0 < node["bytes_read"] < 1e9  # the looked-up rows, not the 250k-row table nor the stale value


def _samples(ys, xs, op="aten.mm.default"):
    from gpuest.calibrate.fit import RowFeatures
    return [RowFeatures("matmul", op, "bf16", float(y), np.asarray(x, dtype=float), False, 1e-3, {})
            for y, x in zip(ys, xs)]


def _features(**cols):
    from gpuest.price.features import RESIDUAL_FEATURES
    n = len(next(iter(cols.values())))
    x = np.zeros((n, len(RESIDUAL_FEATURES)))
    x[:, 0] = 1.0
    for name, values in cols.items():
        x[:, RESIDUAL_FEATURES.index(name)] = values
    return x


def test_pooled_fit_corrects_level_and_inherits_slopes():
    """A narrow key with few benchmarks corrects its parent's level; the slope its own narrow data
    cannot pin down comes from the parent (partial pooling), not from noise."""
    from gpuest.calibrate.fit import fit_category
    from gpuest.price.features import RESIDUAL_FEATURES
    rng = np.random.default_rng(0)
    j = RESIDUAL_FEATURES.index("log_size")
    wide = np.linspace(-2, 4, 40)
    parent = fit_category(_samples(0.5 + 0.3 * wide + rng.normal(0, 0.01, 40), _features(log_size=wide)))
    assert parent.coef[0] == pytest.approx(0.5, abs=0.02) and parent.coef[j] == pytest.approx(0.3, abs=0.01)
    narrow = np.linspace(0.0, 0.1, 10)  # too narrow to tell a slope from noise
    child = fit_category(_samples(0.9 + 0.3 * narrow + rng.normal(0, 0.05, 10), _features(log_size=narrow)),
                         parent)
    assert child.coef[j] == pytest.approx(0.3, abs=0.01)
    assert child.coef[0] == pytest.approx(0.9, abs=0.05)
    # predictions may use the parent's feature range, where the inherited slope was learnt
    assert child.x_lo[j] == pytest.approx(-2) and child.x_hi[j] == pytest.approx(4)


def test_a_fixed_cost_slope_is_held_at_its_ceiling_and_the_rest_refitted():
    """Data whose time grows as the roofline shrinks (a log_overhead slope of 1.7) would price a smaller op
    slower than a larger one: the fit pins that slope at the feature's ceiling (1) and refits the others."""
    from gpuest.calibrate.fit import fit_category
    from gpuest.price.features import RESIDUAL_FEATURES, coefficient_ceilings
    j, k = RESIDUAL_FEATURES.index("log_overhead"), RESIDUAL_FEATURES.index("log_size")
    assert coefficient_ceilings()[j] == 1.0
    overhead = np.repeat(np.linspace(0.0, 3.0, 10), 3)
    size = np.tile([-1.0, 0.0, 1.0], 10)  # independent of overhead
    fit = fit_category(_samples(0.2 + 1.7 * overhead + 0.3 * size, _features(log_overhead=overhead, log_size=size)))
    assert fit.coef[j] == 1.0
    assert fit.coef[k] == pytest.approx(0.3, abs=0.02)  # an independent slope is unharmed
    child = fit_category(_samples(0.4 + 1.9 * overhead, _features(log_overhead=overhead, log_size=size)), fit)
    assert child.coef[j] == 1.0
    free = fit_category(_samples(0.2 + 0.6 * overhead, _features(log_overhead=overhead, log_size=size)))
    assert free.coef[j] == pytest.approx(0.6, abs=0.01)  # below its ceiling a slope is fitted as is


def test_features_only_a_sliver_of_the_samples_vary_are_not_fitted():
    """Two samples off by a hair in a feature would let the fit explain any residual with a huge slope."""
    from gpuest.calibrate.fit import fit_category
    from gpuest.price.features import RESIDUAL_FEATURES
    size = np.linspace(-2, 3, 20)
    sliver = np.zeros(20)
    sliver[[3, 11]] = 0.05
    ys = 1.0 + 0.2 * size + np.where(sliver > 0, 0.5, 0.0)
    fit = fit_category(_samples(ys, _features(log_size=size, log_row_len=sliver)))
    assert fit.coef[RESIDUAL_FEATURES.index("log_row_len")] == 0.0
    assert fit.coef[RESIDUAL_FEATURES.index("log_size")] == pytest.approx(0.2, abs=0.05)


def test_an_op_in_one_mode_gets_its_own_pooled_fit_from_few_rows():
    """Six fp32 rows of one op get an op@fp32 fit (pooled with matmul@fp32), so a mode the op's
    cross-mode fit barely saw is not priced by it; five do not."""
    from gpuest.calibrate.fit import MIN_ROWS_PER_OP_IN_MODE, RowFeatures, fit_residuals
    rng = np.random.default_rng(1)

    def rows(op, mode, n, level):
        size = np.linspace(-1, 3, n)
        x = _features(log_size=size)
        return [RowFeatures("matmul", op, mode, float(level + 0.1 * s + rng.normal(0, 0.01)), xi, False, 1e-3, {})
                for s, xi in zip(size, x)]
    base = rows("aten.mm.default", "fp32", 12, 0.2) + rows("aten.addmm.default", "bf16", 20, 0.5)
    fits = fit_residuals(base + rows("aten.addmm.default", "fp32", MIN_ROWS_PER_OP_IN_MODE, 0.9))
    assert "aten.addmm.default@fp32" in fits
    assert fits["aten.addmm.default@fp32"].coef[0] == pytest.approx(0.9, abs=0.05)
    fewer = fit_residuals(base + rows("aten.addmm.default", "fp32", MIN_ROWS_PER_OP_IN_MODE - 1, 0.9))
    assert "aten.addmm.default@fp32" not in fewer


def test_an_isolated_variant_is_fitted_alone_and_bends_no_other_fit():
    """Rows of a tiny-inner GEMM (an ISOLATED_VARIANTS variant) get their own op and op@mode fits at their
    own level, and the wide rows' op, category and category@mode fits come out as without them."""
    from gpuest.annotate.registry import TINY_INNER_VARIANT
    from gpuest.calibrate.fit import RowFeatures, fit_residuals
    from gpuest.profile import variant_op
    rng = np.random.default_rng(2)

    def rows(op, mode, n, level):
        size = np.linspace(-1, 3, n)
        return [RowFeatures("matmul", op, mode, float(level + 0.1 * s + rng.normal(0, 0.01)), xi, False, 1e-3, {})
                for s, xi in zip(size, _features(log_size=size))]
    wide = rows("aten.mm.default", "bf16", 12, 0.2) + rows("aten.addmm.default", "bf16", 12, 0.3)
    tiny_op = variant_op("aten.mm.default", TINY_INNER_VARIANT)
    with_tiny = fit_residuals(wide + rows(tiny_op, "bf16", 12, 2.5))
    alone = fit_residuals(wide)
    assert with_tiny[tiny_op].coef[0] == pytest.approx(2.5, abs=0.05)
    assert f"{tiny_op}@16bit" not in with_tiny or with_tiny[f"{tiny_op}@16bit"].coef[0] == pytest.approx(2.5, abs=0.05)
    for key in ("matmul", "aten.mm.default", "aten.addmm.default"):
        assert with_tiny[key].coef == alone[key].coef and with_tiny[key].log_hi == alone[key].log_hi


def test_convolutions_on_cuda_cores_are_recorded_apart_from_their_op_and_category():
    """A GPU whose FP32 convolutions were all depthwise (CUDA-core kernels) saw them under
    CUDA_CORE_GROUPS_KEY, not under the convolution op or category: another GPU's dense FP32 convolutions
    may not borrow its depthwise fits (price.device_time.correction_sources)."""
    from gpuest.calibrate.fit import RowFeatures, fitted_modes
    from gpuest.price.device_time import CUDA_CORE_GROUPS_KEY
    conv = "aten.convolution.default"
    x = _features(log_size=[0.0])[0]
    rows = [RowFeatures("conv", conv, "fp32", 0.0, x, False, 1e-3, {}, cuda_core_groups=True),
            RowFeatures("conv", conv, "tf32", 0.0, x, False, 1e-3, {})]
    modes = fitted_modes(rows)
    assert modes[CUDA_CORE_GROUPS_KEY] == ("fp32",) and modes["conv"] == ("tf32",) and modes[conv] == ("tf32",)



def test_a_gemm_with_a_tiny_inner_dimension_carries_the_isolated_variant():
    """mm, addmm and bmm with N or K below TINY_INNER select the tiny-inner variant; a wide GEMM, and a skinny
    one (a single row against a wide weight), do not."""
    from gpuest.annotate.formulas.matmul import TINY_INNER
    from gpuest.annotate.registry import TINY_INNER_VARIANT
    from gpuest.capture import trace

    class Layers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = torch.nn.Linear(4, 4)
            self.wide = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pairs = x[:, :, :TINY_INNER - 1]           # K just below the threshold
            return (self.wide(x[:, :, :64]).sum() + self.wide(x[:1, :1, :64]).sum() + self.heads(x[:, :, :4]).sum()
                    + torch.bmm(pairs, pairs.mT).sum() + torch.bmm(x, x.mT).sum())
    g = trace(Layers(), (torch.randn(2, 96, 128),), mode="inference")
    by_k = {(d["op"], d["variant"], str(d["gemm_k"])) for _, d in g.nodes(data=True) if d["category"] == "matmul"}
    assert ("aten.mm.default", TINY_INNER_VARIANT, "4") in by_k        # a linear layer over a 3-D input: mm
    assert {("aten.mm.default", "", "64"), ("aten.addmm.default", "", "64")} <= by_k
    assert not any(v for op, v, k in by_k if k == "64")
    assert ("aten.bmm.default", TINY_INNER_VARIANT, str(TINY_INNER - 1)) in by_k
    assert ("aten.bmm.default", "", "128") in by_k


def test_host_paced_rows_give_device_busy_and_a_host_cost_per_launch():
    from gpuest.calibrate.fit import host_costs, host_limited, measured_device_s
    base_s, launch_s = 20e-6, 6e-6
    rows = []
    for steps in (16, 32, 64, 128, 256):
        nodes = [{"op": "aten._cudnn_rnn.default", "category": "rnn", "kernels": 2 * steps + 1}]
        host_s = base_s + launch_s * 2 * steps
        busy_ms = 0.2e-3 * steps  # the GPU is idle most of the call: the host paces it
        rows.append({"name": f"rnn{steps}", "nodes": nodes, "time_ms_median": host_s * 1e3, "busy_ms": busy_ms})
    host = host_costs(rows, {"default": 5e-6})
    assert host["rnn"] == pytest.approx(base_s, rel=0.02) and host["launch_rnn"] == pytest.approx(launch_s, rel=0.02)
    assert host["default"] == 5e-6  # other categories keep the fallback
    r = rows[0]
    assert measured_device_s(r) == pytest.approx(r["busy_ms"] * 1e-3)  # the device model learns busy time
    assert not host_limited(r, {"rnn": 1.0, "default": 1.0})  # profiled: device time by construction
    # a device-bound row (elapsed ~ busy) says nothing about the host
    quiet = [dict(r, time_ms_median=r["busy_ms"] * 1.1) for r in rows]
    assert "launch_rnn" not in host_costs(quiet, {"default": 5e-6})


def _predict_row(row, profile) -> float:
    from gpuest.price.device_time import device_times
    from gpuest.price.node_table import NodeTable
    times, _ = device_times(NodeTable.from_records(row["nodes"]), get_gpu("H100"), 1980.0, profile)
    return float(times.device_s.sum())


def test_local_correction_learns_a_shape_effect_the_linear_fit_cannot_express(tmp_path):
    """One shape runs 1.6x slower than its neighbours (a kernel choice): the regression, linear in the
    features, cannot follow a bump; the residual points do, at that shape, and leave shapes far from every
    measured one to the regression."""
    from dataclasses import replace

    from gpuest.calibrate.fit import MIN_POOL_ROWS, POINT_CLIP_MIN, POINT_CLIP_SIGMAS
    raw = synthetic_rows()
    bumped = next(r for r in raw.rows if r["name"] == "elementwise12")      # the smallest add
    assert not bumped["holdout"]
    bumped["time_ms_median"] = (bumped["time_ms_median"] - LATENCY_S * 1e3) * 1.6 + LATENCY_S * 1e3
    prof = load_profile(fit_profile(raw).save(tmp_path / "p.json"))
    add = "aten.add.Tensor"
    assert add in prof.residual_points and len(prof.residual_points[add].x) >= MIN_POOL_ROWS
    widest = max(POINT_CLIP_SIGMAS * max(fit.sigma for fit in prof.residuals.values()), POINT_CLIP_MIN)
    assert all(abs(r) <= widest + 1e-9 for pts in prof.residual_points.values() for r in pts.residual)
    plain = replace(prof, residual_points={})

    def error(row, p):
        measured = row["time_ms_median"] * 1e-3
        return abs(_predict_row(row, p) - measured) / measured

    assert error(bumped, prof) < 0.6 * error(bumped, plain)
    # 8x the largest add measured: within 1 % of the regression (the prior weight leaves a node that far
    # a sliver of its neighbours' residuals; the bump itself is 60 %)
    far = {"nodes": _nodes(lambda a, b: a + b, (1 << 29,), (1 << 29,))}
    assert _predict_row(far, prof) == pytest.approx(_predict_row(far, plain), rel=0.01)


def test_residual_points_are_validated():
    good = json.loads(json.dumps(fit_profile(synthetic_rows()).to_json()))
    assert good["residual_points"]
    key = next(iter(good["residual_points"]))
    for field, value, message in (("scale", [1.0], "one per feature"), ("residual", [0.0], "same benchmarks"),
                                  ("scale", None, "'scale'")):
        broken = json.loads(json.dumps(good))
        if value is None:
            broken["residual_points"][key].pop(field)
        else:
            broken["residual_points"][key][field] = value
        with pytest.raises(ProfileError, match=message):
            profile_from_json(broken)
    zero_scale = json.loads(json.dumps(good))
    zero_scale["residual_points"][key]["scale"][0] = 0.0
    with pytest.raises(ProfileError, match="positive"):
        profile_from_json(zero_scale)


def test_fit_measures_the_gpu_idle_of_host_synchronisations():
    """Embedding backward over more indices than the direct kernel takes sorts them and waits twice for
    a segment count on the host: synthetic rows with a planted stall per wait give it back."""
    sync_s = 40e-6
    raw = synthetic_rows()
    gpu = get_gpu("H100")
    for i, (vocab, tokens) in enumerate([(100, 4096), (1000, 8192), (500, 16384), (2000, 4096)]):
        g = gpuest.trace(torch.nn.Embedding(vocab, 64, device="meta"),
                            (torch.zeros(tokens, dtype=torch.long, device="meta"),), mode="training")
        nodes = [d for _, d in g.nodes(data=True) if d["op"] == "aten.embedding_dense_backward.default"]
        assert nodes and nodes[0]["host_syncs"] == 2
        roof = sum(n["bytes_read"] + n["bytes_written"] for n in nodes) / gpu.memory_bandwidth_bytes_per_s
        t = sum(n["kernels"] for n in nodes) * LATENCY_S + 2 * sync_s + roof
        raw.rows.append({"name": f"emb{i}", "category": "embedding", "holdout": False, "nodes": nodes,
                         "kind": "device", "timing_method": "events_queued", "time_ms_median": t * 1e3,
                         "error": None, "dry_run": False})
    prof = fit_profile(raw)
    assert prof.host_sync_s == pytest.approx(sync_s, rel=0.1)
    assert load_profile(prof.save(Path(tempfile.mkdtemp()) / "p.json")).host_sync_s == prof.host_sync_s
    # Without such benchmarks the prior's value stands.
    assert fit_profile(synthetic_rows()).host_sync_s == prior_profile().host_sync_s


def test_fit_does_not_learn_an_accumulating_index_puts_serial_chain_twice():
    """Pricing adds an accumulating index_put's chain of dependent updates beside the corrected roofline, so
    the fit must take it out of the measured time too: synthetic rows of launches + chain + roofline are
    priced back at their time (when it did not, the suite's own index_put rows came out at 1.1-3.6x)."""
    from gpuest.price.device_time import dependent_update_time_s

    class Accumulate(torch.nn.Module):
        def forward(self, base, idx, values):
            return torch.ops.aten.index_put(base, [idx], values, True)

    raw = synthetic_rows()
    gpu = get_gpu("H100")
    for i, (rows_, n_idx, width) in enumerate([(16, 8192, 1024), (64, 8192, 1024), (128, 65536, 512),
                                                (8, 4096, 2048), (32, 16384, 256), (16, 32768, 256),
                                                (256, 65536, 128), (4, 2048, 4096), (48, 24576, 512),
                                                (96, 8192, 2048), (24, 12288, 1024), (12, 6144, 512)]):
        g = gpuest.trace(Accumulate(), (torch.empty(rows_, width, device="meta"),
                                        torch.zeros(n_idx, dtype=torch.long, device="meta"),
                                        torch.empty(n_idx, width, device="meta")))
        nodes = [d for _, d in g.nodes(data=True) if not d["free"]]
        table = NodeTable.from_records(nodes)
        assert table.dependent_updates.max() > 0
        roof = sum(n["bytes_read"] + n["bytes_written"] for n in nodes) / gpu.memory_bandwidth_bytes_per_s
        t = sum(n["kernels"] for n in nodes) * LATENCY_S + float(dependent_update_time_s(table).sum()) + roof
        raw.rows.append({"name": f"acc{i}", "category": "copy", "holdout": False, "nodes": nodes, "kind": "device",
                         "timing_method": "events_queued", "time_ms_median": t * 1e3, "error": None,
                         "dry_run": False})
    prof = fit_profile(raw, retrace=False)
    for row in raw.rows[-12:]:
        assert _predict_row(row, prof) == pytest.approx(row["time_ms_median"] * 1e-3, rel=0.1), row["name"]


def test_fit_measures_the_cost_of_a_persistent_rnn_step():
    """Narrow LSTMs run their steps inside one kernel: synthetic rows with a planted cost per step
    (grid barrier) give it back; the held-out rows do not enter the estimate."""
    step_s = 1.5e-6
    raw = synthetic_rows()
    gpu = get_gpu("H100")
    for i, (seq, batch) in enumerate([(64, 1), (128, 8), (256, 4), (100, 16), (50, 2)]):
        g = gpuest.trace(torch.nn.LSTM(32, 64, device="meta"), (torch.empty(seq, batch, 32, device="meta"),))
        nodes = [d for _, d in g.nodes(data=True) if d.get("category") == "rnn"]
        assert nodes[0]["grid_syncs"] == seq
        roof = sum(n["bytes_read"] + n["bytes_written"] for n in nodes) / gpu.memory_bandwidth_bytes_per_s
        planted = step_s if i < 4 else 10 * step_s   # the last is held out and far off
        t = sum(n["kernels"] for n in nodes) * LATENCY_S + seq * planted + roof
        raw.rows.append({"name": f"lstm{i}", "category": "rnn", "holdout": i == 4, "nodes": nodes,
                         "kind": "device", "timing_method": "events_queued", "time_ms_median": t * 1e3,
                         "busy_ms": t * 1e3, "error": None, "dry_run": False})
    prof = fit_profile(raw, retrace=False)
    assert prof.grid_sync_s == pytest.approx(step_s, rel=0.15)
    assert load_profile(prof.save(Path(tempfile.mkdtemp()) / "p.json")).grid_sync_s == prof.grid_sync_s
    assert fit_profile(synthetic_rows()).grid_sync_s == prior_profile().grid_sync_s


def test_fit_tells_a_persistent_steps_barrier_from_its_serial_and_spilled_work():
    """Persistent RNN steps of several widths: synthetic rows planted with a cost per barrier, one per
    serial step (the recurrent weights' multiply) and one per serial step beyond the weights kept in
    registers give back all three."""
    barrier_s, serial_s, spilled_s = 0.3e-6, 0.8e-6, 4e-6
    raw = synthetic_rows()
    gpu = get_gpu("H100")
    for i, (cell, hidden, seq) in enumerate([(torch.nn.LSTM, 32, 64), (torch.nn.GRU, 64, 48), (torch.nn.LSTM, 96, 96),
                                             (torch.nn.LSTM, 128, 50), (torch.nn.GRU, 160, 32),
                                             (torch.nn.LSTM, 192, 40)]):
        g = gpuest.trace(cell(32, hidden, device="meta"), (torch.empty(seq, 4, 32, device="meta"),))
        nodes = [d for _, d in g.nodes(data=True) if d.get("category") == "rnn"]
        assert nodes[0]["grid_syncs"] == seq and nodes[0]["serial_steps"] > 0
        roof = sum(n["bytes_read"] + n["bytes_written"] for n in nodes) / gpu.memory_bandwidth_bytes_per_s
        serial, spilled = persistent_steps(NodeTable.from_records(nodes))
        t = (sum(n["kernels"] for n in nodes) * LATENCY_S + seq * barrier_s
             + float(serial.sum()) * serial_s + float(spilled.sum()) * spilled_s + roof)
        raw.rows.append({"name": f"rnn{i}", "category": "rnn", "holdout": False, "nodes": nodes,
                         "kind": "device", "timing_method": "events_queued", "time_ms_median": t * 1e3,
                         "busy_ms": t * 1e3, "error": None, "dry_run": False})
    prof = fit_profile(raw, retrace=False)
    assert (prof.grid_sync_s, prof.persistent_step_s, prof.spilled_step_s) == pytest.approx(
        (barrier_s, serial_s, spilled_s), rel=0.15)
    saved = load_profile(prof.save(Path(tempfile.mkdtemp()) / "p.json"))
    assert (saved.persistent_step_s, saved.spilled_step_s) == (prof.persistent_step_s, prof.spilled_step_s)


def test_validation_files_skip_a_torn_last_line_and_name_a_corrupt_one(tmp_path):
    from gpuest.calibrate.fit import load_validation
    good = json.dumps({"model": "resnet18", "batch": 1, "image_size": 224, "mode": "inference", "precision": "fp32",
                       "status": "ok"})
    torn = tmp_path / "torn.jsonl"
    torn.write_text(good + "\n" + good[:10])
    with pytest.warns(RuntimeWarning, match="torn last line"):
        assert [r["model"] for r in load_validation(torn)] == ["resnet18"]
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(good + "\n{oops\n" + good + "\n")
    with pytest.raises(ProfileError, match=r"corrupt.jsonl:2 is not a JSON row"):
        load_validation(corrupt)


def test_a_re_measured_validation_config_replaces_the_earlier_row(tmp_path):
    """The fit reads validation files as the accuracy report does: the last row of a config and GPU wins."""
    from gpuest.calibrate.fit import load_validation
    row = {"model": "resnet18", "batch": 1, "image_size": 224, "mode": "training", "precision": "fp32",
           "gpu": "NVIDIA H100 80GB HBM3", "status": "ok"}
    first, again = tmp_path / "full.jsonl", tmp_path / "recheck.jsonl"
    first.write_text(json.dumps({**row, "device_busy_s": 3e-3}) + "\n"
                     + json.dumps({**row, "mode": "inference", "device_busy_s": 1e-3}) + "\n")
    again.write_text(json.dumps({**row, "device_busy_s": 2e-3}) + "\n"
                     + json.dumps({**row, "gpu": "NVIDIA H200", "device_busy_s": 4e-3}) + "\n")
    rows = load_validation(first, again)
    assert [(r["mode"], r["gpu"][-4:], r["device_busy_s"]) for r in rows] == [
        ("training", "HBM3", 2e-3), ("inference", "HBM3", 1e-3), ("training", "H200", 4e-3)]


def test_host_fit_scales_the_optimizers_launch_cost_with_the_optimizer_phase(monkeypatch):
    """The optimizer term of the host fit holds the optimizer's per-op and per-launch costs together,
    so the fitted profile must scale both by that term's coefficient (not the forward one)."""
    import numpy as np
    import gpuest.calibrate.fit_host as F
    rng = np.random.default_rng(0)
    terms = {i: rng.uniform(1e-4, 1e-2, len(F.HOST_TERMS)) for i in range(12)}
    true = np.array([1.5, 0.8, 3.0, 2e-6, 1e-6, 4e-6])
    monkeypatch.setattr(F, "validation_graph", lambda key: key[1])       # the batch field names the row
    monkeypatch.setattr(F, "host_terms", lambda g, profile: terms[g])
    rows = [{"status": "ok", "gpu_canonical": "H100-SXM", "model": "m", "batch": i, "mode": "training",
             "precision": "fp32", "wall_s": float(terms[i] @ true), "device_busy_s": 0.0} for i in terms]
    base = replace(prior_profile(), power=None,
                   host_op_s={**prior_profile().host_op_s, "launch_optimizer": 7e-6, "optimizer": 2e-5})
    fitted, info = F.fit_host_and_gap(base, rows, get_gpu("H100"))
    assert info["host_fit_runs"] == len(rows)
    assert fitted.host_op_s["optimizer"] == pytest.approx(2e-5 * true[2], rel=1e-3)
    assert fitted.host_op_s["launch_optimizer"] == pytest.approx(7e-6 * true[2], rel=1e-3)
    assert fitted.host_op_s["conv"] == pytest.approx(base.host_op_s["conv"] * true[0], rel=1e-3)


def test_power_is_fitted_on_windows_the_gpu_was_busy_through():
    """A host-paced benchmark (device busy well under its elapsed time) or one that waits for the host
    averages idle gaps into its window: the power regression leaves it out, whatever its category."""
    from gpuest.calibrate.fit_power import POWER_BUSY_FRACTION, busy_through_window
    node = {"op": "aten.add.Tensor", "category": "elementwise", "host_syncs": 0}
    plain = {"time_ms_median": 1.0, "nodes": [node]}
    assert busy_through_window(plain)
    assert busy_through_window({**plain, "busy_ms": 0.95})
    assert not busy_through_window({**plain, "busy_ms": POWER_BUSY_FRACTION * 0.9})
    assert not busy_through_window({**plain, "nodes": [{**node, "host_syncs": 1}]})


def test_the_host_fit_of_one_calibration_run_keeps_each_phase_scale_bounded():
    """A default calibration's eight host probes are few runs for six host terms: the fit may not drive a
    phase's dispatch scale to zero and hand its time to another term (HOST_SCALE_BOUNDS)."""
    from gpuest.calibrate.fit import fit_profile, load_raw, load_validation
    from gpuest.calibrate.fit_host import HOST_SCALE_BOUNDS
    from gpuest.profile import prior_profile
    root = Path(__file__).resolve().parents[1] / "data/calibration/fresh"
    raw = load_raw(root / "H100-SXM-quick.jsonl.gz")
    fitted = fit_profile(raw, retrace=False, validation=load_validation(root / "H100-SXM-quick.jsonl.host.jsonl"))
    assert fitted.provenance["host_fit_runs"] == 8
    lo, hi = HOST_SCALE_BOUNDS
    assert lo / hi <= fitted.host_backward_factor <= hi / lo
    unfitted = fit_profile(raw, retrace=False)
    scaled = (set(fitted.host_op_s) & set(unfitted.host_op_s)) - {"module_call", "autocast", "graph_launch"}
    assert "default" in scaled and "conv" in scaled
    for key in scaled:
        ratio = fitted.host_op_s[key] / unfitted.host_op_s[key]
        assert lo * (1 - 1e-9) <= ratio <= hi * (1 + 1e-9), key


def test_a_partial_calibration_corrects_the_shape_priors_fits_in_level_only():
    """Few shapes of a key pin its level, not its slopes: with a shape prior, the key's fit keeps the prior's
    slope (and feature range) and moves its level to this data's, even where this data suggests another
    slope; without one the same rows fit their own slope."""
    from gpuest.calibrate.fit import RowFeatures, fit_category, fit_residuals
    from gpuest.price.features import RESIDUAL_FEATURES
    j = RESIDUAL_FEATURES.index("log_size")
    wide = np.linspace(-2, 4, 40)
    prior_fit = fit_category(_samples(0.5 + 0.3 * wide, _features(log_size=wide)))
    prior = replace(prior_profile(), residuals={"matmul": prior_fit, "default": prior_fit})
    size = np.linspace(0.0, 2.0, 12)
    own = [RowFeatures("matmul", "aten.mm.default", "bf16", float(1.0 - 0.4 * s), x, False, 1e-3, {})
           for s, x in zip(size, _features(log_size=size))]
    alone = fit_residuals(own)["matmul"]
    lent = fit_residuals(own, prior)["matmul"]
    assert alone.coef[j] == pytest.approx(-0.4, abs=0.01)
    assert lent.coef[j] == pytest.approx(0.3, abs=1e-9) and lent.x_lo[j] == pytest.approx(-2)
    # the level moves so that the prior's slope passes through this data's middle (log_size 1: 0.6)
    assert lent.coef[0] + lent.coef[j] * 1.0 == pytest.approx(0.6, abs=0.05)


def test_only_a_partial_suite_borrows_another_gpus_fits():
    from gpuest.calibrate.fit import PARTIAL_SUITE_SHARE, shape_prior_for
    h100 = get_gpu("H100")
    prior = shape_prior_for(h100, 0.3)
    assert prior is not None and prior.gpu != h100.name and "power" in prior.predicts
    assert shape_prior_for(h100, 0.6) is not None   # most of the suite, still not all of it
    assert shape_prior_for(h100, PARTIAL_SUITE_SHARE) is None and shape_prior_for(h100, 1.0) is None
    assert shape_prior_for(h100, 0.0) is None   # imported public timings measure none of the suite


def test_fit_names_an_unknown_shape_prior(tmp_path):
    from gpuest.calibrate.fit import resolve_shape_prior
    with pytest.raises(ProfileError, match="no shipped profile of that GPU; accepted: auto, none"):
        resolve_shape_prior("Z9000", RawData({}, []))
    assert resolve_shape_prior("none", RawData({}, [])) is None
    assert resolve_shape_prior("H200", RawData({}, [])).gpu == "H200"


def test_a_partial_calibration_fits_every_row_once_its_held_out_errors_are_measured():
    """Each benchmark of a short run pins a level: the final fits use the held-out rows too, while the
    held-out figures stay those of the split."""
    from gpuest.profile import shipped_profiles
    raw = synthetic_rows()
    held = sum(1 for r in raw.rows if r["holdout"] and r["category"] == "matmul")
    alone = fit_profile(raw, retrace=False)
    lent = fit_profile(raw, retrace=False, shape_prior=shipped_profiles()["H200"])
    assert held and lent.residuals["matmul"].n == alone.residuals["matmul"].n + held
    assert lent.residuals["matmul"].holdout_median_ape is not None
    assert lent.provenance["shape_prior"].startswith("H200") and "shape_prior" not in alone.provenance


def test_a_partial_calibration_inherits_the_priors_finer_fits_at_the_level_it_measured():
    """A key the prior fits (an op in one math mode) that a short run measured too few of takes the prior's
    fit, moved by the level shift the run measured for the key it would otherwise fall back to."""
    from gpuest.calibrate.fit import RowFeatures, fit_category, fit_residuals
    from gpuest.price.features import RESIDUAL_FEATURES
    j = RESIDUAL_FEATURES.index("log_size")
    wide = np.linspace(-2, 4, 40)
    coarse = fit_category(_samples(0.5 + 0.3 * wide, _features(log_size=wide)))
    fine = fit_category(_samples(0.9 - 0.2 * wide, _features(log_size=wide)))
    prior = replace(prior_profile(), residuals={"matmul": coarse, "aten.mm.default": coarse,
                                                "aten.mm.default@fp32": fine, "default": coarse})
    size = np.linspace(0.0, 2.0, 12)
    # the run's mm rows sit 0.2 above the prior's op fit: that is the level shift its fp32 fit inherits
    own = [RowFeatures("matmul", "aten.mm.default", "bf16", float(0.7 + 0.3 * s), x, False, 1e-3, {})
           for s, x in zip(size, _features(log_size=size))]
    fits = fit_residuals(own, prior)
    shift = fits["aten.mm.default"].coef[0] - coarse.coef[0]
    assert shift == pytest.approx(0.2, abs=0.02)
    inherited = fits["aten.mm.default@fp32"]
    assert inherited.coef[0] == pytest.approx(fine.coef[0] + shift) and inherited.coef[j] == pytest.approx(-0.2, abs=1e-6)
    assert inherited.log_hi == pytest.approx(fine.log_hi + shift)
    assert "aten.mm.default@fp32" not in fit_residuals(own)   # without a prior, nothing to inherit


def test_a_partial_calibration_lends_the_priors_residual_points_where_it_measured_nothing():
    from gpuest.calibrate.fit import SAME_SHAPE_DISTANCE, lend_residual_points
    from gpuest.profile import ResidualPoints
    own = {"aten.mm.default": ResidualPoints((1.0, 1.0), ((0.0, 0.0), (1.0, 0.0)), (0.1, 0.2))}
    lent = {"aten.mm.default": ResidualPoints((1.0, 1.0), ((0.0, 0.5 * SAME_SHAPE_DISTANCE), (5.0, 5.0)), (0.9, -0.3)),
            "aten.bmm.default": ResidualPoints((1.0,) * 2, ((2.0, 2.0),), (0.4,))}
    out = lend_residual_points(own, lent)
    assert out["aten.bmm.default"] == lent["aten.bmm.default"]
    # the prior's copy of a measured shape is dropped, the far one kept
    assert out["aten.mm.default"].residual == (0.1, 0.2, -0.3)
    assert out["aten.mm.default"].x[-1] == (5.0, 5.0)


def test_a_partial_run_without_simt_windows_takes_the_shape_priors_simt_ratio():
    """A quick run whose power windows load no full-fp32 GEMM cannot identify simt_w: it takes its own
    tensor_w times the shape prior's simt_w / tensor_w; a fit that identified it, or a prior without it,
    leaves it as it is."""
    from gpuest.calibrate.fit_power import simt_from_prior
    base = prior_profile()
    own = replace(base.power, tensor_w=600.0, simt_w=None)
    lent = replace(base, power=replace(base.power, tensor_w=500.0, simt_w=300.0))
    assert simt_from_prior(own, lent).simt_w == pytest.approx(600.0 * 300.0 / 500.0)
    assert simt_from_prior(replace(own, simt_w=450.0), lent).simt_w == 450.0
    assert simt_from_prior(own, replace(lent, power=replace(lent.power, simt_w=None))).simt_w is None
    assert simt_from_prior(own, None).simt_w is None
    assert simt_from_prior(None, lent) is None


def test_a_gzipped_run_finds_its_sidecar_under_either_name(tmp_path):
    """A run gzipped after it was measured keeps its sidecar's plain name (run.jsonl.meta.json); one written
    gzipped names it after the archive (run.jsonl.gz.meta.json, the importer's). Both carry the GPU."""
    from gpuest.calibrate.fit import load_raw
    from gpuest.jsonl import write_text
    for archive, sidecar in (("a.jsonl.gz", "a.jsonl.meta.json"), ("b.jsonl.gz", "b.jsonl.gz.meta.json")):
        write_text(tmp_path / archive, '{"name": "x", "time_ms_median": 1.0}\n')
        (tmp_path / sidecar).write_text('{"gpu_name": "NVIDIA H100 80GB HBM3"}')
        raw = load_raw(tmp_path / archive)
        assert raw.meta["gpu_name"] == "NVIDIA H100 80GB HBM3" and raw.rows == [{"name": "x", "time_ms_median": 1.0}]
