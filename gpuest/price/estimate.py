"""`estimate`: time, power and energy of a traced graph on a catalogued GPU at a clock or power limit."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
import torch

from ..catalog import GPUSpec, get_gpu
from ..catalog.chips import full_load_power_w
from ..capture.trace import routing_decisions
from ..capture.trace import unsupported_ops as graph_unsupported_ops
from .memory.peak import MemoryEstimate, has_memory_facts, memory_estimate
from .device_time import Z90, DeviceTimes, device_times, warn_notes
from .host_timeline import LAUNCHES, Timeline, host_parts, simulate
from .node_table import PHASES, NodeTable, node_table
from .power import CLOCK_SEARCH_STEPS, HW_SLOWDOWN_FLOOR, NodePower, node_power, transfer_power
from .profile_choice import ProfileChoice, choose_profile

BOUNDS = ("host", "latency", "memory", "compute")


@dataclass
class Estimate:
    """Predicted time, power and energy of one step of a traced model on one GPU.

    Times in seconds, power in watts, energy in joules. `str(est)` is a summary table.
    """

    model: str
    mode: str
    precision: str
    batch: int
    gpu: str
    clock_mhz: float                 # requested SM clock (max boost when none was given)
    effective_clock_mhz: float       # time-weighted clock after power capping
    power_limit_w: float
    launch: str
    profile_source: str
    profile_note: str
    time_s: float                    # wall time of one iteration (host and device)
    time_low_s: float                # 90 % prediction interval
    time_high_s: float
    device_time_s: float             # sum of kernel times
    host_time_s: float               # CPU dispatch time
    bound: str                       # host / latency / memory / compute
    energy_j: float
    avg_power_w: float
    per_node: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    phase_clocks_mhz: dict[str, float] = field(default_factory=dict)
    memory: MemoryEstimate | None = None   # None for a graph traced without storage events
    routing: str = ""                # the mixture-of-experts routing assumption ("" for a model without routing)
    _graph: nx.DiGraph | None = field(default=None, repr=False)

    @property
    def peak_memory_bytes(self) -> int | None:
        """Predicted torch.cuda.max_memory_allocated() of the step after warm-up (bytes)."""
        return None if self.memory is None else self.memory.peak_bytes

    @property
    def memory_breakdown(self) -> dict[str, int]:
        """Allocated bytes at the peak by kind: weights, inputs, optimizer_state, gradients, activations,
        temporaries, workspace (sums to peak_memory_bytes)."""
        return {} if self.memory is None else dict(self.memory.breakdown_bytes)

    @property
    def fits(self) -> bool | None:
        """Whether the step runs on this GPU without running out of memory (None: memory not predicted)."""
        return None if self.memory is None else self.memory.fits

    @property
    def edp_js(self) -> float:
        """Energy-delay product (J*s)."""
        return self.energy_j * self.time_s

    def by_module(self, depth: int = 1) -> pd.DataFrame:
        """Time, energy, FLOPs and bytes summed per module path cut at `depth` components."""
        df = self.per_node[~self.per_node["free"]]
        return self._summed(df["module"].map(lambda m: ".".join(m.split(".")[:depth]) if m else "(top level)"))

    def by_operator(self) -> pd.DataFrame:
        """Time, energy, FLOPs and bytes summed per ATen op."""
        return self._summed("op")

    def by_category(self) -> pd.DataFrame:
        """Time, energy, FLOPs and bytes summed per cost category."""
        return self._summed("category")

    def _summed(self, key: Any) -> pd.DataFrame:
        """Node counts and sums of the non-free nodes grouped by `key` (a column name or a Series)."""
        df = self.per_node[~self.per_node["free"]]
        out = df.groupby(key).agg(nodes=("op", "size"), time_s=("time_s", "sum"), energy_j=("energy_j", "sum"),
                                  flops=("flops", "sum"), bytes=("bytes", "sum"))
        out["share"] = out["time_s"] / max(self.device_time_s, 1e-30)
        return out.sort_values("time_s", ascending=False)

    def hot_ops(self, n: int = 10) -> pd.DataFrame:
        """The `n` nodes with the largest predicted device time."""
        cols = ["op", "module", "phase", "category", "math_mode", "flops", "bytes", "time_s", "bound", "share",
                "energy_j"]
        return self.per_node.nlargest(n, "time_s")[cols]

    def unsupported_ops(self) -> dict[str, int]:
        """Ops priced by bytes only (no cost formula), with their counts."""
        return graph_unsupported_ops(self._graph) if self._graph is not None else {}

    def annotated_graph(self) -> nx.DiGraph:
        """A copy of the traced graph with the predictions on its nodes (pred_* attributes)."""
        if self._graph is None:
            raise ValueError("this Estimate was built without its graph")
        g = self._graph.copy()
        cols = {"time_s": "pred_time_s", "host_s": "pred_host_s", "start_s": "pred_start_s", "bound": "pred_bound",
                "power_w": "pred_power_w", "energy_j": "pred_energy_j", "clock_mhz": "pred_clock_mhz"}
        for row in self.per_node[["node", *cols]].itertuples(index=False):
            values = row._asdict()
            g.nodes[values.pop("node")].update({cols[k]: (float(v) if not isinstance(v, str) else v)
                                                for k, v in values.items()})
        g.graph.update(pred_gpu=self.gpu, pred_time_s=self.time_s, pred_energy_j=self.energy_j,
                       pred_clock_mhz=self.clock_mhz, pred_profile=self.profile_source)
        return g

    def summary(self) -> dict[str, Any]:
        keys = ("model", "mode", "precision", "batch", "gpu", "clock_mhz", "effective_clock_mhz", "power_limit_w",
                "launch", "profile_source", "profile_note", "time_s", "time_low_s", "time_high_s", "device_time_s",
                "host_time_s", "bound", "energy_j", "avg_power_w", "edp_js", "peak_memory_bytes", "fits")
        out = {k: getattr(self, k) for k in keys}
        if self.memory is not None:
            out.update(peak_reserved_bytes=self.memory.peak_reserved_bytes,
                       memory_capacity_bytes=self.memory.capacity_bytes, memory_breakdown=self.memory_breakdown)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Summary, notes, breakdowns and per-node rows as plain JSON-ready data."""
        data = self.summary()
        data.update(notes=list(self.notes), phase_clocks_mhz=self.phase_clocks_mhz, routing=self.routing,
                    unsupported_ops=self.unsupported_ops(),
                    by_category=json.loads(self.by_category().to_json(orient="index")),
                    hot_ops=json.loads(self.hot_ops(10).to_json(orient="records")),
                    per_node=json.loads(self.per_node.to_json(orient="records")))
        return data

    def __str__(self) -> str:
        from ..report.text import estimate_summary
        return estimate_summary(self)


