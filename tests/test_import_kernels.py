"""Public kernel timings (NeuSight) become calibration rows with the runner's own nodes, malformed rows are
refused by line, and the time-only profiles fitted from them ship, load and price their GPUs."""
from __future__ import annotations

import gzip
import json
import shlex
from pathlib import Path

import pytest
import torch

from gpuest.calibrate.fit import fit_profile, load_raw
from gpuest.calibrate.import_kernels import (CONDITIONS, DRIVER_UNKNOWN, OPS, TIMING_METHOD, SourceRow, import_kernels,
                                        sample)
from gpuest.catalog import get_gpu
from gpuest.errors import MeasuredDataError
from gpuest.profile import REQUIRED_PROVENANCE, load_profile, shipped_profiles

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "external" / "neusight-kernels"
EXTERNAL = {"Tesla_T4": "T4", "Tesla_V100-PCIE-32GB": "V100-PCIe-32GB", "Tesla_P100-PCIE-16GB": "P100-PCIe-16GB",
            "Tesla_P4": "P4", "NVIDIA_A100-PCIE-40GB": "A100-PCIe-40GB"}
BMM_HEADER = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,Grid x,Grid y,"
              "Grid z,Block x,Block y,Block z,CUDA Version,Kernels,B,M,N,K")


def _bmm_file(tmp_path: Path, rows: list[str], name: str = "bmm.csv") -> Path:
    d = tmp_path / "gpu"
    d.mkdir(exist_ok=True)
    (d / name).write_text("\n".join([BMM_HEADER, *rows]) + "\n")
    return d


def _bmm_row(latency: str = "0.5", b: str = "4", m: str = "64", n: str = "32", k: str = "16",
             device: str = "Tesla T4") -> str:
    return f"bmm,{latency},{device},p2.1.0,8902,volta_sgemm,1,1,1,1,1,64,1,1,cu121,;volta_sgemm,{b},{m},{n},{k}"


@pytest.mark.skipif(not SOURCE.is_dir(), reason="the public kernel data is not beside this checkout")
@pytest.mark.parametrize("folder", sorted(EXTERNAL))
def test_importer_round_trips_a_few_rows_of_each_gpu(tmp_path, folder):
    src = tmp_path / folder
    src.mkdir()
    picked = {}
    for op in ("bmm", "ln"):
        with gzip.open(SOURCE / folder / f"{op}.csv.gz", "rt") as fh:
            lines = [next(fh) for _ in range(4)]          # header + 3 rows
        (src / f"{op}.csv").write_text("".join(lines))
        picked[op] = lines[1:]
    meta = import_kernels(src, tmp_path / "out.jsonl", per_op={op: 10 for op in OPS})
    raw = load_raw(tmp_path / "out.jsonl")
    assert raw.meta["catalog_gpu"] == EXTERNAL[folder] and meta["imported_rows"] == len(raw.rows) == 6
    assert raw.meta["driver_version"] == DRIVER_UNKNOWN and raw.meta["conditions"] == CONDITIONS
    bmm_rows = [r for r in raw.rows if r["params"]["op"] == "bmm"]
    times = sorted(float(line.split(",")[1]) for line in picked["bmm"])
    assert sorted(r["time_ms_median"] for r in bmm_rows) == times
    for r in bmm_rows:
        p, (node,) = r["params"], r["nodes"]
        # torch.bmm((B,M,N), (B,N,K)): a batch of B (M x N) @ (N x K) products, 2 FLOPs per multiply-add.
        assert node["op"] == "aten.bmm.default" and node["math_mode"] == "fp32"
        assert (node["gemm_batch"], node["gemm_m"], node["gemm_n"], node["gemm_k"]) == (p["B"], p["M"], p["K"], p["N"])
        assert node["flops"] == 2 * p["B"] * p["M"] * p["N"] * p["K"]
        assert r["timing_method"] == TIMING_METHOD and 0 < r["host_overhead_ms"] < r["time_ms_median"] or \
            r["kind"] == "latency"
    ln = [r for r in raw.rows if r["params"]["op"] == "ln"]
    assert all(n["category"] == "norm" for r in ln for n in r["nodes"])


@pytest.mark.parametrize("row,why", [
    (_bmm_row(latency="-1"), "line 3: Latency -1.0 must be a positive"),
    (_bmm_row(latency="fast"), "line 3: Latency 'fast' is not a number"),
    (_bmm_row(m="0"), "line 3: M is 0"),
    (_bmm_row(k="1.5"), "line 3: K '1.5' is not a non-negative integer"),
    (_bmm_row(device="Tesla P4"), "line 3: Device 'Tesla P4' differs"),
    (_bmm_row().replace("p2.1.0", "p2.3.0"), "line 3: measured with torch 'p2.3.0'"),
])
def test_malformed_row_is_refused_with_its_line(tmp_path, row, why):
    src = _bmm_file(tmp_path, [_bmm_row(), row])
    with pytest.raises(MeasuredDataError, match=f"bmm.csv, {why}"):
        import_kernels(src, tmp_path / "out.jsonl")


def test_missing_column_and_empty_folder_are_named(tmp_path):
    d = tmp_path / "gpu"
    d.mkdir()
    with pytest.raises(MeasuredDataError, match="no kernel files"):
        import_kernels(d, tmp_path / "out.jsonl")
    (d / "bmm.csv").write_text(BMM_HEADER.replace(",K", "") + "\n")
    with pytest.raises(MeasuredDataError, match="line 1: header lacks column.*K"):
        import_kernels(d, tmp_path / "out.jsonl")


