"""`estimate_generation`: a generate() call priced as prefill plus decode steps over a KV cache; its fields,
its integration over the answer, its errors, `compare` and the `gpuest generate` command. Small configs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers

import gpuest
from gpuest.capture.generation import GreedyStep
from gpuest.capture.trace import routing_decisions
from gpuest.cli import main
from gpuest.errors import GenerationError
from gpuest.price.generation import compare_generation, decode_contexts, price_generation, trace_generation

TINY = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "use_cache": False}


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cfg") / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return f"hf:{path}"


@pytest.fixture(scope="module")
def graphs(tiny_spec):
    return trace_generation(tiny_spec, batch=4, prompt_tokens=64, new_tokens=40)


def test_decode_contexts_cover_the_answer():
    # every step priced when there are few; else quadrature weights sum to the decode steps, nodes inside
    assert decode_contexts(100, 4) == [(100, 1.0), (101, 1.0), (102, 1.0)]
    assert decode_contexts(100, 1) == []
    points = decode_contexts(100, 201)
    assert sum(s for _, s in points) == pytest.approx(200)
    assert all(100 <= c <= 299 for c, _ in points) and len({c for c, _ in points}) == len(points)
    # the rule integrates a linear cost exactly (up to rounding the contexts to whole tokens)
    assert sum(s * c for c, s in points) == pytest.approx(sum(range(100, 300)), rel=1e-3)


def test_fields_are_consistent(graphs):
    est = price_generation(graphs, "H100")
    decode = est.phases[est.phases["phase"] == "decode"]
    assert decode["steps"].sum() == pytest.approx(39)
    assert est.time_s == pytest.approx(est.ttft_s + decode["total_time_s"].sum())
    assert est.time_s == pytest.approx(est.ttft_s + 39 * est.tpot_s)
    assert est.time_s == pytest.approx(est.phases["total_time_s"].sum())
    assert est.tokens_per_s == pytest.approx(4 * 40 / est.time_s)
    assert est.energy_j > 0 and est.energy_per_token_j == pytest.approx(est.energy_j / (4 * 40))
    assert 0 < est.device_time_s < est.time_s
    # the prefill of 64 tokens is more device work than a one-token decode step
    assert est.prefill.device_time_s > max(d.device_time_s for d in est.decode)
    assert "time per output token" in str(est) and "decode" in str(est)


def test_decode_step_grows_with_context(tiny_spec):
    short = trace_generation(tiny_spec, batch=8, prompt_tokens=16, new_tokens=2)
    long = trace_generation(tiny_spec, batch=8, prompt_tokens=480, new_tokens=2)
    a, b = (price_generation(g, "H100", profile="roofline") for g in (short, long))
    assert b.decode[0].device_time_s > a.decode[0].device_time_s
    bytes_ = [sum(d["bytes_read"] for _, d in g.decode[0].graph.nodes(data=True) if d["category"] == "attention")
              for g in (short, long)]
    assert bytes_[1] > 10 * bytes_[0]   # attention reads the whole cache: 481 against 17 tokens


def test_decode_step_is_one_loop_iteration(graphs):
    g = graphs.decode[0].graph
    ops = [d["op"] for _, d in g.nodes(data=True)]
    assert "aten.argmax.default" in ops
    lm_head = [d for _, d in g.nodes(data=True) if d["category"] == "matmul" and d["module"].endswith("lm_head")]
    assert len(lm_head) == 1 and lm_head[0]["gemm_m"] == 4   # logits of the last position of each sequence
    att = [d for _, d in g.nodes(data=True) if d["category"] == "attention"]
    assert all(d["input_shapes"].startswith(f"4x4x1x16;4x2x{graphs.decode[0].context + 1}x16") for d in att)


def test_static_cache_attends_over_its_whole_length(tiny_spec):
    g = trace_generation(tiny_spec, batch=2, prompt_tokens=30, new_tokens=10, cache="static")
    att = [d for _, d in g.decode[0].graph.nodes(data=True) if d["category"] == "attention"]
    # keys of the whole static length; their heads are the KV heads, or the query's where transformers
    # repeats them before SDPA (5.17 does for a static cache)
    keys = [d["input_shapes"].split(";")[1] for d in att]
    assert att and all(k in ("2x2x40x16", "2x4x40x16") for k in keys)


def test_real_weights_module_is_accepted():
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    est = gpuest.estimate_generation(model, "A100", batch=1, prompt_tokens=8, new_tokens=3)
    assert len(est.decode) == 2 and est.time_s > 0
    assert next(model.parameters()).dtype == torch.float32   # the caller's model is not cast


@pytest.mark.parametrize("impl", ["grouped_mm", "eager"])
def test_mixture_of_experts_decoders_generate(tmp_path, impl):
    """The KV cache's scratch forward passes expert routing; only the routers are routing decisions (the greedy
    argmax over the vocabulary decides no shape)."""
    path = tmp_path / "tiny-mixtral.json"
    path.write_text(json.dumps({**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                                "experts_implementation": impl}))
    graphs = trace_generation(f"hf:{path}", batch=2, prompt_tokens=16, new_tokens=3)
    for g in (graphs.prefill, *(d.graph for d in graphs.decode)):
        decisions = routing_decisions(g)
        assert len(decisions) == TINY["num_hidden_layers"]
        assert {(d["experts"], d["top_k"]) for d in decisions} == {(4, 2)}
    est = price_generation(graphs, "H100")
    assert est.time_s > 0 and any("routing assumed balanced" in n for n in est.notes)
    if impl == "grouped_mm":   # the routing assumption reaches every step
        skewed = trace_generation(f"hf:{path}", batch=2, prompt_tokens=16, new_tokens=3, routing="skewed:0.5")
        [first, *_] = routing_decisions(skewed.prefill)
        assert max(first["tokens_per_expert"]) == 0.5 * 32 * 2 > max(routing_decisions(graphs.prefill)[0]
                                                                       ["tokens_per_expert"])
        assert main(["generate", f"hf:{path}", "--batch", "2", "--prompt", "16", "--new-tokens", "3", "--gpu", "H100",
                     "--routing", "0.5,0.5"]) == 2


def test_a_static_cache_counts_its_tokens_for_models_that_ask(tmp_path):
    """OPT sizes its position mask by the cache's get_seq_length, a device counter in transformers' StaticCache whose
    value fake tensors lack; Falcon-RW's ALiBi bias cannot run over a static cache at all (nor can transformers')."""
    opt = tmp_path / "tiny-opt.json"
    opt.write_text(json.dumps({"model_type": "opt", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "ffn_dim": 128, "word_embed_proj_dim": 64,
                               "max_position_embeddings": 256}))
    graphs = trace_generation(f"hf:{opt}", batch=2, prompt_tokens=16, new_tokens=3, cache="static")
    assert [d.graph.graph["generation_context"] for d in graphs.decode] == [16, 17]
    falcon = tmp_path / "tiny-falcon.json"
    falcon.write_text(json.dumps({"model_type": "falcon", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "alibi": True, "new_decoder_architecture": False,
                                  "multi_query": False, "parallel_attn": False, "bias": True}))
    with pytest.raises(GenerationError, match="(?s)does not run over a static cache.*cache='dynamic'"):
        trace_generation(f"hf:{falcon}", batch=2, prompt_tokens=16, new_tokens=3, cache="static")


def test_a_dense_decoders_greedy_argmax_is_no_routing_decision(graphs):
    assert all(routing_decisions(g) == [] for g in (graphs.prefill, *(d.graph for d in graphs.decode)))
    assert not any("routing" in n for n in price_generation(graphs, "H100").notes)


def test_the_call_needs_the_memory_of_its_fullest_cache(tiny_spec, graphs):
    """The last token's decode step (the fullest cache) is traced for memory: the call's peak is the highest of its
    steps', above the prefill's and the first decode point's, and larger GPUs fit what smaller ones may not."""
    from gpuest.catalog import get_gpu
    from gpuest.price.memory.peak import memory_estimate
    assert graphs.last.graph["generation_context"] == 64 + 40 - 2
    est = price_generation(graphs, "H100")
    last = memory_estimate(graphs.last, get_gpu("H100"))
    assert est.peak_memory_bytes == max(last.peak_bytes, est.prefill.peak_memory_bytes,
                                        *(d.peak_memory_bytes for d in est.decode))
    assert last.peak_bytes > est.decode[0].peak_memory_bytes   # the cache grew by the answer
    assert est.fits and "peak memory" in str(est) and est.to_dict()["peak_memory_bytes"] == est.peak_memory_bytes
    table = compare_generation(graphs, ["H100", "T4"]).set_index("gpu")
    assert table.loc["H100-SXM", "peak_memory_bytes"] == est.peak_memory_bytes and table["fits"].all()


