"""CPU-only tests of the calibration runner: dry runs, resume, NVML fallbacks and throttling."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from gpuest.calibrate import nvml_monitor
from gpuest.calibrate.nvml_monitor import NvmlUnavailableError, PowerMonitor, decode_throttle_reasons
from gpuest.calibrate.runner import ROW_SCHEMA, CalibrationError, host_probe_path, meta_path, run_suite
from gpuest.calibrate.budget import plan
from gpuest.calibrate.suite import all_benchmarks
from gpuest.annotate.registry import CATEGORIES

BUDGET = 3.0  # seconds of dry run: a stratified prefix of the grid, at least one benchmark per category


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _session(path: Path, i: int = -1) -> dict:
    return json.loads(meta_path(path).read_text())["sessions"][i]


# ---------------------------------------------------------------- a fake pynvml

class _FakeNVMLError(Exception):
    pass


class _NotSupported(_FakeNVMLError):
    pass


def fake_nvml(*, energy: bool = True, reasons: int = 0x0, sm_mhz: int = 1980, init_fails: bool = False):
    """A module with the pynvml functions PowerMonitor uses. Setters raise: the monitor must never call one."""
    state = {"energy_mj": 0}
    m = types.SimpleNamespace()
    m.NVMLError = _FakeNVMLError
    m.NVMLError_NotSupported = _NotSupported

    def init() -> None:
        if init_fails:
            raise _FakeNVMLError("Driver Not Loaded")
    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)

    def total_energy(h):
        if not energy:
            raise _NotSupported("Not Supported")
        state["energy_mj"] += 150  # grows with every read: a GPU drawing power
        return state["energy_mj"]
    m.nvmlDeviceGetTotalEnergyConsumption = total_energy
    m.nvmlDeviceGetPowerUsage = lambda h: 300_000  # mW
    m.nvmlDeviceGetClockInfo = lambda h, kind: sm_mhz if kind == nvml_monitor.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980 if kind == nvml_monitor.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetTemperature = lambda h, kind: 55
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reasons
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    m.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: (200_000, 700_000)
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    m.nvmlSystemGetDriverVersion = lambda: "570.00"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12080
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)

    def forbidden(*_a, **_k):
        raise AssertionError("calibration must never call an NVML set* function")
    for setter in ("nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetApplicationsClocks",
                   "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetMemoryLockedClocks"):
        setattr(m, setter, forbidden)
    return m


def _monitor_factory(module):
    def make():
        mon = PowerMonitor(nvml=module, sample_interval_s=0.002)
        mon.idle_power = lambda seconds=0.0, **_: 60.0  # real settling takes seconds: not under test here
        return mon
    return make


# ---------------------------------------------------------------- tests

def test_dry_run_covers_every_category_with_annotated_nodes(tmp_path: Path) -> None:
    out = run_suite(tmp_path / "c.jsonl", budget_s=BUDGET, dry_run=True, progress=False)
    rows = _rows(out)
    # ... then the host probes, and the run says what share of its suite and of the full suite it measured
    assert [r["status"] for r in _rows(host_probe_path(out))] == ["ok"] * 3
    coverage = _session(out)["coverage"]
    assert coverage["measured_of_planned"] == coverage["planned"] == len(rows)
    assert coverage["measured_of_full"] == len(rows) < coverage["full_suite"] == len(all_benchmarks())
    assert rows and all(r["schema"] == ROW_SCHEMA and r["dry_run"] for r in rows)
    assert all(r["error"] is None for r in rows), [(r["name"], r["error"]) for r in rows if r["error"]]
    assert all(r["trace_error"] is None for r in rows), [(r["name"], r["trace_error"]) for r in rows]
    grid_categories = {b.category for b in all_benchmarks()}
    assert grid_categories == set(CATEGORIES) - {"view", "other"}
    assert {r["category"] for r in rows} == grid_categories
    for r in rows:
        assert r["nodes"], r["name"]
        assert r["time_ms_median"] > 0 and r["time_ms_p10"] <= r["time_ms_median"] <= r["time_ms_p90"]
        if r["category"] == "matmul":
            assert any(n["flops"] > 0 and n["gemm_m"] > 0 for n in r["nodes"]), r["name"]
        if r["category"] == "copy":
            assert any(n["bytes_read"] > 0 and n["bytes_written"] > 0 for n in r["nodes"]), r["name"]
        if r["kind"] == "host_dispatch":
            assert r["host_dispatch_us"] > 0
    session = _session(out)
    assert session["dry_run"] and "NOT calibration" in session["warning"]
    assert json.loads(meta_path(out).read_text())["dry_run"] is True


def test_every_category_traces_in_dry_run(tmp_path: Path) -> None:
    """The first benchmark of each family, including backward, optimizer and RNN ones, traces cleanly."""
    out = run_suite(tmp_path / "t.jsonl", budget_s=30, dry_run=True, progress=False, power=False,
                    categories=["attention", "rnn", "optimizer", "norm", "pool", "embedding"])
    rows = _rows(out)
    by_op = {}
    for r in rows:
        assert r["error"] is None and r["trace_error"] is None, (r["name"], r["error"], r["trace_error"])
        by_op.setdefault(r["params"]["op"], r)
    bwd = by_op["sdpa_backward"]["nodes"]
    assert bwd and all("backward" in n["op"] for n in bwd if n["category"] == "attention")
    assert all(n["phase"] == "optimizer" and n["category"] == "optimizer" or n["category"] != "matmul"
               for n in by_op["adamw"]["nodes"])
    assert any(n["category"] == "rnn" for n in by_op["lstm_forward"]["nodes"])
    assert any(n["op"].endswith("embedding_dense_backward.default") for n in by_op["embedding_dense_backward"]["nodes"])


def test_holdout_and_budget_are_deterministic() -> None:
    a, b = all_benchmarks(), all_benchmarks()
    assert [(x.name, x.holdout, x.priority) for x in a] == [(x.name, x.holdout, x.priority) for x in b]
    for cat in {x.category for x in a}:
        dev = [x for x in a if x.category == cat and x.kind == "device"]
        share = sum(x.holdout for x in dev) / len(dev)
        assert 0.1 <= share <= 0.3, (cat, share)
    p1, p2 = plan(a, 60), plan(b, 60)
    assert [x.name for x in p1.benchmarks] == [x.name for x in p2.benchmarks] and p1.power == p2.power
    assert p1.est_s <= 60 + 1 and {x.category for x in p1.benchmarks} == {x.category for x in a}


def test_resume_after_interrupt(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    k = 5

    class Interrupt(Exception):
        pass

    seen = []

    def stop_after_k(row: dict) -> None:
        seen.append(row["name"])
        if len(seen) == k:
            raise Interrupt
    with pytest.raises(Interrupt):
        run_suite(path, budget_s=BUDGET, dry_run=True, progress=False, on_row=stop_after_k, host_probes=False)
    first = path.read_bytes()
    assert len(first.splitlines()) == k
    run_suite(path, budget_s=BUDGET, dry_run=True, progress=False, resume=True, host_probes=False)
    full = path.read_bytes()
    assert full.startswith(first)
    names = [r["name"] for r in _rows(path)]
    assert len(names) == len(set(names))
    expected = {b.name for b in plan(all_benchmarks(), BUDGET, fixed_s=1.0, window_s=0.02, dry_run=True).benchmarks}
    assert set(names) == expected
    sessions = json.loads(meta_path(path).read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["skipped_existing"] == k
    assert {r["session"] for r in _rows(path)} == {0, 1}


def test_resume_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    run_suite(path, budget_s=1.5, dry_run=True, progress=False, categories=["copy"])
    good = path.read_bytes()
    path.write_bytes(good + b'{"schema": "gpuest.calib-row/1", "name": "cast_')
    run_suite(path, budget_s=1.5, dry_run=True, progress=False, categories=["copy"], resume=True)
    assert path.read_bytes() == good


def test_existing_file_without_resume_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"schema": ROW_SCHEMA, "name": "x"}) + "\n")
    with pytest.raises(CalibrationError, match="--resume"):
        run_suite(path, dry_run=True, progress=False)
    from gpuest.calibrate.runner import main
    assert main(["--out", str(path), "--dry-run", "--no-progress"]) == 2


def test_no_nvml_gives_time_only_rows_and_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NvmlUnavailableError):
        PowerMonitor()
    with pytest.warns(RuntimeWarning, match="time-only"):
        out = run_suite(tmp_path / "n.jsonl", budget_s=BUDGET, dry_run=True, progress=False,
                        monitor_factory=PowerMonitor, categories=["matmul", "copy"])
    rows = _rows(out)
    assert rows and all(r["time_ms_median"] is not None and r["energy_j"] is None for r in rows)
    assert _session(out)["power"] is False


def test_nvml_init_failure_is_unavailable() -> None:
    with pytest.raises(NvmlUnavailableError, match="Driver Not Loaded"):
        PowerMonitor(nvml=fake_nvml(init_fails=True))


def test_energy_counter_and_sampled_sources(tmp_path: Path) -> None:
    mon = PowerMonitor(nvml=fake_nvml(energy=True), sample_interval_s=0.002)
    mon.begin_window("a")
    m = mon.end_window("a")
    assert m.source == "energy_counter" and m.energy_j > 0 and not m.reliable
    mon.close()
    out = run_suite(tmp_path / "s.jsonl", budget_s=BUDGET, dry_run=True, progress=False,
                    monitor_factory=_monitor_factory(fake_nvml(energy=False)), categories=["matmul"])
    rows = [r for r in _rows(out) if r["energy_j"] is not None]
    assert rows and all(r["source"] == "sampled" for r in rows)
    for r in rows:  # 300 W held over the window: the trapezoid integral is exact
        assert r["avg_power_w"] == pytest.approx(300.0, rel=1e-6)
        assert r["sm_clock_mhz"] == 1980 and r["throttled"] is False and r["throttle_reasons"] == ["none"]
    info = _session(out)["nvml"]
    assert info["power_limit_max_w"] == 700.0 and info["energy_counter"] is False
    assert _session(out)["idle_power_w"] == 60.0


def test_throttling_is_flagged_and_counted(tmp_path: Path) -> None:
    assert decode_throttle_reasons(0x4) == ["sw_power_cap"] and decode_throttle_reasons(0) == ["none"]
    out = run_suite(tmp_path / "th.jsonl", budget_s=BUDGET, dry_run=True, progress=False,
                    monitor_factory=_monitor_factory(fake_nvml(reasons=0x4 | 0x1, sm_mhz=1500)),
                    categories=["elementwise"])
    rows = [r for r in _rows(out) if r["energy_j"] is not None]
    assert rows and all(r["throttled"] and "sw_power_cap" in r["throttle_reasons"] for r in rows)
    assert all(r["sm_clock_min_mhz"] == 1500 for r in rows)
    summary = _session(out)["summary"]
    assert summary["throttled_windows"] == len(rows) > 0
    assert summary["throttle_reasons"]["sw_power_cap"] == len(rows)


def test_idle_power_settles() -> None:
    readings = iter([200_000] * 12 + [120_000] * 12 + [80_000] * 1000)
    module = fake_nvml()
    module.nvmlDeviceGetPowerUsage = lambda h: next(readings)
    mon = PowerMonitor(nvml=module, sample_interval_s=1.0)
    idle = mon.idle_power(0.2, settle_timeout_s=10.0, step_s=0.05)
    mon.close()
    assert idle == pytest.approx(80.0)


def test_compact_nodes_sums_large_node_lists() -> None:
    from gpuest.calibrate.runner import compact_nodes
    node = {"op": "aten.add.Tensor", "cpu_op": "aten.add.Tensor", "category": "elementwise", "phase": "forward",
            "math_mode": "fp32", "dtype": "float32", "flops": 2.0, "bytes_read": 8.0, "bytes_written": 4.0,
            "gemm_m": 0, "gemm_n": 0, "gemm_k": 0, "gemm_batch": 1, "kernels": 1, "host_only": False,
            "supported": True, "input_shapes": "1;1", "output_shapes": "1", "count": 1}
    small, merged = compact_nodes([dict(node)] * 3)
    assert not merged and len(small) == 3
    big, merged = compact_nodes([dict(node) for _ in range(1000)], limit=256)
    assert merged and len(big) == 1
    assert big[0]["count"] == 1000 and big[0]["flops"] == 2000.0 and big[0]["kernels"] == 1000


def test_kernel_profile_needs_a_gpu(monkeypatch, tmp_path, capsys):
    import torch

    from gpuest.calibrate import kernel_profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "k.jsonl"
    assert kernel_profile.main(["resnet18", "--batch", "2", "--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_committed_kernel_profiles_are_complete():
    """Every committed kernel profile lists its kernels, which add up to its stated per-step sum."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "kernels" / "H100-SXM-training.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["model"] for r in records} >= {"convnext_tiny", "hf:gpt2", "lstm", "resnet50"}
    for r in records:
        # the module's name when it was measured: calibration.kernel_profile before the gpuest package
        assert r["schema"] == "gpuest.kernel-profile/1" and r["command"].startswith(
            ("python3 -m calibration.kernel_profile", "python3 -m gpuest.calibrate.kernel_profile"))
        assert sum(k["us_per_iter"] for k in r["kernels"]) / 1e3 == pytest.approx(r["kernel_sum_ms"], rel=1e-3)


