"""The published-throughput check (benchmarks/published.py): its rows, their scoring rule, its report."""
from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from types import SimpleNamespace
from pathlib import Path

import pytest

from gpuest.capture.trace import OPTIMIZERS, PRECISIONS
from gpuest.catalog import get_gpu

SPEC = importlib.util.spec_from_file_location("published", Path(__file__).resolve().parents[1] / "benchmarks" / "published.py")
published = importlib.util.module_from_spec(SPEC)
sys.modules["published"] = published   # its dataclasses look their module up by name
SPEC.loader.exec_module(published)


@pytest.mark.parametrize("row", published.ROWS, ids=lambda r: f"{r.gpu}-{r.mode}-{r.precision}-b{r.batch}")
def test_every_row_names_its_table_conditions_and_a_catalogued_gpu(row):
    assert row.table and row.conditions and row.published_per_s > 0 and row.source in published.SOURCES
    assert get_gpu(row.gpu).name == row.gpu
    assert row.precision in PRECISIONS and row.mode in ("training", "inference") and row.optimizer in OPTIMIZERS
    # the layout priced is the one the row's stated conditions name (DLE's AMP recipes NHWC, Lambda's NCHW)
    assert (row.memory_format == "channels_last") == ("NHWC" in row.conditions)


def test_small_inference_batches_are_listed_not_scored():
    row = published.ROWS[0]
    assert replace(row, mode="training", batch=1).modelled
    assert not replace(row, mode="inference", batch=published.MIN_MODELLED_INFERENCE_BATCH - 1).modelled
    assert replace(row, mode="inference", batch=published.MIN_MODELLED_INFERENCE_BATCH).modelled


def test_same_chip_profile_is_another_board_of_the_same_chip():
    assert published.same_chip_profile("V100-SXM2-16GB") == "V100-PCIe-32GB"
    assert published.same_chip_profile("V100-PCIe-32GB") is None     # it has a profile of its own
    assert published.same_chip_profile("L4") is None                 # no calibrated Ada board


def test_report_scores_a_row_against_its_published_figure():
    row = published.PublishedRow("a table", "T4", "resnet18", "inference", "fp32", "contiguous", 64, 1000.0, "c")
    text = published.report((row,))
    line = next(l for l in text.splitlines() if l.startswith("| a table |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[6] == "img/s"
    predicted, error = float(cells[8]), float(cells[9])
    assert error == pytest.approx(100.0 * (predicted / 1000.0 - 1.0), abs=0.06)
    assert f"inference at batch >= {published.MIN_MODELLED_INFERENCE_BATCH}): 1;" in text


def test_bert_squad_rows_trace_the_source_model_with_tf32_gemms():
    row = next(r for r in published.ROWS if r.model == "bert_large_squad" and r.precision == "fp32")
    graph = published.trace_row(replace(row, batch=2, seq=64))
    modes = {d.get("math_mode") for _, d in graph.nodes(data=True) if d.get("category") == "matmul"}
    assert modes == {"tf32"}        # NGC's cuBLAS override, recorded at trace time
    weight_bytes = sum(b for _, b, kind in json.loads(graph.graph["memory_persistent"]) if kind == "weights")
    # DLE's weight count less the pooler it never uses, plus HF's two int64 id buffers of 512 positions
    assert weight_bytes == 4 * (335_150_082 - 1024 * 1024 - 1024) + 2 * 512 * 8


def test_measured_here_splits_the_gap_between_pricing_and_the_sources_software(tmp_path, monkeypatch):
    row = published.ROWS[0]
    record = {"table": row.table, "step_s": row.batch / 1000.0, "device_busy_s": 0.25, "torch": "x",
              "device_name": "GPU", "date": "2026-12-07T00:00:00+00:00"}
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps(record) + "\n")
    monkeypatch.setattr(published, "MEASURED_HERE", path)
    monkeypatch.setattr(published, "MEASURED_HERE_PER_OP", tmp_path / "no-per-op.jsonl")
    monkeypatch.setattr(published, "REPO", tmp_path)
    estimate = SimpleNamespace(device_time_s=0.2)
    lines = published.measured_here([(row, {"pred_per_s": 1100.0, "busy_share": 0.5, "estimate": estimate})])
    cells = [c.strip() for c in next(l for l in lines if l.startswith(f"| {row.table} |")).strip("|").split("|")]
    assert cells[2] == "1000" and cells[3] == "1100" and float(cells[4]) == pytest.approx(10.0)
    assert float(cells[5]) == pytest.approx(100.0 * (row.published_per_s / 1000.0 - 1.0), abs=0.06)
    assert float(cells[6]) == pytest.approx(250.0) and float(cells[7]) == pytest.approx(200.0)
    monkeypatch.setattr(published, "MEASURED_HERE", tmp_path / "absent.jsonl")
    assert published.measured_here([(row, {"pred_per_s": 1.0, "busy_share": 1.0})]) == []


def test_per_op_lines_compare_each_measured_op_with_its_traced_node(tmp_path, monkeypatch):
    import gpuest
    from gpuest.evaluate.accuracy import _norm_pred, ops_as_profiled
    row = replace(published.ROWS[0], model="resnet18", batch=2, table="a step")
    estimate = gpuest.estimate(published.trace_row(row), row.gpu)
    ops = ops_as_profiled(estimate.per_node)
    # a measurement where every op took twice its predicted time
    measured = {"ops": [[f"aten::{_norm_pred(op)}", 2e6 * t, []] for op, t in ops],
                "iteration_device_busy_us": sum(2e6 * t for _, t in ops)}
    path = tmp_path / "perop.jsonl"
    path.write_text(json.dumps({"table": "a step", "per_op": measured}) + "\n")
    monkeypatch.setattr(published, "MEASURED_HERE_PER_OP", path)
    monkeypatch.setattr(published, "REPO", tmp_path)
    lines = published._per_op_lines([(row, {"estimate": estimate})])
    total = [c.strip() for c in next(l for l in lines if l.startswith("| a step |")).strip("|").split("|")]
    assert total[1].startswith("all matched (100 %") and float(total[5]) == pytest.approx(-50.0, abs=0.1)
    per_op = [l for l in lines if l.startswith("| | ")]
    assert len(per_op) == published.PER_OP_SHOWN
    assert all(float(l.strip("|").split("|")[5]) == pytest.approx(-50.0, abs=0.1) for l in per_op)