def test_compare_ranks_gpus(graphs):
    by_rate = gpuest.compare(graphs, ["H100", "L4"], by="tokens_per_s")
    assert list(by_rate["tokens_per_s"]) == sorted(by_rate["tokens_per_s"], reverse=True)
    by_energy = gpuest.compare(graphs, ["H100", "L4"], by="energy_per_token")
    assert list(by_energy["energy_per_token_j"]) == sorted(by_energy["energy_per_token_j"])
    with pytest.raises(ValueError, match="tokens_per_s"):
        gpuest.compare(graphs, ["H100"], by="edp")


def test_too_many_tokens(tiny_spec):
    with pytest.raises(GenerationError, match="max_position_embeddings 512"):
        trace_generation(tiny_spec, batch=1, prompt_tokens=500, new_tokens=13)


def test_model_without_cache():
    with pytest.raises(GenerationError, match="no KV cache"):
        trace_generation("lstm", batch=1, prompt_tokens=8, new_tokens=2)


def test_non_decoder_model():
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    with torch.device("meta"):
        bert = transformers.BertForMaskedLM(config)
    with pytest.raises(GenerationError, match="not a decoder LM"):
        trace_generation(bert, batch=1, prompt_tokens=8, new_tokens=2)


def test_bad_counts(tiny_spec):
    with pytest.raises(GenerationError, match="new_tokens must be an integer >= 1"):
        trace_generation(tiny_spec, batch=1, prompt_tokens=8, new_tokens=0)


