"""The calibration grid: one small benchmark per (op, shape, dtype) the estimator prices.

Every `Benchmark.build(device, seed)` returns a `Built`: the function that runs ONE op (or one
small op group), a factory of input sets (the runner makes several when one set fits in L2), and
how to trace the same call with `gpuest.capture.trace` (by default: `fn` wrapped in a module).
Builders never close over tensors in `fn` when the default trace is used: FakeTensorMode refuses
real tensors, so everything `fn` touches must come in through its arguments.

On a CPU device (dry runs) every size is capped to a few elements so the whole grid runs in
seconds; names and `params` keep the GPU sizes.

`all_benchmarks()` assembles the grid from one module per benchmark family, each importing only `base` and
`shape_tables`; a family's shapes are data, the tables of shapes/<module>.json (each with the reason for its
shapes), and its code says which dtypes, batches and passes run over them:
  shape_tables shape_table / shape_column: the rows of one table, read on first use and checked
  base         Benchmark, Built, TraceSpec, DTYPES, the planning estimate and the builders' helpers
  matmul       mm, linear (addmm), bmm
  conv         2-D (dense, depthwise, grouped), 1-D and transposed convolutions, forward and backward
  attention    scaled dot-product attention, forward and backward
  rnn          cuDNN LSTMs and GRUs, and their host-dispatch probes
  elementwise  unary and binary streaming ops, broadcast bias adds, in-place activations
  reduction    row, column and whole-tensor reductions, column sums, softmax and log-softmax
  norm         batch norm (NCHW, NHWC, 1-d; training and eval), layer norm, group norm
  pool         pools, upsampling, squeeze-and-excitation, and those ops on channels-last activations
  embedding    embedding lookups and their backward
  copy         casts, transposes, permuted copies, concatenations, rolls, accumulating index_put
  strided      ops whose operands are strided views (chunks, halves, interleaved pairs)
  grouped      mixture-of-experts grouped GEMMs (torch._grouped_mm), forward and backward
  optimizer    foreach AdamW and SGD steps
  probes       latency (one-element) and host-dispatch probes
  fp16         fp16 twins of a share of the bf16 benchmarks
"""
from __future__ import annotations

from typing import Iterable

from .attention import _attention
from .base import DTYPES, Benchmark, Built, TraceSpec, _FnModule, _stable_hash  # noqa: F401 (re-exported)
from .conv import _conv
from .copy import _copy, _gathers, _index_put, index_put_accumulate_shapes  # noqa: F401 (re-exported)
from .elementwise import _activations_in_place, _elementwise
from .embedding import _embedding
from .fp16 import FP16_TWIN_CATEGORIES, FP16_TWIN_SHARE, _fp16_twins  # noqa: F401 (re-exported)
from .grouped import _grouped_gemm
from .matmul import _matmul
from .norm import _norm
from .optimizer import OPTIMIZER_FACTORIES, _foreach_walks, _optimizer  # noqa: F401 (re-exported)
from .pool import _nhwc_spatial, _pool
from .probes import _probes
from .reduction import _reduction
from .rnn import _rnn
from .strided import _strided_operands

HOLDOUT_FRACTION = 0.2


def all_benchmarks(categories: Iterable[str] | None = None) -> list[Benchmark]:
    """The full grid, with holdout flags and priorities assigned deterministically.

    Holdout: per category, the ~20 % of shapes with the smallest name hash (probes excluded).
    Priority: per category, a fixed pseudo-random order (by name hash), so any budget-trimmed prefix
    samples every op, dtype and size range of the category evenly; probes come first.
    """
    grid: list[Benchmark] = []
    for family in (_matmul, _conv, _attention, _rnn, _elementwise, _activations_in_place, _reduction, _norm, _pool,
                   _embedding, _copy, _optimizer, _foreach_walks, _probes, _nhwc_spatial, _index_put, _gathers,
                   _strided_operands, _grouped_gemm):
        family(grid)
    grid += _fp16_twins(grid)
    by_cat: dict[str, list[Benchmark]] = {}
    for b in grid:
        by_cat.setdefault(b.category, []).append(b)
    for cat, items in by_cat.items():
        for rank, b in enumerate(sorted(items, key=lambda b: _stable_hash("priority:" + b.name))):
            b.priority = rank
        device_items = [b for b in items if b.kind == "device"]
        n_hold = round(HOLDOUT_FRACTION * len(device_items))
        for b in sorted(device_items, key=lambda b: _stable_hash(b.name))[:n_hold]:
            b.holdout = True
        for b in items:  # probes first: they are cheap and every fit needs the latency floor
            if b.kind != "device":
                b.priority = -1
    names = [b.name for b in grid]
    if len(names) != len(set(names)):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise AssertionError(f"duplicate benchmark names: {dupes}")
    if categories is not None:
        wanted = set(categories)
        grid = [b for b in grid if b.category in wanted]
    return grid


BUSY_CALLS = 5                  # calls profiled for a host-paced op's device-busy time