def test_sample_picks_the_same_shapes_on_every_gpu_and_depends_on_the_seed():
    def rows(device: str, offset: float) -> dict[str, list[SourceRow]]:
        return {"add": [SourceRow("add", {"B": b, "H": 64}, 0.1 + offset, device, "add.csv", b + 1)
                        for b in range(1, 200)]}
    pick = lambda by_op, seed: [r.params["B"] for r in sample(by_op, {"add": 20}, seed)]
    assert pick(rows("Tesla T4", 0.0), 1) == pick(rows("Tesla P4", 0.3), 1)
    assert len(pick(rows("Tesla T4", 0.0), 1)) == 20
    assert pick(rows("Tesla T4", 0.0), 1) != pick(rows("Tesla T4", 0.0), 2)


@pytest.mark.parametrize("gpu", sorted(EXTERNAL.values()))
def test_external_profiles_ship_time_only_with_provenance(gpu):
    prof = shipped_profiles()[gpu]
    assert prof.kind == "measured" and prof.predicts == ("time",) and prof.power is None
    assert all(prof.provenance.get(k) not in (None, "", []) for k in REQUIRED_PROVENANCE)
    assert prof.provenance["driver_version"] == DRIVER_UNKNOWN
    assert prof.provenance["fitted_by"].startswith(f"gpuest fit data/calibration/external/{gpu}.jsonl.gz")
    # fp32 GEMMs and elementwise ops are what the public data measured: both have their own fits.
    assert {"matmul", "elementwise"} <= set(prof.residuals)
    assert "passes" in prof.provenance["power_capped_clocks"]   # fitted at the clocks its TDP holds them to


def test_time_only_rows_run_at_the_clock_their_tdp_holds_them_to():
    """A row that measured no clock takes the clock at which the estimator, pricing it with the profile,
    throttles it to the TDP (row_clock reads it); a row with a measured clock keeps that one. On the 70 W T4
    a long fp32 GEMM is throttled far more than a short copy (which the borrowed model's static power alone
    takes past 70 W at the max clock)."""
    from gpuest.calibrate.calibration_rows import POWER_CAPPED_CLOCK_KEY, row_clock
    from gpuest.calibrate.fit import with_power_capped_clocks
    t4 = get_gpu("T4")
    gemm = {"op": "aten.mm.default", "category": "matmul", "math_mode": "fp32", "flops": 2 * 4096 ** 3,
            "bytes_read": 1.3e8, "bytes_written": 6.7e7, "gemm_m": 4096, "gemm_n": 4096, "gemm_k": 4096}
    copy = {"op": "aten.copy_.default", "category": "elementwise", "math_mode": "fp32", "flops": 0,
            "bytes_read": 4096, "bytes_written": 4096}
    rows = [{"kind": "device", "name": "gemm", "nodes": [gemm]},
            {"kind": "device", "name": "measured", "nodes": [gemm], "sm_clock_mhz": 1200.0},
            {"kind": "device", "name": "copy", "nodes": [copy]}]
    out = with_power_capped_clocks(rows, t4, shipped_profiles()["T4"])
    assert t4.min_clock_mhz < out[0][POWER_CAPPED_CLOCK_KEY] < t4.max_clock_mhz
    assert row_clock(out[0], t4) == out[0][POWER_CAPPED_CLOCK_KEY]
    assert POWER_CAPPED_CLOCK_KEY not in out[1] and row_clock(out[1], t4) == 1200.0
    assert out[0][POWER_CAPPED_CLOCK_KEY] < 0.8 * row_clock(out[2], t4) <= 0.8 * t4.max_clock_mhz
    assert POWER_CAPPED_CLOCK_KEY not in rows[0]    # the caller's rows are left as they were


def test_time_only_profile_prices_its_gpu_and_borrows_power():
    import gpuest
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    est = gpuest.estimate(gpuest.trace(model, torch.randn(32, 256)), "T4")
    assert est.profile_source == "measured" and "T4" in est.profile_note
    note = [n for n in est.notes if "predicts time only" in n]
    assert note and ("H100-SXM" in note[0] or "H200" in note[0])
    assert est.energy_j > 0 and 0 < est.avg_power_w <= gpuest.get_gpu("T4").tdp_w


def test_refit_reproduces_the_t4_profile():
    committed = json.loads((ROOT / "gpuest/profiles/T4.json").read_text())
    words = shlex.split(committed["provenance"]["fitted_by"])
    assert words[:2] == ["gpuest", "fit"] and words[3:5] == ["-o", "gpuest/profiles/T4.json"]
    refit = fit_profile(load_raw(ROOT / words[2]), command=committed["provenance"]["fitted_by"])
    from tests.test_profiles import _close
    _close(json.loads(json.dumps(refit.to_json())), committed)


def test_gzipped_data_files_read_as_their_text_and_write_the_same_bytes(tmp_path):
    from gpuest.jsonl import read_jsonl, write_text
    text = '{"a": 1}\n{"b": [2, 3]}\n'
    write_text(tmp_path / "x.jsonl.gz", text)
    first = (tmp_path / "x.jsonl.gz").read_bytes()
    write_text(tmp_path / "x.jsonl.gz", text)
    assert (tmp_path / "x.jsonl.gz").read_bytes() == first and first[:2] == b"\x1f\x8b"
    assert read_jsonl(tmp_path / "x.jsonl.gz") == [{"a": 1}, {"b": [2, 3]}]
    (tmp_path / "bad.jsonl.gz").write_bytes(first[:10])   # a truncated archive names its file
    with pytest.raises(MeasuredDataError, match="bad.jsonl.gz"):
        read_jsonl(tmp_path / "bad.jsonl.gz")
