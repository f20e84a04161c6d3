"""Convolutions, forward and backward (`aten.convolution_backward`), tf32 and bf16: dense, depthwise
(NCHW and channels-last), grouped, 1-D and transposed layers of CNN, speech and decoder stages."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _channels_last, _d, _est, _simple, _tiny
from .shape_tables import shape_column, shape_table


class _ConvLayer(NamedTuple):
    cin: int
    cout: int
    size: int             # spatial edge of the input (length of a 1-D one)
    kernel: int
    stride: int
    groups: int
    dims: int = 2         # spatial dimensions
    transposed: bool = False
    pad: int | None = None  # explicit padding (a table's), else the "same"-style default below
    dilation: int = 1

    @property
    def padding(self) -> int:
        if self.pad is not None:
            return self.pad
        return (self.kernel - self.stride) // 2 if self.transposed else self.dilation * (self.kernel // 2)

    @property
    def out_size(self) -> int:
        if self.transposed:
            return (self.size - 1) * self.stride - 2 * self.padding + self.kernel
        return (self.size + 2 * self.padding - self.dilation * (self.kernel - 1) - 1) // self.stride + 1

    @property
    def prefix(self) -> str:
        return ("convT" if self.transposed else "conv") + f"{self.dims}d"

    def tag(self, batch: int, channels_last: bool) -> str:
        size = f"hw{self.size}" if self.dims == 2 else f"l{self.size}"
        return (f"c{self.cin}_{self.cout}_{size}_k{self.kernel}_s{self.stride}_g{self.groups}"
                + ("" if self.pad is None else f"_p{self.pad}") + ("" if self.dilation == 1 else f"_d{self.dilation}")
                + f"_n{batch}" + ("_nhwc" if channels_last else ""))


def _conv_grid() -> list[tuple[_ConvLayer, tuple[int, ...], bool, bool | str]]:
    """(layer, batches, with backward at every batch, channels-last: False, True for the activations, or
    "weights" for the activations and the weights) for every convolution benchmark."""
    grid = []
    layers = shape_table("conv", "layers", "wide_layers", "downsampling_layers")
    for ci, spec in enumerate(layers):
        layer = _ConvLayer(*spec)
        # Dense layers also at batch 128: at large batch cuDNN picks other (faster) algorithms,
        # and a grid whose only big convolutions are awkward ones teaches the fit "big is slow".
        batches = (1, 32, 128) if ci % 3 == 0 or (layer.groups == 1 and layer.cin >= 64) else (1, 32)
        if spec == layers[0]:  # the 7x7 ResNet stem, also at the batches its networks run
            batches = batches + tuple(shape_column("conv", "stem_batches"))
        grid.append((layer, batches, ci % 2 == 0, False))
    # Depthwise layers in both memory formats: on NCHW data PyTorch runs its own depthwise kernels, on
    # channels-last data (ConvNeXt permutes its activations to NHWC) cuDNN's NHWC kernels, ~4x faster
    # in bf16 and a shape-dependent 0.3-3.4x in tf32 (benchmarks/kernel_facts.py).
    grid += [(_ConvLayer(c, c, hw, k, stride, c), (32, 128), True, last) for last in (False, True)
             for c, hw, k, stride in shape_table("conv", "depthwise")]
    grouped = shape_table("conv", "grouped")
    grid += [(_ConvLayer(c, c, hw, 3, 1, 32), (32, 128), True, False) for c, hw in grouped]
    grid += [(_ConvLayer(*spec), (32, 128), True, "weights") for spec in shape_table("conv", "channels_last_layers")]
    grid += [(_ConvLayer(c, c, hw, 3, 1, 32), (32, 128), True, "weights") for c, hw in grouped]
    grid += [(_ConvLayer(*spec), (32, 128), True, "weights") for spec in shape_table("conv", "channels_last_narrow")]
    # Grouped 1x1 layers in both memory formats (shapes/conv.json `grouped_pointwise`): cuDNN's grouped
    # kernels, fitted apart from dense ones (registry.GROUPED_POINTWISE_VARIANT).
    grid += [(_ConvLayer(*spec), (32, 128), True, last) for last in (False, "weights")
             for spec in shape_table("conv", "grouped_pointwise")]
    # Dilated layers of segmentation backbones and ASPP heads, in both memory formats (shapes/conv.json
    # `dilated`: a non-test network's dilated depthwise layers ran 12-25x slower than an undilated one is priced).
    grid += [(_ConvLayer(cin, cout, hw, k, 1, groups, dilation=d), (8, 32), True, last) for last in (False, True)
             for cin, cout, hw, k, groups, d in shape_table("conv", "dilated")]
    grid += [(_ConvLayer(cin, cout, length, k, stride, 1, dims=1), (1, 8, 32), True, False)
             for cin, cout, length, k, stride in shape_table("conv", "conv1d")]
    grid += [(_ConvLayer(cin, cout, hw, k, stride, 1, transposed=True), (1, 32, 128), True, False)
             for cin, cout, hw, k, stride in shape_table("conv", "transposed")]
    return grid


def _conv_shapes(layer: _ConvLayer, batch: int, device: torch.device) -> tuple[tuple, tuple, int]:
    """(input shape, weight shape, groups) of `layer` at `batch` (capped on CPU dry runs)."""
    g = layer.groups if not _tiny(device) else (min(layer.groups, 4) if layer.groups > 1 else 1)
    ci_, co_ = _d(layer.cin, device, 8), _d(layer.cout, device, 8)
    if g > 1:
        ci_, co_ = g * max(1, ci_ // g), g * max(1, co_ // g)
    size = _d(layer.size, device, max(12 if layer.dims == 2 else 64, layer.kernel))  # a dry run keeps a kernel's window
    window = (layer.kernel,) * layer.dims
    weight = (ci_, co_ // g, *window) if layer.transposed else (co_, ci_ // g, *window)
    return (_d(batch, device, 2), ci_, *(size,) * layer.dims), weight, g


def _conv_call(layer: _ConvLayer, g: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The forward convolution of `layer` (F.conv1d, F.conv2d or F.conv_transpose2d)."""
    if layer.transposed:
        return lambda x, w: F.conv_transpose2d(x, w, None, layer.stride, layer.padding, 0, g)
    conv = F.conv1d if layer.dims == 1 else F.conv2d
    return lambda x, w: conv(x, w, None, layer.stride, layer.padding, layer.dilation, g)


