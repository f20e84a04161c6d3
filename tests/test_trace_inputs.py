"""`trace` takes any inputs a model takes: every tensor reachable from them becomes a fake one (caches,
dataclasses, nested containers), whether it was real, meta or fake."""
from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode

from gpuest.capture import trace

B, KV_HEADS, HEADS, HEAD_DIM, LAYERS, CONTEXT = 2, 2, 4, 16, 2, 37


def tiny_llama() -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=HEADS * HEAD_DIM, intermediate_size=96,
                                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                      num_key_value_heads=KV_HEADS, max_position_embeddings=256)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def filled(cache: transformers.Cache, kind: str) -> transformers.Cache:
    """`cache` holding CONTEXT tokens per layer, as `kind` tensors (a fake cache is built under its own mode)."""
    shape = (B, KV_HEADS, CONTEXT, HEAD_DIM)
    with FakeTensorMode() if kind == "fake" else torch.device("meta" if kind == "meta" else "cpu"):
        for layer in range(LAYERS):
            cache.update(torch.empty(shape), torch.empty(shape), layer)
    return cache


def attention_nodes(graph):
    return [d for _, d in graph.nodes(data=True) if d["category"] == "attention"]


def decode_inputs(cache: transformers.Cache) -> dict:
    return dict(input_ids=torch.zeros(B, 1, dtype=torch.long), past_key_values=cache,
                position_ids=torch.zeros(B, 1, dtype=torch.long), use_cache=True)


@pytest.mark.parametrize("kind", ["meta", "fake", "real"])
def test_dynamic_cache_decode_step_attends_over_the_cache(kind):
    model = tiny_llama()
    cache = filled(transformers.DynamicCache(config=model.config), kind)
    graph = trace(model, decode_inputs(cache), precision="bf16")
    att = attention_nodes(graph)
    assert len(att) == LAYERS
    # one query token against the cached keys plus its own, GQA heads as given
    assert all(a["input_shapes"].startswith(f"{B}x{HEADS}x1x{HEAD_DIM};{B}x{KV_HEADS}x{CONTEXT + 1}x{HEAD_DIM}")
               for a in att), att[0]["input_shapes"]
    assert all(a["dtype"] == "bfloat16" for a in att)
    # the cache update reads the whole cache and writes it one token longer, per layer, keys and values
    cats = [d for _, d in graph.nodes(data=True)
            if d["op"] == "aten.cat.default" and d["output_shapes"] == f"{B}x{KV_HEADS}x{CONTEXT + 1}x{HEAD_DIM}"]
    assert len(cats) == 2 * LAYERS
    # the caller's cache is untouched
    assert cache.layers[0].keys.shape[-2] == CONTEXT and cache.layers[0].keys.dtype == torch.float32


def test_static_cache_updates_in_place_and_attends_over_its_length():
    model = tiny_llama()
    cache = filled(transformers.StaticCache(config=model.config, max_cache_len=64), "meta")
    graph = trace(model, decode_inputs(cache), precision="bf16")
    att = attention_nodes(graph)
    # keys of the whole static length; their heads are the KV heads, or the query's where transformers
    # repeats them before SDPA (5.17 does for a static cache)
    keys = {a["input_shapes"].split(";")[1] for a in att}
    assert att and keys <= {f"{B}x{KV_HEADS}x64x{HEAD_DIM}", f"{B}x{HEADS}x64x{HEAD_DIM}"}
    assert sum(d["op"] == "aten.index_copy_.default" for _, d in graph.nodes(data=True)) == 2 * LAYERS


def test_sliding_window_cache_keeps_its_window():
    model = tiny_llama()
    config = model.config
    config.sliding_window, config.layer_types = 20, ["sliding_attention"] * LAYERS
    cache = filled(transformers.DynamicCache(config=config), "meta")
    graph = trace(model, decode_inputs(cache), precision="bf16")
    # the window layer keeps its last window-1 tokens; the step attends over them plus the new one
    assert all(f"{B}x{KV_HEADS}x20x{HEAD_DIM}" == a["input_shapes"].split(";")[1] for a in attention_nodes(graph))


class PairNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, batch: "Batch") -> torch.Tensor:
        return self.lin(batch.x) + self.lin(batch.extra["y"][0].pair.b)


Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass
class Holder:
    pair: Pair


@dataclasses.dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    extra: dict


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_dataclass_and_nested_container_inputs(device):
    x = torch.empty(4, 8, device=device)
    batch = Batch(x, {"y": [Holder(Pair(a=3, b=torch.empty(4, 8, device=device)))]})
    graph = trace(PairNet(), (batch,), precision="bf16")
    mms = [d for _, d in graph.nodes(data=True) if d["category"] == "matmul"]
    assert len(mms) == 2 and all(d["dtype"] == "bfloat16" for d in mms)
    assert batch.x is x and batch.x.dtype == torch.float32   # the caller's objects are not mutated
