"""Elementwise ops over flat tensors (unary and binary, fp32 and bf16, bf16 meeting fp32), broadcast
bias adds and attention-mask adds, binary ops of activations in two memory formats, in-place activations and
ReLU's backward, division and multiplication by a Python number, and the division of an expanded gradient."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .base import DTYPES, Benchmark, Built, _channels_last, _d, _est, _nchw, _numels, _simple, _tiny
from .shape_tables import shape_table


def _streaming(opname: str, tag: str, fn: Callable[..., Any], arity: int, mode: str, n: int) -> Benchmark:
    """`fn` over `arity` flat tensors of `n` elements in `mode`'s dtype, named ew_<tag>_<mode>_n<n>."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        return _simple(fn, [(_d(n, device, 1024),)] * arity, [dt] * arity)(device, seed)
    return Benchmark(f"ew_{tag}_{mode}_n{n}", "elementwise", {"op": opname, "dtype": mode, "numel": n}, build,
                     est_ms=_est(2.0 * n, (arity + 1) * n * dt.itemsize, mode))


def _elementwise(out: list[Benchmark]) -> None:
    unary = {"relu": torch.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid, "silu": F.silu,
             "dropout": lambda x: F.dropout(x, 0.1, True)}
    binary = {"add": torch.add, "mul": torch.mul}
    all_numels = _numels()
    for mode in ("fp32", "bf16"):
        for opname, fn in {**binary, **unary}.items():
            arity = 2 if opname in binary else 1
            numels = all_numels if mode == "fp32" or opname in ("add", "gelu") else all_numels[1::2]
            for n in numels:
                out.append(_streaming(opname, opname, fn, arity, mode, n))
    # broadcast: bias adds along the channels of NCHW activations and along the last dim
    _broadcast_adds(out, "bias_add", torch.Tensor.add_, "add_", "bias_shape",
                    lambda shape, bshape: "x".join(map(str, shape)))
    # Attention-mask adds: a mask broadcast over the heads leaves TensorIterator's vectorised path
    _broadcast_adds(out, "mask_add", torch.add, "add", "mask_shape",
                    lambda shape, mshape: "x".join(map(str, shape)) + "_mask" + "x".join(map(str, mshape)))
    # Mixed precision: a bf16 tensor meets an fp32 one (a residual stream under autocast); TensorIterator
    # casts per element on its non-vectorised path.
    for opname, fn in binary.items():
        for n in all_numels[1::2]:
            def build(device: torch.device, seed: int, n=n, fn=fn) -> Built:
                return _simple(fn, [(_d(n, device, 1024),)] * 2, [torch.bfloat16, torch.float32])(device, seed)
            out.append(Benchmark(f"ew_{opname}_bf16xfp32_n{n}", "elementwise",
                                 {"op": opname, "dtype": "bf16+fp32", "numel": n}, build,
                                 est_ms=_est(2.0 * n, 10.0 * n, "fp32")))
    _mixed_layouts(out, binary)


