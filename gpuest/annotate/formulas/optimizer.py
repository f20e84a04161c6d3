"""Cost formulas of foreach and fused optimizer ops: one launch per chunk of tensors that ATen's
MultiTensorApply packs."""
from __future__ import annotations

import math

import torch

from ..registry import Cost, OpCall, generic_cost, iter_ops, register_cost, tensors

# Elements one foreach kernel launch covers per tensor list depth (ATen's MultiTensorApply limits).
FOREACH_TENSORS_PER_LAUNCH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}


def _foreach(flops_per_element: float):
    def formula(call: OpCall) -> Cost:
        lists = [a for a in call.args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        n_tensors = len(lists[0]) if lists else 1
        depth = len(lists) + (0 if tensors(call.out) == [] else 1)
        per_launch = FOREACH_TENSORS_PER_LAUNCH.get(min(max(depth, 1), 5), 30)
        elements = sum(t.numel() for t in (lists[0] if lists else call.inputs))
        return generic_cost(call, category="optimizer", flops=flops_per_element * elements,
                            kernels=max(1, math.ceil(n_tensors / per_launch)))
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
