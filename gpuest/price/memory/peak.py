"""Peak device memory of a traced step: replay its storages through the caching allocator.

Protocol predicted (what gpuest/calibrate/memory_validate.py measures): the model, its inputs and (training)
the optimizer state are on the GPU; WARMUP_STEPS steps run; `torch.cuda.reset_peak_memory_stats()`;
one more step; `torch.cuda.max_memory_allocated()`. A training step begins with
`zero_grad(set_to_none=True)`, so the previous step's gradients are allocated when the peak is reset and
freed before the forward pass. The first step has no previous gradients, and the optimizer creates its
state in that step, when its update begins, in blocks the freed activations left cached: where those
persistent blocks land decides how fragmented the later steps' cache is, and so whether they fit.
"""
from __future__ import annotations

import json
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from ...catalog import GPUSpec
from ...errors import GraphNotAnnotatedError
from ...measurement_protocol import WARMUP_STEPS
from ..device_time import effective_math_modes
from ..features import cudnn_relayouts
from ..node_table import NodeTable
from .allocator import CachingAllocator, ExactCounter, SimulatedOOM
from .workspace import CUBLAS_CATEGORIES, library_workspaces

# Device memory outside the caching allocator: the CUDA context, cuBLAS/cuDNN handles and the kernels
# they load lazily (gpuest/calibrate/memory_validate.py records it per config as context_bytes).
CUDA_CONTEXT_RESERVE_BYTES = 1 << 30
# What each storage is, by the phase that allocated it (persistent storages carry their own kind).
PHASE_KIND = {"forward": "activations", "loss": "activations", "backward": "temporaries", "optimizer": "temporaries"}
KINDS = ("weights", "inputs", "optimizer_state", "gradients", "activations", "temporaries", "workspace")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted device memory of one steady-state step (bytes).

    peak_bytes: torch.cuda.max_memory_allocated() over the step; breakdown_bytes: the allocated blocks at
    that moment by kind (KINDS), summing to peak_bytes; peak_reserved_bytes: max_memory_reserved() with
    unlimited memory; capacity_bytes: what the allocator may use on the GPU (its memory less the CUDA
    context); fits: the step runs there without an out-of-memory error."""

    peak_bytes: int
    breakdown_bytes: dict[str, int]
    peak_reserved_bytes: int
    capacity_bytes: float
    fits: bool
    workspaces: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Program:
    persistent: list[tuple[int, int, str]]       # (sid, bytes, kind)
    events: list[tuple[bool, int, int, str]]     # (is_alloc, sid, bytes, kind) in op order
    gradients: list[int]
    gemm_phases: frozenset[str]
    optimizer_start: int                         # index in events where the optimizer update begins
    table: NodeTable                             # the nodes in op order
    after_outputs: list[int]                     # per node: index in events just after it allocated its outputs


_PROGRAMS: "weakref.WeakKeyDictionary[nx.DiGraph, _Program]" = weakref.WeakKeyDictionary()
_REPLAYS: "weakref.WeakKeyDictionary[nx.DiGraph, dict]" = weakref.WeakKeyDictionary()


def has_memory_facts(graph: nx.DiGraph) -> bool:
    """Whether `graph` carries the storage events `gpuest.trace` records (older graphs do not)."""
    return "memory_persistent" in graph.graph


def _program(graph: nx.DiGraph) -> _Program:
    cached = _PROGRAMS.get(graph)
    if cached is not None:
        return cached
    if not has_memory_facts(graph):
        raise GraphNotAnnotatedError("the graph has no storage events (memory_persistent): trace the model again "
                                     "with this version of gpuest.trace to predict its memory")
    persistent = [(int(s), int(b), str(k)) for s, b, k in json.loads(graph.graph["memory_persistent"])]
    gradients = [int(s) for s in json.loads(graph.graph.get("memory_gradients", "[]"))]
    grads = set(gradients)
    events: list[tuple[bool, int, int, str]] = []
    gemm_phases = set()
    optimizer_start = None
    ordered = sorted(graph.nodes(data=True), key=lambda kv: kv[1].get("order", kv[0]))
    after_outputs = []
    for _, attrs in ordered:
        if optimizer_start is None and attrs.get("phase") == "optimizer":
            optimizer_start = len(events)
        tokens = str(attrs.get("mem_events", "")).split()
        allocated_first = next((i for i, t in enumerate(tokens) if t[0] != "+"), len(tokens))
        after_outputs.append(len(events) + allocated_first)
        if attrs.get("category") in CUBLAS_CATEGORIES:
            gemm_phases.add(attrs.get("phase", "forward"))
        kind = PHASE_KIND.get(attrs.get("phase", "forward"), "temporaries")
        for token in str(attrs.get("mem_events", "")).split():
            if token[0] == "+":
                sid, nbytes = token[1:].split(":")
                s = int(sid)
                events.append((True, s, int(nbytes), "gradients" if s in grads else kind))
            else:
                events.append((False, int(token[1:]), 0, ""))
    program = _Program(persistent, events, gradients, frozenset(gemm_phases),
                       len(events) if optimizer_start is None else optimizer_start,
                       NodeTable.from_records([a for _, a in ordered]), after_outputs)
    _PROGRAMS[graph] = program
    return program


@dataclass
class _Replay:
    peak_bytes: int
    breakdown: dict[str, int]
    peak_reserved_bytes: int


def _higher(total: int, kinds: Counter[str], best_total: int, best: dict[str, int]) -> tuple[int, dict[str, int]]:
    """The allocated bytes and their breakdown by kind now if they exceed the best so far, else the best."""
    return (total, dict(kinds)) if total > best_total else (best_total, best)


def _replay(program: _Program, workspaces: list[tuple[str, int]], capacity: float | None,
            exact: bool = False, transients: tuple[tuple[int, int], ...] = ()) -> _Replay:
    """Run WARMUP_STEPS + 1 steps through a caching allocator of `capacity` bytes (SimulatedOOM if it
    cannot hold them), or with `exact` through a plain byte count; the peak and its breakdown are the
    last step's. transients: (event index, bytes) of workspaces allocated and freed just before that event."""
    transient_at = dict(transients)
    alloc: CachingAllocator | ExactCounter = ExactCounter() if exact else CachingAllocator(capacity)
    kinds: Counter[str] = Counter()
    owned: dict[Any, tuple[str, int]] = {}

    def malloc(key: Any, nbytes: int, kind: str) -> None:
        size = alloc.malloc(key, nbytes)
        owned[key] = (kind, size)
        kinds[kind] += size

    def free(key: Any) -> None:
        kind, size = owned.pop(key, ("", 0))
        if kind:
            kinds[kind] -= size
            alloc.free(key)

    lazy_state = [p for p in program.persistent if p[2] == "optimizer_state"]

    def create_state() -> None:   # the optimizer's first update
        for sid, nbytes, kind in lazy_state:
            malloc(("persistent", sid), nbytes, kind)

    for sid, nbytes, kind in program.persistent:
        if kind != "optimizer_state":
            malloc(("persistent", sid), nbytes, kind)
    for name, nbytes in workspaces:
        malloc(("workspace", name), nbytes, "workspace")
    previous: list[tuple[int, int]] = []
    best_total, best = 0, dict(kinds)
    for step in range(WARMUP_STEPS + 1):
        measured = step == WARMUP_STEPS
        if measured:
            alloc.reset_peak()
            best_total, best = alloc.allocated_bytes, dict(kinds)
        for key in previous:     # zero_grad(set_to_none=True)
            free(key)
        for i, (is_alloc, sid, nbytes, kind) in enumerate(program.events):
            if step == 0 and i == program.optimizer_start:
                create_state()
            if i in transient_at:
                malloc(("transient", step, i), transient_at[i], "workspace")
                if measured:
                    best_total, best = _higher(alloc.allocated_bytes, kinds, best_total, best)
                free(("transient", step, i))
            if is_alloc:
                malloc((step, sid), nbytes, kind)
                if measured:
                    best_total, best = _higher(alloc.allocated_bytes, kinds, best_total, best)
            else:
                free((step, sid))
        if step == 0 and program.optimizer_start >= len(program.events):
            create_state()
        previous = [(step, sid) for sid in program.gradients]
        keep = set(previous)
        for key in [k for k in owned if k[0] == step and k not in keep]:
            free(key)        # anything else the step left dies with its locals
    breakdown = {k: int(best.get(k, 0)) for k in KINDS}
    return _Replay(alloc.peak_allocated_bytes, breakdown, alloc.peak_reserved_bytes)


