"""gpuest: predict time, power and energy of PyTorch models on NVIDIA GPUs without running them there.

    import estimator
    g = estimator.trace(model, (x,), mode="training", precision="bf16-mixed")
    est = estimator.estimate(g, gpu="A100", clock=1410)
    print(est)
"""
from .capture import trace, unsupported_ops
from .catalog import get_gpu, list_gpus
from .price import Estimate, GenerationEstimate, compare, estimate, estimate_generation, optimal, sweep, trace_generation
from .profile import Profile, load_profile

__all__ = ["Estimate", "GenerationEstimate", "estimate_generation", "trace_generation", "Profile", "compare", "estimate", "optimal", "sweep", "get_gpu", "list_gpus", "load_profile", "trace", "unsupported_ops"]
__version__ = "0.1.0"
