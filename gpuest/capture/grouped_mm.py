"""The fake output of `aten._grouped_mm` for the dtypes CUDA runs but its meta kernel rejects.

torch's meta kernel for `_grouped_mm` accepts only bf16/fp16 operands, while CUDA's kernel (2.9+) also
takes fp32 (and fp16 where its CUTLASS path does not), running them through `_grouped_mm_fallback`: one
GEMM per group. transformers 5 feeds it fp32 in fp32 and under autocast (it casts the activations to
the fp32 weights' dtype), so a trace needs the output CUDA's kernel allocates.
"""
from __future__ import annotations

import torch

# dtypes the CUDA kernel accepts for both operands (its fallback loops over torch.mm per group).
CUDA_GROUPED_MM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUTPUT_ALIGN_BYTES = 16   # CUDA pads the output's row stride to this (create_grouped_gemm_output_tensor)


def grouped_mm_output_shape(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None) -> list[int]:
    """Output shape of a grouped GEMM: 2-D x 3-D (groups of rows) -> (rows, N); 3-D x 2-D -> (M, N);
    2-D x 2-D (groups along K, a weight gradient) -> (groups, M, N); 3-D x 3-D (a bmm) -> (groups, M, N)."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        if offs is None:
            raise ValueError("a 2-D x 2-D grouped GEMM needs offs")
        return [int(offs.shape[0]), int(mat_a.shape[0]), int(mat_b.shape[1])]
    if mat_a.dim() == 2:
        return [int(mat_a.shape[0]), int(mat_b.shape[-1])]
    if mat_b.dim() == 2:
        return [int(mat_a.shape[1]), int(mat_b.shape[1])]
    return [int(mat_a.shape[0]), int(mat_a.shape[1]), int(mat_b.shape[-1])]


def fake_grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The (fake) output CUDA's `_grouped_mm` returns, with its padded row stride; raises the error CUDA
    would for operands it refuses (mismatched dtypes, other dtypes, a contraction that does not match)."""
    if mat_a.dtype != mat_b.dtype or mat_a.dtype not in CUDA_GROUPED_MM_DTYPES:
        raise RuntimeError(f"_grouped_mm takes two operands of one of {CUDA_GROUPED_MM_DTYPES}, got "
                           f"{mat_a.dtype} and {mat_b.dtype}")
    if mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3):
        raise RuntimeError(f"_grouped_mm multiplicands must be 2-D or 3-D, got {mat_a.dim()}-D and {mat_b.dim()}-D")
    if (mat_a.dim() == 3 or mat_b.dim() == 3) and mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError(f"_grouped_mm contraction dimensions differ: {tuple(mat_a.shape)} x {tuple(mat_b.shape)}")
    shape = grouped_mm_output_shape(mat_a, mat_b, offs)
    dtype = out_dtype or mat_a.dtype
    align = max(OUTPUT_ALIGN_BYTES // dtype.itemsize, 1)
    row = -(-shape[-1] // align) * align
    stride = [shape[1] * row, row, 1] if len(shape) == 3 else [row, 1]
    return torch.empty_strided(shape, stride, dtype=dtype, device=mat_a.device)


FAKE_SUBSTITUTES = {torch.ops.aten._grouped_mm.default: fake_grouped_mm}