def live_storage_peak_bytes(graph: nx.DiGraph) -> tuple[int, dict[str, int]]:
    """Peak of the bytes of live storages over the step, and its breakdown, with no allocator rounding and
    no library workspace: the quantity fake-tensor trackers such as torch's MemTracker report."""
    replay = _replay(_program(graph), [], None, exact=True)
    return replay.peak_bytes, replay.breakdown


def capacity_bytes(gpu: GPUSpec) -> float:
    """Bytes the caching allocator may reserve on `gpu`: its device memory less the CUDA context."""
    return gpu.cuda_memory_bytes - CUDA_CONTEXT_RESERVE_BYTES


def relayout_workspaces(program: _Program, gpu: GPUSpec) -> tuple[tuple[int, int], ...]:
    """(event index, bytes) of the workspace each convolution that cuDNN runs in another layout on `gpu`
    holds while it runs (features.cudnn_relayouts): its transposed activations, Cost.relayout_bytes."""
    table = program.table
    relayout = cudnn_relayouts(table, effective_math_modes(table, gpu)[0]) & (table.relayout_bytes > 0)
    return tuple((program.after_outputs[i], int(table.relayout_bytes[i])) for i in np.flatnonzero(relayout))


def memory_estimate(graph: nx.DiGraph, gpu: GPUSpec) -> MemoryEstimate:
    """Predicted peak allocated and reserved bytes of the traced step on `gpu`, and whether it fits."""
    program = _program(graph)
    workspaces = library_workspaces(program.gemm_phases, gpu)
    transients = relayout_workspaces(program, gpu)
    key = (tuple(workspaces), transients)
    replays = _REPLAYS.setdefault(graph, {})
    if key not in replays:
        replays[key] = _replay(program, workspaces, None, transients=transients)
    free_run = replays[key]
    capacity = capacity_bytes(gpu)
    fits = free_run.peak_reserved_bytes <= capacity
    if not fits:   # the allocator releases its cache before giving up: replay against the real limit
        try:
            _replay(program, workspaces, capacity, transients=transients)
            fits = True
        except SimulatedOOM:
            fits = False
    return MemoryEstimate(peak_bytes=free_run.peak_bytes, breakdown_bytes=free_run.breakdown,
                          peak_reserved_bytes=free_run.peak_reserved_bytes, capacity_bytes=capacity, fits=fits,
                          workspaces=dict(workspaces))
