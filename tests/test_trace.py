"""`gpuest.capture.trace`: FLOPs against independent counters, coverage of real model zoos,
training-step structure, precision handling, errors and serialisation. Everything runs on the CPU."""
from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch.utils import flop_counter as fc
from torch.utils.flop_counter import FlopCounterMode

from gpuest.capture import default_loss, trace, unsupported_ops
from gpuest.capture.models import load_model
from gpuest.errors import TraceError

aten = torch.ops.aten
TENSOR_CORE = ("matmul", "conv", "attention", "rnn")
REPO = Path(__file__).resolve().parents[1]


def nodes(graph: nx.DiGraph, **match):
    return [d for _, d in graph.nodes(data=True) if all(d[k] == v for k, v in match.items())]


def flops(graph: nx.DiGraph, categories=TENSOR_CORE, phase: str | None = None) -> float:
    return sum(d["flops"] for _, d in graph.nodes(data=True)
               if d["category"] in categories and (phase is None or d["phase"] == phase))


@pytest.fixture
def mha_fastpath_off():
    """nn.MultiheadAttention / TransformerEncoderLayer run one fused ATen op in eval+no_grad (the 'fast
    path'). FlopCounterMode cannot see inside it (it counts 0 for it), so reference counts run the
    decomposed path; our graph prices the fused op as the sum of its GEMMs and attention."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(previous)


@pytest.fixture
def restore_tf32():
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


# ---------------------------------------------------------------- FLOPs vs torch's FlopCounterMode

# On the CPU, SDPA runs `_scaled_dot_product_flash_attention_for_cpu`, which FlopCounterMode does not
# know; give it torch's own flash-attention formula (the kernel the CUDA run uses).
CPU_SDPA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, out_shape=None, **kwargs: fc.sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *args, out_shape=None, **kwargs: fc.sdpa_backward_flop_count(g, q, k, v),
}


def reference_flops(model: torch.nn.Module, inputs, training: bool) -> int:
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {})
    was = model.training
    model.train(training)
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS) as counter:
            if training:
                default_loss(model(*args, **kwargs)).backward()
            else:
                with torch.no_grad():
                    model(*args, **kwargs)
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
        model.train(was)
    return counter.get_total_flops()


def tiny_encoder():
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.randn(2, 16, 64),)


FLOP_MODELS = {
    "resnet18": lambda: load_model("resnet18", batch=2, image_size=64, device="cpu"),
    "vit_b_16": lambda: load_model("vit_b_16", batch=2, image_size=64, device="cpu"),
    "hf:llama": lambda: load_model("hf:llama", batch=2, seq=16, device="cpu"),
    "tiny_encoder": tiny_encoder,
}


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("name", list(FLOP_MODELS))
def test_tensor_core_flops_match_flop_counter_mode(name, mode):
    if name.startswith("hf:"):
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    built = FLOP_MODELS[name]()
    model, inputs = (built.model, built.example_inputs) if hasattr(built, "model") else built
    graph = trace(model, inputs, mode=mode)  # the fused MHA fast path is left on: its formula is checked too
    expected = reference_flops(model, inputs, training=mode == "training")
    assert expected > 0
    assert graph.graph["total_tensor_core_flops"] == expected
    assert flops(graph) == expected


# ---------------------------------------------------------------- FLOPs vs fvcore

FVCORE_GEMM_HANDLES = ("conv", "linear", "matmul", "bmm", "addmm", "einsum")


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_b_16"])
def test_forward_gemm_flops_are_twice_fvcore_macs(name, mha_fastpath_off):
    """fvcore counts multiply-adds, and also counts norms and pooling; it is restricted to its conv /
    linear / matmul handles (convnext's and vit's layer_norm, the SE blocks' pooling are excluded). fvcore
    has no handle for scaled_dot_product_attention (vit), so our attention nodes are left out too; with
    the MHA fast path off, vit's projections are ordinary addmm nodes and are compared."""
    fvcore_nn = pytest.importorskip("fvcore.nn")
    torch.manual_seed(0)
    lm = load_model(name, batch=1, image_size=64, device="cpu")
    model = lm.model.eval()
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    analysis = fvcore_nn.FlopCountAnalysis(model, lm.example_inputs)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    macs = sum(v for k, v in analysis.by_operator().items() if k in FVCORE_GEMM_HANDLES)
    graph = trace(model, lm.example_inputs)
    assert macs > 0
    assert flops(graph, ("conv", "matmul")) == 2 * macs


# ---------------------------------------------------------------- model zoo coverage

@pytest.mark.parametrize("name", torchvision.models.list_models(module=torchvision.models))
def test_every_torchvision_classifier_traces_inference_fully_supported(name):
    lm = load_model(name, batch=1)
    graph = trace(lm.model, lm.example_inputs, name=lm.name, batch=lm.batch)
    assert graph.graph["unsupported_ops"] == "{}"
    assert graph.graph["total_tensor_core_flops"] > 0
    assert {d["phase"] for _, d in graph.nodes(data=True)} == {"forward"}


# One of each architecture family / op mix (all 80 take ~8 min in training): grouped and depthwise convs,
# squeeze-excite, hardswish/hardsigmoid, channel shuffle, aux heads, layer-norm, windowed attention, MHA.
TRAINING_SUBSET = [
    "alexnet", "resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
    "inception_v3", "shufflenet_v2_x0_5", "squeezenet1_0", "vgg11_bn", "swin_t", "vit_b_16",
]


@pytest.mark.parametrize("name", TRAINING_SUBSET)
def test_torchvision_training_subset_fully_supported(name):
    lm = load_model(name, batch=2)  # batch 2: batch-norm in training needs more than one value per channel
    graph = trace(lm.model, lm.example_inputs, mode="training", name=lm.name)
    assert graph.graph["unsupported_ops"] == "{}"
    assert {d["phase"] for _, d in graph.nodes(data=True)} == {"forward", "loss", "backward", "optimizer"}


TIMM_MODELS = ["resnet18", "efficientnet_b0", "vit_tiny_patch16_224", "convnext_atto", "mobilevitv2_050"]


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_sample_traces(name, mode):
    pytest.importorskip("timm")
    lm = load_model("timm:" + name, batch=2, image_size=64)
    graph = trace(lm.model, lm.example_inputs, mode=mode, name=lm.name)
    assert unsupported_ops(graph) == {}
    assert flops(graph) > 0


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("spec", ["hf:gpt2", "hf:bert-base-uncased", "hf:llama", "lstm", "gru"])
def test_language_models_trace(spec, mode):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    lm = load_model(spec, batch=2, seq=16)
    if spec.startswith("hf:"):
        assert isinstance(lm.example_inputs, dict)  # {"input_ids": ...}, passed to forward() as kwargs
    graph = trace(lm.model, lm.example_inputs, mode=mode, name=lm.name)
    assert unsupported_ops(graph) == {}
    categories = {d["category"] for _, d in graph.nodes(data=True)}
    if spec in ("lstm", "gru"):
        rnn = nodes(graph, category="rnn")
        # one fused cuDNN call per direction of the pass, for the whole 2-layer stack
        assert [d["op"] for d in rnn] == (["aten._cudnn_rnn.default"] if mode == "inference" else
                                          ["aten._cudnn_rnn.default", "aten._cudnn_rnn_backward.default"])
        assert all(d["module"] == "rnn" for d in rnn)
    else:
        assert "attention" in categories
        # one fused SDPA kernel per layer and pass: in training, the attention dropout (GPT-2, BERT) is
        # folded into the kernel as on CUDA, not traced as the CPU's bmm/softmax/dropout math fallback
        attention = [d["op"] for d in nodes(graph, category="attention")]
        layers = lm.model.config.num_hidden_layers
        assert len(attention) == layers * (1 if mode == "inference" else 2)
        assert all(op.startswith("aten._scaled_dot_product_") for op in attention)
        # (a rotary embedding's inv_freq @ positions is a bmm in some transformers versions: not attention)
        assert not [d for d in nodes(graph, op="aten.bmm.default") if "attn" in d["module"] or
                    "attention" in d["module"]]
    assert "embedding" in categories


def test_dict_example_inputs_are_passed_as_kwargs():
    class KwOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, *, x):
            return self.lin(x)

    graph = trace(KwOnly(), {"x": torch.empty(4, 8)})
    assert flops(graph) == 2 * 4 * 8 * 8


