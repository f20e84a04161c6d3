"""gpuest.report.accuracy on a small SYNTHETIC results file.

The "measured" numbers below are made up for the test, NOT real GPU measurements: each is 1.1 x
gpuest's own prediction for the config (computed here with load_model + trace + estimate, never
hard-coded), so every calibrated-predictor error is |1 - 1.1| / 1.1 = 9.09 %."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpuest.capture.models import load_model
from gpuest.capture.trace import trace
from gpuest.price.estimate import estimate
from gpuest.evaluate import accuracy as E
from gpuest.report import accuracy as A

SYNTHETIC_FACTOR = 1.1
GPU = "NVIDIA H100 80GB HBM3"
CONFIGS = [  # model, family, batch, seq, image_size, mode, precision, heldout
    ("lstm", "rnn", 2, 8, None, "inference", "fp32", False),
    ("gru", "rnn", 2, 8, None, "training", "bf16-mixed", True),
]


def _synthetic_row(model, family, batch, seq, image_size, mode, precision, heldout, *, per_op=False):
    lm = load_model(model, batch=batch, seq=seq, image_size=image_size)
    graph = trace(lm.model, lm.example_inputs, mode=mode, precision=precision, name=lm.name, batch=batch)
    est = estimate(graph, gpu=GPU)
    shape = f"s{seq}" if seq else f"i{image_size}"
    row = {
        "schema": "gpuest.validation/1", "synthetic": True, "key": f"{model}|b{batch}|{shape}|{mode}|{precision}",
        "model": model, "family": family, "batch": batch, "seq": seq, "image_size": image_size, "mode": mode,
        "precision": precision, "heldout": heldout, "optimizer": "adamw", "gpu": GPU, "status": "ok",
        "error": None, "dry_run": False, "date": "2000-01-01T00:00:00+00:00",
        "provenance": {"torch": "synthetic", "driver_version": "synthetic"},
        "device_busy_s": SYNTHETIC_FACTOR * est.device_time_s, "wall_s": SYNTHETIC_FACTOR * est.time_s,
        "avg_power_w": SYNTHETIC_FACTOR * est.avg_power_w, "energy_j": SYNTHETIC_FACTOR * est.energy_j,
    }
    if per_op:  # synthetic per-op sequence: the graph's own ops in profiler spelling, 1.1 x predicted
        ops = []
        for op, t in zip(est.per_node["op"], est.per_node["time_s"]):
            ops.append([f"aten::{op.split('.')[1]}", SYNTHETIC_FACTOR * t * 1e6, []])
        ops.insert(1, ["aten::linear", 3.0, [["aten::t", 0.0], ["aten::addmm", 3.0]]])  # not in the graph
        row["per_op"] = {"ops": ops, "iteration_device_busy_us": row["device_busy_s"] * 1e6,
                         "sum_top_level_us": sum(o[1] for o in ops)}
    return row, est


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acc")
    rows = [_synthetic_row(*c, per_op=(i == 0))[0] for i, c in enumerate(CONFIGS)]
    failed = {**rows[0], "key": "resnet18|b256|i224|training|fp32", "model": "resnet18", "status": "error",
              "error": "OutOfMemoryError: synthetic"}
    dry = {**rows[0], "key": "lstm|b1|s8|inference|fp32", "dry_run": True}
    results = tmp / "synthetic.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in [*rows, failed, dry]))
    out_md = tmp / "ACCURACY.md"
    png = tmp / "accuracy.png"
    metrics = A.build_report([results], out_md, png=png)
    return metrics, out_md.read_text(), png, results


def test_mape_arithmetic(report):
    metrics, _, _, _ = report
    expected = abs(1 - SYNTHETIC_FACTOR) / SYNTHETIC_FACTOR * 100  # 9.0909...
    cal = metrics["predictors"]["calibrated"]
    for q in ("device_time", "wall", "power", "energy"):
        assert cal["overall"][q]["n"] == 2
        assert cal["overall"][q]["mape"] == pytest.approx(expected, rel=1e-6)
        assert cal["overall"][q]["p90"] == pytest.approx(expected, rel=1e-6)
    assert cal["heldout"]["wall"]["n"] == 1 and cal["fitted"]["wall"]["n"] == 1
    assert set(cal["by_mode"]) == {"inference", "training"}
    assert set(cal["by_gpu"]) == {"H100-SXM"}
    assert {"roofline", "prior"} <= set(metrics["predictors"])
    aims = {(a["aim"], a["scope"]): a for a in metrics["aims"]}
    energy = aims[("energy per iteration", "all")]
    assert energy["met"] is True and energy["mape_pct"] == pytest.approx(expected)  # 9.09 <= 10
    assert aims[("wall time per iteration", "all")]["met"] is True


def test_skipped_rows(report):
    metrics, md, _, _ = report
    reasons = {s["key"]: s["reason"] for s in metrics["skipped"]}
    assert "measurement failed" in reasons["resnet18|b256|i224|training|fp32"]
    assert "dry run" in reasons["lstm|b1|s8|inference|fp32"]
    assert metrics["n_rows"] == 2


def test_markdown_sections(report):
    _, md, png, results = report
    for section in ("# gpuest prediction accuracy", "## Sources", "## Aims", "## Summary by predictor",
                    "## Splits: calibrated", "## Held-out models", "## Per-config results", "## Per-op device time",
                    "## Skipped rows", "## Predicted vs measured"):
        assert section in md, section
    assert "python3 -m gpuest.report.accuracy" in md and str(results) in md
    assert "9.1 %" in md
    assert "`gru`" in md  # the held-out model is listed
    assert png.exists() and png.stat().st_size > 1000


def test_per_op_alignment(report):
    metrics, _, _, _ = report
    (p,) = metrics["per_op"]
    assert p["n_matched"] >= p["n_predicted_ops"]  # every graph node found; linear expanded to t + addmm
    assert p["matched_sum_error_pct"] == pytest.approx(-(1 - 1 / SYNTHETIC_FACTOR) * 100, abs=1.0)


def test_align_per_op_expands_composites():
    measured = {"ops": [["aten::embedding", 10.0, []],
                        ["aten::linear", 20.0, [["aten::t", 0.0], ["aten::addmm", 20.0]]],
                        ["aten::softmax", 5.0, [["aten::_softmax", 5.0]]]],
                "iteration_device_busy_us": 40.0}
    predicted = [("aten.embedding.default", 8e-6), ("aten.t.default", 0.0), ("aten.addmm.default", 25e-6),
                 ("aten._softmax.default", 5e-6)]
    r = E.align_per_op(measured, predicted)
    assert r["n_matched"] == 4
    assert r["matched_measured_us"] == pytest.approx(35.0)
    assert r["matched_predicted_us"] == pytest.approx(38.0)
    assert r["coverage_pct"] == pytest.approx(35 / 40 * 100)


def test_align_per_op_matches_the_batch_norm_composite_with_its_kernel():
    """The profiler shows a batch norm's forward as aten::batch_norm; the graph names the kernel it runs."""
    measured = {"ops": [["aten::batch_norm", 30.0, [["aten::_batch_norm_impl_index", 30.0]]],
                        ["aten::relu_", 5.0, []]], "iteration_device_busy_us": 35.0}
    for kernel in ("native_batch_norm", "cudnn_batch_norm", "_native_batch_norm_legit_no_training"):
        r = E.align_per_op(measured, [(f"aten.{kernel}.default", 25e-6), ("aten.relu_.default", 5e-6)])
        assert r["n_matched"] == 2 and r["matched_measured_us"] == pytest.approx(35.0)


