"""Trace what a transformers `generate()` call runs: the prefill and single-token decode steps over a KV cache.

Each traced step is one iteration of transformers' greedy decoding loop (`GenerationMixin._sample` with
`do_sample=False`) as it runs on CUDA: the model forward over the cache (the whole prompt for the prefill,
one token per sequence for a decode step, logits of the last position only), then the loop's own ops:
position-id and attention-mask growth, the last logits copied to float32, argmax, the new token appended,
the max-length stopping criterion and the unfinished-sequence flags. The loop then reads those flags on the
host (`bool(unfinished.max() == 0)`), which waits for the device: each step is priced from an idle device
until host and device are both done, so that synchronisation is where one step's estimate ends.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..errors import GenerationError, TraceError
from .grouped_mm import FAKE_SUBSTITUTES
from .routing import FormatKnownScalars, RoutingAssumption, RoutingValues, ValuedOps, fake_kernel_log_muted
from .trace import TRACE_DEVICE, _fake_like, trace

CACHES = ("dynamic", "static")


@dataclass(frozen=True)
class DecoderFacts:
    """What a generation estimate needs to know about a decoder LM."""

    max_positions: int | None   # longest sequence its position embeddings cover (None: unbounded)
    logits_to_keep: bool        # its forward can compute the logits of the last position only


def decoder_facts(model: nn.Module, name: str) -> DecoderFacts:
    """Check `model` is a decoder LM with a KV cache; raise GenerationError saying what it is otherwise."""
    params = _forward_params(model)
    config = getattr(model, "config", None)
    can_generate = getattr(model, "can_generate", None)
    if config is not None and (getattr(config, "is_encoder_decoder", False) or
                               (callable(can_generate) and not can_generate())):
        kind = "an encoder-decoder model" if getattr(config, "is_encoder_decoder", False) else \
            f"not a decoder LM ({type(model).__name__} cannot generate)"
        raise GenerationError(f"{name} is {kind}: generation estimates take a decoder-only causal LM "
                              "(e.g. hf:gpt2, hf:llama, a transformers *ForCausalLM)")
    if "past_key_values" not in params:
        raise GenerationError(f"{name} has no KV cache: its forward takes no past_key_values, so every generated "
                              "token would recompute the whole sequence; generation estimates take a decoder LM "
                              "whose forward accepts past_key_values (a transformers *ForCausalLM)")
    if config is None:
        raise GenerationError(f"{name} has no transformers config: the KV cache is built from one "
                              "(num layers and cache layer kinds); pass a transformers *ForCausalLM")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    max_pos = getattr(text, "max_position_embeddings", None)
    unbounded = not max_pos or max_pos < 0   # XLNet's -1: relative positions, no limit
    return DecoderFacts(max_positions=None if unbounded else int(max_pos), logits_to_keep="logits_to_keep" in params)


def _forward_params(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def check_lengths(facts: DecoderFacts, name: str, prompt_tokens: int, new_tokens: int) -> None:
    """The prompt and answer must fit the model's position embeddings."""
    if facts.max_positions is not None and prompt_tokens + new_tokens > facts.max_positions:
        raise GenerationError(f"prompt_tokens + new_tokens = {prompt_tokens} + {new_tokens} = "
                              f"{prompt_tokens + new_tokens} exceeds {name}'s max_position_embeddings "
                              f"{facts.max_positions}; generate at most {facts.max_positions} tokens in all")


def kv_cache(model: nn.Module, batch: int, context: int, kind: str, max_len: int) -> Any:
    """A transformers cache of `kind` ("dynamic" or "static", max_len tokens) holding `context` tokens per
    sequence, as fake tensors. The shape of each layer's keys and values is the model's own: one
    one-token forward on fake tensors fills a scratch cache, and the cache's own `update` then takes
    `context` tokens of those shapes (a sliding-window layer keeps its window)."""
    import transformers
    if kind not in CACHES:
        raise ValueError(f"unknown cache {kind!r}; accepted: {', '.join(CACHES)}")
    # The scratch forward runs on fake CPU tensors as a trace does (nothing is computed), so mixture-of-experts
    # layers pass: their routing gets values, grouped GEMMs the fake kernel CUDA's takes, and transformers picks
    # the device-dependent paths (histc's input dtype) it picks for a trace.
    run_op = RoutingValues(RoutingAssumption(), FAKE_SUBSTITUTES)
    with FakeTensorMode(allow_non_fake_inputs=True):
        state = {n: _fake_like(t, None) for n, t in [*model.named_parameters(), *model.named_buffers()]}
        scratch = transformers.DynamicCache(config=model.config)
        with fake_kernel_log_muted(), ValuedOps(run_op), FormatKnownScalars(run_op), torch.no_grad():
            torch.func.functional_call(model, state, (), dict(
                input_ids=torch.zeros(batch, 1, dtype=torch.long, device=TRACE_DEVICE), past_key_values=scratch,
                use_cache=True))
        cache = (transformers.DynamicCache(config=model.config) if kind == "dynamic" else
                 counted_static_cache()(config=model.config, max_cache_len=max_len))
        for i, layer in enumerate(scratch.layers if context else []):
            k, v = layer.keys, layer.values
            cache.update(torch.empty(*k.shape[:-2], context, k.shape[-1], dtype=k.dtype, device=k.device),
                         torch.empty(*v.shape[:-2], context, v.shape[-1], dtype=v.dtype, device=v.device), i)
    return cache