def test_tied_weights_trace_once():
    """A weight shared by two modules is one parameter: traced once, updated once by the optimizer."""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 16)
            self.head = torch.nn.Linear(16, 100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    graph = trace(Tied(), (torch.zeros(2, 8, dtype=torch.int64),), mode="training")
    muls = [d for d in _optimizer_foreach(graph) if d["op"] == "aten._foreach_mul_.Scalar"]
    assert muls and all(d["bytes_read"] == 4 * 100 * 16 for d in muls)


def test_llama_3b_inference_without_materialising_weights():
    pytest.importorskip("transformers")
    script = """
import json, resource, sys
import torch, transformers
from gpuest.capture import trace, unsupported_ops
from gpuest.capture.models import load_model
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lm = load_model("hf:llama-3b", batch=1, seq=128)
graph = trace(lm.model, lm.example_inputs, name=lm.name, batch=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
params = sum(p.numel() for p in lm.model.parameters())
norms = sum(p.numel() for n, p in lm.model.named_parameters() if "norm" in n)
matmul = sum(d["flops"] for _, d in graph.nodes(data=True) if d["category"] == "matmul")
print(json.dumps(dict(growth_kb=after - before, params=params, norms=norms, matmul=matmul,
                      unsupported=unsupported_ops(graph), meta=all(p.is_meta for p in lm.model.parameters()))))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    weights_bytes = out["params"] * 4
    assert 3.0e9 < out["params"] < 3.4e9 and out["meta"]
    assert out["growth_kb"] * 1024 < 1.5e9 < weights_bytes / 8  # peak RSS grew by far less than 12.8 GB
    assert out["unsupported"] == {}
    # Every weight but the norms (embedding tied to the LM head) is one GEMM per token: 2 FLOPs per param.
    assert out["matmul"] == pytest.approx(2 * 128 * (out["params"] - out["norms"]), rel=1e-4)


# ---------------------------------------------------------------- training-step structure

@pytest.fixture(scope="module")
def resnet_training():
    model = torchvision.models.resnet18()
    x = torch.empty(2, 3, 64, 64)
    return model, x, trace(model, (x,), mode="training", optimizer="adamw")


def test_training_phases(resnet_training):
    _, _, graph = resnet_training
    phases = [d["phase"] for _, d in sorted(graph.nodes(data=True))]
    assert set(phases) == {"forward", "loss", "backward", "optimizer"}
    # in order: all forward, then loss, then backward, then the optimizer step
    order = {"forward": 0, "loss": 1, "backward": 2, "optimizer": 3}
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)


def test_backward_gemm_flops_twice_forward(resnet_training):
    _, _, graph = resnet_training
    fwd, bwd = flops(graph, ("conv", "matmul"), "forward"), flops(graph, ("conv", "matmul"), "backward")
    # autograd skips the data gradient of the first conv (its input needs no grad)
    stem = sum(d["flops"] for d in nodes(graph, phase="forward", module="conv1"))
    assert stem > 0
    assert bwd == pytest.approx(2 * fwd - stem, rel=1e-12)
    assert bwd / fwd == pytest.approx(2.0, rel=0.05)


def test_backward_nodes_carry_the_module_they_differentiate(resnet_training):
    model, _, graph = resnet_training
    convs = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    bwd = nodes(graph, op="aten.convolution_backward.default")
    assert len(bwd) == len(convs)
    assert all(d["phase"] == "backward" for d in bwd)
    assert all(d["module"] in convs for d in bwd)  # a conv module path, e.g. "layer1.0.conv1"
    assert {"conv1", "layer1.0.conv1", "layer4.1.conv2"} <= {d["module"] for d in bwd}
    fc_grads = nodes(graph, phase="backward", category="matmul")
    assert [d["module"] for d in fc_grads] == ["fc", "fc"]


def test_backward_module_attribution_is_one_to_one(resnet_training):
    model, _, graph = resnet_training
    convs = sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d))
    bwd = nodes(graph, op="aten.convolution_backward.default")
    assert sorted(d["module"] for d in bwd) == convs  # exactly one per conv
    bn_bwd = nodes(graph, op="aten.cudnn_batch_norm_backward.default")
    assert sorted(d["module"] for d in bn_bwd) == sorted(n for n, m in model.named_modules()
                                                         if isinstance(m, torch.nn.BatchNorm2d))


def _optimizer_foreach(graph):
    return [d for d in nodes(graph, phase="optimizer") if d["op"].startswith("aten._foreach_")]


def test_adamw_traffic_proportional_to_param_count(resnet_training):
    model, _, graph = resnet_training
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    foreach = _optimizer_foreach(graph)
    assert len(foreach) >= 8
    per_param = [d for d in foreach if not d["input_shapes"].startswith("scalar")]
    step_counters = [d for d in foreach if d["input_shapes"].startswith("scalar")]
    for d in per_param:  # fp32 state: 4 bytes per element, each list covers every trainable parameter
        assert d["bytes_read"] % (4 * n_params) == 0 and d["bytes_read"] > 0, d["op"]
        assert d["bytes_written"] % (4 * n_params) == 0 and d["bytes_written"] > 0, d["op"]
    # the per-parameter `step` counters: one scalar each
    assert len(step_counters) == 1 and step_counters[0]["bytes_written"] == 4 * n_tensors


def test_frozen_parameters_get_no_optimizer_traffic():
    model = torchvision.models.resnet18()
    x = torch.empty(2, 3, 64, 64)
    full = trace(model, (x,), mode="training")
    model.fc.requires_grad_(False)
    frozen = trace(model, (x,), mode="training")
    total = sum(p.numel() for p in model.parameters())
    fc_share = sum(p.numel() for p in model.fc.parameters()) / total

    def per_param_bytes(g):
        return sum(d["bytes_read"] + d["bytes_written"] for d in _optimizer_foreach(g)
                   if not d["input_shapes"].startswith("scalar"))

    assert per_param_bytes(frozen) == pytest.approx(per_param_bytes(full) * (1 - fc_share), rel=1e-12)
    step_written = [sum(d["bytes_written"] for d in _optimizer_foreach(g) if d["input_shapes"].startswith("scalar"))
                    for g in (full, frozen)]
    assert step_written[0] - step_written[1] == 4 * 2  # fc.weight and fc.bias lost their step counters
    # and the frozen layer computes no weight gradient: one mm fewer in the backward pass
    assert len(nodes(frozen, phase="backward", category="matmul")) == len(nodes(full, phase="backward",
                                                                                  category="matmul")) - 1


def test_sgd_optimizer_and_no_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.empty(8, 16)
    sgd = trace(model, (x,), mode="training", optimizer="sgd")
    assert sgd.graph["optimizer"] == "sgd" and nodes(sgd, phase="optimizer")
    none = trace(model, (x,), mode="training", optimizer=None)
    assert none.graph["optimizer"] == "none"
    assert {d["phase"] for _, d in none.nodes(data=True)} == {"forward", "loss", "backward"}


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_forloop_optimizer_launches_per_parameter_and_moves_the_same_bytes(name):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.empty(8, 16)
    graphs = {impl: trace(model, (x,), mode="training", optimizer=impl)
              for impl in (name, f"{name}-forloop")}
    steps = {impl: [d for _, d in g.nodes(data=True) if d["phase"] == "optimizer" and d["kernels"] > 0]
             for impl, g in graphs.items()}
    n_tensors = len(list(model.parameters()))
    # foreach: one launch per op over all tensors; for-loop: every op once per parameter
    assert len(steps[f"{name}-forloop"]) >= n_tensors * len(steps[name]) // 2 > len(steps[name])
    assert all(not d["op"].startswith("aten._foreach") for d in steps[f"{name}-forloop"])
    device_bytes = {impl: sum(d["bytes_read"] + d["bytes_written"] for d in ds
                              if not d["input_shapes"].startswith("scalar")) for impl, ds in steps.items()}
    assert device_bytes[f"{name}-forloop"] >= device_bytes[name] > 0


def test_a_tensor_held_outside_parameters_and_buffers_is_traced_as_a_constant():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.scales = [torch.full((16,), 0.5)]   # a plain attribute, as torchvision's anchor caches are

        def forward(self, x):
            return self.lin(x) * self.scales[0]

    graph = trace(Scaled(), (torch.empty(4, 16),), mode="training")
    muls = [d for _, d in graph.nodes(data=True) if d["op"] == "aten.mul.Tensor" and d["phase"] == "forward"]
    assert len(muls) == 1 and muls[0]["bytes_read"] == 4 * (4 * 16 + 16)
    assert nodes(graph, phase="optimizer")    # the constant takes no gradient, the layer does


def test_value_dependent_selection_outside_routing_says_what_is_not_supported():
    class Thresholded(torch.nn.Module):
        def forward(self, x):
            keep = torch.nonzero(x[:, 0] > 0.5)[:, 0]     # detection-style score threshold
            return x[keep].sum()

    with pytest.raises(TraceError, match=r"nonzero[\s\S]*depends on the values of its input[\s\S]*routing="):
        trace(Thresholded(), (torch.empty(32, 4),))


# ---------------------------------------------------------------- precision and math modes

def test_bf16_mixed_runs_gemms_in_bf16():
    graph = trace(torchvision.models.resnet18(), (torch.empty(2, 3, 64, 64),), mode="training",
                  precision="bf16-mixed")
    gemms = [d for _, d in graph.nodes(data=True) if d["category"] in ("conv", "matmul")]
    assert {d["phase"] for d in gemms} == {"forward", "backward"}
    assert {d["math_mode"] for d in gemms} == {"bf16"}
    # the optimizer still updates fp32 master weights
    assert {d["dtype"] for d in _optimizer_foreach(graph) if not d["input_shapes"].startswith("scalar")} == {"float32"}


def _conv_mlp():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))


@pytest.mark.parametrize("matmul_precision,cudnn_tf32,matmul_mode,conv_mode", [
    ("high", True, "tf32", "tf32"),
    ("highest", True, "fp32", "tf32"),
    ("highest", False, "fp32", "fp32"),
    ("medium", False, "tf32", "fp32"),
])
def test_fp32_tf32_switches(restore_tf32, matmul_precision, cudnn_tf32, matmul_mode, conv_mode):
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    graph = trace(_conv_mlp(), (torch.empty(2, 3, 8, 8),), mode="training")
    assert {d["math_mode"] for d in nodes(graph, category="matmul")} == {matmul_mode}
    assert {d["math_mode"] for d in nodes(graph, category="conv")} == {conv_mode}
    assert graph.graph["matmul_allow_tf32"] == (matmul_mode == "tf32")
    assert graph.graph["cudnn_allow_tf32"] == cudnn_tf32


def test_cuda_matmul_allow_tf32_flag(restore_tf32):
    torch.backends.cuda.matmul.allow_tf32 = True
    graph = trace(_conv_mlp(), (torch.empty(2, 3, 8, 8),))
    assert {d["math_mode"] for d in nodes(graph, category="matmul")} == {"tf32"}
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = trace(_conv_mlp(), (torch.empty(2, 3, 8, 8),))
    assert {d["math_mode"] for d in nodes(graph, category="matmul")} == {"fp32"}


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, explicit_mask: bool = False):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.explicit_mask = explicit_mask

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
        if self.explicit_mask:
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("precision,mask,backend", [
    ("bf16", False, "flash"), ("bf16-mixed", False, "flash"), ("fp16-mixed", False, "flash"),
    ("fp32", False, "efficient"), ("bf16", True, "efficient"),
])
def test_sdpa_backend_normalisation(precision, mask, backend):
    graph = trace(CausalSelfAttention(mask), (torch.empty(2, 16, 64),), mode="training", precision=precision)
    assert graph.graph["sdpa_backend"] == backend
    kernel = "flash" if backend == "flash" else "efficient"
    assert [d["op"] for d in nodes(graph, category="attention")] == [
        f"aten._scaled_dot_product_{kernel}_attention.default",
        f"aten._scaled_dot_product_{kernel}_attention_backward.default"]
    assert all(d["cpu_op"].endswith("_for_cpu.default") or d["cpu_op"].endswith("_for_cpu_backward.default")
               for d in nodes(graph, category="attention"))


def test_sdpa_bf16_vit_is_flash():
    lm = load_model("vit_b_16", batch=2, image_size=64)
    graph = trace(lm.model, lm.example_inputs, mode="training", precision="bf16")
    assert graph.graph["sdpa_backend"] == "flash"
    assert len(nodes(graph, op="aten._scaled_dot_product_flash_attention.default")) == 12


# F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, ...):
# dropout folding must replace args[4] (dropout_p), never args[3] (attn_mask).


@pytest.mark.parametrize("positional_dropout", [False, True])
def test_sdpa_with_dropout_is_one_attention_node(positional_dropout):
    class DropoutAttention(CausalSelfAttention):
        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
            p = 0.1 if self.training else 0.0
            if positional_dropout:  # (query, key, value, attn_mask, dropout_p, is_causal)
                return F.scaled_dot_product_attention(q, k, v, None, p, True)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    graph = trace(DropoutAttention(), (torch.empty(2, 16, 64),), mode="training", precision="bf16")
    assert graph.graph["sdpa_backend"] == "flash"
    assert not nodes(graph, phase="forward", op="aten.bmm.default")
    # dropout folded into the kernel: no separate mask, same single fused op forward and backward
    assert not [d for _, d in graph.nodes(data=True) if "bernoulli" in d["op"] or "dropout" in d["op"]]
    assert [d["op"] for d in nodes(graph, category="attention")] == [
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_flash_attention_backward.default"]


def test_sdpa_positional_mask_traces():
    """attn_mask given positionally (as nn.MultiheadAttention's functional form does) is kept."""
    class PositionalMask(CausalSelfAttention):
        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, torch.ones(s, s, dtype=torch.bool, device=x.device).tril())

    graph = trace(PositionalMask(), (torch.empty(2, 16, 64),), precision="bf16")
    assert graph.graph["sdpa_backend"] == "efficient"  # a mask rules flash out, as in test_sdpa_backend_normalisation
    assert [d["op"] for d in nodes(graph, category="attention")] == [
        "aten._scaled_dot_product_efficient_attention.default"]


def test_grouped_query_attention_counts_the_query_heads():
    """Key/value heads broadcast to the query's (enable_gqa): the FLOPs are those of 8 query heads, forward
    and backward, on every torch version (torch's own formula refuses such shapes before 2.14)."""
    class GroupedQuery(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.kv = torch.nn.Linear(64, 8 * 16), torch.nn.Linear(64, 2 * 2 * 16)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, 8, 16).transpose(1, 2)
            k, v = self.kv(x).view(b, s, 2, 2, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    graph = trace(GroupedQuery(), (torch.empty(2, 32, 64),), mode="training", precision="bf16")
    by_phase = {d["phase"]: d["flops"] for d in nodes(graph, category="attention")}
    score = 2 * 8 * 32 * 32 * 16  # batch x query heads x s_q x s_k x head_dim
    assert by_phase == {"forward": 2 * 2 * score, "backward": 2 * 5 * score}


def test_sdpa_bf16_hf_llama_is_flash():
    pytest.importorskip("transformers")
    lm = load_model("hf:llama", batch=2, seq=16)
    graph = trace(lm.model, lm.example_inputs, precision="bf16")
    assert graph.graph["sdpa_backend"] == "flash"
    assert len(nodes(graph, op="aten._scaled_dot_product_flash_attention.default")) == 4


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,accepted", [
    (dict(mode="train"), ["inference", "training"]),
    (dict(precision="fp8"), ["fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed"]),
    (dict(mode="training", optimizer="lion"), ["adamw", "sgd"]),
])
def test_bad_choices_list_accepted_values(kwargs, accepted):
    with pytest.raises(ValueError) as err:
        trace(torch.nn.Linear(4, 4), (torch.empty(2, 4),), **kwargs)
    for value in accepted:
        assert value in str(err.value)