# ---------------------------------------------------------------------------------------------------------


def _device_and_power(table: NodeTable, gpu: GPUSpec, clocks: np.ndarray, choice: ProfileChoice,
                      launch: str) -> tuple[DeviceTimes, NodePower | None, list[str]]:
    times, notes = device_times(table, gpu, clocks, choice.profile, launch, choice.donors)
    fit = choice.profile.power
    power = None if fit is None else node_power(table, times, gpu, clocks,
                                                transfer_power(fit, get_gpu(choice.profile.gpu), gpu))
    return times, power, notes


def _price(table: NodeTable, gpu: GPUSpec, clocks: np.ndarray, choice: ProfileChoice, launch: str,
           host_scale: float) -> tuple[DeviceTimes, Timeline, NodePower | None, list[str]]:
    times, power, notes = _device_and_power(table, gpu, clocks, choice, launch)
    lead, spread = host_parts(table, choice.profile, launch, host_scale)
    timeline = simulate(times.queue_s, lead + spread, spread, table.kernels, table.host_syncs)
    return times, timeline, power, notes


def _phase_power(table: NodeTable, times: DeviceTimes, node_w: np.ndarray) -> dict[str, float]:
    """Average of `node_w` (W per node) over each phase present in the graph, weighted by the time each node
    holds the queue (its kernels and the gaps after them, all drawing the node's power)."""
    out = {}
    for p in PHASES:
        mask = table.phase == p
        if mask.any():
            d = times.queue_s[mask]
            out[p] = float((node_w[mask] * d).sum() / max(d.sum(), 1e-30))
    return out


