"""gpuest.evaluate.validation_set and gpuest.calibrate.validate: the config list, row writing and resume logic.

The GPU parts are replaced by an injected fake `measure` function and a fake run context; one test runs
the real measurement code path on the CPU (dry run: perf_counter, fake power monitor)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gpuest.calibrate import validate as V
from gpuest.evaluate import validation_set as VS


# ------------------------------------------------------------------ validation set

def test_set_has_enough_models_and_families():
    specs = [m.spec for m in VS.MODELS]
    assert len(specs) == len(set(specs)) >= 20
    families = Counter(m.family for m in VS.MODELS)
    assert len(families) >= 3
    assert {"cnn", "vit", "llm", "rnn"} <= set(families)
    for m in VS.MODELS:
        assert 1 <= m.small_batch < m.large_batch <= 256


def test_heldout_is_a_third_deterministic_and_across_families():
    held = [m for m in VS.MODELS if m.heldout]
    assert abs(len(held) / len(VS.MODELS) - 1 / 3) < 0.05
    assert [m.spec for m in held] == [m.spec for i, m in enumerate(VS.MODELS) if i % 3 == 2]
    assert VS.heldout_models() == [m.spec for m in held]
    assert set(VS.heldout_models()).isdisjoint(VS.fitted_models())
    assert len({m.family for m in held}) >= 3
    # every config carries its model's mark
    for c in VS.full_set() + VS.quick_set():
        assert c.heldout == VS.MODEL_INDEX[c.model].heldout


def test_full_and_quick_sets():
    full = VS.full_set()
    assert len(full) == len(VS.MODELS) * 8
    assert len({c.key for c in full}) == len(full)
    assert {c.mode for c in full} == {"inference", "training"}
    assert {c.precision for c in full} == {"fp32", "bf16-mixed"}
    assert min(c.batch for c in full) == 1 and max(c.batch for c in full) == 256
    quick = VS.quick_set()
    assert 40 <= len(quick) <= 60
    assert {c.key for c in quick} <= {c.key for c in full}
    assert {c.model for c in quick} == {m.spec for m in VS.MODELS}
    combos = {(c.mode, c.precision, c.batch == 1) for c in quick}
    assert len(combos) == 8  # every mode x precision x small/large combination
    assert VS.estimated_duration_s(quick) <= 6 * 60
    assert any(c.per_op for c in quick)
    assert VS.quick_set() == quick  # deterministic


def test_explicit_configs_keep_set_metadata():
    cfgs = VS.explicit_configs(["hf:gpt2", "resnet18", "alexnet"], [2], ["training"], ["fp32"])
    assert [c.key for c in cfgs] == ["hf:gpt2|b2|s128|training|fp32", "resnet18|b2|i224|training|fp32",
                                     "alexnet|b2|i224|training|fp32"]
    assert cfgs[0].heldout and not cfgs[1].heldout and cfgs[2].family == "cnn"
    both = VS.explicit_configs(["lstm"])
    assert sorted({c.batch for c in both}) == [VS.MODEL_INDEX["lstm"].small_batch, VS.MODEL_INDEX["lstm"].large_batch]


# ------------------------------------------------------------------ run_validation with injected parts

class FakeContext:
    """Stands in for RunContext: no device, no NVML."""

    def __init__(self, gpu: str = "NVIDIA H100 80GB HBM3"):
        self.gpu = gpu
        self.gpu_canonical = "H100-SXM"
        self.dry_run = False
        self.window_s = 2.0
        self.provenance = {"gpu_name": gpu, "torch": "test"}
        self.dropped = 0

    def drop_model(self):
        self.dropped += 1

    def close(self):
        pass


def _configs():
    return VS.explicit_configs(["resnet18", "lstm"], [1], ["inference"], ["fp32", "bf16-mixed"])


def _fake_measure(calls, fail=()):
    def measure(cfg, ctx):
        calls.append(cfg.key)
        for pattern, exc in fail:
            if pattern in cfg.key:
                raise exc
        return {"wall_s": 0.01, "device_busy_s": 0.009, "energy_j": 2.0, "avg_power_w": 200.0}
    return measure


def test_rows_written_errors_recorded_and_resume(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    cfgs = _configs()
    calls: list[str] = []
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls, [("lstm|b1|s64|inference|bf16", oom)]),
                     log=None)
    rows = V.read_rows(out)
    assert len(rows) == len(cfgs) == len(calls)
    by_key = {r["key"]: r for r in rows}
    bad = by_key["lstm|b1|s64|inference|bf16-mixed"]
    assert bad["status"] == "error" and bad["error_type"] == "OutOfMemory" and "out of memory" in bad["error"]
    good = by_key["resnet18|b1|i224|inference|fp32"]
    assert good["status"] == "ok" and good["error"] is None and good["wall_s"] == 0.01
    for r in rows:  # config, GPU and provenance in every row
        assert r["schema"] == V.ROW_SCHEMA and r["gpu"] == "NVIDIA H100 80GB HBM3"
        for k in ("model", "family", "batch", "mode", "precision", "heldout", "seq", "image_size", "date",
                  "provenance", "elapsed_s"):
            assert k in r
    assert not (tmp_path / "r.jsonl.inflight").exists()

    # resume: nothing left to do (errored configs are not retried by default)
    calls.clear()
    V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls), log=None)
    assert calls == [] and len(V.read_rows(out)) == len(cfgs)
    # retry_errors: only the failed one
    V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls), retry_errors=True, log=None)
    assert calls == ["lstm|b1|s64|inference|bf16-mixed"]
    # another GPU in the same file is not "done"
    calls.clear()
    V.run_validation(cfgs[:1], out, context=FakeContext("NVIDIA H200"), measure=_fake_measure(calls), log=None)
    assert calls == [cfgs[0].key]
    # resume=False measures again and appends
    calls.clear()
    V.run_validation(cfgs[:1], out, context=FakeContext(), measure=_fake_measure(calls), resume=False, log=None)
    assert calls == [cfgs[0].key]


def test_torn_line_and_process_death_are_handled(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    cfgs = _configs()
    calls: list[str] = []
    V.run_validation(cfgs[:1], out, context=FakeContext(), measure=_fake_measure(calls), log=None)
    with out.open("a") as f:
        f.write('{"key": "torn')  # the previous run was killed mid-write
    # the previous run died inside cfgs[1]
    (tmp_path / "r.jsonl.inflight").write_text(json.dumps({"key": cfgs[1].key, "gpu": "NVIDIA H100 80GB HBM3"}))
    calls.clear()
    V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls), log=None)
    assert cfgs[1].key not in calls and set(calls) == {c.key for c in cfgs[2:]}
    died = [r for r in V.read_rows(out) if r["key"] == cfgs[1].key]
    assert died and died[0]["status"] == "error" and died[0]["error_type"] == "ProcessDied"


def test_fatal_cuda_error_stops_after_recording(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    cfgs = _configs()
    calls: list[str] = []
    fatal = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(V.FatalCudaError):
        V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls, [(cfgs[0].key, fatal)]),
                         log=None)
    rows = V.read_rows(out)
    assert len(rows) == 1 and rows[0]["status"] == "error"
    calls.clear()
    V.run_validation(cfgs, out, context=FakeContext(), measure=_fake_measure(calls), log=None)
    assert set(calls) == {c.key for c in cfgs[1:]}


def test_union_length():
    assert V.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert V.union_length([]) == 0


def test_device_work_excludes_annotations_on_the_gpu_timeline():
    """A record_function range (the optimizer's step) shows on the GPU timeline spanning its idle gaps:
    device busy time counts kernels, memcpys and memsets only."""
    from types import SimpleNamespace

    import torch

    from gpuest.calibrate.timing import is_device_work, is_gpu_event
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    kernel = SimpleNamespace(device_type=cuda, is_user_annotation=False, name="ampere_sgemm")
    step = SimpleNamespace(device_type=cuda, is_user_annotation=True, name="Optimizer.step#AdamW.step")
    host = SimpleNamespace(device_type=cpu, is_user_annotation=False, name="aten::mm")
    assert [is_gpu_event(e) for e in (kernel, step, host)] == [True, True, False]
    assert [is_device_work(e) for e in (kernel, step, host)] == [True, False, False]


def test_cli_list(capsys):
    assert V.main(["--set", "quick", "--list"]) == 0
    out = capsys.readouterr().out
    assert "configs" in out and "estimated" in out


def test_modes_and_precision_narrow_a_predefined_set(capsys):
    assert V.main(["--set", "full", "--modes", "training", "--precision", "bf16-mixed", "--list"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "|" in line]
    full = VS.get_set("full")
    assert len(listed) == sum(c.mode == "training" and c.precision == "bf16-mixed" for c in full) > 0
    assert all("|training|bf16-mixed" in line for line in listed)
    with pytest.raises(SystemExit, match="no mode 'train'.*inference, training"):
        V.main(["--set", "full", "--modes", "train", "--list"])


def test_batch_narrows_a_predefined_set(capsys):
    assert V.main(["--set", "full", "--modes", "training", "--batch", "1", "--list"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "|" in line]
    full = VS.get_set("full")
    assert len(listed) == sum(c.mode == "training" and c.batch == 1 for c in full) > 0
    assert all("|b1|" in line for line in listed)
    with pytest.raises(SystemExit, match="no batch '7'.*it has: 1, "):
        V.main(["--set", "full", "--batch", "7", "--list"])


def test_keys_pick_configs_of_a_predefined_set(capsys):
    chosen = [c.key for c in VS.get_set("full")][1:3]
    assert V.main(["--set", "full", "--keys", ";".join(chosen), "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "|" in line]
    assert listed == chosen
    with pytest.raises(SystemExit, match="no config 'resnet50\\|b3'.*--set full --list"):
        V.main(["--set", "full", "--keys", "resnet50|b3", "--list"])


def test_dry_run_real_code_path(tmp_path: Path):
    """The real measurement (warm-up, timing, profiler, energy window, per-op) on the CPU."""
    cfg = VS.ValidationConfig(model="lstm", family="rnn", batch=1, mode="training", precision="fp32", seq=4,
                              per_op=True)
    out = tmp_path / "dry.jsonl"
    ctx = V.RunContext(dry_run=True, window_s=0.05)
    V.run_validation([cfg], out, context=ctx, log=None)
    (row,) = V.read_rows(out)
    assert row["status"] == "ok", row.get("traceback")
    assert row["dry_run"] and row["wall_s"] > 0 and row["device_busy_s"] > 0
    assert row["energy_j"] > 0 and row["energy_source"] == "dry_run"
    names = [op[0] for op in row["per_op"]["ops"]]
    assert "aten::embedding" in names and any("lstm" in n for n in names)


def test_the_test_split_is_the_committed_seeded_draw():
    """TEST_MODELS is random.Random(TEST_SPLIT_SEED)'s draw of a third of all validation models, all of them
    new (none the profiles were fitted on), and every generalisation config of one is marked test."""
    from gpuest.evaluate.validation_set import (MODELS, TEST_MODELS, draw_test_split, fitted_models,
                                            generalisation_set)
    assert tuple(TEST_MODELS) == draw_test_split()
    configs = generalisation_set()
    assert len(TEST_MODELS) * 3 >= len(MODELS) + len({c.model for c in configs})
    assert not set(TEST_MODELS) & {m.spec for m in MODELS} and not set(TEST_MODELS) & set(fitted_models())
    assert all((c.split == "test") == (c.model in TEST_MODELS) for c in configs)
    assert {c.mode for c in configs} == {"inference", "training"} and any(c.memory_format == "channels_last"
                                                                          for c in configs)
    assert len({c.key for c in configs}) == len(configs)


@pytest.mark.parametrize("name", ["architectures", "families"])
def test_a_drawn_set_s_test_share_is_its_committed_seeded_draw(name):
    """<NAME>_TEST_MODELS is random.Random(<NAME>_TEST_SEED)'s draw of a third of the set's models; no model of
    the set is in another set, and its test configs are exactly those of the draw (the others record per-op
    times)."""
    from gpuest.evaluate import validation_set as vs
    test_models = getattr(vs, f"{name.upper()}_TEST_MODELS")
    assert tuple(test_models) == getattr(vs, f"draw_{name}_test_split")()
    configs = vs.get_set(name)
    models = {c.model for c in configs}
    assert len(test_models) * 3 >= len(models)
    others = {m.spec for m in vs.MODELS} | {c.model for other in ("generalisation", "moe", "recipes", "architectures",
                                                                   "families") if other != name
                                            for c in vs.get_set(other)}
    assert not models & others
    assert all((c.split == "test") == (c.model in test_models) != c.per_op for c in configs)
    assert set(test_models) <= vs.test_split_models()
    assert len({c.key for c in configs}) == len(configs) == 2 * len(models)


def test_the_recipes_set_probes_test_split_recipes_on_other_models_only():
    """The recipes set runs recipes the test split holds (pure bf16 inference, fp16 autocast training) on
    models outside it, each with per-op times, and none of its configs repeats one measured by another set."""
    from gpuest.evaluate.validation_set import TEST_MODELS, full_set, generalisation_set, moe_set, recipes_set
    configs = recipes_set()
    assert configs and all(c.per_op and c.model not in TEST_MODELS and c.split == "" for c in configs)
    test_recipes = {(c.mode, c.precision) for c in generalisation_set() if c.split == "test"}
    assert {(c.mode, c.precision) for c in configs} <= test_recipes
    others = {c.key for c in full_set() + generalisation_set() + moe_set()}
    assert len({c.key for c in configs}) == len(configs) and not others & {c.key for c in configs}