def test_non_module_rejected():
    with pytest.raises(TypeError, match="nn.Module"):
        trace(lambda x: x, (torch.empty(2),))


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


class WithGate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.gate = DataDependent()

    def forward(self, x):
        return self.gate(self.proj(x))


def test_data_dependent_control_flow_names_the_module():
    with pytest.raises(TraceError) as err:
        trace(WithGate(), (torch.empty(2, 8),))
    msg = str(err.value)
    assert "'gate'" in msg and "data-dependent" in msg


def test_a_training_step_of_a_model_without_trainable_parameters_says_so():
    frozen = torch.nn.Linear(8, 8).requires_grad_(False)
    for model in (torch.nn.Upsample(scale_factor=2), frozen):
        with pytest.raises(TraceError, match="no parameter that requires grad.*mode='inference'"):
            trace(model, (torch.empty(2, 4, 8, 8) if isinstance(model, torch.nn.Upsample) else torch.empty(2, 8),),
                  mode="training")
    assert trace(frozen, (torch.empty(2, 8),)).number_of_nodes() > 0   # inference needs no gradients


@torch.library.custom_op("gpuest_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@_mystery.register_fake
def _(x):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.ops.gpuest_test.mystery(self.lin(x))


def test_op_without_formula_is_priced_by_bytes_and_flagged():
    graph = trace(UsesCustomOp(), (torch.empty(4, 16),))
    (node,) = nodes(graph, op="gpuest_test.mystery.default")
    assert node["supported"] is False
    assert node["bytes_read"] == 4 * 16 * 4 and node["bytes_written"] == 4 * 16 * 4
    assert unsupported_ops(graph) == {"gpuest_test.mystery.default": 1}
    assert all(d["supported"] for d in nodes(graph, category="matmul"))


# ---------------------------------------------------------------- serialisation

def test_graph_writes_to_graphml_as_traced(resnet_training, tmp_path):
    _, _, graph = resnet_training
    nx.write_graphml(graph, tmp_path / "g.graphml")


def test_graphml_round_trip(resnet_training, tmp_path):
    """Nodes, edges, every graph attribute and every node attribute survive GraphML, as traced."""
    _, _, graph = resnet_training
    path = tmp_path / "g.graphml"
    nx.write_graphml(graph, path)
    back = nx.read_graphml(path)
    assert back.number_of_nodes() == graph.number_of_nodes()
    assert back.number_of_edges() == graph.number_of_edges()
    assert back.graph["total_tensor_core_flops"] == graph.graph["total_tensor_core_flops"]
    assert json.loads(back.graph["unsupported_ops"]) == {}
    assert {k: v for k, v in back.graph.items() if k not in ("node_default", "edge_default")} == graph.graph
    assert back.graph["torch_version"] == torch.__version__
    original = dict(graph.nodes(data=True))
    for key, attrs in back.nodes(data=True):
        assert attrs == original[int(key)]


@pytest.mark.parametrize("cell, hidden", [("gru", 512), ("lstm", 512), ("gru", 128), ("lstm", 128)])
def test_fused_rnn_moves_each_tensor_once_and_rereads_only_per_step_weights(cell, hidden):
    """A cuDNN RNN call moves each tensor once, however the CPU decomposes it into time steps; only a
    layer that runs a GEMM kernel per step reads its recurrent weights again at every step, while a
    persistent one keeps them on chip: doubling the sequence adds exactly those re-reads besides the
    activations of the extra steps."""
    from gpuest.annotate.formulas.rnn import PERSISTENT_RNN_MAX_HIDDEN
    rnn_cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell]

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = rnn_cls(input_size=64, hidden_size=hidden, num_layers=1, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0]

    model = Wrapped()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    recurrent_bytes = model.rnn.weight_hh_l0.numel() * 4

    def fused_bytes(seq: int) -> float:
        graph = trace(model, (torch.randn(1, seq, 64),), mode="inference")
        (node,) = nodes(graph, category="rnn")
        return node["bytes_read"] + node["bytes_written"]

    short, long = fused_bytes(16), fused_bytes(32)
    assert short >= weight_bytes
    rereads = 16 * recurrent_bytes if hidden > PERSISTENT_RNN_MAX_HIDDEN else 0
    activation_per_step = 4 * (64 + 3 * hidden) * 4  # input, output and gate-sized state, fp32, generous
    assert rereads <= long - short < rereads + 16 * activation_per_step


@pytest.mark.parametrize("lookup", ["embedding", "index_select", "advanced_index"])
def test_gather_reads_the_selected_rows_not_the_table(lookup):
    """Looking up 8 rows of a 100k-row table moves about 8 rows; its backward scatters into (and so
    writes) the whole gradient table."""
    rows, dim, n = 100_000, 256, 8
    fns = {"embedding": lambda table, ids: F.embedding(ids, table),
           "index_select": lambda table, ids: table.index_select(0, ids),
           "advanced_index": lambda table, ids: table[ids]}

    class Lookup(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(rows, dim))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return fns[lookup](self.table, ids)

    graph = trace(Lookup(), (torch.zeros(n, dtype=torch.long),), mode="inference")
    (node,) = [d for _, d in graph.nodes(data=True) if not d["free"]]
    assert node["bytes_written"] == n * dim * 4
    # the rows and the int64 indices (a table lookup counts the rows 8 draws are expected to hit: 7.9997)
    assert node["bytes_read"] == pytest.approx(n * dim * 4 + n * 8, rel=1e-3)
    assert node["table_lookup"] == (lookup == "embedding")


@pytest.mark.parametrize("rows", [100, 1_000_000])
def test_a_table_lookup_reads_each_distinct_row_once(rows):
    """4096 lookups into a 100-row table read its 100 rows once (the rest come from cache); into a
    million-row table almost every lookup hits a row of its own."""
    n, dim = 4096, 64
    emb = torch.nn.Embedding(rows, dim, device="meta")
    graph = trace(emb, (torch.zeros(n, dtype=torch.long, device="meta"),), mode="inference")
    (node,) = nodes(graph, category="embedding")
    table_bytes = (node["bytes_read"] - n * 8) / (dim * 4)
    assert table_bytes == pytest.approx(min(rows, n), rel=0.01)


def test_expected_distinct_rows_is_bounded_by_draws_and_population():
    from gpuest.annotate.formulas.embedding import expected_distinct
    assert expected_distinct(0, 100) == 0.0 and expected_distinct(5, 1) == 1.0
    for draws, population in [(1, 10), (10, 10), (1000, 10), (8192, 50257), (8192, 512)]:
        got = expected_distinct(draws, population)
        assert 0 < got <= min(draws, population)
        assert expected_distinct(draws + 1, population) >= got
    assert expected_distinct(1, 10) == pytest.approx(1.0)
    assert expected_distinct(1000, 10) == pytest.approx(10.0)


@pytest.mark.parametrize("p, inplace, fused", [(0.1, False, True), (0.5, False, True), (0.0, False, False),
                                               (0.1, True, False)])
