"""Cost formulas of foreach and fused optimizer ops: the launches ATen's MultiTensorApply packs their tensors
into, and the chunk walk that bounds a launch with few blocks."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple, Sequence

import torch

from ..registry import Cost, OpCall, generic_cost, iter_ops, register_cost, tensors

# ATen's MultiTensorApply (ATen/native/cuda/MultiTensorApply.cuh): tensors one launch takes per tensor-list
# depth (fewer where the op takes one scalar per tensor), the blocks one launch takes, the elements of one
# chunk (a block's share of a tensor) and those one block step covers (512 threads x 4 elements each).
FOREACH_TENSORS_PER_LAUNCH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
FOREACH_TENSORS_PER_LAUNCH_SCALAR_LIST = {1: 96, 2: 64, 3: 48, 4: 36, 5: 30}
FOREACH_BLOCKS_PER_LAUNCH = 320
FOREACH_CHUNK_ELEMENTS = 65536
FOREACH_STEP_ELEMENTS = 512 * 4


class ForeachLaunches(NamedTuple):
    """How MultiTensorApply packs a list of tensors into kernel launches."""

    launches: int
    chunk_walks: int     # steps of the longest chunk of each launch, summed over the launches


def tensors_per_launch(depth: int, scalar_list: bool) -> int:
    """Tensors MultiTensorApply takes into one launch of an op over `depth` tensor lists (read and written),
    capped at the deepest its tables list, that takes one scalar per tensor or not."""
    table = FOREACH_TENSORS_PER_LAUNCH_SCALAR_LIST if scalar_list else FOREACH_TENSORS_PER_LAUNCH
    return table[min(max(depth, 1), max(table))]


def foreach_launches(numels: Sequence[int], tensors_per_launch: int) -> ForeachLaunches:
    """Launches of a multi-tensor kernel over tensors of `numels` elements (in list order, empty ones
    skipped): a launch closes when it holds `tensors_per_launch` tensors or FOREACH_BLOCKS_PER_LAUNCH chunks,
    a tensor split across two launches counting in both."""
    launches = walks = 0
    tensors = blocks = longest = 0
    for numel in numels:
        if numel <= 0:
            continue
        tensors += 1
        chunks = math.ceil(numel / FOREACH_CHUNK_ELEMENTS)
        for chunk in range(chunks):
            blocks += 1
            longest = max(longest, min(FOREACH_CHUNK_ELEMENTS, numel - chunk * FOREACH_CHUNK_ELEMENTS))
            last = chunk == chunks - 1
            if (tensors == tensors_per_launch and last) or blocks == FOREACH_BLOCKS_PER_LAUNCH:
                launches += 1
                walks += math.ceil(longest / FOREACH_STEP_ELEMENTS)
                blocks = longest = 0
                tensors = 0 if last else 1
    if blocks:
        launches += 1
        walks += math.ceil(longest / FOREACH_STEP_ELEMENTS)
    return ForeachLaunches(launches, walks)


def _foreach(flops_per_element: float):
    def formula(call: OpCall) -> Cost:
        lists = [a for a in call.args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        scalar_list = any(isinstance(a, (list, tuple)) and a and not isinstance(a[0], torch.Tensor)
                          for a in call.args)
        depth = len(lists) + (0 if tensors(call.out) == [] else 1)
        numels = [t.numel() for t in (lists[0] if lists else call.inputs)]
        packed = foreach_launches(numels, tensors_per_launch(depth, scalar_list))
        cost = generic_cost(call, category="optimizer", flops=flops_per_element * sum(numels),
                            kernels=max(1, packed.launches))
        return replace(cost, chunk_walks=float(packed.chunk_walks), list_tensors=len(numels))
    return formula


_FOREACH_FLOPS = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "addcmul": 2, "addcdiv": 2, "lerp": 2, "sqrt": 1,
    "maximum": 1, "minimum": 1, "neg": 1, "abs": 1, "exp": 1, "sign": 1, "reciprocal": 1, "pow": 1,
    "clamp_max": 1, "clamp_min": 1, "norm": 2, "zero": 0, "copy": 0, "rsqrt": 1,
}
_FOREACH_WITHOUT_IN_PLACE = {"norm"}   # a norm reduces each tensor to a new one
for _base, _fl in _FOREACH_FLOPS.items():
    _names = [f"_foreach_{_base}"] + ([] if _base in _FOREACH_WITHOUT_IN_PLACE else [f"_foreach_{_base}_"])
    register_cost(*iter_ops(_names))(_foreach(float(_fl)))
register_cost(*iter_ops(["_fused_adamw_", "_fused_adam_", "_fused_sgd_", "_fused_adagrad_"]))(_foreach(12.0))
