"""Annotate: per-op cost formulas (FLOPs, bytes, category) and math modes."""
from .registry import CATEGORIES, REGISTRY, TENSOR_CORE_CATEGORIES, Cost, OpCall, register_cost

__all__ = ["CATEGORIES", "REGISTRY", "TENSOR_CORE_CATEGORIES", "Cost", "OpCall", "register_cost"]