def test_dropout_traces_as_the_kernels_cuda_runs(p, inplace, fused):
    """CUDA runs F.dropout (0 < p < 1, not in place) as one native_dropout kernel and its gradient as one
    native_dropout_backward; the CPU composes bernoulli_/div_/mul, which must not reach the graph."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(p, inplace=inplace))
    graph = trace(model, (torch.empty(8, 64),), mode="training")
    ops = [d["op"] for _, d in graph.nodes(data=True)]
    if fused:
        assert ops.count("aten.native_dropout.default") == 1
        assert ops.count("aten.native_dropout_backward.default") == 1
        assert not [o for o in ops if "bernoulli" in o]
        (drop,) = nodes(graph, op="aten.native_dropout.default")
        # reads the activation, writes the output and a one-byte-per-element mask
        assert drop["bytes_read"] == 8 * 64 * 4
        assert drop["bytes_written"] == 8 * 64 * (4 + 1)
    else:
        assert "aten.native_dropout.default" not in ops
    # inference never samples a mask
    infer = trace(model, (torch.empty(8, 64),), mode="inference")
    assert not [d for _, d in infer.nodes(data=True) if "dropout" in d["op"] or "bernoulli" in d["op"]]


@pytest.mark.parametrize("precision, layer, backend", [
    ("fp32", torch.nn.BatchNorm2d(8), "cudnn"),
    ("fp16-mixed", torch.nn.BatchNorm2d(8), "cudnn"),          # fp16 data, fp32 weights: cuDNN
    ("bf16-mixed", torch.nn.BatchNorm2d(8), "native"),         # bf16 anywhere: PyTorch's kernels
    ("bf16", torch.nn.BatchNorm2d(8), "native"),
    ("fp16", torch.nn.BatchNorm2d(8), "native"),               # fp16 weights
    ("fp32", torch.nn.BatchNorm2d(8, affine=False), "native"),
    ("fp32", torch.nn.BatchNorm2d(8, eps=1e-6), "native"),     # below cuDNN's smallest epsilon
])
def test_training_batch_norm_is_named_by_the_backend_torch_picks(precision, layer, backend):
    """torch's _select_batch_norm_backend sends only some dtypes and arguments to cuDNN; the rest run
    PyTorch's native kernels, which the profiler names and the profile prices apart."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), layer)
    graph = trace(model, (torch.empty(4, 3, 16, 16),), mode="training", precision=precision)
    ops = {d["op"] for _, d in graph.nodes(data=True) if "batch_norm" in d["op"]}
    assert ops == {f"aten.{backend}_batch_norm.default", f"aten.{backend}_batch_norm_backward.default"}


def test_batch_norm_1d_over_features_runs_native_kernels():
    graph = trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8)), (torch.empty(16, 4),),
                  mode="training")
    assert {d["op"] for _, d in graph.nodes(data=True) if "batch_norm" in d["op"]} == {
        "aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"}


def test_batch_norm_records_the_memory_format_its_kernels_get():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    layouts = {}
    for memory_format in (torch.contiguous_format, torch.channels_last):
        graph = trace(model.to(memory_format=memory_format),
                      (torch.empty(4, 3, 16, 16).to(memory_format=memory_format),), mode="training")
        layouts[memory_format] = {d["channels_last"] for _, d in graph.nodes(data=True) if "batch_norm" in d["op"]}
    assert layouts == {torch.contiguous_format: {False}, torch.channels_last: {True}}


def test_row_wise_ops_carry_their_rows():
    """Norms, softmax and reductions record the independent rows they reduce and each row's length."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.GroupNorm(2, 8),
                                torch.nn.Flatten(), torch.nn.LayerNorm(8 * 30 * 30), torch.nn.Softmax(-1))
    graph = trace(model, (torch.empty(4, 3, 32, 32),), mode="training")
    by_op = {(d["op"], d["phase"]): (d["row_count"], d["row_len"]) for _, d in graph.nodes(data=True)}
    assert by_op[("aten.cudnn_batch_norm.default", "forward")] == (8, 4 * 30 * 30)          # channels
    assert by_op[("aten.cudnn_batch_norm_backward.default", "backward")] == (8, 4 * 30 * 30)
    assert by_op[("aten.native_group_norm.default", "forward")] == (4 * 2, 4 * 30 * 30)     # N * groups
    assert by_op[("aten.native_group_norm_backward.default", "backward")] == (4 * 2, 4 * 30 * 30)
    assert by_op[("aten.native_layer_norm.default", "forward")] == (4, 7200)                # trailing dims
    assert by_op[("aten.native_layer_norm_backward.default", "backward")] == (4, 7200)
    assert by_op[("aten._softmax.default", "forward")] == (4, 7200)
    assert by_op[("aten._softmax_backward_data.default", "backward")] == (4, 7200)
    assert by_op[("aten.mean.default", "loss")] == (1, 4 * 7200)
    # ops that are not row-wise carry none
    assert by_op[("aten.convolution.default", "forward")] == (0, 0)
    # a batch-norm channel of NCHW data is one 30x30 run per sample; contiguous rows record no run
    segment = {(d["op"], d["phase"]): d["row_segment"] for _, d in graph.nodes(data=True)}
    assert segment[("aten.cudnn_batch_norm.default", "forward")] == 30 * 30
    assert segment[("aten.cudnn_batch_norm_backward.default", "backward")] == 30 * 30
    assert segment[("aten.native_layer_norm.default", "forward")] == 0
    assert segment[("aten.native_group_norm.default", "forward")] == 0


@pytest.mark.parametrize("reduce, rows, run", [
    (lambda x: x.sum(0), (36, 32), 1),                       # a column sum: every element its own run
    (lambda x: x.amax(0), (36, 32), 1),
    (lambda x: x.max(0).values, (36, 32), 1),
    (lambda x: x.view(4, 8, 36).sum(1), (144, 8), 1),        # a middle dimension
    (lambda x: x.t().sum(-1), (36, 32), 1),                  # the last dimension of a transposed view
    (lambda x: x.sum(-1), (32, 36), 0),                      # rows as stored
    (lambda x: x.view(4, 8, 6, 6).mean((2, 3)), (32, 36), 0),
    (lambda x: x.mean(), (1, 32 * 36), 0),                   # the whole tensor
])
def test_reductions_record_the_contiguous_run_of_their_rows(reduce, rows, run):
    class Reduce(torch.nn.Module):
        def forward(self, x):
            return reduce(x)
    graph = trace(Reduce(), (torch.empty(32, 36),))
    node, = [d for _, d in graph.nodes(data=True) if d["row_count"]]
    assert (node["row_count"], node["row_len"], node["row_segment"]) == (*rows, run)
    assert node["reduce_kernel"]       # all run ATen's generic reduction kernel


def test_softmax_and_losses_are_not_priced_as_the_generic_reduction_kernel():
    class Loss(torch.nn.Module):
        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(x.softmax(-1), y)
    graph = trace(Loss(), (torch.empty(32, 36), torch.zeros(32, dtype=torch.long)))
    rowwise = [d for _, d in graph.nodes(data=True) if d["row_count"]]
    assert rowwise and not any(d["reduce_kernel"] for d in rowwise)


def test_batch_norm_rows_of_channels_last_or_single_sample_data_are_contiguous():
    """Channels-last data reads a channel across the rows of C; a single sample's channel is one plane."""
    bn = torch.nn.BatchNorm2d(8)
    nhwc = trace(bn, (torch.empty(4, 8, 6, 6).to(memory_format=torch.channels_last),), mode="training")
    one = trace(bn, (torch.empty(1, 8, 6, 6),), mode="training")
    for graph in (nhwc, one):
        stats, = nodes(graph, op="aten.cudnn_batch_norm.default")
        assert (stats["row_count"], stats["row_segment"]) == (8, 0)


def test_column_reduction_rows():
    class ColumnSum(torch.nn.Module):
        def forward(self, x):
            return x.sum(0)
    graph = trace(ColumnSum(), (torch.empty(32, 1000),))
    (node,) = nodes(graph, op="aten.sum.dim_IntList")
    assert (node["row_count"], node["row_len"]) == (1000, 32)


# ---------------------------------------------------------------- shapes the device-time model reads

def _conv_nodes(graph: nx.DiGraph, op: str) -> list[dict]:
    return [d for _, d in graph.nodes(data=True) if d["op"] == f"aten.{op}.default"]


def test_conv_backward_gemm_is_the_data_gradient():
    """convolution_backward's representative GEMM is the data gradient (M = N*input spatial, N = Cin/g,
    K = Cout/g * kernel); when only the weight gradient is computed (the first layer), that GEMM (M = Cout/g,
    N = Cin/g * kernel, K = N*output spatial)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 32, 3, 1, 1, bias=False))
    graph = trace(model, (torch.empty(2, 3, 32, 32),), mode="training")
    gemm = lambda d: (d["gemm_m"], d["gemm_n"], d["gemm_k"], d["kernels"])  # noqa: E731
    second, first = _conv_nodes(graph, "convolution_backward")
    assert gemm(second) == (2 * 16 * 16, 64, 32 * 9, 2)
    assert gemm(first) == (64, 3 * 49, 2 * 16 * 16, 1) and first["variant"] == "weight_grad"


def test_transposed_conv_gemm_shapes():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, bias=False), torch.nn.ConvTranspose2d(16, 8, 4, 2, 1, bias=False))
    graph = trace(model, (torch.empty(2, 3, 32, 32),), mode="training")
    fwd = _conv_nodes(graph, "convolution")[1]
    # forward: output 8 channels at 60x60 from 16 channels through a 4x4 kernel
    assert (fwd["gemm_m"], fwd["gemm_n"], fwd["gemm_k"]) == (2 * 60 * 60, 8, 16 * 16)
    bwd = _conv_nodes(graph, "convolution_backward")[0]
    # its data gradient is a normal convolution back to 16 channels at 30x30
    assert (bwd["gemm_m"], bwd["gemm_n"], bwd["gemm_k"]) == (2 * 30 * 30, 16, 8 * 16)


def test_transposed_and_1d_convolutions_are_kernel_variants():
    """cuDNN runs a transposed convolution with data-gradient kernels and a 1-D one over height-1 planes:
    both ops and their backward carry the variant, so the residual fit can give them fits of their own
    while a plain 2-D convolution keeps the op's (its backward here, the first layer's, computes the weight
    gradient alone: a variant of its own too)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ConvTranspose2d(8, 8, 2, 2), torch.nn.Flatten(2),
                                torch.nn.Conv1d(8, 4, 3))
    graph = trace(model, (torch.empty(2, 3, 10, 10),), mode="training")
    assert [d["variant"] for d in _conv_nodes(graph, "convolution")] == ["", "transposed", "1d"]
    backward = sorted(d["variant"] for d in _conv_nodes(graph, "convolution_backward"))
    assert backward == ["1d", "transposed", "weight_grad"]


