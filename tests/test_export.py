"""Exports: every format writes and reads back; the predicted timeline is a valid Chrome/Perfetto trace."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict

import networkx as nx
import pandas as pd
import pytest
import torch

import gpuest
from gpuest.profile import prior_profile
from gpuest.report.export import FORMATS, export


class Tiny(torch.nn.Module):
    """Conv, norm, pool and a linear head: every phase of a training step in ~60 nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4))
        self.head = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return gpuest.trace(Tiny(), (torch.empty(8, 3, 32, 32, device="meta"),), mode="training", name="tiny",
                           batch=8)


@pytest.fixture(scope="module")
def est(graph):
    return gpuest.estimate(graph, "A100")


@pytest.fixture(scope="module")
def est_no_power(graph):
    return gpuest.estimate(graph, "A100", profile=dataclasses.replace(prior_profile(), power=None))


def strict_json(text: str):
    """json.loads that rejects NaN/Infinity (not JSON; browsers and Perfetto refuse them)."""
    def bad(token):
        raise ValueError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=bad)


def validate_trace(data: dict) -> list[dict]:
    """Checks the Chrome trace-event format rules this project promises; returns the events."""
    assert set(data) >= {"traceEvents", "displayTimeUnit"}
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        assert isinstance(e.get("name"), str) and e["name"], e
        assert e.get("ph") in {"X", "C", "M"}, e
        assert "pid" in e, e
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert "tid" in e, e
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            tracks[(e["pid"], e["tid"])].append(e)
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
    for key, xs in tracks.items():
        ts = [e["ts"] for e in xs]
        assert ts == sorted(ts), f"track {key}: timestamps go backwards"
    return events


def device_track(events: list[dict]) -> list[dict]:
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    device_pid = next(pid for pid, n in names.items() if n.startswith("GPU"))
    return [e for e in events if e["ph"] == "X" and e["pid"] == device_pid]


# ------------------------------------------------------------------------------------------ graph formats

@pytest.mark.parametrize("which", ["graph", "estimate"])
def test_graphml_round_trip(tmp_path, graph, est, which):
    obj = graph if which == "graph" else est
    path = export(obj, tmp_path / "g.graphml")
    back = nx.read_graphml(path)
    assert back.number_of_nodes() == graph.number_of_nodes()
    assert back.number_of_edges() == graph.number_of_edges()
    attrs = next(iter(back.nodes(data=True)))[1]
    assert {"op", "category", "phase", "flops"} <= set(attrs)
    if which == "estimate":
        assert "pred_time_s" in attrs and "pred_bound" in attrs
        assert sum(d["pred_time_s"] for _, d in back.nodes(data=True)) == pytest.approx(est.device_time_s)
        assert back.graph["pred_gpu"] == est.gpu
    assert back.graph["model"] == "tiny"


@pytest.mark.parametrize("which", ["graph", "estimate"])
def test_json_node_link_round_trip(tmp_path, graph, est, which):
    path = export(graph if which == "graph" else est, tmp_path / "g.json")
    data = strict_json(path.read_text())
    back = nx.node_link_graph(data, edges="edges")
    assert back.number_of_nodes() == graph.number_of_nodes()
    assert back.number_of_edges() == graph.number_of_edges()
    assert back.graph["model"] == "tiny" and back.graph["mode"] == "training"
    if which == "estimate":
        assert data["estimate"]["time_s"] == pytest.approx(est.time_s)
        assert all("pred_time_s" in n for n in data["nodes"])


def test_json_without_power_is_still_strict_json(tmp_path, est_no_power):
    assert math.isnan(est_no_power.energy_j)
    data = strict_json(export(est_no_power, tmp_path / "e.json").read_text())
    assert data["estimate"]["energy_j"] is None


@pytest.mark.parametrize("which", ["graph", "estimate"])
def test_csv_one_row_per_node(tmp_path, graph, est, which):
    df = pd.read_csv(export(graph if which == "graph" else est, tmp_path / "g.csv"))
    assert len(df) == graph.number_of_nodes()
    assert {"node", "op", "flops"} <= set(df.columns)
    if which == "estimate":
        assert {"time_s", "start_s", "bound", "energy_j"} <= set(df.columns)
        assert df["time_s"].sum() == pytest.approx(est.device_time_s)


