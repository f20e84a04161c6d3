"""Re-derive the graph nodes of calibration benchmarks with the current estimator (no GPU).

A calibration row stores the nodes `trace` produced when it was measured. When the estimator's
capture or cost formulas improve later, the fit must regress the measured times on what the
estimator computes *now*, or the profile corrects errors that no longer exist. Every benchmark can
be rebuilt on the meta device at its real sizes and traced again; the measured time stays as it was.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Iterable

import torch

META = torch.device("meta")


def _retrace_chunk(names: list[str]) -> dict[str, list[dict[str, Any]]]:
    from .runner import built_nodes, tf32_flags
    from .suite import all_benchmarks

    by_name = {b.name: b for b in all_benchmarks()}
    out = {}
    for name in names:
        b = by_name[name]
        with tf32_flags(b.matmul_tf32, b.cudnn_tf32):
            built = b.build(META, 0)
            out[name] = built_nodes(built, built.make_set(0))[0]
    return out


_CACHE: dict[str, list[dict[str, Any]]] = {}


def retrace_nodes(names: Iterable[str], jobs: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Current nodes of the named suite benchmarks (names the suite no longer has are left out).
    Results are cached per process: every GPU's data shares the same benchmarks."""
    from .suite import all_benchmarks

    known = {b.name for b in all_benchmarks()}
    todo = sorted({n for n in names if n in known and n not in _CACHE})
    jobs = max(1, min(jobs or os.cpu_count() or 1, 8, len(todo)))
    if todo and jobs > 1:
        chunks = [todo[i::jobs] for i in range(jobs)]
        # spawn, not fork: a process that already ran autograd cannot fork safely.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for part in pool.map(_retrace_chunk, chunks):
                _CACHE.update(part)
    elif todo:
        _CACHE.update(_retrace_chunk(todo))
    return {n: _CACHE[n] for n in names if n in _CACHE}