@pytest.mark.parametrize("mode, channels_last, serial", [("bilinear", False, True), ("bilinear", True, False),
                                                         ("nearest", False, False)])
def test_interpolation_of_nchw_planes_loops_over_them_serially(mode, channels_last, serial):
    """PyTorch's CUDA kernel for (bi)linear interpolation of contiguous NCHW data gives each thread an
    output position (1024 to a block) and walks every (sample, channel) plane in turn; channels-last data
    and nearest upsampling take kernels parallel over all outputs."""
    x = torch.empty(4, 6, 8, 8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    graph = trace(torch.nn.Upsample(scale_factor=2, mode=mode), (x,))
    node, = [d for _, d in graph.nodes(data=True) if d["category"] == "pool"]
    assert node["plane_walks"] == (4 * 6 if serial else 0)
    assert node["walk_blocks"] == (1 if serial else 0)    # 16 x 16 output positions


def test_scatters_are_marked_as_atomic_accumulation():
    """Interpolation gradients and index_add / scatter_add scatter with atomic adds (16-bit ones cost about
    twice fp32 ones); the forward interpolation and a plain gather do not."""
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.Upsample(scale_factor=2, mode="bilinear"))
    graph = trace(model, (torch.empty(2, 4, 8, 8),), mode="training")
    atomic = {d["op"]: d["atomic_adds"] for _, d in graph.nodes(data=True) if d["category"] == "pool"}
    assert atomic == {"aten.upsample_bilinear2d.default": False, "aten.upsample_bilinear2d_backward.default": True}

    class Scatter(torch.nn.Module):
        def forward(self, x, i):
            return torch.zeros(10, 4).index_add(0, i, x) + torch.zeros(10, 4).scatter_add(0, i[:, None].expand(-1, 4), x)
    graph = trace(Scatter(), (torch.empty(6, 4), torch.zeros(6, dtype=torch.long)))
    assert sorted(d["op"] for _, d in graph.nodes(data=True) if d.get("atomic_adds")) == [
        "aten.index_add.default", "aten.scatter_add.default"]


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_grouped_conv_backward_flops_count_each_group_once(groups):
    """Each gradient of a convolution costs what its forward does; torch's formula prices a grouped
    convolution's weight gradient over all input channels (groups times too much), ours does not."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, bias=False),
                                torch.nn.Conv2d(16, 16, 3, groups=groups, bias=False))
    graph = trace(model, (torch.empty(2, 3, 32, 32),), mode="training")
    forward = _conv_nodes(graph, "convolution")[1]
    backward = _conv_nodes(graph, "convolution_backward")[0]
    assert backward["gemm_batch"] == groups
    assert backward["flops"] == pytest.approx(2 * forward["flops"])


@pytest.mark.parametrize("groups, channels_last, reduces", [(16, False, True), (16, True, False), (4, False, False),
                                                            (1, False, False)])
def test_native_depthwise_weight_gradient_is_a_row_reduction(groups, channels_last, reduces):
    """PyTorch's own depthwise kernels (NCHW, one input channel per group) reduce each weight's gradient
    in a block over the batch and the output positions: the backward node carries those rows. cuDNN's
    grouped and channels-last convolutions, and dense ones, do not."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, bias=False),
                                torch.nn.Conv2d(16, 16, 5, stride=2, groups=groups, bias=False))
    x = torch.empty(2, 3, 34, 34)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    graph = trace(model, (x,), mode="training")
    backward = _conv_nodes(graph, "convolution_backward")[0]
    rows = (backward["row_count"], backward["row_len"])
    assert rows == ((16 * 5 * 5, 2 * 14 * 14) if reduces else (0, 0))



@pytest.mark.parametrize("precision, channels, kernel, stride, cudnn", [
    ("fp16-mixed", 32, 3, 1, True), ("fp16-mixed", 64, 5, 1, True),
    ("bf16-mixed", 32, 3, 1, False),          # bf16 stays on PyTorch's kernels
    ("fp16-mixed", 16, 3, 1, False),          # fewer than 32 channels
    ("fp16-mixed", 32, 7, 1, False),          # a 7x7 filter
    ("fp16-mixed", 32, 3, 2, False),          # stride 2: measured at PyTorch's speed
])
def test_fp16_nchw_depthwise_convolutions_that_cudnn_takes(precision, channels, kernel, stride, cudnn):
    """PyTorch hands an fp16 NCHW depthwise convolution with >= 32 channels, a 1/3/5 filter and stride 1 to
    cuDNN (variant cudnn_depthwise, forward and backward; its weight gradient is not PyTorch's row
    reduction); bf16, narrow, 7x7 and stride-2 ones run PyTorch's own kernels."""
    from gpuest.annotate.formulas.conv import CUDNN_DEPTHWISE_VARIANT
    model = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 1, bias=False),
                                torch.nn.Conv2d(channels, channels, kernel, stride=stride, padding=kernel // 2,
                                                groups=channels, bias=False))
    graph = trace(model, (torch.empty(2, 3, 28, 28),), mode="training", precision=precision)
    forward = _conv_nodes(graph, "convolution")[1]
    backward = _conv_nodes(graph, "convolution_backward")[0]
    for node in (forward, backward):
        assert (CUDNN_DEPTHWISE_VARIANT in str(node.get("variant", "")).split("+")) == cudnn
    assert (backward["row_count"] == 0) == cudnn


@pytest.mark.parametrize("dilation, groups", [(1, 1), (2, 1), (2, 32), (4, 32)])
def test_dilated_convolutions_are_a_variant_of_their_own(dilation, groups):
    """A convolution with dilation > 1 (forward and both gradients) carries DILATED_VARIANT, which the
    fit isolates: dilated depthwise layers run other, far slower kernels than undilated ones."""
    from gpuest.annotate.registry import DILATED_VARIANT, ISOLATED_VARIANTS
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 1, bias=False),
                                torch.nn.Conv2d(32, 32, 3, padding=dilation, dilation=dilation, groups=groups,
                                                bias=False))
    graph = trace(model, (torch.empty(2, 3, 16, 16),), mode="training")
    assert DILATED_VARIANT in ISOLATED_VARIANTS
    for node in (_conv_nodes(graph, "convolution")[1], _conv_nodes(graph, "convolution_backward")[0]):
        assert (DILATED_VARIANT in str(node.get("variant", "")).split("+")) == (dilation > 1)

@pytest.mark.parametrize("kernel, groups, grouped_pointwise", [(1, 1, False), (1, 8, True), (3, 8, False),
                                                             (1, 32, False)])
