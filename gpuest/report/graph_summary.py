"""The text summary `gpuest graph` prints: per-category and per-module FLOPs, bytes and node counts."""
from __future__ import annotations

from collections import defaultdict

import networkx as nx

from ..capture.trace import unsupported_ops
from .text import si, table


def _totals(graph: nx.DiGraph, key) -> list[list[str]]:
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for _, d in graph.nodes(data=True):
        if d["free"]:
            continue
        a = acc[key(d)]
        a[0] += 1
        a[1] += d["flops"]
        a[2] += d["bytes_read"] + d["bytes_written"]
    rows = sorted(acc.items(), key=lambda kv: -kv[1][1] - kv[1][2] * 1e-3)
    return [[k, str(int(v[0])), si(v[1], "FLOP"), si(v[2], "B")] for k, v in rows]


def graph_summary(graph: nx.DiGraph, module_depth: int = 1) -> str:
    """Header with graph totals, then per-phase, per-category and per-module tables and unsupported ops."""
    g = graph.graph
    free = sum(1 for _, d in graph.nodes(data=True) if d["free"])
    lines = [
        f"{g['model']} [{g['mode']}, {g['precision']}, batch {g['batch']}]: {graph.number_of_nodes()} nodes "
        f"({free} metadata-only), {graph.number_of_edges()} edges; torch {g['torch_version']}, "
        f"SDPA backend {g['sdpa_backend']}",
        f"total {si(g['total_flops'], 'FLOP')} ({si(g['total_tensor_core_flops'], 'FLOP')} on tensor-core ops), "
        f"{si(g['total_bytes'], 'B')} moved",
        "",
        table(_totals(graph, lambda d: d["phase"]), ["phase", "nodes", "flops", "bytes"]),
        "",
        table(_totals(graph, lambda d: d["category"]), ["category", "nodes", "flops", "bytes"]),
        "",
        table(_totals(graph, lambda d: ".".join(d["module"].split(".")[:module_depth]) or "(top level)")[:20],
              ["module", "nodes", "flops", "bytes"]),
    ]
    missing = unsupported_ops(graph)
    lines.append("")
    if missing:
        lines.append("unsupported ops (no cost formula; priced by their bytes): "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(missing.items())))
    else:
        lines.append("unsupported ops: none")
    return "\n".join(lines)