def _conv(out: list[Benchmark]) -> None:
    for mode in ("tf32", "bf16"):
        for layer, batches, all_bwd, last in _conv_grid():
            for batch in batches:
                _conv_benchmarks(out, mode, layer, batch, last, fwd=True, bwd=all_bwd or batch >= 32)
    _conv_padded_tables(out)


def _conv_padded_tables(out: list[Benchmark]) -> None:
    """The layers whose padding their tables give: image stems, whose backward computes the weight
    gradient only (the image needs none), and non-overlapping patch-merging layers; at training batches,
    bf16 also on channels-last activations. A stem whose padding is the grid's default already has its
    forward in the grid."""
    layers = ([(_ConvLayer(ci, co, hw, k, s, 1, pad=p), True)
               for ci, co, hw, k, s, p in shape_table("conv", "image_stems")]
              + [(_ConvLayer(ci, co, hw, k, s, 1, pad=p), False)
                 for ci, co, hw, k, s, p in shape_table("conv", "patch_merging")])
    for mode in ("tf32", "bf16"):
        for layer, weight_only in layers:
            fwd = layer.pad != layer.kernel // 2
            for batch in (32, 128):
                _conv_benchmarks(out, mode, layer, batch, False, fwd=fwd, bwd=True, weight_only=weight_only)
            # Batch 1 (inference, train-b1): a stem's handful of output tiles each walk its whole window, far
            # from its roofline and outside the batches above (conv2d_fwd_bf16_c3_768_hw224_k32_s32_g1_p0_n1).
            if weight_only:
                _conv_benchmarks(out, mode, layer, 1, False, fwd=fwd, bwd=True, weight_only=True)
            if mode == "bf16":
                _conv_benchmarks(out, mode, layer, 128, True, fwd=True, bwd=True, weight_only=weight_only)