def test_grouped_pointwise_convolutions_are_a_variant_of_their_own(kernel, groups, grouped_pointwise):
    """A grouped 1x1 convolution with several channels per group (forward and backward) carries
    GROUPED_POINTWISE_VARIANT, which the fit isolates; a dense, a grouped 3x3 and a depthwise (32 groups of
    32 channels) layer do not."""
    from gpuest.annotate.registry import GROUPED_POINTWISE_VARIANT, ISOLATED_VARIANTS
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 1, bias=False),
                                torch.nn.Conv2d(32, 32, kernel, padding=kernel // 2, groups=groups, bias=False))
    graph = trace(model, (torch.empty(2, 3, 16, 16),), mode="training")
    assert GROUPED_POINTWISE_VARIANT in ISOLATED_VARIANTS
    for node in (_conv_nodes(graph, "convolution")[1], _conv_nodes(graph, "convolution_backward")[0]):
        assert (GROUPED_POINTWISE_VARIANT in str(node.get("variant", "")).split("+")) == grouped_pointwise


def test_im2col_launches_a_kernel_per_sample_and_col2im_one():
    """ATen's CUDA im2col loops over the batch with one kernel per sample; col2im runs one batched kernel."""
    class Fold(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.fold(torch.nn.functional.unfold(x, 3, padding=1), (14, 14), 3, padding=1)
    graph = trace(Fold(), (torch.empty(6, 8, 14, 14),))
    im2col, = nodes(graph, op="aten.im2col.default")
    col2im, = nodes(graph, op="aten.col2im.default")
    assert (im2col["kernels"], col2im["kernels"]) == (6, 1)


def test_conv_and_pool_record_their_window_and_memory_format():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)
            self.pool = torch.nn.MaxPool2d(3, 2)

        def forward(self, x):  # ConvNeXt-style: activations stored NHWC, viewed as NCHW
            return self.pool(self.conv(x.permute(0, 3, 1, 2)))
    graph = trace(Net(), (torch.empty(2, 16, 16, 8),), mode="training")
    conv, = _conv_nodes(graph, "convolution")
    assert (conv["window"], conv["channels_last"]) == (49, True)
    assert _conv_nodes(graph, "convolution_backward")[0]["channels_last"]
    pool, = nodes(graph, op="aten.max_pool2d_with_indices.default")
    assert pool["window"] == 9 and pool["channels_last"]     # the pooling kernel reads NHWC too
    plain = trace(torch.nn.Conv2d(8, 8, 3), (torch.empty(2, 8, 16, 16),))
    assert _conv_nodes(plain, "convolution")[0]["channels_last"] is False


@pytest.mark.parametrize("conv, planes", [
    (dict(kernel_size=1), 14 * 14),                       # a GEMM over the 14x14 planes as stored
    (dict(kernel_size=1, stride=2), 0),                   # strided: gathers its operand
    (dict(kernel_size=1, padding=1), 0),                  # padded: the output plane is larger
    (dict(kernel_size=3, padding=1), 0),                  # a window: implicit im2col
    (dict(kernel_size=1, groups=4), 0),                   # grouped
])
def test_conv_records_the_plane_of_a_plain_gemm(conv, planes):
    graph = trace(torch.nn.Conv2d(8, 16, **conv), (torch.empty(2, 8, 14, 14),), mode="training")
    assert _conv_nodes(graph, "convolution")[0]["gemm_plane"] == planes
    assert _conv_nodes(graph, "convolution_backward")[0]["gemm_plane"] == planes


@pytest.mark.parametrize("expr, permuted", [
    (lambda x: x.t().contiguous(), True), (lambda x: x.clone(), False),
    (lambda x: x.view(4, 8, 4, 8).permute(0, 2, 3, 1).contiguous(), True),
    (lambda x: x.to(torch.bfloat16), False), (lambda x: x.t() + 1, False),
    (lambda x: x.view(2, 16, 4, 8).transpose(1, 2).contiguous(), True),  # attention heads: outer dims only
    (lambda x: x[:, :16].contiguous(), True), (lambda x: x[:16] * 2, False),   # a slice with gaps; without
])
def test_transposing_copies_are_flagged(expr, permuted):
    """A copy that reads one memory order and writes another cannot coalesce both sides."""
    class Fn(torch.nn.Module):
        def forward(self, x):
            return expr(x)
    graph = trace(Fn(), (torch.empty(32, 32),))
    (node,) = [d for _, d in graph.nodes(data=True) if not d["free"]]
    assert node["permuted"] is permuted


@pytest.mark.parametrize("expr, kernels, permuted, variant", [
    (lambda x: torch.cat((x, x + 1), 1), 1, False, ""),                  # dense inputs: one vectorised batch
    (lambda x: torch.cat((x[..., 4:], x[..., :4]), -1), 1, True, "strided"),   # rotate_half: a strided batch
    (lambda x: torch.cat((x[:, :, :1], x + 1), 2), 1, True, "strided"),  # EVA's class token kept apart
    (lambda x: torch.stack((x[..., 1::2], x[..., ::2]), -1), 2, True, ""),   # 5-d: a strided copy per input
    (lambda x: torch.stack((x, x + 1), 0), 2, False, ""),                # 5-d along the outermost: dense copies
])
def test_cat_prices_the_path_cuda_takes(expr, kernels, permuted, variant):
    """CUDA's cat: a batched vectorised kernel for dense inputs of at most 4 dims, a batched strided one
    for other strides, else one copy per input (strided where its narrow of the output has gaps)."""
    class Fn(torch.nn.Module):
        def forward(self, x):
            return expr(x)
    graph = trace(Fn(), (torch.empty(2, 3, 16, 8, dtype=torch.bfloat16),))
    (node,) = [d for _, d in graph.nodes(data=True) if d["op"].split(".")[1] in ("cat", "stack")]
    assert (node["kernels"], node["permuted"], node["variant"]) == (kernels, permuted, variant)


@pytest.mark.parametrize("shape, expr, dtype, amplification", [
    ((1024, 1024), lambda x: x.t().contiguous(), torch.float32, 8.0),   # every element in its own 32-byte sector
    ((1024, 1024), lambda x: x.t().contiguous(), torch.bfloat16, 16.0),
    ((64, 64), lambda x: x.t().contiguous(), torch.float32, 1.0),       # a block's 8 rows fill each sector
    ((4, 64, 8, 64), lambda x: x.transpose(1, 2).contiguous(), torch.float32, 1.0),   # heads: rows of 64 move whole
    ((2, 3, 32, 32), lambda x: x.contiguous(memory_format=torch.channels_last), torch.float32, 1.0),  # 3 long runs
    ((2, 3, 32, 32), lambda x: x.contiguous(memory_format=torch.channels_last).contiguous(), torch.float32, 3.0),
    ((64, 64), lambda x: x.clone(), torch.float32, 1.0),
])
def test_permuted_reads_count_the_sectors_a_loop_block_touches(shape, expr, dtype, amplification):
    """A strided copy's read pattern: sectors a block of 512 output elements reads over those its bytes fill."""
    class Fn(torch.nn.Module):
        def forward(self, x):
            return expr(x)
    graph = trace(Fn(), (torch.empty(*shape, dtype=dtype),))
    node = [d for _, d in graph.nodes(data=True) if not d["free"]][-1]
    assert node["read_amplification"] == pytest.approx(amplification, rel=0.05)


def test_causal_attention_records_the_skipped_tiles():
    from gpuest.annotate.formulas.attention import causal_kept_fraction

    assert causal_kept_fraction(4, 4, 0) == 1.0
    assert causal_kept_fraction(4, 4, 1) == pytest.approx(10 / 16)          # rows see 1, 2, 3, 4 keys
    assert causal_kept_fraction(2, 4, 2) == pytest.approx((3 + 4) / 8)      # bottom-right: 3 and 4 keys
    assert causal_kept_fraction(2, 4, 1) == pytest.approx((1 + 2) / 8)      # top-left: 1 and 2 keys
    graph = trace(CausalSelfAttention(), (torch.empty(2, 512, 64),), mode="training", precision="bf16")
    fwd, bwd = nodes(graph, category="attention")
    for node in (fwd, bwd):  # 4 query tiles of 128: tiles on and below the diagonal, 10 of 16
        assert node["flops_skipped"] == pytest.approx(node["flops"] * 6 / 16)
    full = trace(CausalSelfAttention(explicit_mask=True), (torch.empty(2, 512, 64),), precision="bf16")
    assert nodes(full, category="attention")[0]["flops_skipped"] == 0.0


def test_mixed_precision_follows_cuda_autocast():
    """CUDA autocast runs pow, layer norm and softmax in fp32 where CPU autocast (the trace's) would not;
    GEMMs stay in 16 bits."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.ln = torch.nn.LayerNorm(16)

        def forward(self, x):
            h = self.fc(x)
            return self.ln(torch.softmax(h * torch.pow(h, 3.0), -1))
    graph = trace(Block(), (torch.empty(4, 16),), precision="bf16-mixed")
    dtype = {d["op"]: d["dtype"] for _, d in graph.nodes(data=True) if not d["free"]}
    assert dtype["aten.addmm.default"] == "bfloat16"
    assert dtype["aten.pow.Tensor_Scalar"] == "float32"
    assert dtype["aten._softmax.default"] == "float32"
    assert dtype["aten.native_layer_norm.default"] == "float32"


def test_promoting_ops_take_the_widest_input_dtype_as_cuda_autocast_does():
    """Under bf16 autocast a cuDNN LSTM returns fp16 (its autocast kernel casts to half); CUDA concatenates two such
    outputs in fp16 and promotes fp16 with bf16 to fp32, where CPU autocast refuses fp16 (Sequencer2d's
    bidirectional LSTMs failed to trace)."""
    class TwoLSTMs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rows = torch.nn.LSTM(16, 8, batch_first=True, bidirectional=True)
            self.cols = torch.nn.LSTM(16, 8, batch_first=True, bidirectional=True)

        def forward(self, x):
            v, h = self.rows(x)[0], self.cols(x)[0]
            return torch.cat([v, h], -1), torch.stack([v, x.to(torch.bfloat16)])
    graph = trace(TwoLSTMs(), (torch.empty(2, 5, 16),), precision="bf16-mixed")
    assert [d["dtype"] for d in nodes(graph, op="aten.cat.default")] == ["float16"]
    assert [d["dtype"] for d in nodes(graph, op="aten.stack.default")] == ["float32"]


def test_conv_bias_is_a_separate_add_as_on_cuda():
    """cuDNN convolves without the bias and PyTorch adds it after (a broadcast add); its gradient is a
    separate reduction. PyTorch's own depthwise kernel keeps it inside."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3, groups=8))
    graph = trace(model, (torch.empty(2, 3, 16, 16),), mode="training")
    ops = [(d["op"], d["phase"]) for _, d in graph.nodes(data=True) if not d["free"]]
    assert ops.index(("aten.add_.Tensor", "forward")) == ops.index(("aten.convolution.default", "forward")) + 1
    add, = nodes(graph, op="aten.add_.Tensor")
    assert add["broadcast"] and add["category"] == "elementwise"
    assert ("aten.sum.dim_IntList", "backward") in ops            # grad of the first conv's bias
    assert len(nodes(graph, op="aten.add_.Tensor")) == 1          # the depthwise conv's bias stays fused
    # the FLOPs of the convolutions themselves are unchanged
    assert flops(graph, phase="forward") == pytest.approx(flops(trace(model, (torch.empty(2, 3, 16, 16),)), phase="forward"))


def test_depthwise_conv_of_channels_last_data_adds_its_bias_after():
    """PyTorch's depthwise kernels take NCHW data only: on channels-last activations (ConvNeXt) the
    convolution runs in cuDNN and the bias is a separate broadcast add, as for dense convolutions."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)

        def forward(self, x):  # activations stored NHWC, viewed as NCHW
            return self.dw(x.permute(0, 3, 1, 2))
    channels_last = trace(Net(), (torch.empty(2, 16, 16, 8),), mode="training")
    add, = nodes(channels_last, op="aten.add_.Tensor")
    assert add["broadcast"]
    nchw = trace(Net().dw, (torch.empty(2, 8, 16, 16),), mode="training")
    assert not nodes(nchw, op="aten.add_.Tensor")


def test_mixed_dtype_and_broadcast_flags():
    class Fn(torch.nn.Module):
        def forward(self, x, y, b):
            return (x + y) * b
    graph = trace(Fn(), (torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(8, 16), torch.empty(16)))
    add, mul = [d for _, d in graph.nodes(data=True) if not d["free"]]
    assert (add["mixed_dtypes"], add["broadcast"]) == (True, False)
    assert (mul["mixed_dtypes"], mul["broadcast"]) == (False, True)
    assert (add["broadcast_run"], mul["broadcast_run"]) == (0, 1)   # a value per element of the last dim


def test_a_single_element_parameter_of_another_dtype_is_a_mixed_dtype_operand():
    """A 0-dim fp32 gain scaling a bf16 activation is an operand on the GPU, read through TensorIterator's
    casting path; a Python number is a kernel constant and leaves the op single-dtype."""
    class Gain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x.mul(self.gain), x.mul(2.0)
    x = torch.empty(8, 16, dtype=torch.bfloat16)
    by_param, by_number = [d for _, d in trace(Gain(), (x,)).nodes(data=True) if not d["free"]]
    assert by_param["mixed_dtypes"] and not by_number["mixed_dtypes"]


@pytest.mark.parametrize("pad, kernels", [((1, 1, 1, 1), 2), ((-1, -1, 0, 0), 1)])
def test_constant_pad_fills_the_output_then_copies_the_input_in(pad, kernels):
    """CUDA's constant_pad_nd fills the whole output, then copies the input into its interior: two kernels,
    the interior written twice. With no positive pad it is a copy of the narrowed input."""
    class Pad(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.pad(x, pad)
    x = torch.empty(2, 8, 16, 16)
    (node,) = [d for _, d in trace(Pad(), (x,)).nodes(data=True) if not d["free"]]
    out_bytes = 2 * 8 * (16 + pad[2] + pad[3]) * (16 + pad[0] + pad[1]) * 4
    assert node["kernels"] == kernels
    assert node["bytes_written"] == out_bytes + (x.numel() * 4 if kernels == 2 else 0)


@pytest.mark.parametrize("fn, memory_format, run", [
    (lambda x, c: x + c.view(8, 1, 1), torch.contiguous_format, 36),        # per-channel bias over 6x6 planes
    (lambda x, c: x * x.mean((2, 3), keepdim=True), torch.contiguous_format, 36),   # squeeze-excite scale
    (lambda x, c: x + c.view(8, 1, 1), torch.channels_last, 1),             # channels innermost: every element
    (lambda x, c: x + x[:1], torch.contiguous_format, 1),                   # a sample over the batch: a new
                                                                            # value every element
    (lambda x, c: F.batch_norm(x, c, c + 1, training=False), torch.contiguous_format, 36),
    (lambda x, c: F.batch_norm(x, c, c + 1, training=False), torch.channels_last, 1),
    (lambda x, c: c.view(8, 1, 1).expand(4, 8, 6, 6) / 2.0, torch.contiguous_format, 36),   # an expanded view
    (lambda x, c: x.sum().expand(4, 8, 6, 6) / 2.0, torch.contiguous_format, 1152),  # a mean's backward: one value
])
def test_broadcast_ops_record_the_run_over_which_the_expanded_value_holds(fn, memory_format, run):
    class Fn(torch.nn.Module):
        def forward(self, x, c):
            return fn(x, c)
    graph = trace(Fn(), (torch.empty(4, 8, 6, 6).to(memory_format=memory_format), torch.empty(8)))
    node, = [d for _, d in graph.nodes(data=True) if d["broadcast"]]
    assert node["broadcast_run"] == run
    # only eval batch norm's per-channel kernel walks the planes (its row segment, with no rows to reduce);
    # on channels-last data it reads the channels' values in turn, a row of 8 per pixel (4 x 6 x 6 pixels)
    walks = "batch_norm" in node["op"] and run > 1
    nhwc = "batch_norm" in node["op"] and memory_format == torch.channels_last
    assert (node["row_segment"], node["row_count"], node["row_len"]) == ((run if walks else 0), 144 * nhwc, 8 * nhwc)
    assert node["variant"] == ("nhwc" if nhwc else "")


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_on_channels_last_data_is_the_isolated_nhwc_variant(training):
    """Every batch norm kernel of a channels-last activation (forward, backward, eval) carries NHWC_VARIANT, one
    of the variants the residual fit prices alone; on NCHW data none does."""
    from gpuest.annotate.registry import ISOLATED_VARIANTS, NHWC_VARIANT
    assert NHWC_VARIANT in ISOLATED_VARIANTS
    for memory_format, variant in ((torch.channels_last, NHWC_VARIANT), (torch.contiguous_format, "")):
        graph = trace(torch.nn.BatchNorm2d(8), (torch.empty(4, 8, 6, 6).to(memory_format=memory_format),),
                      mode="training" if training else "inference")
        norms = [d for _, d in graph.nodes(data=True) if "batch_norm" in d["op"]]
        assert len(norms) == (2 if training else 1)
        assert {d["variant"] for d in norms} == {variant}


def test_embedding_lookups_record_one_row_per_index():
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(1000, 64)

        def forward(self, idx):
            return self.table(idx)
    graph = trace(Lookup(), (torch.zeros(8, 32, dtype=torch.long),), mode="training")
    nodes = {d["op"]: d for _, d in graph.nodes(data=True) if d.get("category") == "embedding"}
    for op in ("aten.embedding.default", "aten.embedding_dense_backward.default"):
        assert (nodes[op]["row_count"], nodes[op]["row_len"]) == (8 * 32, 64), op


@pytest.mark.parametrize("tokens,sorted_path", [(512, False), (3072, False), (3073, True), (16384, True)])
def test_embedding_backward_takes_pytorchs_path_for_its_index_count(tokens, sorted_path):
    emb = torch.nn.Embedding(50257, 768, device="meta")
    g = trace(emb, (torch.zeros(tokens, dtype=torch.long, device="meta"),), mode="training")
    (bwd,) = [d for _, d in g.nodes(data=True) if d["op"] == "aten.embedding_dense_backward.default"]
    assert bwd["host_syncs"] == (2 if sorted_path else 0)
    assert (bwd["kernels"] > 2) == sorted_path
    # Either way the whole weight gradient is zeroed: at least vocab x width x 4 bytes written.
    assert bwd["bytes_written"] >= 50257 * 768 * 4
    assert bwd["row_count"] == tokens and bwd["row_len"] == 768
    # The direct kernel walks the indices 32 at a time, each chunk waiting on memory; the sorting path
    # spreads them over the GPU.
    assert (bwd["serial_steps"] == 0) == sorted_path
    if not sorted_path:
        from gpuest.annotate.formulas.embedding import EMBEDDING_BWD_CHUNK, EMBEDDING_BWD_CHUNK_TRIPS
        assert EMBEDDING_BWD_CHUNK == 32   # BLOCKDIMY, the warps of a block, one index each
        assert bwd["serial_steps"] == EMBEDDING_BWD_CHUNK_TRIPS * math.ceil(tokens / 32)


def test_reading_a_gpu_value_on_the_host_synchronises_a_cpu_value_does_not():
    # A device value read on the host (.item()) cannot be traced on fake tensors, but the optimizer's
    # CPU step counts are read in every training graph: only the former waits for the GPU.
    from gpuest.annotate.registry import OpCall, REGISTRY
    op = torch.ops.aten._local_scalar_dense.default
    cost = lambda t: REGISTRY.lookup(op)(OpCall(op, (t,), {}, 1.0))  # noqa: E731
    assert cost(torch.ones((), device="meta")).host_syncs == 1
    assert cost(torch.ones(())).host_syncs == 0
    g = trace(torchvision.models.resnet18(num_classes=10).to("meta"), (torch.empty(2, 3, 32, 32, device="meta"),),
              mode="training")
    reads = [d for _, d in g.nodes(data=True) if d["op"] == "aten._local_scalar_dense.default"]
    assert reads and not any(d["host_syncs"] for d in reads)


def test_ops_dispatched_under_autocast_are_marked():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("meta")
    x = (torch.empty(4, 8, device="meta"),)
    mixed = trace(model, x, mode="training", precision="bf16-mixed")
    by_phase = {}
    for _, d in mixed.nodes(data=True):
        by_phase.setdefault(d["phase"], set()).add(d["autocast"])
    assert by_phase["forward"] == {True}
    assert by_phase["backward"] == {False} and by_phase["optimizer"] == {False}
    assert not any(d["autocast"] for _, d in trace(model, x, mode="training").nodes(data=True))


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_a_recurrent_layer_launches_cudnns_kernels_whatever_the_cpu_path_decomposes_it_into(cls):
    # The CPU runs an LSTM as one op per layer but a GRU as a dozen ops per step; on CUDA both are
    # one cuDNN call: per layer and direction a GEMM and a cell kernel per step plus the input GEMM
    # (hidden sizes above PERSISTENT_RNN_MAX_HIDDEN; narrower ones: test_price's persistent-kernel test).
    from gpuest.annotate.formulas.rnn import PERSISTENT_RNN_MAX_HIDDEN, cudnn_rnn_kernels
    steps, layers, hidden = 16, 2, 2 * PERSISTENT_RNN_MAX_HIDDEN
    for bidirectional in (False, True):
        rnn = cls(32, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional).to("meta")
        g = trace(rnn, (torch.empty(4, steps, 32, device="meta"),), mode="training")
        nodes = {d["phase"]: d for _, d in g.nodes(data=True) if d["category"] == "rnn"}
        per = layers * (2 if bidirectional else 1)
        assert nodes["forward"]["kernels"] == per * cudnn_rnn_kernels(steps)
        assert nodes["backward"]["kernels"] == per * cudnn_rnn_kernels(steps, backward=True)


def test_a_recurrent_model_traced_on_its_own_keeps_its_loss_and_optimizer_apart():
    g = trace(torch.nn.GRU(32, 32, batch_first=True).to("meta"), (torch.empty(4, 8, 32, device="meta"),),
              mode="training")
    fused = {d["phase"] for _, d in g.nodes(data=True) if d["category"] == "rnn"}
    assert fused == {"forward", "backward"}
    assert any(d["phase"] == "optimizer" and d["category"] == "optimizer" for _, d in g.nodes(data=True))


class _NormOfTransposed(torch.nn.Module):
    """A layer norm and a softmax over a transposed view, as after nn.MultiheadAttention(batch_first=True)."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.transposed = transposed

    def forward(self, x):
        if self.transposed:
            x = x.transpose(0, 1)
        return self.norm(x).softmax(-1) if not self.transposed else self.norm(x).transpose(0, 1).softmax(-1)


@pytest.mark.parametrize("transposed", [True, False])
def test_kernels_that_need_contiguous_inputs_record_their_copies(transposed):
    """Layer norm and softmax copy a non-contiguous input first (forward and backward): a copy node per
    such input, recorded just before its op and marked with it; contiguous inputs get none."""
    graph = trace(_NormOfTransposed(transposed), (torch.empty(16, 8, 64),), mode="training")
    order = [d for _, d in sorted(graph.nodes(data=True)) if not d["free"]]
    staged = [(i, d) for i, d in enumerate(order) if d["staged_for"]]
    if not transposed:
        assert staged == []
        return
    owners = {d["staged_for"] for _, d in staged}
    # (softmax's backward reads its own contiguous output and the contiguous gradient of it: no copy)
    assert owners == {"aten.native_layer_norm.default", "aten.native_layer_norm_backward.default",
                      "aten._softmax.default"}
    x_bytes = 16 * 8 * 64 * 4
    for i, d in staged:
        assert d["op"] == "aten.clone.default" and d["category"] == "copy"
        assert d["bytes_read"] == d["bytes_written"] == x_bytes
        assert order[i + 1]["cpu_op"] == d["staged_for"] or order[i + 1]["staged_for"] == d["staged_for"]


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_convolution_of_a_channel_split_copies_its_half_first(channels_last):
    """ShuffleNet convolves one half of x.chunk(2, dim=1), a strided view: each convolution backend copies
    it to a dense layout first, forward and (its saved input) backward, and backward also the gradient,
    here a slice of cat's; a dense input is taken as is."""
    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            return torch.cat([a, self.conv(b)], 1)
    x = torch.empty(2, 16, 8, 8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    graph = trace(Split(), (x,), mode="training")
    staged = [d for _, d in graph.nodes(data=True) if d["staged_for"]]
    assert [d["staged_for"] for d in staged] == ["aten.convolution.default"] + \
        ["aten.convolution_backward.default"] * 2
    assert all(d["bytes_read"] == 2 * 8 * 8 * 8 * 4 and d["permuted"] for d in staged)
    plain = trace(torch.nn.Conv2d(8, 8, 1), (torch.empty(2, 8, 8, 8),), mode="training")
    assert not any(d["staged_for"] for _, d in plain.nodes(data=True))


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_channels_last_group_norm_copies_its_input_to_nchw_first(channels_last):
    """aten::group_norm gives CUDA's kernel input.contiguous() (a CPU input keeps its layout, the branch a
    CPU trace takes): a channels-last input costs one copy to NCHW, recorded before the norm; training's
    backward reads the saved contiguous copy and adds none. An NCHW input is taken as is."""
    x = torch.empty(4, 32, 14, 14)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    graph = trace(torch.nn.GroupNorm(4, 32), (x,), mode="training")
    order = [d for _, d in sorted(graph.nodes(data=True)) if not d["free"]]
    staged = [(i, d) for i, d in enumerate(order) if d["staged_for"]]
    if not channels_last:
        assert staged == []
        return
    assert [d["staged_for"] for _, d in staged] == ["aten.native_group_norm.default"]
    i, copy = staged[0]
    assert copy["op"] == "aten.clone.default" and copy["bytes_read"] == copy["bytes_written"] == x.numel() * 4
    assert order[i + 1]["cpu_op"] == "aten.native_group_norm.default"


def test_a_roll_over_two_dimensions_is_two_passes():
    """CUDA's roll moves one dimension per kernel (Swin's shifted windows roll two)."""
    class Rolls(torch.nn.Module):
        def forward(self, x):
            return torch.roll(x, (3, 3), (1, 2)), torch.roll(x, 2, 1)
    graph = trace(Rolls(), (torch.empty(2, 8, 8, 4),))
    two, one = nodes(graph, op="aten.roll.default")
    assert (two["kernels"], one["kernels"]) == (2, 1)
    assert two["bytes_read"] == two["bytes_written"] == 2 * one["bytes_read"] == 2 * 2 * 8 * 8 * 4 * 4
    assert two["permuted"] and two["read_amplification"] == 1.0    # index-mapped, one element per lane


def _attention_ops(batch_first: bool, training: bool, need_weights: bool, precision: str = "bf16") -> list[str]:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=batch_first)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=need_weights)[0]

    g = trace(Block(), torch.randn(2, 16, 64), mode="training" if training else "inference", precision=precision)
    return [d["op"] for _, d in g.nodes(data=True) if d["phase"] == "forward" and not d.get("free")]


