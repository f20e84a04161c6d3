"""gpuest: predict time, power and energy of PyTorch models on NVIDIA GPUs without running them there.

    import gpuest
    g = gpuest.trace(model, (x,), mode="training", precision="bf16-mixed")
    est = gpuest.estimate(g, gpu="A100", clock=1410)
    print(est)
"""
from .capture import trace, unsupported_ops
from .catalog import get_gpu, list_gpus
from .price.memory import max_batch, memory_estimate
from .price import (Estimate, GenerationEstimate, compare, estimate, estimate_generation, optimal, sweep,
                    trace_generation)
from .profile import Profile, load_profile
from .report.export import export

__all__ = ["Estimate", "GenerationEstimate", "Profile", "compare", "estimate", "estimate_generation", "export",
           "get_gpu", "list_gpus", "load_profile", "max_batch", "memory_estimate", "optimal", "sweep", "trace",
           "trace_generation", "unsupported_ops"]
__version__ = "0.1.0"
