"""`export`: write a traced graph or an Estimate to a file, the format chosen by the file's extension.

  .graphml     GraphML (networkx), scalar attributes; an Estimate writes its annotated graph (pred_* attrs)
  .json        networkx node-link data (+ the estimate's summary for an Estimate)
  .dot         Graphviz DOT text (node labels: op and predicted time, or op and FLOPs for a bare graph)
  .csv         one row per node (the per-node predictions for an Estimate, node attributes for a graph)
  .trace.json  predicted host/device timeline and power as Chrome trace / Perfetto JSON (Estimate only)
  .html        a self-contained HTML report (Estimate only)
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import networkx as nx
import pandas as pd

if TYPE_CHECKING:
    from ..price.estimate import Estimate

FORMATS = (".graphml", ".json", ".dot", ".csv", ".trace.json", ".html")
Exportable = Union["Estimate", nx.DiGraph]


def _format_of(path: Path) -> str:
    name = path.name.lower()
    # Longest suffix first: ".trace.json" must win over ".json".
    for ext in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(ext):
            return ext
    raise ValueError(f"cannot export to {path.name!r}: unknown extension; accepted: {', '.join(FORMATS)}")


def _is_estimate(obj: Any) -> bool:
    from ..price.estimate import Estimate
    return isinstance(obj, Estimate)


def _graph_of(obj: Exportable) -> nx.DiGraph:
    if _is_estimate(obj):
        return obj.annotated_graph()
    if isinstance(obj, nx.DiGraph):
        return obj
    raise TypeError(f"export() takes an Estimate or a traced graph (networkx.DiGraph), not {type(obj).__name__}")


def _scalar(value: Any) -> Any:
    """GraphML holds only str/int/float/bool: anything else (None, lists, numpy scalars) is converted."""
    # Exact types: GraphML rejects subclasses such as torch's TorchVersion (a str).
    if isinstance(value, bool):
        return bool(value)
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    if value is None:
        return ""
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return json.dumps(value, default=str)


def _scalar_graph(graph: nx.DiGraph) -> nx.DiGraph:
    g = nx.DiGraph()
    g.graph.update({k: _scalar(v) for k, v in graph.graph.items()})
    g.add_nodes_from((n, {k: _scalar(v) for k, v in d.items()}) for n, d in graph.nodes(data=True))
    g.add_edges_from((u, v, {k: _scalar(x) for k, x in d.items()}) for u, v, d in graph.edges(data=True))
    return g


def _json_safe(value: Any) -> Any:
    """Strict JSON has no NaN/inf (energy is NaN without a power model): write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _json_safe(value.item())
    return value


def write_graphml(obj: Exportable, path: Path) -> Path:
    nx.write_graphml(_scalar_graph(_graph_of(obj)), path)
    return path


def write_json(obj: Exportable, path: Path) -> Path:
    data = nx.node_link_data(_graph_of(obj), edges="edges")
    if _is_estimate(obj):
        summary = obj.summary()
        summary.update(notes=list(obj.notes), phase_clocks_mhz=obj.phase_clocks_mhz)
        data["estimate"] = summary
    path.write_text(json.dumps(_json_safe(data), indent=1, allow_nan=False))
    return path


def _dot_str(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


BOUND_COLOURS = {"compute": "#f4a582", "memory": "#92c5de", "latency": "#d9d9d9", "host": "#fddbc7",
                 "none": "#ffffff"}


def write_dot(obj: Exportable, path: Path) -> Path:
    """Plain DOT text (no pygraphviz needed); metadata-only (view) nodes are drawn dashed and grey."""
    from .text import seconds, si
    graph = _graph_of(obj)
    predicted = _is_estimate(obj)
    lines = [f"digraph {_dot_str(graph.graph.get('model', 'graph'))} {{",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];']
    for n, d in graph.nodes(data=True):
        op = str(d.get("op", n)).removeprefix("aten.")
        if predicted:
            extra = seconds(float(d.get("pred_time_s", 0.0)))
            colour = BOUND_COLOURS.get(str(d.get("pred_bound", "none")), "#ffffff")
        else:
            extra = si(float(d.get("flops", 0.0)), "FLOP")
            colour = "#ffffff"
        label = f"{op}\n{extra}"
        if d.get("module"):
            label += f"\n{d['module']}"
        style = ', style="rounded,dashed", fontcolor="#888888"' if d.get("free") else ""
        lines.append(f"  {_dot_str(n)} [label={_dot_str(label)}, fillcolor={_dot_str(colour)}{style}];")
    for u, v in graph.edges():
        lines.append(f"  {_dot_str(u)} -> {_dot_str(v)};")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(obj: Exportable, path: Path) -> Path:
    if _is_estimate(obj):
        obj.per_node.to_csv(path, index=False)
    else:
        graph = _graph_of(obj)
        pd.DataFrame([{"node": n, **d} for n, d in graph.nodes(data=True)]).to_csv(path, index=False)
    return path


def export(obj: Exportable, path: str | Path) -> Path:
    """Write `obj` (an Estimate or a traced graph) to `path`, the format chosen by its extension.

    Accepted: .graphml .json .dot .csv .trace.json .html; the last two need an Estimate (predictions)."""
    path = Path(path)
    fmt = _format_of(path)
    if fmt in (".trace.json", ".html") and isinstance(obj, nx.DiGraph):
        what = "a predicted timeline" if fmt == ".trace.json" else "an HTML report"
        raise ValueError(f"{fmt} exports {what} and needs an Estimate, not a bare traced graph; price it first: "
                         f"export(gpuest.estimate(graph, gpu='A100'), {str(path)!r}) in Python, or "
                         f"`gpuest export MODEL --gpu A100 -o {path.name}`")
    if not (_is_estimate(obj) or isinstance(obj, nx.DiGraph)):
        raise TypeError(f"export() takes an Estimate or a traced graph (networkx.DiGraph), not {type(obj).__name__}")
    if fmt == ".graphml":
        return write_graphml(obj, path)
    if fmt == ".json":
        return write_json(obj, path)
    if fmt == ".dot":
        return write_dot(obj, path)
    if fmt == ".csv":
        return write_csv(obj, path)
    if fmt == ".trace.json":
        from .perfetto import write_trace
        return write_trace(obj, path)
    from .html import html_report
    return html_report(obj, path)
