"""Normalisation layers (category "norm"): batch norm in training (forward, backward) and eval over
NCHW, channels-last and BatchNorm1d layouts, layer norm and group norm."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _fwd_bwd, _randn


def _batch_norm_layouts(out: list[Benchmark]) -> None:
    """Batch norm in the layouts other recipes run, training (forward, backward) and eval: channels-last
    (NHWC) CNN activations, whose kernels read across channels, and BatchNorm1d over (N, C) tokens and
    (N, C, L) sequences."""
    nhwc = [((32, 64, 112, 112), True), ((128, 256, 56, 56), True), ((128, 512, 28, 28), True),
            ((128, 1024, 14, 14), True), ((128, 2048, 7, 7), True), ((8, 96, 56, 56), True)]
    flat = [((65536, 384), False), ((12544, 128), False), ((64, 256, 1024), False), ((256, 64, 4096), False)]
    for mode in ("fp32", "bf16", "bf16mix"):
        dt = DTYPES[mode.removesuffix("mix")]
        pt = torch.float32 if mode.endswith("mix") else dt
        for shape, channels_last in nhwc + flat:
            numel, c = math.prod(shape), shape[1]

            def leaves(device: torch.device, seed: int, i: int, shape=shape, dt=dt, pt=pt,
                       channels_last=channels_last) -> tuple:
                dims = tuple(_d(d, device, 4 if k == 1 else 6) for k, d in enumerate(shape))
                x = _randn(dims, dt, device, seed, i)
                x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
                cc = dims[1]
                return (x, torch.ones(cc, dtype=pt, device=device), torch.zeros(cc, dtype=pt, device=device),
                        torch.zeros(cc, dtype=pt, device=device), torch.ones(cc, dtype=pt, device=device))

            def bn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) \
                    -> torch.Tensor:
                return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)

            def bn_eval(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) \
                    -> torch.Tensor:
                return F.batch_norm(x, rm, rv, w, b, training=False)
            layout = "nhwc" if channels_last else f"{len(shape)}d"
            params = {"dtype": mode, "shape": list(shape), "memory_format": layout}
            tag = f"{layout}_{mode}_" + "x".join(map(str, shape))
            _fwd_bwd(out, "batchnorm", tag, "norm", "batch_norm", params, bn, leaves, 3,
                     _est(5.0 * numel, 3.0 * numel * dt.itemsize), _est(8.0 * numel, 4.0 * numel * dt.itemsize))
            out.append(Benchmark(f"batchnorm_eval_{tag}", "norm", {"op": "batch_norm_eval", **params},
                                 lambda device, seed, leaves=leaves, fn=bn_eval:
                                 Built(fn, lambda i: leaves(device, seed, i)),
                                 est_ms=_est(2.0 * numel, 2.0 * numel * dt.itemsize)))


def _norm(out: list[Benchmark]) -> None:
    # batch norm (training statistics), NCHW; "bf16mix" is what autocast runs: bf16 activations with the
    # module's fp32 weight and running statistics (PyTorch's native kernels, not cuDNN's)
    for mode in ("fp32", "bf16", "bf16mix"):
        dt = DTYPES[mode.removesuffix("mix")]
        pt = torch.float32 if mode.endswith("mix") else dt
        shapes = [(32, 64, 112), (32, 256, 56), (128, 512, 28), (8, 2048, 7), (1, 64, 56), (64, 96, 35),
                  (64, 32, 112), (16, 24, 112), (256, 128, 14),
                  # last stages at training batch: few channels per SM and 49-element planes
                  (256, 512, 7), (128, 2048, 7),
                  # first stages at training batch: millions of elements per channel
                  (256, 64, 112), (128, 256, 56), (128, 96, 112)]
        for n, c, hw in shapes:
            numel = n * c * hw * hw

            def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt, pt=pt) -> tuple:
                cc = _d(c, device, 4)
                return (_randn((_d(n, device, 2), cc, _d(hw, device, 6), _d(hw, device, 6)), dt, device, seed, i),
                        torch.ones(cc, dtype=pt, device=device), torch.zeros(cc, dtype=pt, device=device),
                        torch.zeros(cc, dtype=pt, device=device), torch.ones(cc, dtype=pt, device=device))

            def bn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) \
                    -> torch.Tensor:
                return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
            params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
            tag = f"{mode}_n{n}_c{c}_hw{hw}"
            _fwd_bwd(out, "batchnorm", tag, "norm", "batch_norm", params, bn, leaves, 3,
                     _est(5.0 * numel, 3.0 * numel * dt.itemsize), _est(8.0 * numel, 4.0 * numel * dt.itemsize))

            # Inference (running statistics): every CNN's eval-mode forward runs one per convolution.
            def bn_eval(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) \
                    -> torch.Tensor:
                return F.batch_norm(x, rm, rv, w, b, training=False)
            out.append(Benchmark(f"batchnorm_eval_{tag}", "norm", {"op": "batch_norm_eval", **params},
                                 lambda device, seed, leaves=leaves, fn=bn_eval:
                                 Built(fn, lambda i: leaves(device, seed, i)),
                                 est_ms=_est(2.0 * numel, 2.0 * numel * dt.itemsize)))
    _batch_norm_layouts(out)
    # layer norm over the last dim
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for tokens, dim in [(2048, 768), (8192, 4096), (1, 4096), (32768, 1024), (4 * 197, 384), (16384, 50),
                            (16384, 64), (4096, 128), (65536, 256), (512, 2048), (256, 8192), (4096, 100),
                            (1024, 12288), (401408, 96), (100352, 192),
                            # ConvNeXt-style norms over the channels of NHWC tokens, at training batch
                            (200704, 96), (802816, 96), (25088, 384), (6272, 768),
                            # rows that are not a multiple of 4 elements take the unvectorised kernels
                            (8192, 75), (4096, 250), (32768, 30), (2048, 1001),
                            # transformer widths at more token counts (layer norm's backward
                            # had the category's largest held-out error)
                            (8192, 1024), (16384, 768), (2048, 5120), (64 * 197, 768), (50176, 128)]:
            numel = tokens * dim

            def leaves(device: torch.device, seed: int, i: int, tokens=tokens, dim=dim, dt=dt) -> tuple:
                d_ = _d(dim, device)
                return (_randn((_d(tokens, device), d_), dt, device, seed, i), torch.ones(d_, dtype=dt, device=device),
                        torch.zeros(d_, dtype=dt, device=device))

            def ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                return F.layer_norm(x, (x.shape[-1],), w, b)
            params = {"dtype": mode, "tokens": tokens, "dim": dim}
            tag = f"{mode}_t{tokens}_d{dim}"
            _fwd_bwd(out, "layernorm", tag, "norm", "layer_norm", params, ln, leaves, 3,
                     _est(5.0 * numel, 2.0 * numel * dt.itemsize), _est(8.0 * numel, 3.0 * numel * dt.itemsize))
    # group norm
    for n, c, hw, groups in [(8, 256, 64, 32), (32, 128, 32, 32), (2, 512, 128, 32), (16, 64, 56, 8),
                             (4, 320, 64, 32), (1, 128, 256, 32), (64, 256, 16, 16)]:
        numel = n * c * hw * hw

        def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, groups=groups) -> tuple:
            cc = _d(c, device, 8)
            return (_randn((_d(n, device, 2), cc, _d(hw, device, 6), _d(hw, device, 6)), torch.float32, device, seed,
                           i), torch.ones(cc, device=device), torch.zeros(cc, device=device))

        def gn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups=groups) -> torch.Tensor:
            g = groups if x.shape[1] % groups == 0 else 1
            return F.group_norm(x, g, w, b)
        params = {"dtype": "fp32", "batch": n, "channels": c, "hw": hw, "groups": groups}
        tag = f"fp32_n{n}_c{c}_hw{hw}_g{groups}"
        _fwd_bwd(out, "groupnorm", tag, "norm", "group_norm", params, gn, leaves, 3,
                 _est(5.0 * numel, 8.0 * numel), _est(8.0 * numel, 12.0 * numel))