def test_cli_generate(tiny_spec, capsys):
    assert main(["generate", tiny_spec, "--batch", "2", "--prompt", "32", "--new-tokens", "8", "--gpu", "H100",
                 "--compare", "L4"]) == 0
    out = capsys.readouterr().out
    assert "time to first token" in out and "L4" in out and "tokens_per_s" in out
    assert main(["generate", tiny_spec, "--prompt", "32", "--new-tokens", "8", "--gpu", "H100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["new_tokens"] == 8 and math.isclose(data["tokens_per_s"], 8 / data["time_s"])
    assert main(["generate", "lstm", "--prompt", "4", "--new-tokens", "2", "--gpu", "H100"]) == 2
    assert "no KV cache" in capsys.readouterr().err


def test_greedy_step_runs_on_real_tensors():
    # the traced loop iteration is a runnable module: one real step on the CPU
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        finished = GreedyStep(model, True)(ids, torch.ones_like(ids), torch.arange(5).expand(2, 5),
                                           torch.ones(2, dtype=torch.long), transformers.DynamicCache(config=config), 5)
    assert finished.dtype == torch.bool and not bool(finished)


def test_accuracy_report_scores_rows(tiny_spec, tmp_path):
    from gpuest.report.generation_accuracy import latest_rows, predict, render
    base = {"status": "ok", "dry_run": False, "gpu": "NVIDIA H100 80GB HBM3", "gpu_canonical": "H100-SXM",
            "model": tiny_spec, "family": "llama", "precision": "bf16", "cache": "dynamic"}
    rows = [dict(base, key="d", kind="decode", batch=2, context=100, prompt=0, new_tokens=0),
            dict(base, key="g", kind="generate", batch=2, context=0, prompt=16, new_tokens=6,
                 generate_python_per_step_s=4e-4)]
    pred = predict(rows)
    # predictions 50 % above the measurement, then 12 % below it in a later file: the later row wins
    for scale, name in ((1.5, "a.jsonl"), (0.88, "b.jsonl")):
        with (tmp_path / name).open("w") as f:
            for r, p in zip(rows, pred.itertuples()):
                f.write(json.dumps(dict(r, device_busy_s=p.pred_device / scale, wall_s=p.pred_wall / scale,
                                        energy_j=p.pred_energy / scale)) + "\n")
    df = predict(latest_rows([tmp_path / "a.jsonl", tmp_path / "b.jsonl"]))
    assert len(df) == 2 and np.allclose(df[["ape_device", "ape_wall", "ape_energy"]], 12.0)
    text = render(df, ["b.jsonl"], "cmd")
    assert "| decode-step device time | 1 | 12.0 % | <= 10 % | not met |" in text
    assert "| generate() wall time | 1 | 12.0 % | <= 15 % | met |" in text


def test_measurement_script_respects_its_budget(tmp_path):
    from gpuest.calibrate.generation_validate import configs, run
    out = tmp_path / "gen.jsonl"
    assert run(out, budget_s=0.0, dry_run=True) == 0 and not out.exists()
    grid = configs()
    # every model's core configs come before any extended one, and all three families are covered
    tiers = [c.tier for c in grid]
    assert tiers == sorted(tiers)
    core_models = {c.model for c in grid if c.tier == 0}
    assert {"hf:llama", "hf:qwen2-0.5b", "hf:gpt2"} <= core_models
    assert {c.kind for c in grid if c.tier == 0} == {"decode", "prefill", "generate"}
    assert len({c.key for c in grid}) == len(grid)


@pytest.mark.parametrize("filters, named", [({"keys": ["decode|hf:llama|b3|c7|p0|n0"]}, "config keys"),
                                             ({"kinds": ["decoding"]}, "kinds"), ({"models_filter": ["hf:nope"]}, "models")])
def test_measurement_script_rejects_a_filter_that_names_nothing_it_measures(tmp_path, filters, named):
    """A misspelt --keys, --kinds or --models is an error naming it and what is accepted, before any GPU work,
    not a run that measures nothing."""
    from gpuest.calibrate.generation_validate import run
    out = tmp_path / "gen.jsonl"
    with pytest.raises(SystemExit, match=f"unknown {named} .*; accepted: "):
        run(out, budget_s=60.0, dry_run=True, **filters)
    assert not out.exists()


def test_graph_launch_removes_per_op_dispatch_from_decode_only(graphs):
    eager, graph = (price_generation(graphs, "H100", launch=launch) for launch in ("eager", "graph"))
    assert graph.tpot_s < eager.tpot_s
    assert graph.prefill.time_s == pytest.approx(eager.prefill.time_s)   # the prefill is never graphed
    assert graph.decode[0].device_time_s <= eager.decode[0].device_time_s   # no launch gaps between kernels
