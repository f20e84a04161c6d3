"""`estimate_generation`: time, tokens/s and energy of a whole transformers `generate()` call on a GPU.

A greedy `generate(max_new_tokens=N)` runs one prefill (the prompt through the model, building the KV cache;
it yields the first token) and N - 1 decode steps (one token per sequence over a cache one token longer each
time), each ending in a host synchronisation (capture.generation). Every step is priced with `estimate_graph`
from an idle device until host and device are done. A decode step's cost grows with its context (attention
and, for a dynamic cache, the cache concatenation read the whole cache), so the N - 1 steps are integrated with
a QUADRATURE_POINTS-point Gauss-Legendre rule over their contexts: the step at context c stands for the sum's
continuous extension over [c - 1/2, c + 1/2], so the nodes lie in [prompt - 1/2, prompt + N - 3/2] and are
rounded to whole tokens; with N - 1 <= QUADRATURE_POINTS every step is priced at its own context. On top of its
ops' dispatch, generate()'s Python work (configuration, logits-processor and stopping-criteria lists, model
kwargs bookkeeping) costs host time a call and a step (`generate_call` and `generate_step` in the profile's
host costs, else the prior's) during which the device waits at its waiting power.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx
import numpy as np
import pandas as pd
import torch

from ..catalog import GPUSpec, get_gpu
from ..errors import GenerationError
from ..profile import Profile, prior_profile
from .estimate import Estimate, estimate_graph
from .host_timeline import LAUNCHES
from .memory.peak import MemoryEstimate, has_memory_facts, memory_estimate
from .power import transfer_power, waiting_power_w
from .profile_choice import choose_profile

QUADRATURE_POINTS = 4
GENERATION_OBJECTIVES = {"tokens_per_s": ("tokens_per_s", False), "energy_per_token": ("energy_per_token_j", True),
                         "time": ("time_s", True), "ttft": ("ttft_s", True)}
HOST_KEYS = ("generate_call", "generate_step")


@dataclass(frozen=True)
class DecodePoint:
    """A decode step priced at `context` cached tokens that stands for `steps` steps of the answer."""

    context: int
    steps: float
    graph: nx.DiGraph


@dataclass(frozen=True)
class GenerationGraphs:
    """The traced steps of one generate() call, priced on any GPU by `price_generation`."""

    model: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    precision: str
    cache: str
    prefill: nx.DiGraph
    decode: tuple[DecodePoint, ...]
    # The decode step of the answer's last token, whose cache is the fullest (its memory; None: new_tokens == 1).
    last: nx.DiGraph | None = None


@dataclass
class GenerationEstimate:
    """Predicted generate() call: times in s, energy in J, rates per generated token (batch x new tokens).

    `phases`: one row per priced step (prefill, each decode quadrature point) and one for generate()'s own
    host work, with the steps each stands for and their totals. `str()` is a table."""

    model: str
    gpu: str
    precision: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    cache: str
    launch: str
    clock_mhz: float
    power_limit_w: float
    profile_source: str
    ttft_s: float              # time to first token: generate()'s setup and the prefill step
    tpot_s: float              # mean time per output token after the first (NaN for one new token)
    time_s: float              # the whole call: ttft_s + decode_time_s
    decode_time_s: float       # all decode steps
    tokens_per_s: float        # generated tokens (all sequences) per second of the call
    device_time_s: float       # device busy over the call
    host_time_s: float         # host work over the call (dispatch and generate()'s Python)
    energy_j: float
    energy_per_token_j: float
    avg_power_w: float
    phases: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    prefill: Estimate | None = field(default=None, repr=False)
    decode: list[Estimate] = field(default_factory=list, repr=False)
    memory: MemoryEstimate | None = field(default=None, repr=False)   # the step of the call with the highest peak

    @property
    def peak_memory_bytes(self) -> int | None:
        """Predicted torch.cuda.max_memory_allocated() over the call (bytes): weights, the KV cache at its
        fullest and the step's temporaries; None when the steps were traced without storage events."""
        return None if self.memory is None else self.memory.peak_bytes

    @property
    def fits(self) -> bool | None:
        """Whether every step of the call fits the GPU's memory (None: unknown)."""
        return None if self.memory is None else self.memory.fits

    def summary(self) -> dict[str, Any]:
        keys = ("model", "gpu", "precision", "batch", "prompt_tokens", "new_tokens", "cache", "launch", "clock_mhz",
                "power_limit_w", "profile_source", "ttft_s", "tpot_s", "time_s", "decode_time_s", "tokens_per_s",
                "device_time_s", "host_time_s", "energy_j", "energy_per_token_j", "avg_power_w", "peak_memory_bytes",
                "fits")
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "notes": list(self.notes), "phases": self.phases.to_dict(orient="records")}

    def __str__(self) -> str:
        from ..report.text import generation_summary
        return generation_summary(self)


