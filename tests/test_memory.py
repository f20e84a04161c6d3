"""Peak memory: allocator replay, storage events of traced steps, fits, max_batch and the CLI (no GPU)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import gpuest
from gpuest.catalog import get_gpu
from gpuest.cli import main as cli_main
from gpuest.price.memory import max_batch, memory_estimate
from gpuest.price.memory.allocator import (LARGE_BUFFER_BYTES, SMALL_BUFFER_BYTES, CachingAllocator, SimulatedOOM,
                                        round_size, segment_size)
from gpuest.price.memory.peak import CUDA_CONTEXT_RESERVE_BYTES, KINDS, live_storage_peak_bytes

MiB = 1 << 20


def mlp(width: int = 512) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


def mlp_graph(batch: int = 64, **kw) -> "gpuest.trace":
    return gpuest.trace(mlp(), (torch.empty(batch, 256, device="meta"),), batch=batch, **kw)


def param_bytes(model: torch.nn.Module) -> int:
    return sum(round_size(p.numel() * p.element_size()) for p in model.parameters())


def tiny_gpu(usable_bytes: int):
    """The T4's spec with only `usable_bytes` left to PyTorch (after the CUDA context reserve)."""
    return dataclasses.replace(get_gpu("T4"), memory_total_bytes=CUDA_CONTEXT_RESERVE_BYTES + usable_bytes)


# ------------------------------------------------------------------------------------------ allocator

def test_allocator_rounds_to_512_byte_blocks_and_caches_segments():
    assert [round_size(n) for n in (1, 512, 513, 4096)] == [512, 512, 1024, 4096]
    assert segment_size(512) == SMALL_BUFFER_BYTES == segment_size(MiB)
    assert segment_size(MiB + 512) == LARGE_BUFFER_BYTES == segment_size(10 * MiB - 512)
    assert segment_size(10 * MiB + 1) == 12 * MiB          # large requests: rounded up to 2 MiB
    a = CachingAllocator()
    assert a.malloc(1, 100) == 512 and a.reserved_bytes == SMALL_BUFFER_BYTES
    assert a.malloc(2, 700) == 1024 and a.reserved_bytes == SMALL_BUFFER_BYTES   # same small segment
    a.free(1)
    a.free(2)
    assert a.allocated_bytes == 0 and a.reserved_bytes == SMALL_BUFFER_BYTES      # cached, not returned
    assert a.peak_allocated_bytes == 1536


def test_allocator_counts_an_unsplit_remainder_as_allocated():
    a = CachingAllocator()
    # 11.5 MiB takes a 12 MiB segment; 0.5 MiB is too small to split off a large block, so it counts.
    assert a.malloc(1, int(11.5 * MiB)) == 12 * MiB
    # 10.5 MiB in its 12 MiB segment leaves 1.5 MiB, which is split off and stays free.
    assert a.malloc(2, int(10.5 * MiB)) == int(10.5 * MiB)
    a.free(1)
    assert a.malloc(3, 11 * MiB) == 12 * MiB            # best fit reuses the freed segment, no new one
    assert a.reserved_bytes == 24 * MiB


def test_allocator_releases_its_cache_before_running_out():
    a = CachingAllocator(capacity_bytes=55 * MiB)
    a.malloc(1, 5 * MiB)                               # a 20 MiB segment
    a.free(1)
    a.malloc(2, 40 * MiB)                              # 20 + 40 > 55: the free segment is released first
    assert a.reserved_bytes == 40 * MiB
    with pytest.raises(SimulatedOOM):
        a.malloc(3, 5 * MiB)                           # another 20 MiB segment: nothing left to release


# ------------------------------------------------------------------------------------------ traced steps

@pytest.fixture(scope="module")
def adamw_step():
    return mlp_graph(mode="training", optimizer="adamw")


