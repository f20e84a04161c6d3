"""The shipped profiles are exactly what `gpuest fit` makes of the committed raw measurements."""
from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuest.calibrate.fit import RawData, fit_profile, load_raw, load_validation, resolve_shape_prior
from gpuest.profile import load_profile, shipped_profiles

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ["H100-SXM", "H200"]


def _close(a, b, path="profile", rel=1e-6):
    """Equal structure; floats equal to `rel` (BLAS summation order may differ by machine)."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", rel)
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", rel)
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_refit_reproduces_committed_profiles():
    # One test for every GPU: their suites share benchmarks, which retrace_nodes re-traces once per process.
    for gpu in PROFILES:
        out = f"gpuest/profiles/{gpu}.json"
        committed = json.loads((ROOT / out).read_text())
        # The command the profile says made it (gpuest fit RAW -o OUT --validation FILE...), run again.
        command = committed["provenance"]["fitted_by"]
        words = shlex.split(command)
        shape_prior = "auto"
        if "--shape-prior" in words:   # gpuest fit's option, last on the command line
            at = words.index("--shape-prior")
            shape_prior = words[at + 1]
            del words[at:at + 2]
        assert words[:2] == ["gpuest", "fit"] and words[3:5] == ["-o", out] and words[5] == "--validation", command
        raw_path, val_paths = words[2], words[6:]
        assert raw_path == f"data/calibration/{gpu}.jsonl" and f"data/validation/{gpu}-full.jsonl" in val_paths
        validation = load_validation(*(ROOT / path for path in val_paths))
        raw = load_raw(ROOT / raw_path)
        refit = fit_profile(raw, validation=validation, command=command,
                            shape_prior=resolve_shape_prior(shape_prior, raw))
        _close(json.loads(json.dumps(refit.to_json())), committed, gpu)


def test_shipped_profiles_are_measured_and_used():
    shipped = shipped_profiles()
    assert set(PROFILES) <= set(shipped)
    for name in PROFILES:
        prof = load_profile(ROOT / f"gpuest/profiles/{name}.json")
        assert prof.kind == "measured" and prof.power is not None
        assert prof.provenance["gpu_name"].startswith("NVIDIA H")
        assert prof.provenance["fitted_rows"] > 500



def test_every_shipped_profile_fits_the_current_residual_features():
    """A transferred estimate averages the corrections of every profile whose feature list is the nearest
    calibrated GPU's: a shipped profile fitted before a feature was added would silently drop out of the
    donors (a V100-SXM2 ResNet-50 fp32 step lost its V100 donor and came out 2.4x slow)."""
    from gpuest.price.features import RESIDUAL_FEATURES
    for name, prof in shipped_profiles().items():
        assert tuple(prof.residual_features) == tuple(RESIDUAL_FEATURES), name

def _stored_node_fit(shuffle_seed: int | None = None) -> dict:
    """A profile fitted on every other H100 calibration row, on the nodes stored in the rows (no
    re-trace: seconds, not minutes); rows shuffled first with `shuffle_seed`."""
    raw = load_raw(ROOT / "data/calibration/H100-SXM.jsonl")
    rows = list(raw.rows)[::2]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    return json.loads(json.dumps(fit_profile(RawData(raw.meta, rows), retrace=False).to_json()))


@pytest.fixture(scope="module")
def stored_node_fit() -> dict:
    return _stored_node_fit()


def test_fit_does_not_depend_on_row_order(stored_node_fit):
    assert json.dumps(_stored_node_fit(shuffle_seed=7), sort_keys=True) == json.dumps(stored_node_fit, sort_keys=True)


_FIT_IN_SUBPROCESS = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); from tests.test_profiles import _stored_node_fit; "
    "print(json.dumps(_stored_node_fit()))")


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("coretype", [None, "Prescott"])
def test_fit_does_not_depend_on_blas_kernels_or_threads(stored_node_fit, coretype, threads):
    """OpenBLAS picks its kernels by CPU (or OPENBLAS_CORETYPE) and splits sums over threads: neither
    may move a fitted number beyond 1e-9 (Prescott: SSE3 kernels any x86-64 runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", _FIT_IN_SUBPROCESS, str(ROOT)], env=env, capture_output=True,
                         text=True, check=True).stdout
    _close(json.loads(out), stored_node_fit, rel=1e-9)


def test_shipped_profiles_record_their_provenance():
    from gpuest.profile import REQUIRED_PROVENANCE
    for name in PROFILES:
        prov = load_profile(ROOT / f"gpuest/profiles/{name}.json").provenance
        assert all(prov.get(k) not in (None, "", []) for k in REQUIRED_PROVENANCE), name
        assert 0 < prov["suite_share"] <= 1 and prov["calibration_commands"][0].startswith("python3 -m calibration")


@pytest.mark.parametrize("dropped", ["cudnn_version", "suite_version", "calibration_commands"])
def test_a_measured_profile_without_provenance_fails_to_load(tmp_path, dropped):
    from gpuest.errors import ProfileError
    data = json.loads((ROOT / "gpuest/profiles/H100-SXM.json").read_text())
    del data["provenance"][dropped]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=f"lacks {dropped}.*gpuest fit"):
        load_profile(path)


@pytest.mark.parametrize("fitted_modes", [["fp32"], {"conv": "fp32"}, {"conv": [32]}])
def test_a_profile_with_malformed_fitted_modes_fails_to_load(tmp_path, fitted_modes):
    from gpuest.errors import ProfileError
    data = json.loads((ROOT / "gpuest/profiles/T4.json").read_text())
    data["fitted_modes"] = fitted_modes
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="fitted_modes must map each category or op to a list of math-mode names"):
        load_profile(path)


def test_shipped_profiles_record_the_math_modes_their_fits_saw():
    """Transfer needs them (price.device_time.correction_sources): the public FP32 profiles saw only fp32,
    the Hopper ones 16-bit and TF32 convolutions too."""
    profiles = shipped_profiles()
    assert all(p.fitted_modes for p in profiles.values())
    assert profiles["T4"].saw("matmul", "fp32") and not profiles["T4"].saw("matmul", "bf16")
    assert profiles["H100-SXM"].saw("aten.convolution.default", "bf16") and profiles["H100-SXM"].saw("conv", "tf32")