def test_staged_copies_count_inside_the_op_that_makes_them():
    per_node = pd.DataFrame({"op": ["aten.clone.default", "aten.native_layer_norm.default", "aten.clone.default"],
                             "time_s": [3e-6, 5e-6, 2e-6], "staged": [True, False, False]})
    assert E.ops_as_profiled(per_node) == [("aten.native_layer_norm.default", pytest.approx(8e-6)),
                                           ("aten.clone.default", 2e-6)]


@pytest.mark.parametrize("mode, source, noted", [
    ("training", E.BUSY_WITH_ANNOTATIONS, True),        # measured before annotations were excluded
    ("training", "profiler_gpu_work", False),
    ("inference", E.BUSY_WITH_ANNOTATIONS, False),       # no optimizer step to span
])
def test_rows_whose_busy_time_spans_annotations_are_noted(mode, source, noted):
    from gpuest.calibrate.validate import DEVICE_BUSY_SOURCE
    assert DEVICE_BUSY_SOURCE != E.BUSY_WITH_ANNOTATIONS   # rows the runner writes now are never noted
    row = {"key": "k", "gpu_canonical": "H100-SXM", "model": "m", "batch": 1, "mode": mode, "precision": "fp32",
           "wall_s": 0.01, "device_busy_s": 0.009, "device_busy_source": source}
    rec = E._record(row, "calibrated", {"device_time_s": 0.009, "time_s": 0.01}, {})
    assert (rec["note"] == E.BUSY_WITH_ANNOTATIONS_NOTE) is noted and rec["error"] is None