@functools.cache
def counted_static_cache() -> type:
    """transformers' StaticCache whose get_seq_length is the count of tokens written to it, a Python int: its own
    is a device counter whose value fake tensors lack, and OPT's forward sizes its position mask by it."""
    import transformers

    class CountedStaticCache(transformers.StaticCache):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tokens_written = 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> Any:
            if layer_idx == 0:
                self.tokens_written += int(key_states.shape[-2])
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.tokens_written

    return CountedStaticCache


class GreedyStep(nn.Module):
    """One iteration of transformers' greedy `generate` loop around `lm` (see the module docstring).

    forward(sequences, attention_mask, position_ids, unfinished, past_key_values, query_tokens): the ids
    so far (B, L), their mask and positions (B, L), the unfinished flags (B,), the cache, and how many of
    the last ids the forward takes (all of them for the prefill, 1 for a decode step)."""

    def __init__(self, lm: nn.Module, logits_to_keep: bool) -> None:
        super().__init__()
        self.lm = lm
        self.logits_to_keep = logits_to_keep

    def forward(self, sequences: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                unfinished: torch.Tensor, past_key_values: Any, query_tokens: int) -> torch.Tensor:
        batch = sequences.shape[0]
        prefill = query_tokens == sequences.shape[1]
        kwargs: dict[str, Any] = dict(input_ids=sequences[:, -query_tokens:].contiguous(),
                                      past_key_values=past_key_values, use_cache=True)
        if not prefill:
            # In the prefill the model makes the positions itself (as for an unpadded prompt on the device).
            kwargs["position_ids"] = position_ids[:, -query_tokens:]
        if self.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.lm(**kwargs)
        # _update_model_kwargs_for_generation: positions and attention mask grow by one token
        step = torch.arange(1, dtype=position_ids.dtype, device=position_ids.device).view(1, -1)
        position_ids = torch.cat([position_ids, step + position_ids[:, -1:] + 1], dim=-1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
        # token selection and the stopping criteria
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        tokens = torch.argmax(logits, dim=-1)
        sequences = torch.cat([sequences, tokens[:, None]], dim=-1)
        length_done = torch.full((batch,), False, dtype=torch.bool, device=sequences.device)
        done = length_done | torch.full((batch,), False, dtype=torch.bool, device=sequences.device)
        unfinished = unfinished & ~done
        return unfinished.max() == 0   # read on the host: the end of the step


def trace_step(model: nn.Module, facts: DecoderFacts, *, batch: int, context: int, query_tokens: int,
               cache: str, max_len: int, precision: str, name: str, routing: Any = "balanced") -> nx.DiGraph:
    """Graph of one greedy loop iteration: `query_tokens` new ids over a cache holding `context` tokens."""
    total = context + query_tokens
    ids = torch.empty(batch, total, dtype=torch.long, device="meta")
    inputs = (ids, torch.empty_like(ids), torch.empty_like(ids), torch.empty(batch, dtype=torch.long, device="meta"),
              kv_cache(model, batch, context, cache, max_len), query_tokens)
    try:
        graph = trace(GreedyStep(model, facts.logits_to_keep), inputs, precision=precision, name=name, batch=batch,
                      routing=routing)
    except TraceError as exc:
        if cache != "static":
            raise
        raise GenerationError(f"{name}'s forward does not run over a static cache: {exc}\n  Some models do not "
                              "support one (Falcon-RW sizes its ALiBi bias by the attention mask, not the cache, and "
                              "transformers' own generate(cache_implementation='static') fails the same way); "
                              "price it with cache='dynamic'") from exc
    graph.graph.update(generation_context=context, generation_query_tokens=query_tokens, generation_cache=cache)
    return graph
