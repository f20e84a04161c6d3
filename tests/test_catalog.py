"""Tests of the GPU catalogue (gpuest/catalog): data files, loader, lookups, range checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuest.catalog import (
    BUILTIN_DIR,
    MATH_MODES,
    CatalogError,
    ClockOutOfRangeError,
    GPUSpec,
    PowerLimitOutOfRangeError,
    UnknownGPUError,
    get_gpu,
    list_gpus,
    load_gpu_file,
)
from gpuest.catalog.gpu_spec import SOURCED_FIELDS
from gpuest.errors import GpuestError

GPU_FILES = sorted(BUILTIN_DIR.glob("*.json"))
T4_SOURCES = json.loads((BUILTIN_DIR / "T4.json").read_text())["sources"]   # a complete sources object
REQUIRED = [
    "K80", "P100-SXM2", "V100-SXM2-16GB", "V100-SXM2-32GB", "T4", "A10", "A100-SXM4-40GB",
    "A100-SXM4-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB", "L4", "L40S", "RTX-3090", "RTX-4090",
    "H100-SXM", "H100-PCIe", "H200",
]


@pytest.fixture(autouse=True)
def _no_user_path(monkeypatch):
    monkeypatch.delenv("GPUEST_GPU_PATH", raising=False)


@pytest.mark.parametrize("path", GPU_FILES, ids=[p.stem for p in GPU_FILES])
def test_every_file_loads_and_is_consistent(path: Path):
    spec = load_gpu_file(path)
    assert isinstance(spec, GPUSpec)
    assert spec.min_clock_mhz <= spec.base_clock_mhz <= spec.max_clock_mhz
    assert spec.power_limit_min_w <= spec.tdp_w <= spec.power_limit_max_w
    assert 0 < spec.idle_power_w < spec.power_limit_min_w
    assert set(spec.peak_tflops) == set(MATH_MODES)
    # fp32 CUDA-core peak matches the usual cores x 2 FLOP x clock within 5 % (128/192/64 per SM)
    per_sm = spec.peak_tflops["fp32"] * 1e6 / (spec.sm_count * spec.peak_tflops_clock_mhz * 2)
    assert min(abs(per_sm - c) / c for c in (64, 128, 192)) < 0.05, per_sm
    if spec.tensor_cores:
        assert spec.peak_tflops["fp16"] >= 1.9 * spec.peak_tflops["fp32"]  # GeForce: 2x (rounded)
    else:
        for mode in ("tf32", "bf16", "fp8"):
            assert spec.peak_tflops[mode] is None
    # file names are the canonical names
    assert path.stem == spec.name


def test_every_number_has_a_source():
    for path in GPU_FILES:
        raw = json.loads(path.read_text())
        numeric = [k for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        numeric = [k for k in numeric if k != "schema_version"] + ["peak_tflops", "compute_capability"]
        for key in numeric:
            assert raw["sources"].get(key, "").strip(), f"{path.name}: no source for {key}"
        assert set(SOURCED_FIELDS) <= set(raw["sources"])


def test_all_required_gpus_present():
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED) <= names
    assert len(names) == len(GPU_FILES)


@pytest.mark.parametrize(
    "query,expected",
    [
        ("H100", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("h100_sxm5", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("A100", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
        ("Tesla T4", "T4"),
        ("Tesla K80", "K80"),
        ("Tesla P100-SXM2-16GB", "P100-SXM2"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("nvidia l40s", "L40S"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("rtx 4090", "RTX-4090"),
        ("NVIDIA H200", "H200"),
        ("h200-sxm", "H200"),
    ],
)
def test_aliases_resolve(query: str, expected: str):
    assert get_gpu(query).name == expected


def test_every_alias_resolves_to_its_own_gpu():
    for spec in list_gpus():
        for label in (spec.name, *spec.aliases):
            assert get_gpu(label).name == spec.name


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownGPUError) as ei:
        get_gpu("H10O-SXM")
    msg = str(ei.value)
    assert "H100-SXM" in msg.split("Known GPUs")[0]
    assert "GPUEST_GPU_PATH" in msg and "JSON" in msg
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, GpuestError)


def test_peaks_scale_linearly_with_clock():
    g = get_gpu("H100")
    full = g.peak_flops_per_s("bf16")
    assert full == pytest.approx(g.peak_tflops["bf16"] * 1e12)
    half = g.peak_flops_per_s("bf16", g.peak_tflops_clock_mhz / 2)
    assert half == pytest.approx(full / 2)
    f1, f2 = 800.0, 1600.0
    assert g.peak_flops_per_s("fp32", f2) / g.peak_flops_per_s("fp32", f1) == pytest.approx(2.0)


def test_bandwidth_independent_of_clock():
    g = get_gpu("A100")
    assert g.memory_bandwidth_bytes_per_s == pytest.approx(2039e9)
    r1, r2 = g.ridge_point("fp16", 705), g.ridge_point("fp16", 1410)
    assert r2 == pytest.approx(2 * r1)  # only the compute side moves


def test_unavailable_math_mode_lists_available_ones():
    with pytest.raises(ValueError, match="available modes.*fp16"):
        get_gpu("V100").peak_flops_per_s("bf16")
    with pytest.raises(ValueError, match="unknown"):
        get_gpu("H100").peak_flops_per_s("fp4")


@pytest.mark.parametrize("bad", [0, -5, 100, 5000, float("nan")])
def test_clock_out_of_range_message_contains_range(bad):
    g = get_gpu("H100")
    with pytest.raises(ClockOutOfRangeError) as ei:
        g.check_clock(bad)
    assert f"{g.min_clock_mhz:g}-{g.max_clock_mhz:g} MHz" in str(ei.value)
    with pytest.raises(ClockOutOfRangeError):
        g.peak_flops_per_s("fp32", bad)
    assert g.check_clock(g.max_clock_mhz) == g.max_clock_mhz


def test_power_limit_range():
    g = get_gpu("H100")
    assert g.check_power_limit(500) == 500
    for bad in (0, 100, 701):
        with pytest.raises(PowerLimitOutOfRangeError, match="200-700 W"):
            g.check_power_limit(bad)


def test_ridge_points_sane():
    h100 = get_gpu("H100")
    assert h100.ridge_point("bf16") > 200
    assert 10 < h100.ridge_point("fp32") < 40
    for g in list_gpus():
        for mode in g.available_math_modes:
            # consumer/inference parts have 1/32-1/64 FP64, and GP104 (P4) 1/64-rate FP16
            low = 0.1 if mode == "fp64" or g.peak_tflops[mode] < g.peak_tflops["fp32"] else 1
            assert low < g.ridge_point(mode) < 2000, (g.name, mode)


def test_dense_not_sparse():
    assert get_gpu("H100").peak_tflops["bf16"] < 1200
    assert get_gpu("H200").peak_tflops["fp8"] < 2500
    assert get_gpu("A100").peak_tflops["bf16"] == 312
    assert get_gpu("L4").peak_tflops["fp16"] < 200
    # tf32 is half of bf16 on all Ampere/Hopper data-centre parts (dense)
    for name in ("A100-SXM4-40GB", "H100-SXM", "A10", "L4"):
        g = get_gpu(name)
        assert g.peak_tflops["tf32"] == pytest.approx(g.peak_tflops["bf16"] / 2, rel=0.02)


def test_spec_values_h100_h200():
    h100, h200 = get_gpu("H100"), get_gpu("H200")
    assert (h100.sm_count, h100.l2_cache_mb, h100.max_clock_mhz) == (132, 50, 1980)
    assert h100.memory_bandwidth_gb_s == 3350 and h100.tdp_w == 700
    assert h200.memory_gb == 141 and h200.memory_bandwidth_gb_s == 4800 and h200.l2_cache_mb == 60
    assert dict(h200.peak_tflops) == dict(h100.peak_tflops)


def test_spec_is_read_only():
    g = get_gpu("T4")
    with pytest.raises(Exception):
        g.sm_count = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        g.peak_tflops["fp32"] = 1.0  # type: ignore[index]


def _write_user_gpu(d: Path, **overrides) -> Path:
    data = json.loads((BUILTIN_DIR / "T4.json").read_text())
    data.update({"name": "MyGPU-X1", "aliases": ["My Lab GPU"]})
    data.update(overrides)
    p = d / "mygpu.json"
    p.write_text(json.dumps(data))
    return p


def test_user_file_in_env_path_is_found(tmp_path, monkeypatch):
    _write_user_gpu(tmp_path)
    monkeypatch.setenv("GPUEST_GPU_PATH", str(tmp_path))
    assert get_gpu("my lab gpu").name == "MyGPU-X1"
    assert "MyGPU-X1" in {g.name for g in list_gpus()}
    assert get_gpu("H100").name == "H100-SXM"  # built-ins still there
    monkeypatch.delenv("GPUEST_GPU_PATH")
    with pytest.raises(UnknownGPUError):
        get_gpu("MyGPU-X1")


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"sm_count": "many"}, "sm_count"),
        ({"memory_bandwidth_gb_s": -1}, "memory_bandwidth_gb_s"),
        ({"architecture": "quantum"}, "architecture"),
        ({"peak_tflops": {"fp32": 8.1}}, "peak_tflops.fp64"),
        ({"tensor_cores": "yes"}, "tensor_cores"),
        ({"sources": {"sm_count": "x"}}, "sources.compute_capability"),
        ({"chip": 104}, "chip"),
        ({"chip": "TU104", "sources": {k: v for k, v in T4_SOURCES.items() if k != "chip"}}, "sources.chip"),
    ],
)
def test_corrupt_file_raises_catalog_error_naming_field(tmp_path, overrides, field):
    p = _write_user_gpu(tmp_path, **overrides)
    with pytest.raises(CatalogError) as ei:
        load_gpu_file(p)
    assert field in str(ei.value) and str(p) in str(ei.value)


def test_missing_field_and_bad_json(tmp_path, monkeypatch):
    p = _write_user_gpu(tmp_path)
    data = json.loads(p.read_text())
    del data["idle_power_w"]
    p.write_text(json.dumps(data))
    with pytest.raises(CatalogError, match="idle_power_w.*missing"):
        load_gpu_file(p)
    monkeypatch.setenv("GPUEST_GPU_PATH", str(tmp_path))
    with pytest.raises(CatalogError, match="mygpu.json"):
        list_gpus()
    p.write_text("{not json")
    with pytest.raises(CatalogError, match="invalid JSON"):
        load_gpu_file(p)


def test_full_load_power_is_the_tdp_of_a_chips_reference_and_above_the_limit_of_its_low_power_boards():
    """A chip's reference board draws its own TDP flat out; a board of the same chip with a lower limit would draw
    more than that limit (scaled by SMs x clock), and a board with no chip reference draws its TDP."""
    from dataclasses import replace
    from gpuest.catalog.chips import chip_references, full_load_power_w
    for name in ("H100-SXM", "RTX-4090", "A100-SXM4-80GB", "V100-SXM2-32GB", "P100-SXM2"):
        assert full_load_power_w(get_gpu(name)) == pytest.approx(get_gpu(name).tdp_w)
    for name in ("T4", "A10", "L4", "RTX-6000-Ada", "A100-PCIe-40GB", "H100-PCIe", "P4"):
        gpu = get_gpu(name)
        assert full_load_power_w(gpu) > 1.3 * gpu.tdp_w, name
    a100_sxm, a100_pcie = get_gpu("A100-SXM4-80GB"), get_gpu("A100-PCIe-40GB")
    assert full_load_power_w(a100_pcie) == pytest.approx(full_load_power_w(a100_sxm))   # same chip, SMs, clock
    assert full_load_power_w(replace(get_gpu("T4"), chip=None)) == get_gpu("T4").tdp_w
    chips = chip_references()
    assert all(g.chip in chips for g in list_gpus() if g.chip)   # every named chip has a reference


@pytest.mark.parametrize("text,why", [("{not json", "cannot read"),
                                      ('{"chips": {"X1": {"reference": {"board": "B", "sm_count": 0, '
                                       '"max_clock_mhz": 1, "tdp_w": 1, "source": "s"}}}}', "must be numbers > 0"),
                                      ('{"chips": {"X1": {"reference": {"board": "B"}}}}', "must name a catalogue GPU")])
def test_corrupt_chip_references_raise_catalog_error_naming_the_file(tmp_path, monkeypatch, text, why):
    import gpuest.catalog.chips as chips
    bad = tmp_path / "chips.json"
    bad.write_text(text)
    monkeypatch.setattr(chips, "CHIPS_FILE", bad)
    chips.chip_references.cache_clear()
    try:
        with pytest.raises(CatalogError, match=why) as ei:
            chips.chip_references()
        assert str(bad) in str(ei.value)
    finally:
        chips.chip_references.cache_clear()
