"""The one map from the CPU-only kernels a CPU trace dispatches to the CUDA kernels they stand for.

We trace on the CPU (fake tensors, no GPU). A few ATen ops dispatch to CPU-specific kernels; a node is
named and priced as the CUDA kernel and keeps the CPU name in `cpu_op` (gpuest.capture.normalize). The
cost registry gives each CPU name its CUDA kernel's formula from the same map.
"""
from __future__ import annotations

# CPU kernel -> CUDA kernel, where the choice does not depend on arguments.
CUDA_EQUIVALENT = {
    "aten.mkldnn_rnn_layer.default": "aten._cudnn_rnn.default",
    "aten.mkldnn_rnn_layer_backward.default": "aten._cudnn_rnn_backward.default",
}

# Batch norm with batch statistics (CPU name -> direction); the CUDA kernels depend on the arguments
# (BATCH_NORM_CUDA, by backend: gpuest.capture.normalize.batch_norm_backend).
BATCH_NORM_CPU = {
    "aten.native_batch_norm.default": "forward",
    "aten._native_batch_norm_legit.default": "forward",
    "aten._native_batch_norm_legit.no_stats": "forward",
    "aten._batch_norm_with_update.default": "forward",
    "aten.cudnn_batch_norm.default": "forward",
    "aten.native_batch_norm_backward.default": "backward",
    "aten.batch_norm_backward.default": "backward",
    "aten.cudnn_batch_norm_backward.default": "backward",
}
# Batch norm with running statistics (eval) is one per-channel affine pass (cuDNN's inference kernel or
# PyTorch's); it is named by the ATen op that means exactly that, so it is priced apart from training.
BATCH_NORM_EVAL = "aten._native_batch_norm_legit_no_training.default"
BATCH_NORM_CUDA = {
    ("cudnn", "forward"): "aten.cudnn_batch_norm.default",
    ("cudnn", "backward"): "aten.cudnn_batch_norm_backward.default",
    ("native", "forward"): "aten.native_batch_norm.default",
    ("native", "backward"): "aten.native_batch_norm_backward.default",
}

# CPU SDPA kernel -> its direction; the CUDA kernel depends on the arguments (SDPA_CUDA, by backend).
SDPA_CPU = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "forward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "backward",
}
SDPA_CUDA = {
    ("flash", "forward"): "aten._scaled_dot_product_flash_attention.default",
    ("flash", "backward"): "aten._scaled_dot_product_flash_attention_backward.default",
    ("efficient", "forward"): "aten._scaled_dot_product_efficient_attention.default",
    ("efficient", "backward"): "aten._scaled_dot_product_efficient_attention_backward.default",
}
# The CUDA kernel whose cost formula a CPU SDPA kernel takes (the flash kernel's: same FLOPs and operands).
SDPA_CPU_PRICED_AS = {cpu: SDPA_CUDA[("flash", direction)] for cpu, direction in SDPA_CPU.items()}


def packet_name(overload_name: str) -> str:
    """"aten._foo.default" -> "_foo": the ATen overload packet an overload name belongs to."""
    return overload_name.split(".")[1]
