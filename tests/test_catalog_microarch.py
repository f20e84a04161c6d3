"""The catalogue's microarchitecture facts (tensor-core generation, FP32 lanes per SM, DRAM type) are stated,
sourced and consistent with the peaks, for every GPU, including the ones added for issue 27."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuest.catalog import get_gpu, list_gpus, load_gpu_file
from gpuest.catalog.gpu_spec import BUILTIN_DIR, MAX_THREADS_PER_SM, MICROARCH_FIELDS
from gpuest.errors import CatalogError

GPU_FILES = sorted(BUILTIN_DIR.glob("*.json"))
# Issue 27: the GPUs users asked for, and the names the public kernel data (NeuSight) gives its five cards.
ADDED = ["V100-PCIe-32GB", "V100-PCIe-16GB", "P100-PCIe-16GB", "P4", "A30", "A40", "A10G", "L40", "RTX-A6000",
         "RTX-6000-Ada", "H100-NVL", "GH200", "B200", "RTX-5090"]
DEVICE_NAMES = {"Tesla V100-PCIE-32GB": "V100-PCIe-32GB", "Tesla P100-PCIE-16GB": "P100-PCIe-16GB", "Tesla P4": "P4",
                "Tesla T4": "T4", "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB"}
# Tensor-core generation each architecture introduced (NVIDIA's architecture whitepapers).
GENERATION = {"volta": 1, "turing": 2, "ampere": 3, "ada": 4, "hopper": 4, "blackwell": 5}


@pytest.fixture(autouse=True)
def _no_user_path(monkeypatch):
    monkeypatch.delenv("GPUEST_GPU_PATH", raising=False)


def test_added_gpus_present_and_device_names_resolve():
    names = {g.name for g in list_gpus()}
    assert set(ADDED) <= names
    for device, name in DEVICE_NAMES.items():
        assert get_gpu(device).name == name


@pytest.mark.parametrize("path", GPU_FILES, ids=[p.stem for p in GPU_FILES])
def test_microarchitecture_facts_are_sourced_and_consistent(path: Path):
    raw = json.loads(path.read_text())
    for key in MICROARCH_FIELDS:
        assert key in raw and raw["sources"].get(key, "").strip(), f"{path.name}: {key} or its source missing"
    spec = load_gpu_file(path)
    # The FP32 peak is SMs x lanes x 2 FLOP x clock (within the datasheets' rounding).
    lanes = spec.peak_tflops["fp32"] * 1e6 / (spec.sm_count * spec.peak_tflops_clock_mhz * 2)
    assert lanes == pytest.approx(spec.fp32_lanes_per_sm, rel=0.05), path.name
    assert spec.tensor_core_generation == (GENERATION[spec.architecture] if spec.tensor_cores else None)
    # Resident threads come from the compute capability table, never from its fallback.
    assert spec.compute_capability in MAX_THREADS_PER_SM
    if spec.memory_type.startswith("HBM"):
        assert spec.memory_bandwidth_gb_s > 500  # every HBM part moves more than any GDDR5 part here


@pytest.mark.parametrize("field,value,why", [
    ("memory_type", "DDR4", "must be one of"),
    ("fp32_lanes_per_sm", 0, "positive integer"),
    ("tensor_core_generation", None, "null exactly when tensor_cores is false"),
])
def test_bad_microarchitecture_field_is_named(tmp_path, field, value, why):
    raw = json.loads((BUILTIN_DIR / "T4.json").read_text())
    raw[field] = value
    path = tmp_path / "T4.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CatalogError, match=f"{field}.*{why}"):
        load_gpu_file(path)