# ------------------------------------------------------------------------------------------ tracing

def decode_contexts(prompt_tokens: int, new_tokens: int, points: int = QUADRATURE_POINTS) -> list[tuple[int, float]]:
    """(cached tokens, steps it stands for) of the decode steps of a generate() call; the steps sum to
    new_tokens - 1 (see the module docstring for the rule)."""
    n = new_tokens - 1
    if n <= 0:
        return []
    if n <= points:
        return [(prompt_tokens + j, 1.0) for j in range(n)]
    x, w = np.polynomial.legendre.leggauss(points)
    lo, hi = prompt_tokens - 0.5, prompt_tokens + n - 0.5
    return [(int(round(lo + (hi - lo) * (xi + 1) / 2)), float(wi * n / 2)) for xi, wi in zip(x, w)]


def _positive_int(value: Any, what: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise GenerationError(f"{what} must be an integer >= {least}, got {value!r}")
    return int(value)


def trace_generation(model_or_name: torch.nn.Module | str, *, batch: int, prompt_tokens: int, new_tokens: int,
                     precision: str = "bf16", cache: str = "dynamic", name: str | None = None,
                     routing: Any = "balanced") -> GenerationGraphs:
    """Trace the prefill and the decode steps at the quadrature contexts of a greedy generate() call.

    model_or_name: a transformers causal LM (meta, real or any weights) or a model spec ("hf:llama").
    routing: a mixture-of-experts model's routing assumption in every step, as for `trace`."""
    from ..capture.generation import CACHES, check_lengths, decoder_facts, trace_step
    batch = _positive_int(batch, "batch")
    prompt_tokens = _positive_int(prompt_tokens, "prompt_tokens")
    new_tokens = _positive_int(new_tokens, "new_tokens")
    if cache not in CACHES:
        raise GenerationError(f"unknown cache {cache!r}; accepted: {', '.join(CACHES)}")
    if isinstance(model_or_name, str):
        from ..capture.models import load_model
        loaded = load_model(model_or_name, batch=batch, seq=1)
        model, name = loaded.model, name or loaded.name
    elif isinstance(model_or_name, torch.nn.Module):
        model, name = model_or_name, name or type(model_or_name).__name__
    else:
        raise TypeError(f"estimate_generation() takes a model or a model name, not {type(model_or_name).__name__}")
    facts = decoder_facts(model, name)
    check_lengths(facts, name, prompt_tokens, new_tokens)
    max_len = prompt_tokens + new_tokens
    common = dict(batch=batch, cache=cache, max_len=max_len, precision=precision, name=name, routing=routing)
    prefill = trace_step(model, facts, context=0, query_tokens=prompt_tokens, **common)
    decode = tuple(DecodePoint(c, s, trace_step(model, facts, context=c, query_tokens=1, **common))
                   for c, s in decode_contexts(prompt_tokens, new_tokens))
    final = prompt_tokens + new_tokens - 2   # the cache the last token's step reads
    last = next((p.graph for p in decode if p.context == final), None) if decode else None
    if decode and last is None:
        last = trace_step(model, facts, context=final, query_tokens=1, **common)
    return GenerationGraphs(name, batch, prompt_tokens, new_tokens, precision, cache, prefill, decode, last)


# ------------------------------------------------------------------------------------------ pricing

def generate_host_s(profile: Profile) -> dict[str, float]:
    """generate()'s own Python work (s): a call (`generate_call`) and a step (`generate_step`), the
    profile's if it has them, else the prior's."""
    prior = prior_profile().host_op_s
    return {k: float(profile.host_op_s.get(k, prior.get(k, 0.0))) for k in HOST_KEYS}


def price_generation(graphs: GenerationGraphs, gpu: str | GPUSpec, clock: float | None = None, *,
                     profile: Any = None, launch: str = "eager", power_limit: float | None = None,
                     host_scale: float = 1.0, warn: bool = True) -> GenerationEstimate:
    """Price traced generate() steps on `gpu` (arguments as `estimate_generation`)."""
    if launch not in LAUNCHES:
        raise ValueError(f"unknown launch {launch!r}; accepted: {', '.join(LAUNCHES)}")
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    kw = dict(profile=profile, power_limit=power_limit, host_scale=host_scale)
    # transformers compiles (CUDA-graphs) only the decode steps: the prefill always runs eagerly
    pre = estimate_graph(graphs.prefill, spec, clock, warn=warn, launch="eager", **kw)
    steps = [estimate_graph(p.graph, spec, clock, warn=False, launch=launch, **kw) for p in graphs.decode]
    choice = choose_profile(spec, profile)
    host = {k: v * host_scale for k, v in generate_host_s(choice.profile).items()}
    fit = choice.profile.power
    wait_w = (float(waiting_power_w(spec, pre.effective_clock_mhz, transfer_power(fit, get_gpu(choice.profile.gpu),
                                                                                   spec)))
              if fit is not None else float("nan"))
    weights = np.array([p.steps for p in graphs.decode])
    n_decode = graphs.new_tokens - 1
    rows = [_phase_row("prefill", 0, graphs.prompt_tokens, 1.0, pre.time_s + host["generate_step"],
                       pre.device_time_s, pre.host_time_s + host["generate_step"],
                       pre.energy_j + wait_w * host["generate_step"], pre.bound)]
    rows += [_phase_row("decode", p.context, 1, p.steps, e.time_s + host["generate_step"], e.device_time_s,
                        e.host_time_s + host["generate_step"], e.energy_j + wait_w * host["generate_step"], e.bound)
             for p, e in zip(graphs.decode, steps)]
    rows.append(_phase_row("generate() setup", 0, 0, 1.0, host["generate_call"], 0.0, host["generate_call"],
                           wait_w * host["generate_call"], "host"))
    phases = pd.DataFrame(rows)
    totals = phases[["total_time_s", "total_device_time_s", "total_host_time_s", "total_energy_j"]].sum()
    decode_s = float(phases.loc[phases["phase"] == "decode", "total_time_s"].sum())
    ttft = float(phases.loc[phases["phase"] != "decode", "total_time_s"].sum())
    time_s = ttft + decode_s
    tokens = graphs.batch * graphs.new_tokens
    energy = float(totals["total_energy_j"])
    notes = list(pre.notes)
    memory = _peak_step_memory([pre.memory, *(e.memory for e in steps),
                                memory_estimate(graphs.last, spec) if graphs.last is not None and
                                has_memory_facts(graphs.last) else None])
    if len(weights) and n_decode > len(weights):
        notes.append(f"{n_decode} decode steps integrated from {len(weights)} priced at contexts "
                     + ", ".join(str(p.context) for p in graphs.decode) + " (Gauss-Legendre)")
    return GenerationEstimate(
        model=graphs.model, gpu=spec.name, precision=graphs.precision, batch=graphs.batch,
        prompt_tokens=graphs.prompt_tokens, new_tokens=graphs.new_tokens, cache=graphs.cache, launch=launch,
        clock_mhz=pre.clock_mhz, power_limit_w=pre.power_limit_w, profile_source=pre.profile_source,
        ttft_s=ttft, tpot_s=decode_s / n_decode if n_decode else float("nan"), time_s=time_s,
        decode_time_s=decode_s, tokens_per_s=tokens / time_s if time_s > 0 else float("nan"),
        device_time_s=float(totals["total_device_time_s"]), host_time_s=float(totals["total_host_time_s"]),
        energy_j=energy, energy_per_token_j=energy / tokens, avg_power_w=energy / time_s if time_s > 0 else math.nan,
        phases=phases, notes=notes, prefill=pre, decode=steps, memory=memory)


def _peak_step_memory(steps: list[MemoryEstimate | None]) -> MemoryEstimate | None:
    """The step's memory with the highest reserved peak (None if any step's is unknown)."""
    if not steps or any(m is None for m in steps):
        return None
    return max(steps, key=lambda m: m.peak_reserved_bytes)


def _phase_row(phase: str, context: int, query_tokens: int, steps: float, time_s: float, device_s: float,
               host_s: float, energy_j: float, bound: str) -> dict[str, Any]:
    return {"phase": phase, "context": context, "query_tokens": query_tokens, "steps": steps, "time_s": time_s,
            "device_time_s": device_s, "host_time_s": host_s, "energy_j": energy_j, "bound": bound,
            "total_time_s": steps * time_s, "total_device_time_s": steps * device_s,
            "total_host_time_s": steps * host_s, "total_energy_j": steps * energy_j}


def estimate_generation(model_or_name: torch.nn.Module | str, gpu: str | GPUSpec, *, batch: int,
                        prompt_tokens: int, new_tokens: int, precision: str = "bf16", cache: str = "dynamic",
                        launch: str = "eager", clock: float | None = None, power_limit: float | None = None,
                        profile: Any = None, host_scale: float = 1.0,
                        routing: Any = "balanced") -> GenerationEstimate:
    """Predict a greedy transformers `generate()` call of `new_tokens` tokens after a `prompt_tokens` prompt,
    for `batch` sequences, on `gpu`.

    model_or_name: a transformers decoder LM (weights never needed: build it on the meta device) or a model
        spec such as "hf:llama", "hf:gpt2".
    precision: the model's weights and KV cache ("bf16", "fp16", "fp32").
    cache: "dynamic" (transformers' default: the cache grows by concatenation, each step copies it) or
        "static" (preallocated to prompt + new tokens, updated in place; attention spans its whole length).
    launch: "eager" (every op dispatched from Python) or "graph" (decode steps replayed as CUDA graphs, one
        launch a step, as with a static cache and torch.compile; the prefill runs eagerly either way).
    clock: SM clock in MHz (default max boost); power_limit: board limit in W (default TDP).
    profile: as for `estimate` (None: the GPU's calibrated profile or the nearest one).
    host_scale: multiplies every host cost, the ops' dispatch and generate()'s own Python work (this host's
        speed against the profile's calibration hosts: `gpuest host-probe` measures it).
    routing: a mixture-of-experts model's routing assumption in every step, as for `trace`.
    The result carries ttft_s, tpot_s, time_s, tokens_per_s, energy_j, energy_per_token_j and `phases`;
    decode steps are priced at QUADRATURE_POINTS contexts spread over the answer and integrated (module
    docstring). Raises GenerationError for a model that is not a decoder LM with a KV cache, or for more
    tokens than its position embeddings cover.
    """
    graphs = trace_generation(model_or_name, batch=batch, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                              precision=precision, cache=cache, routing=routing)
    return price_generation(graphs, gpu, clock, profile=profile, launch=launch, power_limit=power_limit,
                            host_scale=host_scale)


def compare_generation(graphs: GenerationGraphs, gpus: Iterable[str] | None = None, clock: float | None = None, *,
                       by: str = "tokens_per_s", launch: str = "eager", profile: Any = None,
                       host_scale: float = 1.0) -> pd.DataFrame:
    """One row per GPU (each at `clock`, clamped to its range, or its max boost) for the traced generate()
    call, ranked by `by`: "tokens_per_s" (highest first), "energy_per_token", "time" or "ttft" (lowest first);
    host_scale as for `estimate_generation`."""
    from ..catalog import list_gpus
    if by not in GENERATION_OBJECTIVES:
        raise ValueError(f"unknown ranking {by!r} for a generation; accepted: {', '.join(GENERATION_OBJECTIVES)}")
    names = list(gpus) if gpus is not None else [g.name for g in list_gpus()]
    rows = []
    for name in names:
        spec = get_gpu(name)
        clk = None if clock is None else min(max(clock, spec.min_clock_mhz), spec.max_clock_mhz)
        est = price_generation(graphs, spec, clk, profile=profile, launch=launch, host_scale=host_scale, warn=False)
        rows.append({k: v for k, v in est.summary().items() if k in (
            "gpu", "clock_mhz", "ttft_s", "tpot_s", "time_s", "tokens_per_s", "energy_j", "energy_per_token_j",
            "avg_power_w", "profile_source", "peak_memory_bytes", "fits")})
    df = pd.DataFrame(rows)
    for name, (col, ascending) in GENERATION_OBJECTIVES.items():
        df[f"rank_{name}"] = df[col].rank(method="min", ascending=ascending).astype(int)
    col, ascending = GENERATION_OBJECTIVES[by]
    return df.sort_values(col, ascending=ascending).reset_index(drop=True)
