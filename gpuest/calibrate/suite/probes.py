"""Latency probes (one-element ops: the launch floor) and host-dispatch probes (the CPU cost of
enqueueing one op)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Benchmark, _simple


def _probes(out: list[Benchmark]) -> None:
    tiny = {
        "add": (torch.add, [(1,), (1,)], "elementwise"),
        "relu": (torch.relu, [(1,)], "elementwise"),
        "mm": (torch.mm, [(1, 1), (1, 1)], "matmul"),
        "sum": (torch.sum, [(1,)], "reduction"),
    }
    for opname, (fn, shapes, cat) in tiny.items():
        out.append(Benchmark(f"latency_{opname}_1elem", cat, {"op": opname, "dtype": "fp32", "numel": 1},
                             _simple(fn, shapes, [torch.float32] * len(shapes)), kind="latency", est_ms=0.005))
    probes = {
        "add": (torch.add, [(1,), (1,)], "elementwise"),
        "linear": (F.linear, [(1, 512), (512, 512), (512,)], "matmul"),
        "conv2d": (lambda x, w: F.conv2d(x, w, None, 1, 1), [(1, 16, 8, 8), (16, 16, 3, 3)], "conv"),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (512,), w, b), [(1, 512), (512,), (512,)], "norm"),
        "foreach_add_100": (lambda *ts: torch._foreach_add(list(ts), 1.0), [(16,)] * 100, "optimizer"),
    }
    for opname, (fn, shapes, cat) in probes.items():
        out.append(Benchmark(f"host_dispatch_{opname}", cat, {"op": opname, "dtype": "fp32", "shapes": shapes},
                             _simple(fn, shapes, [torch.float32] * len(shapes)), kind="host_dispatch", est_ms=0.01))
