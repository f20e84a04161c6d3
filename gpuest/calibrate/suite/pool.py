"""Spatial ops (category "pool", with the per-channel elementwise ops beside them): max and average
pools, adaptive average pools, 2x upsampling, squeeze-and-excitation, on NCHW and channels-last (NHWC)
activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _d, _est, _fwd_bwd, _nchw, _randn, _simple
from .shape_tables import shape_table


def _avg_pool_3x3_stride_1(x: torch.Tensor) -> torch.Tensor:
    """PoolFormer's token mixer (padding left out of the mean); Inception's pooling branches keep it in."""
    return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)


def _pool(out: list[Benchmark]) -> None:
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in shape_table("pool", "max_pool"):
            numel = n * c * hw * hw

            def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                return (_randn(_nchw(device, n, c, hw), dt, device, seed, i),)

            def mp(x: torch.Tensor) -> torch.Tensor:
                return F.max_pool2d(x, 3, 2, 1)
            params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
            tag = f"{mode}_n{n}_c{c}_hw{hw}"
            _fwd_bwd(out, "maxpool", tag, "pool", "max_pool2d_3x3s2", params, mp, leaves, 1,
                     _est(9.0 * numel / 4, 1.25 * numel * dt.itemsize), _est(numel, 2.0 * numel * dt.itemsize))
    # more 3x3/2 max pools (ResNet stems, AlexNet-like 55x55), 2x2/2 max pools (VGG) and 2x2 average
    # pools (DenseNet transitions), forward and backward, fp32 and bf16
    pools = {"maxpool": (lambda x: F.max_pool2d(x, 3, 2, 1), "max_pool2d_3x3s2", "max_pool_more"),
             "maxpool2x2": (lambda x: F.max_pool2d(x, 2), "max_pool2d_2x2", "max_pool_2x2"),
             "avgpool2x2": (lambda x: F.avg_pool2d(x, 2), "avg_pool2d_2x2", "avg_pool_2x2"),
             "avgpool3x3s1": (_avg_pool_3x3_stride_1, "avg_pool2d_3x3s1", "avg_pool_3x3_stride_1")}
    for prefix, (fn, opname, table) in pools.items():
        for mode in ("fp32", "bf16"):
            dt = DTYPES[mode]
            for n, c, hw in shape_table("pool", table):
                numel = n * c * hw * hw
                def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                    return (_randn(_nchw(device, n, c, hw), dt, device, seed, i),)
                params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
                tag = f"{mode}_n{n}_c{c}_hw{hw}"
                _fwd_bwd(out, prefix, tag, "pool", opname, params, fn, leaves, 1,
                         _est(numel, 1.25 * numel * dt.itemsize), _est(numel, 2.0 * numel * dt.itemsize))
    for n, c, hw in shape_table("pool", "global_avg_pool"):
        numel = n * c * hw * hw

        def build(device: torch.device, seed: int, n=n, c=c, hw=hw) -> Built:
            return _simple(lambda x: F.adaptive_avg_pool2d(x, 1),
                           [_nchw(device, n, c, hw)],
                           [torch.float32])(device, seed)
        out.append(Benchmark(f"adaptive_avgpool_fp32_n{n}_c{c}_hw{hw}", "pool",
                             {"op": "adaptive_avg_pool2d", "dtype": "fp32", "batch": n, "channels": c, "hw": hw},
                             build, est_ms=_est(numel, 4.0 * numel)))

        def build_avg(device: torch.device, seed: int, n=n, c=c, hw=hw) -> Built:
            return _simple(lambda x: F.avg_pool2d(x, 2),
                           [(_d(n, device, 2), _d(c, device, 4), _d(hw, device, 8) // 2 * 2,
                             _d(hw, device, 8) // 2 * 2)], [torch.float32])(device, seed)
        if hw % 2 == 0:
            out.append(Benchmark(f"avgpool2x2_fp32_n{n}_c{c}_hw{hw}", "pool",
                                 {"op": "avg_pool2d_2x2", "dtype": "fp32", "batch": n, "channels": c, "hw": hw},
                                 build_avg, est_ms=_est(numel, 5.0 * numel)))
    # 2x upsampling, nearest and bilinear, forward and backward
    upsample = {"upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), "upsample_nearest2d"),
                "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
                                      "upsample_bilinear2d")}
    for prefix, (fn, opname) in upsample.items():
        for mode in ("fp32", "bf16"):
            dt = DTYPES[mode]
            for n, c, hw in shape_table("pool", "upsample"):
                numel = n * c * hw * hw
                def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                    return (_randn(_nchw(device, n, c, hw), dt, device, seed, i),)
                params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
                _fwd_bwd(out, prefix, f"{mode}_n{n}_c{c}_hw{hw}", "pool", opname, params, fn, leaves, 1,
                         _est(4.0 * numel, 5.0 * numel * dt.itemsize), _est(4.0 * numel, 5.0 * numel * dt.itemsize))
    # squeeze-and-excitation: a pool to one value per (sample, channel), then a scale by it
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in shape_table("pool", "squeeze_excitation"):
            numel = n * c * hw * hw

            def build_squeeze(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=dt) -> Built:
                return _simple(lambda x: F.adaptive_avg_pool2d(x, 1), [_nchw(device, n, c, hw)], [dt])(device, seed)

            def build_excite(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=dt) -> Built:
                xs = _nchw(device, n, c, hw)
                return _simple(torch.mul, [xs, (*xs[:2], 1, 1)], [dt, dt])(device, seed)
            params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
            out.append(Benchmark(f"adaptive_avgpool_{mode}_n{n}_c{c}_hw{hw}", "pool",
                                 {"op": "adaptive_avg_pool2d", **params}, build_squeeze,
                                 est_ms=_est(numel, numel * dt.itemsize)))
            out.append(Benchmark(f"ew_channel_scale_{mode}_n{n}_c{c}_hw{hw}", "elementwise",
                                 {"op": "mul", **params}, build_excite, est_ms=_est(numel, 2.0 * numel * dt.itemsize)))


def _nhwc_spatial(out: list[Benchmark]) -> None:
    """Pooling, upsampling and per-channel elementwise ops on channels-last (NHWC) activations, the
    layout channels-last recipes hand them: their kernels index channels fastest, unlike NCHW's."""
    shapes = shape_table("pool", "channels_last")
    spatial = {"maxpool": (lambda x: F.max_pool2d(x, 3, 2, 1), "max_pool2d_3x3s2"),
               "avgpool2x2": (lambda x: F.avg_pool2d(x, 2), "avg_pool2d_2x2"),
               "avgpool3x3s1": (_avg_pool_3x3_stride_1, "avg_pool2d_3x3s1"),
               "upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), "upsample_nearest2d"),
               "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear",
                                                              align_corners=False), "upsample_bilinear2d")}
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in shapes:
            numel = n * c * hw * hw

            def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                x = _randn(_nchw(device, n, c, hw), dt, device, seed, i)
                return (x.contiguous(memory_format=torch.channels_last),)
            params = {"dtype": mode, "batch": n, "channels": c, "hw": hw, "memory_format": "nhwc"}
            tag = f"nhwc_{mode}_n{n}_c{c}_hw{hw}"
            for prefix, (fn, opname) in spatial.items():
                grows = 4.0 if prefix.startswith("upsample") else 1.0
                _fwd_bwd(out, prefix, tag, "pool", opname, params, fn, leaves, 1,
                         _est(grows * numel, (1.0 + grows) * numel * dt.itemsize),
                         _est(grows * numel, (1.0 + grows) * numel * dt.itemsize))

            def build_squeeze(device: torch.device, seed: int, leaves=leaves) -> Built:
                return Built(lambda x: F.adaptive_avg_pool2d(x, 1), lambda i: leaves(device, seed, i))

            def build_scale(device: torch.device, seed: int, leaves=leaves, dt=dt) -> Built:
                def make_set(i: int) -> tuple:
                    x, = leaves(device, seed, i)
                    return x, _randn((*x.shape[:2], 1, 1), dt, device, seed, 1000 + i)
                return Built(torch.mul, make_set)

            def build_bias(device: torch.device, seed: int, leaves=leaves, dt=dt) -> Built:
                def make_set(i: int) -> tuple:
                    x, = leaves(device, seed, i)
                    return x, _randn((1, x.shape[1], 1, 1), dt, device, seed, 1000 + i)
                return Built(torch.Tensor.add_, make_set)
            out.append(Benchmark(f"adaptive_avgpool_{tag}", "pool", {"op": "adaptive_avg_pool2d", **params},
                                 build_squeeze, est_ms=_est(numel, numel * dt.itemsize)))
            out.append(Benchmark(f"ew_channel_scale_{tag}", "elementwise", {"op": "mul", **params}, build_scale,
                                 est_ms=_est(numel, 2.0 * numel * dt.itemsize)))
            out.append(Benchmark(f"ew_bias_add_{tag}", "elementwise", {"op": "add_", **params}, build_bias,
                                 est_ms=_est(numel, 2.0 * numel * dt.itemsize)))