def _broadcast_adds(out: list[Benchmark], table: str, fn: Callable[..., Any], opname: str, shape_key: str,
                    tag: Callable[[list[int], list[int]], str]) -> None:
    """`fn` of a tensor and a smaller one broadcast to it (shapes/elementwise.json `table`: a shape and the
    broadcast operand's, aligned at the right), fp32 and bf16, named ew_<table>_<mode>_<tag>."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for shape, bshape in shape_table("elementwise", table):
            n = math.prod(shape)

            def build(device: torch.device, seed: int, shape=shape, bshape=bshape, dt=dt) -> Built:
                tiny = _tiny(device)
                xs = tuple(_d(v, device, 2) for v in shape) if tiny else tuple(shape)
                bs = tuple(1 if v == 1 else xs[i + len(xs) - len(bshape)] for i, v in enumerate(bshape))
                return _simple(fn, [xs, bs], [dt, dt])(device, seed)
            out.append(Benchmark(f"ew_{table}_{mode}_{tag(shape, bshape)}", "elementwise",
                                 {"op": opname, "dtype": mode, "shape": list(shape), shape_key: list(bshape)},
                                 build, est_ms=_est(n, 2.0 * n * dt.itemsize, mode)))


def _mixed_layouts(out: list[Benchmark], binary: dict[str, Callable[..., Any]]) -> None:
    """Binary ops of an NCHW activation and a channels-last one (a block that permutes its activations
    meeting its residual stream): TensorIterator writes in the first input's order and reads the other
    through its strides, one element per lane, with a read amplification that grows with the channels;
    and of a tensor and the transpose of another, read in whole rows."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in shape_table("elementwise", "mixed_layouts"):
            for first in ("nchw", "nhwc"):
                for opname, fn in binary.items():
                    def build(device: torch.device, seed: int, n=n, c=c, hw=hw, fn=fn, dt=dt) -> Built:
                        return _simple(fn, [_nchw(device, n, c, hw)] * 2, [dt, dt])(device, seed)
                    numel = n * c * hw * hw
                    out.append(Benchmark(f"ew_{opname}_mixed_{first}_first_{mode}_n{n}_c{c}_hw{hw}", "elementwise",
                                         {"op": opname, "dtype": mode, "shape": [n, c, hw, hw],
                                          "layouts": [first, "nhwc" if first == "nchw" else "nchw"]},
                                         _channels_last(build, (1,) if first == "nchw" else (0,)),
                                         est_ms=_est(numel, 3.0 * numel * dt.itemsize, mode)))
        # A (seq, batch, dim) result met as its (batch, seq, dim) transpose (nn.MultiheadAttention's output
        # with batch_first): read through its strides, but in whole rows of `dim`, every sector used.
        for b, sq, d in shape_table("elementwise", "transposed_operand"):
            for opname, fn in binary.items():
                def build_t(device: torch.device, seed: int, b=b, sq=sq, d=d, fn=fn, dt=dt) -> Built:
                    shapes = [(_d(b, device, 2), _d(sq, device), _d(d, device)),
                              (_d(sq, device), _d(b, device, 2), _d(d, device))]
                    return _simple(lambda x, y: fn(x, y.transpose(0, 1)), shapes, [dt, dt])(device, seed)
                numel = b * sq * d
                out.append(Benchmark(f"ew_{opname}_transposed_{mode}_b{b}_s{sq}_d{d}", "elementwise",
                                     {"op": opname, "dtype": mode, "shape": [b, sq, d], "transposed_operand": 1},
                                     build_t, est_ms=_est(numel, 3.0 * numel * dt.itemsize, mode)))


def _activations_in_place(out: list[Benchmark]) -> None:
    # What CNNs run on their activations: in-place activations (read and write one tensor) and ReLU's
    # backward (threshold_backward: gradient and output in, gradient out).
    fns = {"relu_": torch.relu_, "hardtanh_": lambda x: F.hardtanh(x, 0.0, 6.0, inplace=True),
           "silu_": lambda x: F.silu(x, inplace=True),
           "threshold_backward": lambda g, y: torch.ops.aten.threshold_backward(g, y, 0.0)}
    numels = _numels()
    for mode in ("fp32", "bf16"):
        for opname, fn in fns.items():
            arity = 2 if opname == "threshold_backward" else 1
            tag = opname.replace("_", "") + "inplace" if opname.endswith("_") else opname
            for n in numels[2:]:
                out.append(_streaming(opname, tag, fn, arity, mode, n))
        # a tensor divided by a Python number (attention scaling, loss averaging, optimizer steps)
        for n in numels[1::2]:
            out.append(_streaming("div", "divscalar", lambda x: torch.ops.aten.div.Scalar(x, 3.0), 1, mode, n))
        # and multiplied by one, as model code writes it (GELU's tanh approximation, attention and residual scaling)
        for n in numels[1::2]:
            out.append(_streaming("mul", "mulscalar", lambda x: x * 0.5, 1, mode, n))
    _expanded_divides(out)


def _expanded_divides(out: list[Benchmark]) -> None:
    """A tensor of shapes/elementwise.json expanded_divide's source_shape, expanded to its shape and divided
    by a Python number (autograd's backward of a mean), fp32 and bf16, named ew_expdiv_<mode>_<shape>."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for shape, source in shape_table("elementwise", "expanded_divide"):
            n = math.prod(shape)

            def build(device: torch.device, seed: int, shape=shape, source=source, dt=dt) -> Built:
                xs = tuple(_d(v, device, 2) for v in shape) if _tiny(device) else tuple(shape)
                src = tuple(1 if v == 1 else xs[i] for i, v in enumerate(source))
                return _simple(lambda g: torch.ops.aten.div.Scalar(g.expand(xs), 4096.0), [src], [dt])(device, seed)
            out.append(Benchmark(f"ew_expdiv_{mode}_{'x'.join(map(str, shape))}_from{'x'.join(map(str, source))}",
                                 "elementwise", {"op": "div", "dtype": mode, "shape": list(shape),
                                                 "source_shape": list(source)},
                                 build, est_ms=_est(n, n * dt.itemsize, mode)))