def power_capped_clocks(table: NodeTable, gpu: GPUSpec, clock: float, limit_w: float, choice: ProfileChoice,
                        launch: str = "eager", groups: np.ndarray | None = None) -> np.ndarray:
    """Per-node SM clocks (MHz): each group of nodes runs at the highest clock <= `clock` (MHz) at which the average
    power it would draw unlimited (NodePower.demand_w, weighted by queue time) fits `limit_w` (W).

    groups: a label per node (default: its phase). Power capping acts on the driver's averaging window
    (milliseconds), so a phase is throttled as a whole rather than op by op; a benchmark repeating one kernel
    is a group of its own."""
    clocks = np.full(len(table), float(clock))
    if choice.profile.power is None or not len(table):
        return clocks
    _, group = np.unique(table.phase if groups is None else groups, return_inverse=True)
    n_groups = int(group.max()) + 1

    def over_limit(clk: np.ndarray) -> np.ndarray:
        # The host timeline does not change power per node: price device time and power only.
        times, power, _ = _device_and_power(table, gpu, clk, choice, launch)
        d = times.queue_s
        watts = np.bincount(group, weights=power.demand_w * d, minlength=n_groups)
        return watts / np.maximum(np.bincount(group, weights=d, minlength=n_groups), 1e-30) > limit_w

    todo = over_limit(clocks)
    if not todo.any():
        return clocks
    # Below its lowest supported clock the hardware still enforces a limit (clock slowdown / duty
    # cycling), so the search may go under min_clock_mhz, down to HW_SLOWDOWN_FLOOR of it.
    lo = np.full(n_groups, gpu.min_clock_mhz * HW_SLOWDOWN_FLOOR)
    hi = np.full(n_groups, float(clock))
    for _ in range(CLOCK_SEARCH_STEPS):
        mid = np.where(todo, (lo + hi) / 2, hi)
        over = over_limit(mid[group])
        hi = np.where(todo & over, mid, hi)
        lo = np.where(todo & ~over, mid, lo)
    return np.where(todo, lo, hi)[group]


def _overall_bound(times: DeviceTimes, timeline: Timeline) -> str:
    parts = {
        "host": float(timeline.wait_s.sum() + max(timeline.host_total_s - timeline.end_s[-1], 0.0))
        if len(timeline.end_s) else 0.0,
        "latency": float(times.latency_s.sum()),
        "memory": float((times.device_s - times.latency_s)[times.bound == "memory"].sum()),
        "compute": float((times.device_s - times.latency_s)[times.bound == "compute"].sum()),
    }
    return max(parts, key=parts.get)


def _check_pricing_args(launch: str, host_scale: float) -> None:
    """Raises ValueError for an unknown launch or a host_scale that is not a finite number >= 0."""
    if launch not in LAUNCHES:
        raise ValueError(f"unknown launch {launch!r}; accepted: {', '.join(LAUNCHES)}")
    if not (isinstance(host_scale, (int, float)) and math.isfinite(host_scale) and host_scale >= 0):
        raise ValueError(f"host_scale must be a finite number >= 0, got {host_scale!r}")