def test_storage_events_free_only_what_was_allocated_and_leave_weights_state_and_grads(adamw_step):
    persistent = {s for s, _, _ in json.loads(adamw_step.graph["memory_persistent"])}
    live, allocated = set(persistent), set()
    for _, attrs in sorted(adamw_step.nodes(data=True)):
        for token in attrs["mem_events"].split():
            sid = int(token[1:].split(":")[0])
            if token[0] == "+":
                assert sid not in live
                live.add(sid)
                allocated.add(sid)
            else:
                assert sid in live
                live.remove(sid)
    grads = set(json.loads(adamw_step.graph["memory_gradients"]))
    assert len(grads) == 6 and grads <= allocated
    assert live == persistent | grads      # the step ends holding only weights, inputs, state and gradients


def test_breakdown_sums_to_the_peak(adamw_step):
    mem = memory_estimate(adamw_step, get_gpu("H100"))
    assert set(mem.breakdown_bytes) == set(KINDS)
    assert sum(mem.breakdown_bytes.values()) == mem.peak_bytes
    assert mem.peak_reserved_bytes >= mem.peak_bytes
    assert mem.breakdown_bytes["weights"] == param_bytes(mlp())
    assert mem.breakdown_bytes["workspace"] > 0   # the linear layers run through cuBLAS


def test_training_peak_exceeds_inference_peak():
    gpu = get_gpu("A100")
    train = memory_estimate(mlp_graph(mode="training"), gpu)
    infer = memory_estimate(mlp_graph(mode="inference"), gpu)
    assert train.peak_bytes > infer.peak_bytes + 2 * param_bytes(mlp())
    assert infer.breakdown_bytes["optimizer_state"] == infer.breakdown_bytes["gradients"] == 0


def test_adamw_keeps_two_param_sized_states_and_sgd_with_momentum_one():
    gpu = get_gpu("H100")
    adamw = memory_estimate(mlp_graph(mode="training", optimizer="adamw"), gpu).breakdown_bytes
    sgd = memory_estimate(mlp_graph(mode="training", optimizer="sgd"), gpu).breakdown_bytes
    assert adamw["optimizer_state"] == 2 * param_bytes(mlp())
    assert sgd["optimizer_state"] == param_bytes(mlp())


def test_mixed_precision_inference_keeps_weight_casts_until_autocast_ends():
    # Autocast caches the bf16 cast of each weight that requires grad until its region ends (no_grad or not).
    g = gpuest.trace(mlp(4096), (torch.empty(1, 256, device="meta"),), precision="bf16-mixed")
    peak, breakdown = live_storage_peak_bytes(g)
    cast_bytes = sum(p.numel() * 2 for p in mlp(4096).parameters() if p.dim() == 2)
    assert breakdown["activations"] >= cast_bytes


def test_peak_matches_torch_memtracker_on_fake_tensors():
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from gpuest.capture.trace import OPTIMIZERS, default_loss
    ours, _ = live_storage_peak_bytes(mlp_graph(mode="training", optimizer="adamw"))
    with FakeTensorMode():
        model, x = mlp(), torch.randn(64, 256)
        opt = OPTIMIZERS["adamw"](list(model.parameters()))
        tracker = mem_tracker.MemTracker()
        tracker.track_external(model, opt, x)
        with tracker:
            for _ in range(3):   # the same step as trace and gpuest/calibrate/memory_validate.py
                opt.zero_grad(set_to_none=True)
                out = model(x)
                loss = default_loss(out)
                loss.backward()
                opt.step()
                del out, loss
                tracker.reset_mod_stats()
        theirs = sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_linear_on_a_non_contiguous_input_adds_its_bias_in_place():
    # ATen's linear runs matmul then output.add_(bias) for real tensors (an out-of-place add only for
    # subclasses such as fake tensors): the step holds one output, not two.
    class TimeMajorHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(64, 4096)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x.transpose(0, 1))

    g = gpuest.trace(TimeMajorHead(), (torch.empty(32, 16, 64, device="meta"),), name="head")
    ops = [a["op"] for _, a in g.nodes(data=True)]
    assert "aten.add_.Tensor" in ops and "aten.add.Tensor" not in ops
    peak, breakdown = live_storage_peak_bytes(g)
    output_bytes = 16 * 32 * 4096 * 4
    assert output_bytes <= breakdown["activations"] < 2 * output_bytes


