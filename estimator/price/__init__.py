"""Price: roofline + fitted residual device time, host timeline, power and energy."""
from .estimate import Estimate, as_graph, estimate, estimate_graph
from .sweep import compare, optimal, sweep

__all__ = ["Estimate", "as_graph", "compare", "estimate", "estimate_graph", "optimal", "sweep"]
