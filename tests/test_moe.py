"""Mixture-of-experts models trace under an explicit routing assumption (`gpuest.capture.routing`) and
their grouped GEMMs are priced as routed. Tiny configs (hidden 64, 2 layers, 8 experts) keep it to seconds."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import transformers

from gpuest.capture.models import load_model
from gpuest.capture.routing import assignment, parse_routing, slot_counts
from gpuest.capture.trace import routing_decisions, trace, unsupported_ops
from gpuest.cli import main
from gpuest.errors import RoutingError
from gpuest.price.estimate import estimate_graph

HIDDEN, FFN, LAYERS, EXPERTS, TOP_K, BATCH, SEQ = 64, 128, 2, 8, 2, 2, 16
TOKENS = BATCH * SEQ
COMMON = dict(vocab_size=256, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, intermediate_size=FFN, num_local_experts=EXPERTS,
                                                  num_experts_per_tok=TOP_K),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**COMMON, intermediate_size=FFN, moe_intermediate_size=FFN,
                                                     shared_expert_intermediate_size=FFN, num_experts=EXPERTS,
                                                     num_experts_per_tok=TOP_K),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, intermediate_size=FFN, moe_intermediate_size=FFN,
                                                     num_experts=EXPERTS, num_experts_per_tok=TOP_K, head_dim=16),
    "olmoe": lambda: transformers.OlmoeConfig(**COMMON, intermediate_size=FFN, num_experts=EXPERTS,
                                              num_experts_per_tok=TOP_K, pad_token_id=1, eos_token_id=2),
    "gpt_oss": lambda: transformers.GptOssConfig(**COMMON, intermediate_size=FFN, num_local_experts=EXPERTS,
                                                 num_experts_per_tok=TOP_K, head_dim=16),
}
# Each routed token slot multiplies by the gate+up (2 x FFN outputs) and the down projection.
EXPERT_FLOPS_PER_LAYER = 2.0 * TOKENS * TOP_K * HIDDEN * FFN * 3


def build(kind: str, impl: str = "grouped_mm") -> torch.nn.Module:
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(CONFIGS[kind](), experts_implementation=impl,
                                                             attn_implementation="eager")


def inputs() -> dict:
    return {"input_ids": torch.empty((BATCH, SEQ), dtype=torch.int64, device="meta")}


def expert_nodes(graph, phase: str = "forward", op: str | None = None) -> list[dict]:
    return [d for _, d in graph.nodes(data=True) if d["phase"] == phase and ".experts" in d["module"]
            and d["category"] == "matmul" and (op is None or d["op"] == op)]


# ------------------------------------------------------------------ the assumption

@pytest.mark.parametrize("spec, message", [
    ("0.5,0.3", "sum to 1"), ([0.5, -0.1, 0.6], ">= 0"), ("skewed:1.5", "(0, 1)"), ("skewed", "(0, 1)"),
    ("skewed:abc", "(0, 1)"), ("hot", "unknown routing"), ([1.0], "at least 2"), (3, "string or a sequence"),
])
def test_bad_routing_is_a_specific_error(spec, message):
    with pytest.raises(RoutingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_routing(spec)


def test_routing_round_trips_through_its_description():
    for spec in ("balanced", "skewed:0.3", "0.5,0.25,0.25"):
        assert parse_routing(parse_routing(spec).describe()) == parse_routing(spec)


@pytest.mark.parametrize("shares, tokens, k", [
    ([1 / 8] * 8, 32, 2), ([0.5] + [0.5 / 7] * 7, 32, 2), ([0.3, 0.3, 0.4], 7, 1), ([0.25] * 4, 5, 2)])
def test_assignment_realises_the_counts_with_distinct_experts_per_token(shares, tokens, k):
    counts = slot_counts(np.asarray(shares), tokens, k)
    assert counts.sum() == tokens * k and counts.max() <= tokens
    assert np.all(np.abs(counts - np.asarray(shares) * tokens * k) < 1.0 + 1e-9)
    choice = assignment(counts, tokens, k)
    assert choice.shape == (tokens, k)
    assert np.array_equal(np.bincount(choice.ravel(), minlength=len(counts)), counts)
    assert all(len(set(row)) == k for row in choice.tolist())


def test_fraction_count_must_match_the_experts():
    with pytest.raises(RoutingError, match="8 experts"):
        trace(build("mixtral"), inputs(), routing=[0.25] * 4)


def test_a_share_above_one_over_top_k_cannot_hold():
    with pytest.raises(RoutingError, match="top_k=2"):
        trace(build("mixtral"), inputs(), routing="skewed:0.6")


# ------------------------------------------------------------------ grouped GEMMs and the eager loop

@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-mixed"])
def test_mixtral_grouped_gemm_flops_under_balanced_routing(precision):
    g = trace(build("mixtral"), inputs(), precision=precision)
    assert unsupported_ops(g) == {}
    grouped = expert_nodes(g, op="aten._grouped_mm.default")
    assert len(grouped) == 2 * LAYERS
    assert sum(d["flops"] for d in grouped) == pytest.approx(EXPERT_FLOPS_PER_LAYER * LAYERS)
    # Balanced: every expert's group holds tokens * top_k / experts rows.
    assert {d["gemm_m"] for d in grouped} == {TOKENS * TOP_K // EXPERTS}
    assert {d["gemm_m_max"] for d in grouped} == {TOKENS * TOP_K // EXPERTS}
    assert {d["gemm_batch"] for d in grouped} == {EXPERTS}
    # CUDA runs bf16 in one grouped kernel; fp32 (also under autocast: transformers casts to the fp32
    # weights) loops over one mm per group after reading the offsets on the host.
    fallback = precision != "bf16"
    assert {d["kernels"] for d in grouped} == {EXPERTS if fallback else 1}
    assert {d["host_syncs"] for d in grouped} == {int(fallback)}
    assert routing_decisions(g)[0]["tokens_per_expert"] == [TOKENS * TOP_K // EXPERTS] * EXPERTS


def test_mixtral_training_backward_grouped_gemms_double_the_forward():
    g = trace(build("mixtral"), inputs(), mode="training", precision="bf16")
    assert unsupported_ops(g) == {}
    forward = sum(d["flops"] for d in expert_nodes(g, "forward", "aten._grouped_mm.default"))
    backward = sum(d["flops"] for d in expert_nodes(g, "backward", "aten._grouped_mm.default"))
    assert forward == pytest.approx(EXPERT_FLOPS_PER_LAYER * LAYERS)
    assert backward == pytest.approx(2 * forward)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_eager_expert_loop_traces_with_routed_token_counts(mode):
    g = trace(build("mixtral", "eager"), inputs(), mode=mode, precision="bf16-mixed")
    assert unsupported_ops(g) == {}
    mms = expert_nodes(g)
    assert len(mms) == 2 * EXPERTS * LAYERS   # gate_up and down per expert hit, per layer
    assert {d["gemm_m"] for d in mms} == {TOKENS * TOP_K // EXPERTS}
    assert sum(d["flops"] for d in mms) == pytest.approx(EXPERT_FLOPS_PER_LAYER * LAYERS)
    # Each expert's index is read on the host four times, as on the device: `if expert_idx == num_experts`
    # and three indexings by the 0-d index tensor (expert_mask, gate_up_proj, down_proj).
    reads = [d for _, d in g.nodes(data=True) if d["op"] == "aten._local_scalar_dense.default" and d["phase"] == "forward"]
    assert len(reads) == 4 * EXPERTS * LAYERS


@pytest.mark.parametrize("impl", ["grouped_mm", "eager"])
def test_skewed_routing_grows_the_hottest_experts_gemm(impl):
    balanced = trace(build("mixtral", impl), inputs(), precision="bf16")
    skewed = trace(build("mixtral", impl), inputs(), precision="bf16", routing="skewed:0.5")
    hottest = TOKENS * TOP_K // 2
    if impl == "grouped_mm":
        rows = [d["gemm_m_max"] for d in expert_nodes(skewed)]
    else:
        rows = [d["gemm_m"] for d in expert_nodes(skewed)]
    assert max(rows) == hottest > TOKENS * TOP_K // EXPERTS
    # The same routed slots in total: the same FLOPs.
    assert sum(d["flops"] for d in expert_nodes(skewed)) == pytest.approx(
        sum(d["flops"] for d in expert_nodes(balanced)))
    assert skewed.graph["routing"] == "skewed:0.5"


def test_uneven_groups_are_not_read_as_a_misaligned_gemm():
    """Group sizes are the routed rows (or a weight gradient's contraction) of each expert, not a dimension
    any operand is laid out along: their mean stands for them rounded to GROUP_SIZE_ROUNDING, so uneven
    routing keeps the GEMM shape aligned (a qwen3-MoE training step routed to 4 of 32 experts was priced
    at 2.1x its measured grouped-GEMM time when the mean, 2731 rows, flagged every one misaligned)."""
    from gpuest.annotate.formulas.moe import GROUP_SIZE_ROUNDING
    g = trace(build("mixtral"), inputs(), mode="training", precision="bf16",
              routing=[0.3, 0.3, 0.2, 0.15, 0.05, 0.0, 0.0, 0.0])
    nodes = expert_nodes(g)
    assert len({d["gemm_m"] for d in nodes} | {d["gemm_k"] for d in nodes}) > 2   # forward and weight gradients
    uneven = [d for d in nodes if d["gemm_m_max"] != d["gemm_m"]]
    assert uneven and all(d["gemm_m"] % GROUP_SIZE_ROUNDING == 0 for d in uneven)
    balanced = trace(build("mixtral"), inputs(), precision="bf16")
    assert {d["gemm_m"] for d in expert_nodes(balanced)} == {TOKENS * TOP_K // EXPERTS}   # equal groups: exact


def test_explicit_fractions_route_tokens_as_given():
    shares = [0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]
    g = trace(build("mixtral"), inputs(), precision="bf16", routing=shares)
    counts = routing_decisions(g)[0]["tokens_per_expert"]
    assert counts == [round(s * TOKENS * TOP_K) for s in shares]
    assert {d["gemm_m_max"] for d in expert_nodes(g)} == {max(counts)}


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"])
@pytest.mark.parametrize("mode, precision, impl", [("training", "bf16", "grouped_mm"),
                                                   ("inference", "bf16-mixed", "eager")])
def test_other_moe_families_trace_with_every_expert_routed(kind, mode, precision, impl):
    g = trace(build(kind, impl), inputs(), mode=mode, precision=precision)
    assert unsupported_ops(g) == {}
    decisions = routing_decisions(g)
    assert len(decisions) == LAYERS and {d["experts"] for d in decisions} == {EXPERTS}
    routed = sum(d["gemm_m"] * d["gemm_batch"] for d in expert_nodes(g) if d["op"] == "aten._grouped_mm.default") \
        if impl == "grouped_mm" else sum(d["gemm_m"] for d in expert_nodes(g)) // 2
    assert routed == TOKENS * TOP_K * LAYERS * (2 if impl == "grouped_mm" else 1)


# ------------------------------------------------------------------ top-1 routing with a capacity

class Top1Experts(torch.nn.Module):
    """Switch-Transformer routing as transformers writes it: argmax, a per-sequence capacity that drops
    overflowing tokens, and experts looked up by name in an eager loop."""

    def __init__(self, hidden: int, experts: int, capacity: int) -> None:
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts)
        self.experts = torch.nn.ModuleDict({f"expert_{i}": torch.nn.Linear(hidden, hidden) for i in range(experts)})
        self.capacity = capacity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = torch.nn.functional.one_hot(self.router(x).argmax(-1), len(self.experts))
        chosen = chosen * (torch.cumsum(chosen, dim=-2) <= self.capacity)
        flat, mask = x.reshape(-1, x.shape[-1]), chosen.reshape(-1, len(self.experts)).permute(1, 0)
        out = torch.zeros_like(flat)
        for idx in torch.greater(mask.sum(-1), 0).nonzero():
            tokens = torch.where(mask[idx].squeeze(0))[0]
            out.index_add_(0, tokens, self.experts[f"expert_{idx[0]}"](flat[tokens]))
        return out.reshape(x.shape)


def test_top1_capacity_drops_the_overflow_and_names_each_expert():
    seq, experts, capacity = 64, 4, 10   # balanced: 16 tokens per expert, 10 kept
    g = trace(Top1Experts(32, experts, capacity), (torch.empty(1, seq, 32),), mode="training")
    mms = [d for _, d in g.nodes(data=True) if d["phase"] == "forward" and d["module"].startswith("experts.")
           and d["category"] == "matmul"]
    assert sorted(d["module"] for d in mms) == [f"experts.expert_{i}" for i in range(experts)]
    assert {d["gemm_m"] for d in mms} == {capacity}
    assert routing_decisions(g)[0]["tokens_per_expert"] == [seq // experts] * experts


# ------------------------------------------------------------------ the estimate, model specs, CLI

class _TopOneChoice(torch.nn.Module):
    """A top-1 choice over 4 columns whose values either pick rows (a router) or only flow on (a greedy decoder's
    next token)."""

    def __init__(self, routes: bool) -> None:
        super().__init__()
        self.routes = routes

    def forward(self, scores: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        choice = scores.argmax(-1)
        if self.routes:
            return x[(choice == 0).nonzero().squeeze(-1)]   # the rows sent to expert 0: a shape from values
        return choice.unsqueeze(-1) + 1


def test_a_top1_choice_whose_values_decide_nothing_is_no_routing_decision():
    args = (torch.empty(16, 4), torch.empty(16, 8))
    assert routing_decisions(trace(_TopOneChoice(routes=False), args)) == []
    # ... and an assumption that could not hold for it is never asked to
    assert routing_decisions(trace(_TopOneChoice(routes=False), args, routing=[0.5, 0.5])) == []
    routed = trace(_TopOneChoice(routes=True), args)
    [decision] = routing_decisions(routed)
    assert (decision["experts"], decision["top_k"], decision["tokens_per_expert"]) == (4, 1, [4, 4, 4, 4])
    assert any(d["output_shapes"].startswith("4x8") for _, d in routed.nodes(data=True))
    with pytest.raises(RoutingError, match="2 expert shares but the model routes over 4"):
        trace(_TopOneChoice(routes=True), args, routing=[0.5, 0.5])


def test_fp32_grouped_gemms_trace_without_logging_the_fake_kernels_rejection(caplog):
    with caplog.at_level(logging.DEBUG):
        g = trace(build("mixtral"), inputs(), precision="fp32")
    assert expert_nodes(g, op="aten._grouped_mm.default")
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses.fake_tensor")]


def test_estimate_records_the_routing_assumption():
    g = trace(build("mixtral"), inputs(), precision="bf16", routing="skewed:0.3")
    est = estimate_graph(g, "H100", warn=False)
    assert est.routing == "skewed:0.3" and est.to_dict()["routing"] == "skewed:0.3"
    assert any("routing assumed skewed:0.3" in n for n in est.notes)
    dense = estimate_graph(trace(torch.nn.Linear(8, 8), (torch.empty(4, 8),)), "H100", warn=False)
    assert dense.routing == "" and not any("routing" in n for n in dense.notes)


@pytest.mark.parametrize("spec, experts, top_k, impl", [
    ("hf:mixtral-0.6b", 8, 2, "grouped_mm"), ("hf:mixtral-0.6b-eager", 8, 2, "eager"),
    ("hf:qwen2-moe-0.5b", 16, 4, "grouped_mm"), ("hf:qwen3-moe-0.7b", 32, 4, "grouped_mm"),
    ("hf:olmoe-0.9b", 64, 8, "grouped_mm"), ("hf:gpt-oss-0.5b", 16, 4, "grouped_mm"),
])
def test_shipped_moe_configs_build(spec, experts, top_k, impl):
    model = load_model(spec, seq=8).model
    config = model.config
    assert getattr(config, "num_local_experts", None) or config.num_experts == experts
    assert config.num_experts_per_tok == top_k and config._experts_implementation == impl


def test_cli_rejects_bad_routing(capsys):
    assert main(["estimate", "hf:mixtral-0.6b", "--gpu", "H100", "--seq", "8", "--routing", "0.5,0.6"]) == 2
    assert "sum to 1" in capsys.readouterr().err


def test_moe_validation_set_has_a_frozen_seeded_test_share():
    from gpuest.evaluate.validation_set import MOE_TEST_KEYS, draw_moe_test_split, get_set
    configs = get_set("moe")
    assert tuple(MOE_TEST_KEYS) == draw_moe_test_split()
    assert {c.key for c in configs if c.split == "test"} == set(MOE_TEST_KEYS)
    for mode in ("inference", "training"):
        assert len({c.model for c in configs if c.mode == mode}) >= 3
    assert all(c.model[3:] in {s[3:] for s in __import__("gpuest.capture.models", fromlist=["list_models"])
                               .list_models("hf")} for c in configs)


class _BiasGather(torch.nn.Module):
    """An expert bias gathered per routed token (GPT-OSS): its backward accumulates by index."""

    def __init__(self, experts: int, width: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(experts, width))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x + self.bias[idx]


def _index_put_nodes(graph) -> list[dict]:
    return [d for _, d in graph.nodes(data=True) if str(d["op"]).startswith("aten.index_put")]


@pytest.mark.parametrize("experts", [4, 16])
def test_accumulating_index_put_walks_the_balanced_run_of_duplicates(experts):
    tokens = 512
    graph = trace(_BiasGather(experts, 64), (torch.randn(tokens, 64), torch.randint(0, experts, (tokens,))),
                  mode="training", optimizer=None)
    (node,) = _index_put_nodes(graph)
    assert node["dependent_updates"] == tokens // experts - 1
    assert node["variant"] == "accumulate"
    # the sort pipeline's launches as profiled (data/kernels/H100-SXM-index-put.txt): 10 up to 1024 indices
    from gpuest.annotate.formulas.memory import ACCUMULATE_KERNELS
    assert node["kernels"] == ACCUMULATE_KERNELS[0] == 10
    # the serial chain is priced beyond the op's bytes, and shorter runs cost less
    est = estimate_graph(graph, gpu="H100-SXM")
    row = est.per_node.set_index("node").loc[[n for n, d in graph.nodes(data=True) if d is node][0]]
    assert row["latency_s"] > node["dependent_updates"] * 5e-7


def test_index_put_without_accumulate_has_no_chain():
    graph = trace(_Assign(), (torch.zeros(8, 4), torch.randint(0, 8, (64,)), torch.randn(64, 4)))
    assert [d["dependent_updates"] for d in _index_put_nodes(graph)] == [0.0]


def test_a_plain_index_put_is_not_priced_by_the_accumulating_pipelines_fit():
    """A scatter (an MoE's inverse permutation, `inv[perm] = arange`) is one kernel; the suite's index_puts all
    accumulate (sort + per-run walk, ~100 us), so their fit is keyed by that variant and the scatter takes the
    copy category's: an OLMoE-sized one (65536 int64) stays within a few launches' time."""
    n = 65536
    graph = trace(_Assign(), (torch.zeros(n, dtype=torch.int64), torch.randint(0, n, (n,)),
                              torch.arange(n)), mode="inference")
    (node,) = _index_put_nodes(graph)
    assert node["variant"] == ""
    est = estimate_graph(graph, gpu="H100-SXM")
    time_s = est.per_node.set_index("op").loc[node["op"], "time_s"]
    assert time_s < 20e-6, time_s


class _Assign(torch.nn.Module):
    def forward(self, base: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_put(base, [idx], values, False)


def test_measured_routing_averages_each_decisions_shares_hottest_first():
    from gpuest.evaluate.accuracy import measured_routing
    row = {"routing_counts": [[0, 30, 10, 0], [10, 0, 0, 30], [0, 0, 0, 0]]}
    shares = measured_routing(row)
    assert shares == pytest.approx((0.75, 0.25, 0.0, 0.0))
    assert measured_routing({}) is None
    # the shares are a routing assumption the trace accepts
    assert parse_routing(list(shares)).kind == "fractions"


def test_validation_records_the_routing_a_step_ran():
    from gpuest.calibrate.validate import routing_counts
    loaded = load_model("hf:mixtral-0.6b", batch=1, seq=16, device="cpu")

    def step():
        with torch.no_grad():
            loaded.model(**loaded.example_inputs)
    counts = routing_counts(step)
    config = loaded.model.config
    assert len(counts) == config.num_hidden_layers
    assert all(len(c) == config.num_local_experts and sum(c) == 16 * config.num_experts_per_tok for c in counts)