def test_first_step_creates_optimizer_state_in_the_cached_activation_blocks():
    # The optimizer's state is created in the first step, after the backward freed the activations, so it
    # splits their cached segment: later steps need a fresh segment for the activation (gpt2 b400 fp32 on an
    # H100 ran out of memory that way, data/memory/H100-SXM.jsonl).
    from gpuest.price.memory.peak import _Program, _replay
    from gpuest.price.node_table import NodeTable
    state, activation = 30 * MiB, 100 * MiB
    program = _Program(persistent=[(0, state, "optimizer_state")],
                       events=[(True, 1, activation, "activations"), (False, 1, 0, "")], gradients=[],
                       gemm_phases=frozenset(), optimizer_start=2, table=NodeTable.from_records([]), after_outputs=[])
    lazy = _replay(program, [], None)
    assert lazy.peak_reserved_bytes == 2 * activation
    eager = dataclasses.replace(program, optimizer_start=0)   # state created before the first activation
    assert _replay(eager, [], None).peak_reserved_bytes == state + activation
    with pytest.raises(SimulatedOOM):
        _replay(program, [], 150 * MiB)
    _replay(eager, [], 150 * MiB)


def test_an_nchw_tensor_core_convolution_holds_its_transposed_activations():
    # cuDNN runs a bf16 3x3 convolution of NCHW data in NHWC: the transposed input and output sit in a
    # workspace during the call (data/memory/workspace.H200.jsonl.gz); channels-last data needs none.
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(torch.bfloat16)
    peaks = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.empty(8, 64, 56, 56, device="meta", dtype=torch.bfloat16).contiguous(memory_format=fmt)
        g = gpuest.trace(conv.to(memory_format=fmt), (x,), precision="bf16", name="conv")
        peaks[fmt] = memory_estimate(g, get_gpu("H100"))
    activation = 8 * 64 * 56 * 56 * 2
    nchw, nhwc = peaks[torch.contiguous_format], peaks[torch.channels_last]
    assert nchw.peak_bytes - nhwc.peak_bytes == 2 * activation
    assert nchw.breakdown_bytes["workspace"] - nhwc.breakdown_bytes["workspace"] == 2 * activation


# ------------------------------------------------------------------------------------------ fits, max_batch

def test_a_huge_batch_does_not_fit_a_small_gpu_and_compare_skips_it():
    g = gpuest.trace(*_resnet18(4096), mode="training", batch=4096)
    assert memory_estimate(g, get_gpu("T4")).fits is False
    assert memory_estimate(g, get_gpu("H200")).fits is True
    df = gpuest.compare(g, ["T4", "H200"])
    t4 = df[df.gpu == "T4"].iloc[0]
    assert not t4.fits and t4.isna()["rank_time"] and df.iloc[0].gpu == "H200"
    est = gpuest.estimate(g, "T4")
    assert est.fits is False and any("out of memory" in n for n in est.notes)


def _resnet18(batch: int):
    from gpuest.capture.models import load_model
    loaded = load_model("resnet18", batch=batch)
    return loaded.model, loaded.example_inputs


def test_max_batch_is_the_fitting_boundary():
    gpu = tiny_gpu(96 * MiB)    # weights, first-step optimizer state and workspaces take ~70 MiB of segments
    make = lambda b: (torch.empty(b, 256, device="meta"),)  # noqa: E731
    found = max_batch(mlp(1024), gpu, mode="training", make_inputs=make)
    assert found.batch > 1 and not found.limited
    assert all(fit == (b <= found.batch) for b, fit in found.probes.items())   # monotone, one boundary
    assert found.probes[found.batch] and found.probes[found.batch + 1] is False
    none = max_batch(mlp(1024), tiny_gpu(MiB), mode="training", make_inputs=make)
    assert none.batch == 0 and none.memory is None


