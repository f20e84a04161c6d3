"""The host probe: timing small host-paced steps, the host_scale that makes a profile reproduce them, its use
in generation estimates, the accuracy report and `gpuest host-probe`, and its errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpuest.calibrate.fit_host_scale import HOST_SCALE_RANGE, _curve, probe_host_scale
from gpuest.calibrate.host_probe import CONFIG_FIELDS, PROBE_SCHEMA, HostProbe, probe_configs
from gpuest.cli import main
from gpuest.errors import HostProbeError
from gpuest.evaluate.validation_set import ValidationConfig


def _record_at(scale: float, gpu: str) -> dict:
    """A probe record whose steps take what `gpu`'s profile predicts at host_scale `scale`."""
    steps = []
    for cfg in probe_configs():
        config = {f: getattr(cfg, f) for f in CONFIG_FIELDS}
        scales, walls = _curve(tuple(config.values()), gpu)
        steps.append({"config": config, "wall_s": float(np.interp(scale, scales, walls)), "iters": 10})
    return {"schema": PROBE_SCHEMA, "steps": steps}


@pytest.mark.parametrize("scale", [0.5, 2.0, 4.0])
def test_host_scale_inverts_the_profiles_estimate(scale):
    got = probe_host_scale(_record_at(scale, "H100-SXM"), "H100")
    assert got.gpu == "H100-SXM" and got.host_scale == pytest.approx(scale, rel=0.02)
    assert all(not s.clipped and s.host_scale == pytest.approx(scale, rel=0.02) for s in got.steps)
    # a slower host than the calibration's takes longer than the profile says at scale 1, a faster one less
    assert all((s.measured_s > s.predicted_s) == (scale > 1) for s in got.steps)


def test_a_host_beyond_the_resolved_range_is_clipped_and_marked():
    record = _record_at(1.0, "H100-SXM")
    for step in record["steps"]:
        step["wall_s"] *= 1e3
    got = probe_host_scale(record, "H100")
    assert got.host_scale == pytest.approx(HOST_SCALE_RANGE[1]) and all(s.clipped for s in got.steps)
    # On the range, never a rounding error past it (exp(log(10)) is 10.000000000000002).
    assert got.host_scale <= HOST_SCALE_RANGE[1] and all(s.host_scale <= HOST_SCALE_RANGE[1] for s in got.steps)
    assert "(clipped)" in str(got)


@pytest.mark.parametrize("record, says", [
    ({"schema": "gpuest.generation/1", "steps": []}, "not a host probe record"),
    ({"schema": PROBE_SCHEMA, "steps": []}, "has no steps"),
    ({"schema": PROBE_SCHEMA, "steps": [{"config": {"model": "resnet18"}, "wall_s": 0.01}]}, "lacks 'batch'"),
    ([1, 2], "not a host probe record"),
])
def test_bad_records_get_a_specific_error(record, says):
    with pytest.raises(HostProbeError, match=says) as info:
        probe_host_scale(record, "H100")
    assert "accepted" in str(info.value)


def test_a_step_without_a_time_is_refused():
    record = _record_at(1.0, "H100-SXM")
    record["steps"][0]["wall_s"] = 0.0
    with pytest.raises(HostProbeError, match="accepted: seconds > 0"):
        probe_host_scale(record, "H100")


def test_probe_times_its_steps_on_the_cpu():
    cfg = ValidationConfig(model="resnet18", family="cnn", batch=1, mode="inference", precision="fp32",
                           image_size=32)
    record = HostProbe("cpu", configs=[cfg]).measure()
    assert record["schema"] == PROBE_SCHEMA and len(record["steps"]) == 1
    step = record["steps"][0]
    assert step["config"]["image_size"] == 32 and step["wall_s"] > 0 and step["iters"] >= 5
    got = probe_host_scale(record, "H100")
    assert HOST_SCALE_RANGE[0] <= got.host_scale <= HOST_SCALE_RANGE[1]
    assert got.steps[0].measured_s == step["wall_s"]


def test_host_scale_scales_a_generations_host_time_only():
    from gpuest.price.generation import price_generation, trace_generation
    graphs = trace_generation("hf:llama", batch=1, prompt_tokens=16, new_tokens=4)
    one, two = (price_generation(graphs, "H100", host_scale=s) for s in (1.0, 2.0))
    assert two.host_time_s == pytest.approx(2 * one.host_time_s)
    assert two.device_time_s == pytest.approx(one.device_time_s)
    assert two.time_s > one.time_s and two.tokens_per_s < one.tokens_per_s