def _conv_benchmarks(out: list[Benchmark], mode: str, layer: _ConvLayer, batch: int, last: bool | str, *,
                     fwd: bool, bwd: bool, weight_only: bool = False) -> None:
    """The forward and/or backward benchmark of `layer` at `batch` in `mode`; `last` as in _conv_grid;
    weight_only: the backward computes the weight gradient alone (named "bwdw")."""
    dt = DTYPES[mode]
    cin, cout, kk, groups = layer.cin, layer.cout, layer.kernel, layer.groups
    window = kk ** layer.dims
    in_sp, out_sp = layer.size ** layer.dims, layer.out_size ** layer.dims
    # a transposed convolution's work is its adjoint's: every input pixel meets every weight
    fl = 2.0 * batch * window * (cin * in_sp * (cout // groups) if layer.transposed
                                 else cout * out_sp * (cin // groups))
    nb = (batch * cin * in_sp + cout * (cin // groups) * window + batch * cout * out_sp) * dt.itemsize
    tag = layer.tag(batch, bool(last))
    params = {"dtype": mode, "batch": batch, "cin": cin, "cout": cout, "hw": layer.size, "kernel": kk,
              "stride": layer.stride, "groups": groups, "padding": layer.padding}
    if layer.dims != 2 or layer.transposed:
        params.update(dims=layer.dims, transposed=layer.transposed)
    if layer.dilation != 1:
        params["dilation"] = layer.dilation
    if last:
        params["memory_format"] = "channels_last"
    if last == "weights":
        params["weight_memory_format"] = "channels_last"
    if fwd:
        def build_fwd(device: torch.device, seed: int) -> Built:
            xs, ws, g = _conv_shapes(layer, batch, device)
            return _simple(_conv_call(layer, g), [xs, ws], [dt, dt])(device, seed)
        out.append(Benchmark(f"{layer.prefix}_fwd_{mode}_{tag}", "conv", {"op": layer.prefix, **params},
                             _channels_last(build_fwd, (0, 1) if last == "weights" else (0,)) if last
                             else build_fwd,
                             est_ms=_est(fl, nb, mode)))
    if bwd:
        mask = [not weight_only, True, False]

        def build_bwd(device: torch.device, seed: int) -> Built:
            xs, ws, g = _conv_shapes(layer, batch, device)
            ys = tuple(_meta_out_shape(_conv_call(layer, g), xs, ws))
            n = layer.dims

            def fn(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
                return torch.ops.aten.convolution_backward(
                    dy, x, w, None, [layer.stride] * n, [layer.padding] * n, [layer.dilation] * n, layer.transposed,
                    [0] * n, g, mask)
            return _simple(fn, [ys, xs, ws], [dt, dt, dt])(device, seed)
        bwd_params = {**params, "output_mask": mask} if weight_only else params
        out.append(Benchmark(f"{layer.prefix}_{'bwdw' if weight_only else 'bwd'}_{mode}_{tag}", "conv",
                             {"op": layer.prefix + "_backward", **bwd_params},
                             _channels_last(build_bwd, (0, 1, 2) if last == "weights" else (0, 1))
                             if last else build_bwd,
                             est_ms=_est(fl if weight_only else 2 * fl, 2 * nb, mode)))


def _meta_out_shape(fn: Callable[..., torch.Tensor], *shapes: Sequence[int]) -> torch.Size:
    """Output shape of `fn` on tensors of `shapes`, computed on the meta device (no memory, no kernel)."""
    return fn(*(torch.empty(s, device="meta") for s in shapes)).shape