def test_multihead_attention_inference_traces_cudas_fused_fast_path():
    """In eval without grad or autocast, CUDA runs nn.MultiheadAttention as one biased QKV GEMM, fused SDPA and
    the output projection; the Python path (transposed copy, GEMM, bias add, head-split copy) is what the
    other recipes run."""
    fast = _attention_ops(batch_first=True, training=False, need_weights=False)
    assert fast == ["aten.addmm.default", "aten._scaled_dot_product_flash_attention.default", "aten.addmm.default"]
    for slow in (_attention_ops(batch_first=True, training=True, need_weights=False),
                 _attention_ops(batch_first=False, training=False, need_weights=False),
                 _attention_ops(batch_first=True, training=False, need_weights=True),
                 _attention_ops(batch_first=True, training=False, need_weights=False, precision="bf16-mixed")):
        assert "aten.clone.default" in slow or "aten.mm.default" in slow or "aten.bmm.default" in slow, slow


def test_attention_with_a_learned_bias_traces_as_cudas_memory_efficient_kernel():
    """A relative-position bias trained with the model (BEiT, Swin) is an SDPA mask that requires grad: CUDA
    runs the memory-efficient kernel, which returns the bias's gradient; the CPU would take the math path."""
    import collections

    class BiasedAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(4, 49, 49))
            self.qkv = torch.nn.Linear(128, 3 * 128)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, 4, 32).permute(2, 0, 3, 1, 4)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.unsqueeze(0))
            return out.transpose(1, 2).reshape(b, n, c)

    g = trace(BiasedAttention(), (torch.empty(2, 49, 128),), mode="training", precision="bf16-mixed")
    ops = collections.Counter(d["op"] for _, d in g.nodes(data=True) if not d.get("free"))
    assert ops["aten._scaled_dot_product_efficient_attention.default"] == 1
    assert ops["aten._scaled_dot_product_efficient_attention_backward.default"] == 1
    assert not ops["aten.bmm.default"] and not ops["aten._softmax.default"]
    # 49 keys: ATen pads the bias to the kernel's alignment (one copy forward, its slice backward)
    assert ops["aten.constant_pad_nd.default"] >= 1
    # the backward that writes the bias's gradient is priced as its own kernel variant; a fixed mask's is not
    backward = [d for _, d in g.nodes(data=True)
                if d["op"] == "aten._scaled_dot_product_efficient_attention_backward.default"]
    assert [d["variant"] for d in backward] == ["bias_grad"]
    model = BiasedAttention()
    model.bias.requires_grad_(False)
    fixed = trace(model, (torch.empty(2, 49, 128),), mode="training", precision="bf16-mixed")
    assert {d["variant"] for _, d in fixed.nodes(data=True) if "attention_backward" in d["op"]} == {""}