def test_kernel_facts_recompute_from_committed_data(capsys):
    """benchmarks/kernel_facts.py, the source of the measured ratios DESIGN.md quotes, runs on the
    committed data and reports every fact for both GPUs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_facts.py"
    spec = importlib.util.spec_from_file_location("kernel_facts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    for gpu in ("H100-SXM", "H200"):
        assert f"== {gpu}" in out
    for fact in ("causal/non-causal SDPA: 46 pairs", "transposing", "NCHW/NHWC", "bf16 + fp32", "VGG-16",
                 "50 vs 64 elements per row", "bf16->fp32 cast", "elapsed / device-busy",
                 "persistent RNN kernels (H100-SXM-benchmarks), forward time per step and layer: gru",
                 "kernel gaps (H200): queued ops eager", "grouped 3x3 conv (H200)", "batch norm scaling (H200)",
                 "sort and top-k (H200) launches per call"):
        assert fact in out


def test_redo_moves_a_category_aside_and_measures_it_again(tmp_path: Path) -> None:
    from gpuest.calibrate.runner import main, superseded_path, supersede
    path = tmp_path / "redo.jsonl"
    run_suite(path, budget_s=2.0, dry_run=True, progress=False, categories=["copy", "pool"])
    before = _rows(path)
    copies = [r["name"] for r in before if r["category"] == "copy"]
    assert copies and supersede(path, ["copy"]) == len(copies)
    assert all(r["category"] != "copy" for r in _rows(path))  # moved out of the file ...
    assert [r["name"] for r in _rows(superseded_path(path))] == copies  # ... and kept, never lost
    redo = ["--out", str(path), "--dry-run", "--no-progress", "--budget-s", "2", "--categories", "copy,pool",
            "--redo", "copy"]
    assert main(redo) == 0  # nothing left to move: it resumes and measures the copies again
    assert sorted(r["name"] for r in _rows(path)) == sorted(r["name"] for r in before)
    assert main(redo) == 0
    assert sorted(r["name"] for r in _rows(path)) == sorted(r["name"] for r in before)
    assert len(_rows(superseded_path(path))) == 2 * len(copies)  # the second --redo appended its rows
    with pytest.raises(CalibrationError, match="does not exist"):
        supersede(tmp_path / "missing.jsonl", ["copy"])


def test_rnn_and_optimizer_benchmarks_are_host_paced() -> None:
    """RNNs and whole optimizer steps launch from a host loop; a single foreach call (a few launches of
    one multi-tensor kernel) does not."""
    device = [b for b in all_benchmarks(["rnn", "optimizer"]) if b.kind == "device"]
    paced = [b for b in device if not b.name.startswith("foreach_walk_")]
    assert paced and all(b.host_paced for b in paced)
    assert len(paced) < len(device) and not any(b.host_paced for b in device if b not in paced)
    assert not any(b.host_paced for b in all_benchmarks(["copy", "matmul"]))


def test_kernel_profile_reports_bad_arguments_before_looking_for_a_gpu(tmp_path: Path, capsys) -> None:
    from gpuest.calibrate.kernel_profile import main
    out = str(tmp_path / "k.jsonl")
    with pytest.raises(SystemExit):
        main(["--out", out])                                   # neither a model nor --benchmark
    assert "give a model or --benchmark NAMES" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["resnet18", "--benchmark", "rnn_fwd_gru_t50_b1_in128_h128_l1", "--out", out])
    with pytest.raises(SystemExit):
        main(["resnet18", "--out", out])
    assert "a model needs --batch" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no suite benchmark 'rnn_fwd_gru_t50_b1_in128_h12'; did you mean "
                                         "rnn_fwd_gru_t50_b1_in128_h128_l1"):
        main(["--benchmark", "rnn_fwd_gru_t50_b1_in128_h12", "--out", out])
    assert not Path(out).exists()


def test_gpuest_calibrate_takes_every_runner_option_and_records_its_command(tmp_path, capsys):
    """`gpuest calibrate` is the runner's own parser (one declaration of each option): a category subset on a
    dry run works through it, and the session records the command as the user typed it."""
    from gpuest.cli import main as cli_main
    out = tmp_path / "calib.jsonl"
    words = ["calibrate", "--out", str(out), "--dry-run", "--budget-s", "20", "--no-progress", "--categories", "matmul"]
    assert cli_main(words) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and {r["category"] for r in rows if r.get("kind") == "device"} == {"matmul"}
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["sessions"][-1]["command"] == "gpuest calibrate " + " ".join(words[1:])
    assert f"fit it with: gpuest fit {out}" in capsys.readouterr().out


def test_sampling_stops_once_the_median_is_known() -> None:
    """A tight spread pins the median after MIN_STOP_SAMPLES; a wide one keeps sampling; None never stops early."""
    import random

    from gpuest.calibrate import timing
    tight = [1.0 + 0.001 * random.Random(i).random() for i in range(timing.MIN_STOP_SAMPLES)]
    wide = [1.0 + random.Random(i).random() for i in range(timing.MIN_STOP_SAMPLES)]
    assert timing._median_known(tight, timing.MEDIAN_REL_PRECISION)
    assert not timing._median_known(tight[:-1], timing.MEDIAN_REL_PRECISION)   # too few samples to judge
    assert not timing._median_known(wide, timing.MEDIAN_REL_PRECISION)
    assert not timing._median_known(tight, None)
    r = timing.time_op(lambda: None, [()], repeats=10, target_total_ms=1e9, max_repeats=60, rel_precision=None)
    assert r.n == 60


def test_a_budget_the_host_probes_use_up_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A budget no longer than the host probes' reserve plus start-up would stop before its first benchmark
    (the plan still lists some): it gets a specific error naming what is accepted, and no file is written."""
    from gpuest.calibrate.budget import FIXED_START_S
    from gpuest.calibrate.runner import HOST_PROBE_RESERVE_S
    out = tmp_path / "c.jsonl"
    with pytest.raises(CalibrationError, match="leaves no time for benchmarks.*--no-host-probes"):
        run_suite(out, budget_s=HOST_PROBE_RESERVE_S + FIXED_START_S, progress=False)
    assert not out.exists() and not meta_path(out).exists()