@pytest.mark.parametrize("which", ["graph", "estimate"])
def test_dot_is_plain_graphviz(tmp_path, graph, est, which):
    text = export(graph if which == "graph" else est, tmp_path / "g.dot").read_text()
    assert text.startswith("digraph")
    assert text.rstrip().endswith("}") and text.count("{") == text.count("}")
    assert len(re.findall(r"^\s+\"\d+\" -> \"\d+\";$", text, re.M)) == graph.number_of_edges()
    assert len(re.findall(r"^\s+\"\d+\" \[label=", text, re.M)) == graph.number_of_nodes()
    assert "convolution" in text
    assert (" us" in text) if which == "estimate" else ("FLOP" in text)


# ------------------------------------------------------------------------------------------ timeline

@pytest.mark.parametrize("launch", ["eager", "graph"])
def test_trace_json_is_a_valid_timeline(tmp_path, graph, launch):
    e = gpuest.estimate(graph, "A100", launch=launch)
    events = validate_trace(strict_json(export(e, tmp_path / "t.trace.json").read_text()))
    device = device_track(events)
    # One device slice per node with device time; single stream: no overlap.
    assert len(device) == int((e.per_node["time_s"] > 0).sum())
    for a, b in zip(device, device[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-9, (a, b)
    assert sum(x["dur"] for x in device) == pytest.approx(e.device_time_s * 1e6, rel=1e-9)
    assert max(x["ts"] + x["dur"] for x in device) <= e.time_s * 1e6 * (1 + 1e-9)
    args = device[0]["args"]
    assert {"op", "module", "phase", "category", "flops", "bytes", "bound", "energy_j"} <= set(args)
    assert {x["args"]["phase"] for x in device} == {"forward", "loss", "backward", "optimizer"}
    meta = [x for x in events if x["ph"] == "M"]
    assert {x["name"] for x in meta} >= {"process_name", "thread_name"}
    host = [x for x in events if x["ph"] == "X" and x not in device]
    if launch == "eager":
        assert sum(x["dur"] for x in host) == pytest.approx(e.host_time_s * 1e6, rel=1e-9)


def test_trace_power_counter_integrates_to_the_energy(tmp_path, est):
    events = validate_trace(strict_json(export(est, tmp_path / "t.trace.json").read_text()))
    power = [e for e in events if e["ph"] == "C"]
    assert power and all(e["name"] == "power (W)" for e in power)
    ts = [e["ts"] for e in power]
    assert ts == sorted(ts)
    joules = sum(a["args"]["W"] * (b["ts"] - a["ts"]) * 1e-6 for a, b in zip(power, power[1:]))
    assert joules == pytest.approx(est.energy_j, rel=1e-6)
    assert power[-1]["args"]["W"] == 0.0  # closed at the end of the step


def test_trace_without_power_has_no_counter(tmp_path, est_no_power):
    events = validate_trace(strict_json(export(est_no_power, tmp_path / "t.trace.json").read_text()))
    assert not [e for e in events if e["ph"] == "C"]
    assert device_track(events)


def test_trace_from_a_graph_is_a_clear_error(tmp_path, graph):
    with pytest.raises(ValueError, match="needs an Estimate"):
        export(graph, tmp_path / "t.trace.json")
    assert not (tmp_path / "t.trace.json").exists()


# ------------------------------------------------------------------------------------------ errors

def test_unknown_extension_lists_the_accepted_ones(tmp_path, est):
    with pytest.raises(ValueError) as info:
        export(est, tmp_path / "x.png")
    for ext in FORMATS:
        assert ext in str(info.value)


def test_export_rejects_other_objects(tmp_path):
    with pytest.raises(TypeError, match="Estimate or a traced graph"):
        export({"not": "a graph"}, tmp_path / "x.json")


def test_cli_export_writes_a_trace(tmp_path, capsys):
    from gpuest.cli import main
    out = tmp_path / "cli.trace.json"
    # A file model keeps the CLI test small and fast.
    src = tmp_path / "tiny_model.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), "
                   "(torch.empty(4, 64),)\n")
    assert main(["export", f"{src}:make", "--gpu", "H100", "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    validate_trace(strict_json(out.read_text()))