def _power_limit_notes(table: NodeTable, spec: GPUSpec, times: DeviceTimes, power: NodePower, clocks: np.ndarray,
                       limit_w: float, clock_mhz: float) -> list[str]:
    """A note per phase the power limit throttles: past what the hardware can, below its lowest clock, or below
    the requested `clock_mhz` (MHz)."""
    notes, throttled = [], []
    for p, avg in _phase_power(table, times, power.demand_w).items():
        clk = float(clocks[table.phase == p].max())
        if avg > limit_w * 1.001 and clk <= spec.min_clock_mhz * HW_SLOWDOWN_FLOOR + 1e-6:
            notes.append(f"the {p} phase draws {avg:.0f} W even fully throttled: the {limit_w:g} W limit "
                         "cannot be met according to this power model")
        elif clk < spec.min_clock_mhz - 1e-6:
            notes.append(f"the {p} phase runs below the lowest supported clock ({clk:.0f} < "
                         f"{spec.min_clock_mhz:g} MHz) to meet {limit_w:g} W, as hardware slowdown does")
        elif clk < clock_mhz - 0.5:
            throttled.append(f"{p} {clk:.0f}")
    if throttled:
        notes.append(f"the {limit_w:g} W limit throttles phases to ({', '.join(throttled)}) MHz of {clock_mhz:.0f}; "
                     f"the {spec.name}'s chip draws up to {full_load_power_w(spec):.0f} W flat out")
    return notes