def test_report_prices_a_probed_row_on_its_host(tmp_path):
    """A row measured on a host twice as slow as the profile's, with a probe that says so: priced on its
    host, the wall time is reproduced; priced on the calibration's hosts, it is not."""
    from gpuest.report.generation_accuracy import latest_rows, predict, render, repeat_spreads
    base = {"status": "ok", "dry_run": False, "gpu": "NVIDIA H100 80GB HBM3", "gpu_canonical": "H100-SXM",
            "model": "hf:llama", "family": "llama", "precision": "bf16", "cache": "dynamic", "key": "g",
            "kind": "generate", "batch": 1, "context": 0, "prompt": 16, "new_tokens": 4}
    from gpuest.price.generation import price_generation, trace_generation
    graphs = trace_generation("hf:llama", batch=1, prompt_tokens=16, new_tokens=4)
    slow = price_generation(graphs, "H100", host_scale=2.0)
    row = dict(base, device_busy_s=slow.device_time_s, wall_s=slow.time_s, energy_j=slow.energy_j,
               host_probe=_record_at(2.0, "H100-SXM"), date="2999-01-01T00:00:00+00:00")
    path = tmp_path / "gen.jsonl"
    path.write_text(json.dumps(dict(row, wall_s=slow.time_s * 1.5)) + "\n" + json.dumps(row) + "\n")
    df = predict(latest_rows([path]))
    assert df["host_scale"].iloc[0] == pytest.approx(2.0, rel=0.02)
    assert df["ape_wall_host"].iloc[0] < 2.0 < df["ape_wall"].iloc[0]
    repeats = repeat_spreads([path])
    assert repeats["runs"].iloc[0] == 2 and repeats["wall_spread"].iloc[0] == pytest.approx(50.0)
    assert repeats["device_spread"].iloc[0] == pytest.approx(0.0)
    text = render(df, [str(path)], "cmd", repeats)
    assert "| generate() wall time on the measuring host (host probe) | 1 |" in text
    assert "## Run-to-run spread of generate() calls" in text
    from gpuest.report.generation_accuracy import HOST_PAIRING_CHOSEN_ON
    assert f"The 1 measured after it ({HOST_PAIRING_CHOSEN_ON} on): " in text   # scored out of sample
    assert "No row was measured after it." in render(df.assign(date="2000-01-01"), [str(path)], "cmd", repeats)


def test_cli_prices_a_saved_record_and_refuses_without_a_gpu(tmp_path, capsys):
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(_record_at(1.5, "H100-SXM")))
    assert main(["host-probe", "--gpu", "H100", "--from", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host_scale"] == pytest.approx(1.5, rel=0.02)
    import torch
    if not torch.cuda.is_available():
        assert main(["host-probe", "--gpu", "H100"]) == 2
        assert "accepted: run it where the GPU is" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert main(["host-probe", "--gpu", "H100", "--from", str(tmp_path / "bad.json")]) == 2
    assert "is not JSON" in capsys.readouterr().err


def test_a_rows_after_probe_is_the_next_rows_probe_of_the_same_run(tmp_path):
    from gpuest.report.generation_accuracy import host_scale_of, latest_rows
    slow, fast = _record_at(2.0, "H100-SXM"), _record_at(0.5, "H100-SXM")
    base = {"status": "ok", "dry_run": False, "gpu": "H100", "kind": "generate"}
    rows = [dict(base, key="a", date="2026-11-27T10:00:00+00:00", elapsed_s=30.4, host_probe=slow),
            dict(base, key="b", date="2026-11-27T10:00:31+00:00", elapsed_s=20.0, host_probe=fast),
            # started 10 minutes after b ended: another run, its probe says nothing of b's host
            dict(base, key="c", date="2026-11-27T10:11:00+00:00", elapsed_s=20.0, host_probe=slow),
            dict(base, key="d", date="2026-11-27T10:11:20+00:00", status="skipped", host_probe=fast)]
    path = tmp_path / "gen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {r["key"]: r for r in latest_rows([path])}
    assert set(got) == {"a", "b", "c"}                      # the skipped row is not scored ...
    assert got["a"]["host_probe_after"] == fast and "host_probe_after" not in got["b"]
    assert got["c"]["host_probe_after"] == fast              # ... but its probe follows c
    assert host_scale_of(got["a"], "H100") == pytest.approx(1.0, rel=0.02)   # sqrt(2 * 0.5)
    assert host_scale_of(got["b"], "H100") == pytest.approx(0.5, rel=0.02)
    assert np.isnan(host_scale_of(dict(base), "H100"))


def test_the_scale_is_for_the_profile_asked(tmp_path):
    """One host, two profiles: against the prior's host costs the same probe gives another scale."""
    record = _record_at(2.0, "H100-SXM")
    own, prior = (probe_host_scale(record, "H100", p).host_scale for p in (None, "prior"))
    assert own == pytest.approx(2.0, rel=0.02) and abs(prior / own - 1) > 0.05


def test_cli_refuses_fewer_than_one_repeat(capsys):
    assert main(["host-probe", "--gpu", "H100", "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