def test_max_batch_rejects_a_module_without_inputs():
    with pytest.raises(TypeError, match="make_inputs"):
        max_batch(mlp(), "T4")


# ------------------------------------------------------------------------------------------ CLI

def test_cli_memory_prints_the_peak_and_verdict(capsys):
    assert cli_main(["memory", "resnet18", "--gpu", "L4", "--train", "--batch", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is True and data["gpu"] == "L4"
    assert sum(data["memory_breakdown"].values()) == data["peak_memory_bytes"]
    assert cli_main(["memory", "resnet18", "--gpu", "L4", "--batch", "2"]) == 0
    assert "peak allocated" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["memory", "resnet18", "--gpu", "L5"], "unknown GPU 'L5'"),
    (["memory", "resnet18", "--gpu", "L4", "--batch", "0"], "--batch must be >= 1"),
    (["memory", "resnet18", "--gpu", "L4", "--precision", "fp8"], "unknown precision 'fp8'"),
])
def test_cli_memory_rejects_bad_input(capsys, argv, message):
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ accuracy report

def test_memory_accuracy_report_scores_peaks_and_verdicts(tmp_path):
    from gpuest.report.memory_accuracy import main as report_main
    from gpuest.price.estimate import as_graph
    predicted = memory_estimate(as_graph("resnet18", batch=1, mode="inference"), get_gpu("H100")).peak_bytes
    prov = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "date": "today"}
    base = {"schema": "gpuest.memory/1", "model": "resnet18", "batch": 1, "mode": "inference", "precision": "fp32",
            "optimizer": "adamw", "seq": None, "image_size": None, "intent": "typical", "provenance": prov}
    rows = [{**base, "key": "ran", "oom": False, "error": None, "max_allocated_bytes": round(predicted / 1.1),
             "max_reserved_bytes": predicted, "context_bytes": 5e8},
            {**base, "key": "oom", "oom": True, "oom_stage": "step", "error": "CUDA out of memory"}]
    data = tmp_path / "m.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "MEMORY.md"
    assert report_main([str(data), "--out", str(out)]) == 0
    text = out.read_text()
    assert "MAPE 10.00 %" in text and "right on 1 of 2 configs" in text
    assert "| `oom` |" in text and "WRONG" in text


def test_workspace_probe_lists_every_convolution_variant_and_rnn_cell(capsys):
    from gpuest.calibrate import workspace_probe as probe
    convs = probe.conv_probes()
    variants = {(p.dtype, p.layout, p.direction) for p in convs}
    assert len(variants) == len(probe.CONV_DTYPES) * len(probe.CONV_LAYOUTS) * len(probe.CONV_DIRECTIONS)
    assert len(convs) == len(variants) * len(probe.conv_specs())
    assert {p.mode for p in probe.rnn_probes()} == {"LSTM", "GRU"}
    assert probe.main(["--list"]) == 0
    assert f"{len(convs)} convolution" in capsys.readouterr().out


def test_held_out_memory_set_is_a_seeded_draw_of_models_outside_the_main_set():
    from gpuest.calibrate import memory_validate as mv
    held_out = mv.held_out_configs()
    assert held_out == mv.held_out_configs() and len(held_out) == mv.HELD_OUT_COUNT
    assert not {c.model for c in held_out} & {c.model for c in mv.CONFIGS}
    assert {c.intent for c in held_out} == {"held-out"}


def test_recurrent_memory_set_draws_distinct_cell_mode_precision_combinations():
    from gpuest.calibrate import memory_validate as mv
    drawn = mv.recurrent_configs()
    assert drawn == mv.recurrent_configs() and len(drawn) == mv.RECURRENT_COUNT
    assert len({(c.model, c.mode, c.precision) for c in drawn}) == len(drawn)
    assert {c.model for c in drawn} == {"lstm", "gru"} and {c.mode for c in drawn} == {"inference", "training"}
