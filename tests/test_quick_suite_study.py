"""benchmarks/quick_suite_study.py: what it simulates and which validation configs it may look at."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gpuest.evaluate.validation_set import TEST_MODELS

ROOT = Path(__file__).resolve().parents[1]


def _study():
    spec = importlib.util.spec_from_file_location("quick_suite_study", ROOT / "benchmarks/quick_suite_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(model: str, busy_s: float, wall_s: float = 1.0, gpu: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {"schema": "gpuest.validation/1", "model": model, "family": "cnn", "batch": 8, "mode": "inference",
            "precision": "fp32", "seq": None, "image_size": 224, "status": "ok", "gpu": gpu,
            "wall_s": wall_s, "device_busy_s": busy_s}


def test_the_default_split_never_holds_a_test_model_and_the_test_split_only_those(tmp_path):
    study = _study()
    test_model = TEST_MODELS[0]
    rows = [_row("resnet18", 0.9), _row(test_model, 0.9), _row("resnet50", 0.5),  # the last is host-bound
            _row("resnet34", 0.9, gpu="NVIDIA H200")]
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    nontest = study.gpu_bound_configs([str(path)], "H100-SXM", "nontest")
    test = study.gpu_bound_configs([str(path)], "H100-SXM", "test")
    assert [r["model"] for r in nontest] == ["resnet18"]
    assert [r["model"] for r in test] == [test_model]


def test_the_simulated_profile_is_fitted_on_the_named_rows_only():
    from gpuest.calibrate.fit import RawData, load_raw
    study = _study()
    raw = load_raw(ROOT / "data/calibration/H100-SXM.jsonl")
    # A small slice of the committed rows, nodes as stored (no retrace): latency probes and two categories.
    names = {r["name"] for r in raw.rows if r.get("kind") in ("latency", "host_dispatch")
             or str(r.get("name", "")).startswith(("ew_", "linear_"))}
    profile = study.subset_profile(RawData(raw.meta, raw.rows), names, [])
    assert profile.provenance["fitted_rows"] == len(names)
    assert 0 < profile.provenance["suite_share"] < 1
