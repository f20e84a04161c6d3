"""Refactors leave predictions alone: a sample of the committed validation configs, priced now, equals to
1e-12 what tests/data/prediction_fingerprint.json holds (`python3 -m gpuest.evaluate.fingerprint` writes it
for every config; regenerate it with that command when a change is meant to move predictions)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpuest.evaluate.fingerprint import FIELDS, fingerprint

STORED = json.loads((Path(__file__).resolve().parent / "data/prediction_fingerprint.json").read_text())
SAMPLE_EVERY = 40     # every 40th config (by name): CNNs, transformers, RNNs, HF models, both GPUs


@pytest.mark.parametrize("name", sorted(STORED)[::SAMPLE_EVERY])
def test_predictions_equal_the_fingerprint(name):
    model, batch, seq, image_size, mode, precision, optimizer, memory_format, *routing = name.split("|")
    key = (model, int(batch), None if seq == "None" else int(seq), None if image_size == "None" else int(image_size),
           mode, precision, optimizer, memory_format, ast.literal_eval(routing[0]) if routing else None)
    now = fingerprint(key, sorted(STORED[name]))
    for gpu, values in STORED[name].items():
        for field in FIELDS:
            assert now[gpu][field] == pytest.approx(values[field], rel=1e-12, abs=0), (gpu, field)
