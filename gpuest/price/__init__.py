"""Price: roofline + fitted residual device time, host timeline, power and energy."""
from .estimate import Estimate, as_graph, estimate, estimate_graph
from .generation import GenerationEstimate, estimate_generation, trace_generation
from .sweep import compare, optimal, sweep

__all__ = ["Estimate", "GenerationEstimate", "estimate_generation", "trace_generation", "as_graph", "compare", "estimate", "estimate_graph", "optimal", "sweep"]
