"""The published-throughput check (benchmarks/published.py): its rows, their scoring rule, its report."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuest.capture.trace import PRECISIONS
from gpuest.catalog import get_gpu

SPEC = importlib.util.spec_from_file_location("published", Path(__file__).resolve().parents[1] / "benchmarks" / "published.py")
published = importlib.util.module_from_spec(SPEC)
sys.modules["published"] = published   # its dataclasses look their module up by name
SPEC.loader.exec_module(published)


@pytest.mark.parametrize("row", published.ROWS, ids=lambda r: f"{r.gpu}-{r.mode}-{r.precision}-b{r.batch}")
def test_every_row_names_its_table_conditions_and_a_catalogued_gpu(row):
    assert row.table and row.conditions and row.published_img_s > 0
    assert get_gpu(row.gpu).name == row.gpu
    assert row.precision in PRECISIONS and row.mode in ("training", "inference")
    # AMP recipes run NHWC in the source's configs.yml; FP32/TF32 ones NCHW
    assert (row.memory_format == "channels_last") == (row.precision == "fp16-mixed")


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
    predicted, error = float(cells[7]), float(cells[8])
    assert error == pytest.approx(100.0 * (predicted / 1000.0 - 1.0), abs=0.06)
    assert f"inference at batch >= {published.MIN_MODELLED_INFERENCE_BATCH}): 1;" in text
