"""Which arithmetic a node runs in on an NVIDIA GPU: what its peak FLOP/s depends on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import TENSOR_CORE_CATEGORIES

MATH_MODES = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "int")

_DTYPE_MODE = {
    torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
    torch.int8: "int8", torch.uint8: "int8",
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _DTYPE_MODE[getattr(torch, _name)] = "fp8"


@dataclass(frozen=True)
class TF32Policy:
    """torch's TF32 switches as they were when the model was traced."""

    cudnn_allow_tf32: bool
    matmul_allow_tf32: bool

    @classmethod
    def current(cls) -> "TF32Policy":
        return cls(cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
                   matmul_allow_tf32=torch.get_float32_matmul_precision() != "highest")


def dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "none"


def math_mode(category: str, dtype: torch.dtype | None, tf32: TF32Policy) -> str:
    """fp32 / tf32 / bf16 / fp16 / fp64 / fp8 / int8 / int for a node of `category` computing in `dtype`."""
    if dtype is None or not (dtype.is_floating_point or dtype in _DTYPE_MODE):
        return "int"
    mode = _DTYPE_MODE.get(dtype, "fp32")
    if mode == "fp32" and category in TENSOR_CORE_CATEGORIES:
        # cuDNN (convolutions, RNNs) and cuBLAS (matmuls, attention) each have their own switch.
        allowed = tf32.cudnn_allow_tf32 if category in ("conv", "rnn") else tf32.matmul_allow_tf32
        return "tf32" if allowed else "fp32"
    return mode
