"""The shipped profiles are exactly what `gpuest fit` makes of the committed raw measurements."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from calibration.fit import fit_profile, load_raw, load_validation
from estimator.profile import load_profile, shipped_profiles

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ["H100-SXM", "H200"]


def _close(a, b, path="profile"):
    """Equal structure; floats equal to 1e-9 relative (BLAS summation order may differ by machine)."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("gpu", PROFILES)
def test_refit_reproduces_committed_profile(gpu):
    out = f"estimator/profiles/{gpu}.json"
    committed = json.loads((ROOT / out).read_text())
    # The command the profile says made it (gpuest fit RAW -o OUT --validation FILE...), run again.
    command = committed["provenance"]["fitted_by"]
    words = shlex.split(command)
    assert words[:2] == ["gpuest", "fit"] and words[3:5] == ["-o", out] and words[5] == "--validation", command
    raw_path, val_paths = words[2], words[6:]
    assert raw_path == f"data/calibration/{gpu}.jsonl" and f"data/validation/{gpu}-full.jsonl" in val_paths
    validation = load_validation(*(ROOT / path for path in val_paths))
    refit = fit_profile(load_raw(ROOT / raw_path), validation=validation, command=command)
    _close(json.loads(json.dumps(refit.to_json())), committed)


def test_shipped_profiles_are_measured_and_used():
    shipped = shipped_profiles()
    assert set(PROFILES) <= set(shipped)
    for name in PROFILES:
        prof = load_profile(ROOT / f"estimator/profiles/{name}.json")
        assert prof.kind == "measured" and prof.power is not None
        assert prof.provenance["gpu_name"].startswith("NVIDIA H")
        assert prof.provenance["fitted_rows"] > 500
