"""`max_batch`: the largest batch whose traced step fits a GPU, found by bisection on traced graphs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ...catalog import GPUSpec, get_gpu
from ...errors import TraceError
from .peak import MemoryEstimate, memory_estimate

DEFAULT_BATCH_LIMIT = 1 << 16


@dataclass(frozen=True)
class MaxBatch:
    """batch: the largest batch that fits (0: not even batch 1); memory: its estimate (None when 0);
    limited: the search stopped at `limit` while still fitting; probes: batch -> fits, every batch traced."""

    batch: int
    memory: MemoryEstimate | None
    limited: bool
    probes: dict[int, bool] = field(default_factory=dict)


def max_batch(model: str | torch.nn.Module, gpu: str | GPUSpec, *, mode: str = "inference", precision: str = "fp32",
              optimizer: str | None = "adamw", make_inputs: Callable[[int], Any] | None = None,
              seq: int | None = None, image_size: int | None = None, loss_fn: Callable | None = None,
              limit: int = DEFAULT_BATCH_LIMIT, memory_format: str = "contiguous") -> MaxBatch:
    """The largest batch size whose step (`mode`, `precision`, `optimizer` as in `trace`) fits `gpu`.

    model: a model spec ("resnet50", "hf:gpt2", ...; built for each batch with `seq`, `image_size` and
        `memory_format`), or an nn.Module with `make_inputs(batch)` returning its example inputs for that batch.
    Doubles the batch from 1 until the step no longer fits (or `limit`), then bisects; each probe is a
    trace, so the answer is exact for the memory model (fits is monotone in the batch)."""
    from ..estimate import as_graph
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer batch size, got {limit!r}")
    if isinstance(model, torch.nn.Module) and make_inputs is None:
        raise TypeError("max_batch() of an nn.Module needs make_inputs=lambda batch: <example inputs of that batch>")
    if not isinstance(model, (str, torch.nn.Module)):
        raise TypeError(f"max_batch() takes a model spec string or an nn.Module, not {type(model).__name__}")
    kwargs = dict(mode=mode, precision=precision, optimizer=optimizer, loss_fn=loss_fn)
    probes: dict[int, bool] = {}
    found: dict[int, MemoryEstimate] = {}

    def fits(batch: int) -> bool:
        if isinstance(model, str):
            graph = as_graph(model, batch=batch, seq=seq, image_size=image_size, memory_format=memory_format, **kwargs)
            if int(graph.graph.get("batch", 0)) != batch:
                raise TraceError(f"{model} does not take a batch size (asked for {batch}, built "
                                 f"{graph.graph.get('batch')}): max_batch needs a model whose inputs grow with it")
        else:
            graph = as_graph(model, make_inputs(batch), batch=batch, **kwargs)
        est = memory_estimate(graph, spec)
        probes[batch] = est.fits
        if est.fits:
            found[batch] = est
        return est.fits

    if not fits(1):
        return MaxBatch(0, None, False, probes)
    lo, hi = 1, None
    while hi is None:
        nxt = min(lo * 2, limit)
        if nxt == lo:
            return MaxBatch(lo, found[lo], True, probes)
        if fits(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return MaxBatch(lo, found[lo], False, probes)