def test_fresh_profile_is_judged_against_the_shipped_one_on_the_same_configs():
    """The fresh predictor's MAPE is taken over the GPU-bound configs both priced, and meets its aim
    within FRESH_MARGIN_PP of the shipped profile's."""
    rec = lambda key, predictor, ape, bound=True: {"key": key, "gpu": "H100-SXM", "predictor": predictor,  # noqa: E731
                                                   "error": None, "gpu_bound": bound, "ape_device_time": ape,
                                                   "set": "full"}
    df = pd.DataFrame([rec("a", "calibrated", 2.0), rec("a", "fresh", 3.0), rec("b", "calibrated", 4.0),
                       rec("b", "fresh", 5.5), rec("c", "calibrated", 1.0),  # no fresh price: not compared
                       rec("d", "calibrated", 1.0, False), rec("d", "fresh", 90.0, False)])
    row, everything = E.fresh_comparison(df)
    assert row["configs"] == "validation set" and everything["configs"] == "all" and everything["n"] == row["n"]
    assert row["n"] == 2 and row["shipped_mape"] == pytest.approx(3.0) and row["fresh_mape"] == pytest.approx(4.25)
    assert row["met"] is (4.25 <= 3.0 + E.FRESH_MARGIN_PP)
    assert "## A fresh 5-minute calibration" in "\n".join(A.fresh_markdown(df))


def test_test_split_headline_counts_ratios_outside_the_bounds():
    rec = lambda key, split, meas, pred, bound=True: {  # noqa: E731
        "key": key, "gpu": "H100-SXM", "model": key, "predictor": "calibrated", "error": None, "split": split,
        "heldout": False, "gpu_bound": bound, "meas_device_time": meas, "pred_device_time": pred,
        "ape_device_time": abs(pred - meas) / meas * 100, "ape_energy": 4.0}
    df = pd.DataFrame([rec("a", "test", 1.0, 1.04), rec("b", "test", 1.0, 2.5), rec("c", "test", 2.0, 1.1, False),
                       rec("d", "", 1.0, 3.0)])
    t = E.test_split_summary(df)
    assert t["n_configs"] == 3 and t["outside_bounds"] == 1 and t["all_outside_bounds"] == 2
    device = t["aims"][0]
    assert device["n"] == 2 and device["mape_pct"] == pytest.approx((4 + 150) / 2) and device["met"] is False
    assert list(t["worst_test"]["key"])[:2] == ["b", "c"] and list(t["worst_all"]["key"])[0] == "d"
    assert "## Test split (headline)" in "\n".join(A.test_split_markdown(df))


def test_a_convolutions_bias_add_counts_inside_it_as_the_profiler_nests_it():
    per_node = pd.DataFrame({"op": ["aten.convolution.default", "aten.view.default", "aten.add_.Tensor",
                                    "aten.add_.Tensor"],
                             "module": ["conv", "conv", "conv", "block"], "time_s": [5e-6, 0.0, 2e-6, 1e-6],
                             "staged": [False] * 4, "free": [False, True, False, False]})
    assert E.ops_as_profiled(per_node) == [("aten.convolution.default", pytest.approx(7e-6)),
                                           ("aten.view.default", 0.0), ("aten.add_.Tensor", pytest.approx(1e-6))]