def _graph_notes(graph: nx.DiGraph, spec: GPUSpec) -> tuple[MemoryEstimate | None, str, list[str]]:
    """The step's predicted memory, the routing it assumed ("" for a dense model), and the notes on memory,
    routing and ops priced by their bytes alone."""
    notes = []
    memory = memory_estimate(graph, spec) if has_memory_facts(graph) else None
    if memory is None:
        notes.append("the graph carries no storage events (traced by an older gpuest): memory is not predicted")
    elif not memory.fits:
        notes.append(f"out of memory: the step needs {memory.peak_reserved_bytes / 1e9:.3g} GB of the "
                     f"{memory.capacity_bytes / 1e9:.3g} GB {spec.name} leaves PyTorch; it cannot run there")
    decisions = routing_decisions(graph)
    routing = str(graph.graph.get("routing", "balanced")) if decisions else ""
    if decisions:
        notes.append(routing_note(routing, decisions))
    unsupported = graph_unsupported_ops(graph)
    if unsupported:
        notes.append(f"{sum(unsupported.values())} ops have no cost formula and were priced by their bytes: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(unsupported.items())))
    return memory, routing, notes


def _node_energy(times: DeviceTimes, timeline: Timeline, power: NodePower, n: int) -> tuple[np.ndarray, float]:
    """Energy per node in J (device time and the gaps between its queued kernels at its power, host waits at
    static power) and the step's total in J, which adds the static power over the host's tail after the last
    node. A microsecond gap does not let the board's power fall, and the power fit's windows, whose ops leave
    the same gaps, charge them at the op's power too."""
    node_energy_j = power.power_w * times.queue_s + power.static_w * timeline.wait_s
    tail_s = max(timeline.wall_s - (timeline.end_s[-1] if n else 0.0), 0.0)
    energy_j = float(node_energy_j.sum() + (power.static_w[-1] * tail_s if n else 0.0))
    return node_energy_j, energy_j


def _time_sd_s(times: DeviceTimes) -> float:
    """Standard deviation of the step's device-busy time in s, from its nodes' log-normal uncertainties."""
    # Coefficient uncertainty is shared by all nodes of a category (correlated); residual noise is not.
    d = times.busy_s
    sys_sd = float((d * times.coef_sd).sum())
    rand_sd = float(np.sqrt(((d * np.sqrt(np.maximum(times.log_sd ** 2 - times.coef_sd ** 2, 0))) ** 2).sum()))
    return math.hypot(sys_sd, rand_sd)


def _per_node_frame(table: NodeTable, times: DeviceTimes, timeline: Timeline, clocks: np.ndarray,
                    power_w: np.ndarray, node_energy: np.ndarray) -> pd.DataFrame:
    """Estimate.per_node: one row per node with its op, costs, times (s), bound, clock, power and energy."""
    n = len(table)
    d = times.busy_s
    device_total = float(d.sum())
    host_bound_rows = timeline.wait_s > 0
    node_bound = np.where(host_bound_rows & (times.bound != "none"), "host", times.bound)
    return pd.DataFrame({
        "node": table.node_ids, "op": table.op, "module": table.module, "phase": table.phase,
        "category": table.category, "math_mode": times.effective_mode, "flops": table.flops,
        "bytes": table.bytes, "kernels": table.kernels, "free": table.free, "supported": table.supported,
        "staged": table.staged,
        "time_s": d, "time_low_s": d * np.exp(-Z90 * times.log_sd), "time_high_s": d * np.exp(Z90 * times.log_sd),
        "queue_s": times.queue_s,     # time_s plus the gaps the device leaves after its queued kernels
        "compute_s": times.compute_s, "memory_s": times.memory_s, "latency_s": times.latency_s,
        "host_s": timeline.host_s, "issue_s": timeline.issue_s, "start_s": timeline.start_s,
        "wait_s": timeline.wait_s, "bound": node_bound,
        "share": d / max(device_total, 1e-30), "clock_mhz": np.broadcast_to(clocks, (n,)).astype(float),
        "power_w": power_w, "energy_j": node_energy, "extrapolated": times.extrapolated,
    })


def _extrapolated_note(times: DeviceTimes) -> str:
    """The note on nodes outside their fit's calibration data and their share of device time."""
    d = times.busy_s
    share = float(d[times.extrapolated].sum() / max(float(d.sum()), 1e-30))
    return (f"{int(times.extrapolated.sum())} of {len(d)} nodes ({share:.0%} of device time) lie outside the "
            "calibration data of their fit: their correction is clipped to what the data showed and "
            "their interval widened (per_node column 'extrapolated')")


def estimate_graph(graph: nx.DiGraph, gpu: str | GPUSpec, clock: float | None = None, *,
                   profile: Any = None, launch: str = "eager", power_limit: float | None = None,
                   host_scale: float = 1.0, warn: bool = True) -> Estimate:
    """Price a traced graph; see `estimate` for the arguments."""
    _check_pricing_args(launch, host_scale)
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    clock_mhz = spec.max_clock_mhz if clock is None else spec.check_clock(clock)
    limit_w = spec.tdp_w if power_limit is None else spec.check_power_limit(power_limit)
    table = node_table(graph)
    choice = choose_profile(spec, profile)
    clocks = power_capped_clocks(table, spec, clock_mhz, limit_w, choice, launch)
    times, timeline, power, notes = _price(table, spec, clocks, choice, launch, host_scale)
    if warn:
        warn_notes(notes)   # here, not in a helper: its stacklevel points at estimate_graph's caller
    if choice.source != "measured":
        notes = [choice.note, *notes]
    if choice.power_note:
        notes.append(choice.power_note)
    if power is not None and len(table):
        notes += _power_limit_notes(table, spec, times, power, clocks, limit_w, clock_mhz)
    if host_scale != 1.0:
        notes.append(f"host costs x {host_scale:g} (host_scale) against the {choice.profile.gpu} profile's hosts")
    memory, routing, graph_notes = _graph_notes(graph, spec)
    notes += graph_notes

    n = len(table)
    if power is not None:
        node_energy, energy = _node_energy(times, timeline, power, n)
        power_w = power.power_w
    else:
        node_energy = np.full(n, np.nan)
        power_w = np.full(n, np.nan)
        energy = float("nan")
        notes.append("the profile has no power model: energy is not predicted")
    wall = timeline.wall_s
    sd = _time_sd_s(times)
    d = times.busy_s   # device-busy time: what the Estimate reports (the timeline also holds the queued gaps)
    device_total = float(d.sum())
    per_node = _per_node_frame(table, times, timeline, clocks, power_w, node_energy)
    if times.extrapolated.any():
        notes.append(_extrapolated_note(times))
    eff_clock = float((clocks * d).sum() / device_total) if device_total > 0 else clock_mhz
    phase_clocks = {p: float(clocks[table.phase == p][0]) for p in PHASES if (table.phase == p).any()}
    return Estimate(
        model=str(graph.graph.get("model", "?")), mode=str(graph.graph.get("mode", "?")),
        precision=str(graph.graph.get("precision", "?")), batch=int(graph.graph.get("batch", 0)),
        gpu=spec.name, clock_mhz=float(clock_mhz), effective_clock_mhz=eff_clock, power_limit_w=float(limit_w),
        launch=launch, profile_source=choice.source, profile_note=choice.note,
        time_s=wall, time_low_s=max(wall - Z90 * sd, 0.0), time_high_s=wall + Z90 * sd,
        device_time_s=device_total, host_time_s=timeline.host_total_s,
        bound=_overall_bound(times, timeline) if n else "none",
        energy_j=energy, avg_power_w=energy / wall if wall > 0 else float("nan"),
        per_node=per_node, notes=notes, phase_clocks_mhz=phase_clocks, memory=memory, routing=routing,
        _graph=graph)


def routing_note(routing: str, decisions: list[dict[str, Any]]) -> str:
    """One line saying which expert routing the estimate assumed, and what it gave the first layer."""
    first = decisions[0]
    counts = first["tokens_per_expert"]
    return (f"mixture-of-experts routing assumed {routing} (--routing): {len(decisions)} routing decisions; the "
            f"first sends {first['tokens']} tokens x top-{first['top_k']} over {first['experts']} experts, "
            f"{min(counts)}-{max(counts)} token slots each; measured routing of real weights differs")


def estimate(graph_or_model: nx.DiGraph | torch.nn.Module | str, gpu: str | GPUSpec, clock: float | None = None,
             *, profile: Any = None, launch: str = "eager", power_limit: float | None = None,
             example_inputs: Any = None, host_scale: float = 1.0, **trace_kwargs: Any) -> Estimate:
    """Predict one inference pass or training step of a model on `gpu`.

    graph_or_model: a graph from `gpuest.trace`, an nn.Module (traced with `example_inputs` and
        `trace_kwargs`: mode, precision, optimizer, loss_fn), or a model name such as "resnet50",
        "timm:vit_small_patch16_224", "hf:gpt2" (then `batch`, `seq`, `image_size` may be given).
    gpu: a catalogue name or alias ("A100", "H100", "NVIDIA H100 80GB HBM3").
    clock: SM clock in MHz (None: the GPU's max boost); out-of-range clocks are an error.
    profile: None (the GPU's calibrated profile, else one transferred from the nearest calibrated GPU),
        a Profile, a path to a profile JSON, "prior", or "roofline" (plain roofline baseline).
    launch: "eager" (host dispatch per op) or "graph" (CUDA graphs / compiled: no per-op host cost).
    power_limit: board power limit in W (default: the GPU's TDP); phases that would exceed it run at
        the highest clock that fits.
    host_scale: multiplies the host dispatch costs (a slower or faster CPU than the calibrated one).
    """
    graph = as_graph(graph_or_model, example_inputs, **trace_kwargs)
    return estimate_graph(graph, gpu, clock, profile=profile, launch=launch, power_limit=power_limit,
                          host_scale=host_scale)


def as_graph(graph_or_model: nx.DiGraph | torch.nn.Module | str, example_inputs: Any = None,
             **trace_kwargs: Any) -> nx.DiGraph:
    """A traced graph from a graph, a module plus inputs, or a model name."""
    from ..capture.trace import trace
    if isinstance(graph_or_model, nx.DiGraph):
        if trace_kwargs or example_inputs is not None:
            raise TypeError(f"a traced graph was given; trace arguments {sorted(trace_kwargs)} do not apply")
        return graph_or_model
    if isinstance(graph_or_model, str):
        from ..capture.models import load_model
        load_keys = {"batch", "seq", "image_size", "memory_format"}
        loaded = load_model(graph_or_model, **{k: v for k, v in trace_kwargs.items() if k in load_keys and v})
        rest = {k: v for k, v in trace_kwargs.items() if k not in load_keys}
        return trace(loaded.model, loaded.example_inputs, name=loaded.name, batch=loaded.batch, **rest)
    if isinstance(graph_or_model, torch.nn.Module):
        if example_inputs is None:
            raise TypeError("estimate() got a model without example_inputs; pass example_inputs=(tensor, ...) "
                            "or trace it first with gpuest.trace(model, inputs)")
        return trace(graph_or_model, example_inputs, **trace_kwargs)
    raise TypeError(f"estimate() takes a traced graph, an nn.Module or a model name, "
                    f"not {type(graph_or_model).__name__}")