def test_attention_with_a_mask_the_cpu_flash_kernel_rejects_traces_as_cudas_memory_efficient_kernel():
    """MaxViT's relative-position bias is a (heads, queries, keys) mask: CUDA's memory-efficient kernel
    broadcasts it, in inference too, while the CPU's flash kernel takes only 2-d or 4-d masks and a CPU trace
    would decompose the call (fp32 casts, batched GEMMs, softmax). A 2-d mask stays the CPU flash call,
    which is named as CUDA's kernel; a boolean mask is made additive first, as ATen does."""
    import collections

    def attention_ops(mask_shape, dtype=torch.bfloat16):
        class MaskedAttention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("mask", torch.zeros(mask_shape, dtype=dtype))

            def forward(self, x):
                q = x.reshape(x.shape[0], 49, 4, 32).transpose(1, 2)
                return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.mask)

        g = trace(MaskedAttention(), (torch.empty(2, 49, 128),), mode="inference", precision="bf16")
        return collections.Counter(d["op"] for _, d in g.nodes(data=True) if not d.get("free"))

    for shape in ((4, 49, 49), (1, 49, 49)):
        ops = attention_ops(shape)
        assert ops["aten._scaled_dot_product_efficient_attention.default"] == 1, (shape, ops)
        assert not ops["aten.bmm.default"] and not ops["aten._safe_softmax.default"], (shape, ops)
        assert not ops["aten._to_copy.default"], (shape, ops)
    boolean = attention_ops((4, 49, 49), dtype=torch.bool)
    assert boolean["aten._scaled_dot_product_efficient_attention.default"] == 1
    assert boolean["aten.where.self"] == 1 and boolean["aten.logical_not.default"] == 1
    plain = attention_ops((49, 49))
    assert plain["aten._scaled_dot_product_efficient_attention.default"] == 1
    assert not plain["aten.constant_pad_nd.default"] and not plain["aten.bmm.default"]


class _ClassTokenBlock(torch.nn.Module):
    """CaiT-style: a block gets a view of a parameter as an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 8))
        self.block = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.cls_token.expand(x.shape[0], -1, -1)) + x[:, :1]


def test_inference_traces_a_parameter_view_passed_to_a_module():
    """Under no_grad such a view requires grad but has no autograd node; module tracking must not need one."""
    g = trace(_ClassTokenBlock(), (torch.randn(4, 3, 8),), mode="inference")
    assert any(d["module"].endswith("block") for _, d in g.nodes(data=True))
    g = trace(_ClassTokenBlock(), (torch.randn(4, 3, 8),), mode="training")
    assert any(d["phase"] == "backward" and d["module"].endswith("block") for _, d in g.nodes(data=True))


def test_out_of_place_masked_fill_is_a_clone_then_an_in_place_fill():
    """CUDA runs masked_fill as clone + masked_fill_: two kernels, the output written by the clone, read back
    and written again by the fill; the in-place masked_fill_ is the fill alone."""
    class Fill(torch.nn.Module):
        def forward(self, x, mask):
            return x.masked_fill(mask, 0.0), x.clone().masked_fill_(mask, 1.0)
    x = torch.empty(8, 4, 64, 64, dtype=torch.bfloat16)
    mask = torch.empty(8, 1, 64, 64, dtype=torch.bool)
    nodes = {d["op"].split(".")[1]: d for _, d in trace(Fill(), (x, mask)).nodes(data=True)}
    out, fill = nodes["masked_fill"], nodes["masked_fill_"]
    x_bytes, mask_bytes = x.numel() * 2, mask.numel()
    assert (out["kernels"], fill["kernels"]) == (2, 1)
    assert out["bytes_read"] == 2 * x_bytes + mask_bytes and out["bytes_written"] == 2 * x_bytes
    assert fill["bytes_read"] == x_bytes + mask_bytes and fill["bytes_written"] == x_bytes


def test_fills_write_their_output_and_read_nothing():
    """zeros_like/new_zeros take a tensor for its shape and dtype, fill_/zero_ overwrite theirs: each only
    writes its output, and a small template does not make a new_zeros a broadcast read."""
    class Fills(torch.nn.Module):
        def forward(self, x, small):
            a = torch.zeros_like(x)
            b = small.new_zeros(x.shape)
            c = torch.empty_like(x).fill_(2.0)
            return a, b, c, x.clone().zero_()
    x = torch.empty(64, 1024, dtype=torch.bfloat16)
    graph = trace(Fills(), (x, torch.empty(4, dtype=torch.bfloat16)))
    fills = [d for _, d in graph.nodes(data=True)
             if d["op"].split(".")[1] in ("zeros_like", "new_zeros", "fill_", "zero_")]
    assert len(fills) == 4
    for d in fills:
        assert d["bytes_read"] == 0 and d["bytes_written"] == x.numel() * 2 and not d["broadcast"], d["op"]
