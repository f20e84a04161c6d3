"""Price: roofline + fitted residual device time, host timeline, power and energy."""
from .estimate import Estimate, as_graph, estimate, estimate_graph

__all__ = ["Estimate", "as_graph", "estimate", "estimate_graph"]
