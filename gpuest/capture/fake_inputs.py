"""Make every tensor reachable from a model's inputs a fake tensor, whatever holds it.

A model may take more than tensors: a transformers `Cache` (Dynamic, Static, sliding-window: objects whose
layers hold key/value tensors in attributes), dataclasses, named tuples, nested lists and dicts. `trace`
runs under `FakeTensorMode`, and each input is replaced up front by a fake of the same shape, strides and
dtype (cast to the traced weight dtype where one is forced), so the trace knows it as an input and counts its
memory; only tensors a module holds outside its parameters and buffers are left for the mode to turn into
constants as ops meet them. Containers torch's pytree knows are rebuilt through it; any
other object holding tensors in its attributes (`__dict__`, dataclass fields) is shallow-copied and its
attributes converted, so the caller's objects are never mutated. Inside such an object, a `torch.device`
attribute (where its tensors live, used to allocate more of them) becomes the trace device, and a
floating-point `torch.dtype` attribute becomes the traced weight dtype when one is forced (the dtype its
tensors now have). Nothing is special-cased by class name.
"""
from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

# Objects never walked: code, the model's modules and their parameters (converted by `trace` itself).
OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
          torch.nn.Module, str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


class _Converter:
    """One conversion pass: each object is converted once (shared references stay shared)."""

    def __init__(self, to_fake: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
                 dtype: torch.dtype | None) -> None:
        self.to_fake = to_fake
        self.device = device
        self.dtype = dtype
        self.memo: dict[int, Any] = {}
        self.active: set[int] = set()
        self.keep: list[Any] = []  # originals stay alive while their ids key the memo

    def __call__(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._once(value, lambda: self.to_fake(value))
        if isinstance(value, OPAQUE) or id(value) in self.active:
            return value   # a cycle back to an object being converted keeps the original reference
        if pytree._get_node_type(value) in pytree.SUPPORTED_NODES:   # named tuples share one entry
            return self._once(value, lambda: self._container(value))
        if hasattr(value, "__dict__") or dataclasses.is_dataclass(value):
            return self._once(value, lambda: self._object(value))
        return value

    def _once(self, value: Any, make: Callable[[], Any]) -> Any:
        key = id(value)
        if key not in self.memo:
            self.active.add(key)
            try:
                self.memo[key] = make()
            finally:
                self.active.discard(key)
            self.keep.append(value)
        return self.memo[key]

    def _container(self, value: Any) -> Any:
        node = pytree.SUPPORTED_NODES[pytree._get_node_type(value)]
        children, context = node.flatten_fn(value)
        converted = [self(c) for c in children]
        if all(a is b for a, b in zip(converted, children)):
            return value
        return node.unflatten_fn(converted, context)

    def _attribute(self, value: Any) -> Any:
        if isinstance(value, torch.device):
            return self.device
        if isinstance(value, torch.dtype):
            return self.dtype if (self.dtype is not None and value.is_floating_point) else value
        return self(value)

    def _object(self, value: Any) -> Any:
        attrs = dict(vars(value)) if hasattr(value, "__dict__") else {
            f.name: getattr(value, f.name) for f in dataclasses.fields(value) if hasattr(value, f.name)}
        converted = {k: self(v) for k, v in attrs.items()}
        if all(converted[k] is v for k, v in attrs.items()):
            return value   # holds no tensor: the same object
        out = copy.copy(value)
        for k, v in attrs.items():
            object.__setattr__(out, k, self._attribute(v) if converted[k] is v else converted[k])
        return out


def fake_inputs(inputs: Any, to_fake: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str,
                dtype: torch.dtype | None = None) -> Any:
    """`inputs` with every reachable tensor replaced by `to_fake(tensor)`.

    device: where the fakes live (replaces `torch.device` attributes of objects that held tensors).
    dtype: the floating-point dtype `to_fake` casts to, if any (replaces their floating dtype attributes).
    """
    return _Converter(to_fake, torch.device(device), dtype)(inputs)
