"""Normalisation layers (category "norm"): batch norm in training (forward, backward) and eval over
NCHW, channels-last and BatchNorm1d layouts, layer norm and group norm."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _fwd_bwd, _randn
from .shape_tables import shape_column, shape_table


def _batch_norm_layouts(out: list[Benchmark]) -> None:
    """Batch norm in the layouts other recipes run, training (forward, backward) and eval: channels-last
    (NHWC) CNN activations, whose kernels read across channels, and BatchNorm1d over (N, C) tokens and
    (N, C, L) sequences."""
    nhwc = [(shape, True) for table in ("batch_norm_channels_last", "batch_norm_channels_last_narrow")
            for shape in shape_column("norm", table)]
    flat = [(shape, False) for shape in shape_column("norm", "batch_norm_1d")]
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
        for n, c, hw in shape_table("norm", "batch_norm", "batch_norm_last_stages", "batch_norm_first_stages",
                                   "batch_norm_wide_stages"):
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
        for tokens, dim in shape_table("norm", "layer_norm", "layer_norm_channels", "layer_norm_odd_rows",
                                       "layer_norm_transformer"):
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
    for n, c, hw, groups in shape_table("norm", "group_norm"):
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
