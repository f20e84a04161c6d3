"""Device memory that PyTorch's libraries take from the caching allocator outside any op's outputs.

cuBLAS: ATen gives every (cuBLAS handle, stream) pair a workspace on its first GEMM and keeps it for the
life of the process (aten/src/ATen/cuda/CublasHandlePool.cpp, setWorkspaceForHandle and
getCUDABlasLtWorkspace). Handles are per thread, and autograd runs a CUDA backward on a device thread
of its own, so a training step whose forward and backward both multiply holds two of each.
"""
from __future__ import annotations

from typing import Iterable

from ...catalog import GPUSpec

# CublasHandlePool.cpp parseChosenWorkspaceSize: ":4096:8" (32 MiB) on sm90, ":4096:2:16:8" elsewhere.
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 1024 * 8
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024   # parseCUDABlasLtWorkspaceSize default: 1024 KiB
# Cost categories whose ops run through cuBLAS (convolutions, attention and RNNs use cuDNN or own kernels).
CUBLAS_CATEGORIES = frozenset({"matmul"})
# The thread each phase's ops are issued from: autograd's device thread runs the backward.
PHASE_THREAD = {"forward": "main", "loss": "main", "optimizer": "main", "backward": "autograd"}


def cublas_workspace_bytes(gpu: GPUSpec) -> int:
    """Bytes of the cuBLAS workspace ATen allocates per handle and stream on `gpu` (CUBLAS_WORKSPACE_CONFIG unset)."""
    return CUBLAS_WORKSPACE_BYTES_SM90 if gpu.compute_capability == "9.0" else CUBLAS_WORKSPACE_BYTES


def library_workspaces(gemm_phases: Iterable[str], gpu: GPUSpec) -> list[tuple[str, int]]:
    """(name, bytes) of the persistent library workspaces a step holds once warmed up, given the phases
    in which it runs cuBLAS GEMMs."""
    threads = sorted({PHASE_THREAD.get(p, "main") for p in gemm_phases})
    out: list[tuple[str, int]] = []
    for thread in threads:
        out += [(f"cublas[{thread}]", cublas_workspace_bytes(gpu)), (f"cublasLt[{thread}]", CUBLASLT_WORKSPACE_BYTES)]
    return out
