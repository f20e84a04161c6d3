"""The calibration grid: one small benchmark per (op, shape, dtype) the estimator prices.

Every `Benchmark.build(device, seed)` returns a `Built`: the function that runs ONE op (or one
small op group), a factory of input sets (the runner makes several when one set fits in L2), and
how to trace the same call with `gpuest.capture.trace` (by default: `fn` wrapped in a module).
Builders never close over tensors in `fn` when the default trace is used: FakeTensorMode refuses
real tensors, so everything `fn` touches must come in through its arguments.

On a CPU device (dry runs) every size is capped to a few elements so the whole grid runs in
seconds; names and `params` keep the GPU sizes.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

# Rough H100-class peaks, only used to estimate each benchmark's cost for --budget-s planning.
_EST_PEAK_TFLOPS = {"fp32": 50.0, "tf32": 350.0, "bf16": 700.0, "fp16": 700.0, "none": 50.0}
_EST_BW_BYTES_S = 2.5e12
_EST_LAUNCH_MS = 0.006
HOLDOUT_FRACTION = 0.2

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TraceSpec:
    """How the runner traces a benchmark: `trace(module, inputs, mode=..., optimizer=..., loss_fn=...)`.

    phases: keep only nodes of these phases (e.g. ("optimizer",)).
    skip: a second spec whose nodes are dropped from the front of this one's (the forward of an
    autograd backward benchmark, so only the backward ops remain).
    """

    module: torch.nn.Module
    inputs: tuple
    mode: str = "inference"
    optimizer: str | None = None
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    phases: tuple[str, ...] | None = None
    skip: "TraceSpec | None" = None


@dataclass
class Built:
    """What a build returns. fn(*make_set(i)) runs the op once on input set i."""

    fn: Callable[..., Any]
    make_set: Callable[[int], tuple]
    trace: TraceSpec | None = None
    bytes_per_set: int | None = None  # override when inputs are not plain tensors (optimizers)
    max_sets: int = 8


@dataclass
class Benchmark:
    """One calibration point. kind: "device" (GPU time), "latency" (tiny op), "host_dispatch" (CPU enqueue cost)."""

    name: str
    category: str
    params: dict[str, Any]
    build: Callable[[torch.device, int], Built]
    holdout: bool = False
    kind: str = "device"
    est_ms: float = 0.01  # estimated GPU time of one call on an H100, ms (planning only)
    priority: int = 0  # lower runs first; budget trimming keeps the lowest
    matmul_tf32: bool = False  # torch.set_float32_matmul_precision("high") when True, "highest" otherwise
    cudnn_tf32: bool = True  # torch.backends.cudnn.allow_tf32 (torch's default: True)
    trace_cost_s: float = 0.01  # CPU seconds to trace it (optimizers with many tensors, GRUs take longer)
    # The op launches its kernels from a host loop (cuDNN RNNs: a few per time step; a foreach optimizer
    # step groups its tensors in Python, ~10 us each, so 1000 small tensors take the host longer than the
    # GPU), so its elapsed time includes GPU idle gaps: the runner also records its device-busy time.
    host_paced: bool = False


# ---------------------------------------------------------------- helpers

def _tiny(device: torch.device) -> bool:
    """CPU dry runs use capped sizes; CUDA (measuring) and meta (re-tracing offline) use the real ones."""
    return device.type not in ("cuda", "meta")


def _d(x: int, device: torch.device, cap: int = 16) -> int:
    """A dimension: `x` on the GPU, at most `cap` on CPU dry runs."""
    return x if not _tiny(device) else max(1, min(x, cap))


def _nchw(device: torch.device, n: int, c: int, hw: int) -> tuple[int, int, int, int]:
    """An (N, C, H, W) activation shape: as given on the GPU, capped at (2, 4, 8, 8) on CPU dry runs."""
    return _d(n, device, 2), _d(c, device, 4), _d(hw, device, 8), _d(hw, device, 8)


def _gen(device: torch.device, seed: int, i: int) -> torch.Generator | None:
    if device.type == "meta":
        return None  # meta tensors hold no values to draw
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1000 + i)
    return g


def _randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, seed: int, i: int) -> torch.Tensor:
    return torch.randn(tuple(shape), dtype=dtype, device=device, generator=_gen(device, seed, i))


def _est(flops: float, nbytes: float, mode: str = "fp32") -> float:
    """Estimated ms of one call on an H100 (planning only)."""
    return _EST_LAUNCH_MS + 1e3 * max(flops / (_EST_PEAK_TFLOPS.get(mode, 50.0) * 1e12), nbytes / _EST_BW_BYTES_S)


class _FnModule(torch.nn.Module):
    """Wraps a benchmark's fn so `trace` sees the same call on fake tensors."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class _BackwardModule(torch.nn.Module):
    """Runs fwd(*leaves) with grad enabled and, when `backward`, autograd.grad with the given dout."""

    def __init__(self, fwd: Callable[..., torch.Tensor], n_grad: int, backward: bool) -> None:
        super().__init__()
        self.fwd, self.n_grad, self.backward = fwd, n_grad, backward

    def forward(self, *args: torch.Tensor) -> Any:
        *leaves, dout = args
        with torch.enable_grad():
            grads = [t.requires_grad_() for t in leaves[:self.n_grad]]
            out = self.fwd(*leaves)
            if not self.backward:
                return out
            return torch.autograd.grad(out, grads, dout)


def _backward_built(fwd: Callable[..., torch.Tensor], make_leaves: Callable[[int], tuple], n_grad: int) -> Built:
    """A benchmark of the backward of `fwd` only: the forward runs once per input set at build time
    (graph retained), the timed fn runs autograd.grad(out, leaves[:n_grad], dout, retain_graph=True)."""
    def make_set(i: int) -> tuple:
        leaves = make_leaves(i)
        with torch.enable_grad():
            grads = [t.requires_grad_() for t in leaves[:n_grad]]
            out = fwd(*leaves)
        dout = torch.randn_like(out)
        return (out, dout, *grads)

    def fn(out: torch.Tensor, dout: torch.Tensor, *grads: torch.Tensor) -> Any:
        return torch.autograd.grad(out, grads, dout, retain_graph=True)

    leaves0 = make_leaves(0)
    with torch.no_grad():
        out_meta = fwd(*[t.to("meta") for t in leaves0])
    trace_inputs = (*[t.to("meta") for t in leaves0], torch.empty_like(out_meta, device="meta"))
    spec = TraceSpec(_BackwardModule(fwd, n_grad, True), trace_inputs,
                     skip=TraceSpec(_BackwardModule(fwd, n_grad, False), trace_inputs))
    return Built(fn, make_set, spec)


def _fwd_bwd(out: list[Benchmark], prefix: str, tag: str, category: str, op: str, params: dict[str, Any],
             fwd: Callable[..., torch.Tensor], leaves: Callable[..., tuple], n_grad: int,
             fwd_est_ms: float, bwd_est_ms: float) -> None:
    """Append the forward benchmark of `fwd` and the benchmark of its backward alone."""
    out.append(Benchmark(f"{prefix}_fwd_{tag}", category, {"op": op, **params},
                         lambda device, seed: Built(fwd, lambda i: leaves(device, seed, i)), est_ms=fwd_est_ms))
    out.append(Benchmark(f"{prefix}_bwd_{tag}", category, {"op": op + "_backward", **params},
                         lambda device, seed: _backward_built(fwd, lambda i: leaves(device, seed, i), n_grad),
                         est_ms=bwd_est_ms))


def _simple(fn: Callable[..., Any], shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]) \
        -> Callable[[torch.device, int], Built]:
    def build(device: torch.device, seed: int) -> Built:
        def make_set(i: int) -> tuple:
            return tuple(_randn(s, dt, device, seed, i * 16 + j) for j, (s, dt) in enumerate(zip(shapes, dtypes)))
        return Built(fn, make_set)
    return build


# ---------------------------------------------------------------- matmul

def _matmul(out: list[Benchmark]) -> None:
    square = [256, 512, 1024, 2048, 4096, 8192]
    awkward = [(1000, 1000, 1000), (1023, 1023, 1023), (4097, 4097, 4097), (3000, 5000, 2000)]
    skinny = [(1, 4096, 4096), (8, 4096, 4096), (32, 4096, 4096), (1, 11008, 4096), (8, 4096, 11008),
              (32, 1024, 1024), (128, 4096, 4096), (512, 768, 768)]
    rect = [(8192, 1024, 4096), (16384, 4096, 1024), (4096, 50257, 768), (2048, 8192, 8192), (65536, 256, 256)]
    # weight gradients of linear layers (M x N = the weight, K = the tokens): few output tiles, deep K
    wgrad = [(96, 384, 401408), (192, 768, 100352), (384, 1536, 25088), (768, 3072, 6272), (768, 768, 16384),
             (1024, 4096, 8192)]
    for mode in ("bf16", "fp16", "tf32", "fp32"):
        dt = DTYPES[mode]
        shapes = [(s, s, s) for s in square] + awkward + skinny + rect + wgrad
        if mode == "fp32":  # slow fp32 FMA: skip the largest
            shapes = [s for s in shapes if s[0] * s[1] * s[2] <= 2 * 4096 ** 3]
        for m, n, k in shapes:
            fl = 2.0 * m * n * k
            nb = (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, m=m, n=n, k=k, dt=dt) -> Built:
                a_shape, b_shape = (_d(m, device), _d(k, device)), (_d(k, device), _d(n, device))
                return _simple(torch.mm, [a_shape, b_shape], [dt, dt])(device, seed)
            out.append(Benchmark(f"mm_{mode}_m{m}_n{n}_k{k}", "matmul", {"op": "mm", "dtype": mode, "m": m, "n": n,
                                                                          "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        # nn.Linear: addmm with bias, weight transposed (x @ W^T + b).
        # ... and the token-heavy, narrow projections of ConvNeXt-style blocks and large-batch MLPs
        for tokens, fin, fout in [(1, 4096, 4096), (32, 768, 3072), (2048, 768, 3072), (8192, 4096, 4096),
                                  (4096, 1024, 1000), (512, 2048, 2049), (401408, 96, 384), (401408, 384, 96),
                                  (100352, 192, 768), (25088, 1536, 384), (6272, 768, 3072)]:
            fl = 2.0 * tokens * fin * fout
            nb = (tokens * fin + fin * fout + tokens * fout) * dt.itemsize

            def build(device: torch.device, seed: int, t=tokens, fi=fin, fo=fout, dt=dt) -> Built:
                shapes = [(_d(t, device), _d(fi, device)), (_d(fo, device), _d(fi, device)), (_d(fo, device),)]
                return _simple(F.linear, shapes, [dt] * 3)(device, seed)
            out.append(Benchmark(f"linear_{mode}_t{tokens}_in{fin}_out{fout}", "matmul",
                                 {"op": "linear", "dtype": mode, "tokens": tokens, "in": fin, "out": fout}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))
        for b, m, n, k in [(8, 512, 512, 64), (96, 128, 128, 64), (32, 1024, 1024, 128), (4, 2048, 2048, 2048),
                           (64, 197, 197, 64), (256, 64, 64, 32),
                           # a linear layer on a 3-D activation traces as a batched GEMM against the expanded
                           # weight: a recurrent LM's vocabulary head, sequence-first attention projections
                           (256, 64, 10000, 512), (50, 256, 2304, 768), (197, 64, 2304, 768)]:
            fl = 2.0 * b * m * n * k
            nb = b * (m * k + k * n + m * n) * dt.itemsize

            def build(device: torch.device, seed: int, b=b, m=m, n=n, k=k, dt=dt) -> Built:
                shapes = [(_d(b, device, 4), _d(m, device), _d(k, device)),
                          (_d(b, device, 4), _d(k, device), _d(n, device))]
                return _simple(torch.bmm, shapes, [dt, dt])(device, seed)
            out.append(Benchmark(f"bmm_{mode}_b{b}_m{m}_n{n}_k{k}", "matmul",
                                 {"op": "bmm", "dtype": mode, "batch": b, "m": m, "n": n, "k": k}, build,
                                 est_ms=_est(fl, nb, mode), matmul_tf32=mode == "tf32"))


# ---------------------------------------------------------------- convolution

_CONV_LAYERS = [
    # (cin, cout, hw, kernel, stride, groups)
    (3, 64, 224, 7, 2, 1), (64, 64, 56, 1, 1, 1), (64, 64, 56, 3, 1, 1), (64, 256, 56, 1, 1, 1),
    (128, 128, 28, 3, 1, 1), (128, 128, 56, 3, 2, 1), (256, 256, 14, 3, 1, 1), (512, 512, 7, 3, 1, 1),
    (1024, 256, 14, 1, 1, 1), (256, 1024, 14, 1, 1, 1), (512, 2048, 7, 1, 1, 1), (16, 16, 224, 3, 1, 1),
    (32, 32, 112, 3, 1, 32), (144, 144, 56, 3, 2, 144), (960, 960, 7, 3, 1, 960), (384, 384, 28, 7, 1, 384),
    (256, 256, 56, 3, 1, 32), (96, 200, 33, 5, 1, 1),
    # dense layers of wide CNNs (VGG/ResNet stages), which dominate large-batch training
    (64, 128, 112, 3, 1, 1), (256, 256, 56, 3, 1, 1), (512, 512, 28, 3, 1, 1), (128, 512, 28, 1, 1, 1),
    # strided 1x1 projections of residual blocks (ResNet/ResNeXt/RegNet downsampling): no plain GEMM, and
    # cuDNN transposes the whole NCHW input for a quarter of it; and the 3x3 stride-2 stem of
    # MobileNet/EfficientNet/RegNet, whose 3 input channels a tensor-core kernel pads
    (64, 128, 56, 1, 2, 1), (128, 256, 28, 1, 2, 1), (256, 512, 56, 1, 2, 1), (512, 1024, 28, 1, 2, 1),
    (1024, 2048, 14, 1, 2, 1), (3, 32, 224, 3, 2, 1),
]
# The 7x7 RGB stem of ResNet-family networks at more batch sizes: it runs at a fifteenth of its padded
# roofline, and the batch the networks use must not be an extrapolation.
_STEM_BATCHES = (64, 256)


# Depthwise layers of ConvNeXt, MobileNet and EfficientNet stages (channels, hw, kernel, stride) at
# training batches: cuDNN runs them on CUDA cores with their own kernels, so they need their own fit.
_DEPTHWISE_LAYERS = [(96, 56, 7, 1), (192, 28, 7, 1), (384, 14, 7, 1), (768, 7, 7, 1), (96, 112, 3, 2),
                     (240, 28, 5, 1), (672, 14, 5, 1), (1152, 7, 5, 1)]

# The 3x3 grouped layers of ResNeXt-32x4d stages (channels, hw; 32 groups): 4 channels per group are too
# few for a tensor-core kernel (CUDA cores), 8-32 take grouped tensor-core kernels.
_GROUPED_LAYERS = [(128, 56), (512, 14), (1024, 7)]


# 1-D convolutions of speech and audio encoders and temporal CNNs (cin, cout, length, kernel, stride):
# Whisper's stem over 3000 log-mel frames, wav2vec 2.0's raw-waveform feature encoder, a TCN block. cuDNN
# runs them as 2-D convolutions of height 1.
_CONV1D_LAYERS = [(80, 384, 3000, 3, 1), (384, 384, 3000, 3, 2), (1, 512, 16000, 10, 5), (512, 512, 3199, 3, 2),
                  (512, 512, 799, 2, 2), (256, 256, 1024, 5, 1)]
# Transposed convolutions of decoders (cin, cout, hw of the input, kernel, stride): U-Net's 2x2 stride-2
# up-convolutions and DCGAN's 4x4 stride-2 generator layers.
_CONV_TRANSPOSE_LAYERS = [(512, 256, 28, 2, 2), (256, 128, 56, 2, 2), (128, 64, 112, 2, 2), (512, 256, 8, 4, 2),
                          (256, 128, 16, 4, 2), (128, 64, 32, 4, 2)]


class _ConvLayer(NamedTuple):
    cin: int
    cout: int
    size: int             # spatial edge of the input (length of a 1-D one)
    kernel: int
    stride: int
    groups: int
    dims: int = 2         # spatial dimensions
    transposed: bool = False

    @property
    def padding(self) -> int:
        return (self.kernel - self.stride) // 2 if self.transposed else self.kernel // 2

    @property
    def out_size(self) -> int:
        if self.transposed:
            return (self.size - 1) * self.stride - 2 * self.padding + self.kernel
        return (self.size + 2 * self.padding - self.kernel) // self.stride + 1

    @property
    def prefix(self) -> str:
        return ("convT" if self.transposed else "conv") + f"{self.dims}d"

    def tag(self, batch: int, channels_last: bool) -> str:
        size = f"hw{self.size}" if self.dims == 2 else f"l{self.size}"
        return (f"c{self.cin}_{self.cout}_{size}_k{self.kernel}_s{self.stride}_g{self.groups}_n{batch}"
                + ("_nhwc" if channels_last else ""))


def _conv_grid() -> list[tuple[_ConvLayer, tuple[int, ...], bool, bool]]:
    """(layer, batches, with backward at every batch, channels-last activations) for every convolution
    benchmark."""
    grid = []
    for ci, spec in enumerate(_CONV_LAYERS):
        layer = _ConvLayer(*spec)
        # Dense layers also at batch 128: at large batch cuDNN picks other (faster) algorithms,
        # and a grid whose only big convolutions are awkward ones teaches the fit "big is slow".
        batches = (1, 32, 128) if ci % 3 == 0 or (layer.groups == 1 and layer.cin >= 64) else (1, 32)
        if spec == _CONV_LAYERS[0]:
            batches = batches + _STEM_BATCHES
        grid.append((layer, batches, ci % 2 == 0, False))
    # Depthwise layers in both memory formats: on NCHW data PyTorch runs its own depthwise kernels, on
    # channels-last data (ConvNeXt permutes its activations to NHWC) cuDNN's NHWC kernels, ~4x faster
    # in bf16 and a shape-dependent 0.3-3.4x in tf32 (benchmarks/kernel_facts.py).
    grid += [(_ConvLayer(c, c, hw, k, stride, c), (32, 128), True, last) for last in (False, True)
             for c, hw, k, stride in _DEPTHWISE_LAYERS]
    grid += [(_ConvLayer(c, c, hw, 3, 1, 32), (32, 128), True, False) for c, hw in _GROUPED_LAYERS]
    grid += [(_ConvLayer(cin, cout, length, k, stride, 1, dims=1), (1, 8, 32), True, False)
             for cin, cout, length, k, stride in _CONV1D_LAYERS]
    grid += [(_ConvLayer(cin, cout, hw, k, stride, 1, transposed=True), (1, 32, 128), True, False)
             for cin, cout, hw, k, stride in _CONV_TRANSPOSE_LAYERS]
    return grid


def _channels_last(build: Callable[[torch.device, int], Built], args: tuple[int, ...]) -> Callable[..., Built]:
    """`build` with the 4-d inputs at positions `args` stored channels-last (NHWC), as a model that
    permutes its activations hands them to the convolution."""
    def wrapped(device: torch.device, seed: int) -> Built:
        built = build(device, seed)
        def make_set(i: int) -> tuple:
            return tuple(t.contiguous(memory_format=torch.channels_last) if j in args else t
                         for j, t in enumerate(built.make_set(i)))
        return Built(built.fn, make_set)
    return wrapped


def _conv_shapes(layer: _ConvLayer, batch: int, device: torch.device) -> tuple[tuple, tuple, int]:
    """(input shape, weight shape, groups) of `layer` at `batch` (capped on CPU dry runs)."""
    g = layer.groups if not _tiny(device) else (min(layer.groups, 4) if layer.groups > 1 else 1)
    ci_, co_ = _d(layer.cin, device, 8), _d(layer.cout, device, 8)
    if g > 1:
        ci_, co_ = g * max(1, ci_ // g), g * max(1, co_ // g)
    size = _d(layer.size, device, 12 if layer.dims == 2 else 64)
    window = (layer.kernel,) * layer.dims
    weight = (ci_, co_ // g, *window) if layer.transposed else (co_, ci_ // g, *window)
    return (_d(batch, device, 2), ci_, *(size,) * layer.dims), weight, g


def _conv_call(layer: _ConvLayer, g: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The forward convolution of `layer` (F.conv1d, F.conv2d or F.conv_transpose2d)."""
    if layer.transposed:
        return lambda x, w: F.conv_transpose2d(x, w, None, layer.stride, layer.padding, 0, g)
    conv = F.conv1d if layer.dims == 1 else F.conv2d
    return lambda x, w: conv(x, w, None, layer.stride, layer.padding, 1, g)


def _conv(out: list[Benchmark]) -> None:
    for mode in ("tf32", "bf16"):
        dt = DTYPES[mode]
        for layer, batches, all_bwd, last in _conv_grid():
            cin, cout, kk, groups = layer.cin, layer.cout, layer.kernel, layer.groups
            for batch in batches:
                window = kk ** layer.dims
                in_sp, out_sp = layer.size ** layer.dims, layer.out_size ** layer.dims
                # a transposed convolution's work is its adjoint's: every input pixel meets every weight
                fl = 2.0 * batch * window * (cin * in_sp * (cout // groups) if layer.transposed
                                             else cout * out_sp * (cin // groups))
                nb = (batch * cin * in_sp + cout * (cin // groups) * window + batch * cout * out_sp) * dt.itemsize
                tag = layer.tag(batch, last)
                params = {"dtype": mode, "batch": batch, "cin": cin, "cout": cout, "hw": layer.size, "kernel": kk,
                          "stride": layer.stride, "groups": groups, "padding": layer.padding}
                if layer.dims != 2 or layer.transposed:
                    params.update(dims=layer.dims, transposed=layer.transposed)
                if last:
                    params["memory_format"] = "channels_last"

                def build_fwd(device: torch.device, seed: int, layer=layer, batch=batch, dt=dt) -> Built:
                    xs, ws, g = _conv_shapes(layer, batch, device)
                    return _simple(_conv_call(layer, g), [xs, ws], [dt, dt])(device, seed)
                out.append(Benchmark(f"{layer.prefix}_fwd_{mode}_{tag}", "conv", {"op": layer.prefix, **params},
                                     _channels_last(build_fwd, (0,)) if last else build_fwd,
                                     est_ms=_est(fl, nb, mode)))
                if all_bwd or batch >= 32:
                    def build_bwd(device: torch.device, seed: int, layer=layer, batch=batch, dt=dt) -> Built:
                        xs, ws, g = _conv_shapes(layer, batch, device)
                        ys = tuple(_meta_out_shape(_conv_call(layer, g), xs, ws))
                        n = layer.dims

                        def fn(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
                            return torch.ops.aten.convolution_backward(
                                dy, x, w, None, [layer.stride] * n, [layer.padding] * n, [1] * n, layer.transposed,
                                [0] * n, g, [True, True, False])
                        return _simple(fn, [ys, xs, ws], [dt, dt, dt])(device, seed)
                    out.append(Benchmark(f"{layer.prefix}_bwd_{mode}_{tag}", "conv",
                                         {"op": layer.prefix + "_backward", **params},
                                         _channels_last(build_bwd, (0, 1)) if last else build_bwd,
                                         est_ms=_est(2 * fl, 2 * nb, mode)))


def _meta_out_shape(fn: Callable[..., torch.Tensor], *shapes: Sequence[int]) -> torch.Size:
    """Output shape of `fn` on tensors of `shapes`, computed on the meta device (no memory, no kernel)."""
    return fn(*(torch.empty(s, device="meta") for s in shapes)).shape


# ---------------------------------------------------------------- attention

def _attention(out: list[Benchmark]) -> None:
    shapes = [(1, 16, 512, 64), (8, 16, 1024, 64), (4, 32, 2048, 128), (1, 8, 4096, 128), (16, 12, 256, 64),
              (2, 16, 8192, 64), (32, 12, 197, 64), (4, 8, 1000, 80)]
    for mode in ("bf16", "fp16", "fp32"):
        for si, shape in enumerate(shapes):
            if mode != "bf16" and si % 2:
                continue
            for causal in (False, True):
                _sdpa_benchmark(out, mode, shape, causal, False)
                if si < 6:
                    _sdpa_benchmark(out, mode, shape, causal, True)
    _attention_more(out)


# Attention had 11 held-out shapes; these add head dims 80-128, sequence lengths that are not
# a multiple of 64 (ViT-L/384's 577, CLIP's 77, Whisper's 1500) and more batch x heads per SM.
_ATTENTION_MORE = [(2, 32, 1024, 128), (16, 16, 512, 64), (64, 12, 128, 64), (1, 32, 2048, 128), (8, 12, 384, 64),
                   (4, 16, 1536, 96), (24, 16, 577, 64), (64, 8, 77, 64), (3, 20, 1500, 64)]


def _sdpa_benchmark(out: list[Benchmark], mode: str, shape: tuple[int, int, int, int], causal: bool,
                    backward: bool) -> None:
    b, h, s, dh = shape
    dt = DTYPES[mode]
    fl = 4.0 * b * h * s * s * dh * (0.5 if causal else 1.0)
    nb = 4 * b * h * s * dh * dt.itemsize
    params = {"dtype": mode, "batch": b, "heads": h, "seq": s, "head_dim": dh, "causal": causal}
    tag = f"{mode}_b{b}_h{h}_s{s}_d{dh}{'_causal' if causal else ''}"

    def leaves(device: torch.device, seed: int, i: int) -> tuple:
        shp = (_d(b, device, 2), _d(h, device, 2), _d(s, device, 16), _d(dh, device, 8))
        return tuple(_randn(shp, dt, device, seed, i * 4 + j) for j in range(3))

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    est_mode = mode if mode != "fp32" else "tf32"
    if backward:
        out.append(Benchmark(f"sdpa_bwd_{tag}", "attention", {"op": "sdpa_backward", **params},
                             lambda device, seed: _backward_built(fwd, lambda i: leaves(device, seed, i), 3),
                             est_ms=_est(2.5 * fl, 2 * nb, est_mode)))
    else:
        out.append(Benchmark(f"sdpa_fwd_{tag}", "attention", {"op": "sdpa", **params},
                             lambda device, seed: Built(fwd, lambda i: leaves(device, seed, i)),
                             est_ms=_est(fl, nb, est_mode)))


def _attention_more(out: list[Benchmark]) -> None:
    for si, shape in enumerate(_ATTENTION_MORE):
        for causal in (False, True):
            for backward in (False, True):
                _sdpa_benchmark(out, "bf16", shape, causal, backward)
        if si % 2 == 0:  # fp32 (the memory-efficient kernels) and fp16 on every other shape
            for backward in (False, True):
                _sdpa_benchmark(out, "fp32", shape, False, backward)
            _sdpa_benchmark(out, "fp16", shape, True, False)


# ---------------------------------------------------------------- RNN (cuDNN)

class _RNNForward(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _rnn(out: list[Benchmark]) -> None:
    configs = [(128, 32, 256, 256, 1), (64, 64, 512, 512, 2), (256, 8, 128, 1024, 1), (32, 128, 1024, 1024, 1),
               (512, 16, 64, 128, 2)]
    # More LSTM shapes (batch 1, deep, wide); the GRU's per-step CPU trace makes it slow to re-trace.
    lstm_only = [(64, 1, 512, 512, 1), (128, 64, 256, 512, 1), (32, 32, 128, 256, 3), (256, 128, 512, 512, 1),
                 (16, 256, 1024, 2048, 1)]
    for cell in ("lstm", "gru"):
        for seq, batch, fin, hid, layers in configs + (lstm_only if cell == "lstm" else []):
            _rnn_benchmarks(out, cell, seq, batch, fin, hid, layers, False)
    # (cell, seq, batch, input, hidden, layers, bidirectional): small hidden sizes (whose steps are launch-bound), language and speech models' shapes, and
    # bidirectional layers; GRUs kept to few steps (slow CPU traces).
    launch_bound_shapes = [("lstm", 35, 20, 650, 650, 2, False), ("lstm", 100, 32, 128, 128, 1, False),
                 ("lstm", 50, 1, 128, 128, 1, False), ("lstm", 20, 64, 300, 256, 2, False),
                 ("lstm", 64, 32, 256, 256, 1, True), ("lstm", 50, 16, 128, 512, 2, True),
                 ("lstm", 128, 256, 64, 64, 1, False), ("gru", 32, 64, 256, 256, 1, False),
                 ("gru", 50, 1, 128, 128, 1, False), ("gru", 20, 32, 512, 1024, 2, False),
                 ("gru", 24, 16, 128, 256, 1, True)]
    # cuDNN's persistent kernels (one launch per layer, a grid barrier per step) ran for hidden
    # 64 and 128 and cost a GRU step about half an LSTM step of the same width; more hidden sizes (32 to
    # 192, across where cuDNN stops running persistent), batches and depths of both cells.
    persistent_shapes = [
            ("lstm", 64, 8, 32, 32, 1, False), ("lstm", 96, 64, 96, 96, 1, False),
            ("lstm", 48, 16, 160, 160, 1, False), ("lstm", 48, 16, 192, 192, 1, False),
            ("lstm", 200, 4, 64, 64, 2, False), ("lstm", 64, 128, 128, 128, 1, False),
            ("lstm", 64, 1, 64, 128, 1, True), ("gru", 64, 8, 64, 64, 1, False),
            ("gru", 48, 64, 128, 128, 1, False), ("gru", 32, 16, 96, 96, 2, False),
            ("gru", 32, 4, 160, 160, 1, False), ("gru", 32, 32, 32, 32, 1, False),
            ("gru", 40, 256, 64, 64, 1, False), ("gru", 64, 1, 128, 128, 1, True)]
    for spec in launch_bound_shapes + persistent_shapes:
        _rnn_benchmarks(out, *spec)
    # 16-bit layers (bf16 weights; mixed precision runs cuDNN's RNNs in fp16, the same 16-bit
    # fits), of both cells and of widths that run persistent in fp32 and per step; without them the fits
    # extrapolated the fp32 kernels to a mode they never saw.
    sixteen_bit_shapes = [
            ("lstm", 64, 8, 32, 32, 1, False), ("lstm", 50, 1, 128, 128, 1, False),
            ("lstm", 100, 32, 128, 128, 1, False), ("gru", 48, 64, 128, 128, 1, False),
            ("lstm", 200, 4, 64, 64, 2, False), ("gru", 32, 16, 96, 96, 2, False),
            ("lstm", 48, 16, 160, 160, 1, False), ("lstm", 128, 32, 256, 256, 1, False),
            ("lstm", 64, 64, 512, 512, 2, False), ("lstm", 35, 20, 650, 650, 2, False),
            ("lstm", 32, 128, 1024, 1024, 1, False), ("lstm", 64, 1, 512, 512, 1, False),
            ("gru", 32, 64, 256, 256, 1, False), ("gru", 20, 32, 512, 1024, 2, False),
            ("lstm", 64, 32, 256, 256, 1, True), ("lstm", 256, 8, 128, 1024, 1, False),
            ("lstm", 16, 256, 1024, 2048, 1, False), ("gru", 64, 1, 128, 128, 1, True)]
    for spec in sixteen_bit_shapes:
        _rnn_benchmarks(out, *spec, dtype="bf16")
    for cell in ("lstm", "gru"):
        # One cuDNN RNN call costs the host far more than one elementwise op (weight and descriptor
        # checks); at batch 1 that is most of a step, so "rnn" gets its own measured dispatch cost.
        def build_probe(device: torch.device, seed: int, cell=cell) -> Built:
            cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
            torch.manual_seed(seed)
            rnn = cls(_d(64, device, 8), _d(64, device, 8), 1, device=device).eval()
            meta = _RNNForward(cls(_d(64, device, 8), _d(64, device, 8), 1, device="meta"))
            shape = (16, 1, _d(64, device, 8))
            return Built(lambda x: rnn(x)[0], lambda i: (_randn(shape, torch.float32, device, seed, i),),
                         TraceSpec(meta, (torch.empty(shape, device="meta"),)))
        out.append(Benchmark(f"host_dispatch_{cell}", "rnn", {"op": cell, "dtype": "fp32", "seq": 16, "batch": 1,
                                                              "hidden": 64}, build_probe, kind="host_dispatch",
                             est_ms=0.05, trace_cost_s=0.2))


def _rnn_benchmarks(out: list[Benchmark], cell: str, seq: int, batch: int, fin: int, hid: int, layers: int,
                    bidir: bool, dtype: str = "fp32") -> None:
    """The forward and the forward+backward benchmark of one cuDNN LSTM/GRU (sequence-first input), its
    weights and input in `dtype` ("fp32" names carry no dtype, others end in it)."""
    gates = 4 if cell == "lstm" else 3
    dirs = 2 if bidir else 1
    tdtype = DTYPES[dtype]
    fl = 2.0 * dirs * seq * batch * gates * hid * (fin + hid + (layers - 1) * (dirs + 1) * hid)
    nb = tdtype.itemsize * (seq * batch * (fin + dirs * hid) + dirs * gates * hid * (fin + hid) * layers)
    params = {"cell": cell, "seq": seq, "batch": batch, "input": fin, "hidden": hid, "layers": layers,
              "dtype": dtype, **({"bidirectional": True} if bidir else {})}
    tag = f"{cell}_t{seq}_b{batch}_in{fin}_h{hid}_l{layers}{'_bi' if bidir else ''}"
    tag += "" if dtype == "fp32" else f"_{dtype}"

    def make(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
        cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
        rnn = cls(_d(fin, device, 8), _d(hid, device, 8), layers, bidirectional=bidir, device=device, dtype=tdtype)
        trace_copy = _RNNForward(cls(_d(fin, device, 8), _d(hid, device, 8), layers, bidirectional=bidir,
                                     device="meta", dtype=tdtype))
        return rnn, trace_copy

    def xshape(device: torch.device) -> tuple:
        return (_d(seq, device, 4), _d(batch, device, 2), _d(fin, device, 8))

    def build_fwd(device: torch.device, seed: int) -> Built:
        torch.manual_seed(seed)
        rnn, meta = make(device)
        rnn.eval()
        return Built(lambda x: rnn(x)[0], lambda i: (_randn(xshape(device), tdtype, device, seed, i),),
                     TraceSpec(meta, (torch.empty(xshape(device), device="meta", dtype=tdtype),)))

    def build_fb(device: torch.device, seed: int) -> Built:
        torch.manual_seed(seed)
        rnn, meta = make(device)
        rnn.train()
        params_ = list(rnn.parameters())

        def fn(x: torch.Tensor) -> Any:
            with torch.enable_grad():
                return torch.autograd.grad(rnn(x)[0].sum(), params_)
        return Built(fn, lambda i: (_randn(xshape(device), tdtype, device, seed, i),),
                     TraceSpec(meta, (torch.empty(xshape(device), device="meta", dtype=tdtype),), mode="training",
                               loss_fn=lambda y: y.sum()))
    # On the CPU (where we trace) a GRU is not one op but a few per time step: its trace is
    # slow (~7 ms per step and layer forward, ~20 ms forward+backward, measured).
    steps = dirs * seq * layers if cell == "gru" else 0
    out.append(Benchmark(f"rnn_fwd_{tag}", "rnn", {"op": f"{cell}_forward", **params}, build_fwd,
                         est_ms=_est(fl, nb, "tf32" if dtype == "fp32" else dtype) + 0.005 * seq * layers,
                         trace_cost_s=0.03 + 0.007 * steps, host_paced=True))
    if steps > 512:  # a 10-20 s trace for one point: leave it to the forward benchmark
        return
    out.append(Benchmark(f"rnn_fwdbwd_{tag}", "rnn", {"op": f"{cell}_forward_backward", **params}, build_fb,
                         est_ms=3 * (_est(fl, nb, "tf32" if dtype == "fp32" else dtype) + 0.005 * seq * layers),
                         trace_cost_s=0.05 + 0.02 * steps, host_paced=True))

# ---------------------------------------------------------------- memory-bound families

_NUMELS = [2 ** 12, 2 ** 16, 2 ** 20, 2 ** 22, 2 ** 24, 2 ** 26, 3 * 10 ** 7 + 7]


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
    for mode in ("fp32", "bf16"):
        for opname, fn in {**binary, **unary}.items():
            arity = 2 if opname in binary else 1
            numels = _NUMELS if mode == "fp32" or opname in ("add", "gelu") else _NUMELS[1::2]
            for n in numels:
                out.append(_streaming(opname, opname, fn, arity, mode, n))
    # Broadcast: a per-channel bias added in place to an NCHW activation (how PyTorch adds a cuDNN
    # convolution's bias) and a per-feature vector added along the last dim.
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for shape, bshape in [((64, 64, 112, 112), (1, 64, 1, 1)), ((64, 512, 28, 28), (1, 512, 1, 1)),
                              ((256, 256, 14, 14), (1, 256, 1, 1)), ((8192, 4096), (4096,)),
                              ((16384, 10000), (10000,)), ((12608, 2304), (2304,))]:
            n = math.prod(shape)

            def build(device: torch.device, seed: int, shape=shape, bshape=bshape, dt=dt) -> Built:
                tiny = _tiny(device)
                xs = tuple(_d(v, device, 2) for v in shape) if tiny else shape
                bs = tuple(1 if v == 1 else xs[i + len(xs) - len(bshape)] for i, v in enumerate(bshape))
                return _simple(torch.Tensor.add_, [xs, bs], [dt, dt])(device, seed)
            tag = "x".join(map(str, shape))
            out.append(Benchmark(f"ew_bias_add_{mode}_{tag}", "elementwise",
                                 {"op": "add_", "dtype": mode, "shape": list(shape), "bias_shape": list(bshape)},
                                 build, est_ms=_est(n, 2.0 * n * dt.itemsize, mode)))
    # Mixed precision: a bf16 tensor meets an fp32 one (a residual stream under autocast); TensorIterator
    # casts per element on its non-vectorised path.
    for opname, fn in binary.items():
        for n in _NUMELS[1::2]:
            def build(device: torch.device, seed: int, n=n, fn=fn) -> Built:
                return _simple(fn, [(_d(n, device, 1024),)] * 2, [torch.bfloat16, torch.float32])(device, seed)
            out.append(Benchmark(f"ew_{opname}_bf16xfp32_n{n}", "elementwise",
                                 {"op": opname, "dtype": "bf16+fp32", "numel": n}, build,
                                 est_ms=_est(2.0 * n, 10.0 * n, "fp32")))


def _activations_in_place(out: list[Benchmark]) -> None:
    # What CNNs run on their activations: in-place activations (read and write one tensor) and ReLU's
    # backward (threshold_backward: gradient and output in, gradient out).
    fns = {"relu_": torch.relu_, "hardtanh_": lambda x: F.hardtanh(x, 0.0, 6.0, inplace=True),
           "silu_": lambda x: F.silu(x, inplace=True),
           "threshold_backward": lambda g, y: torch.ops.aten.threshold_backward(g, y, 0.0)}
    for mode in ("fp32", "bf16"):
        for opname, fn in fns.items():
            arity = 2 if opname == "threshold_backward" else 1
            tag = opname.replace("_", "") + "inplace" if opname.endswith("_") else opname
            for n in _NUMELS[2:]:
                out.append(_streaming(opname, tag, fn, arity, mode, n))
        # a tensor divided by a Python number (attention scaling, loss averaging, optimizer steps)
        for n in _NUMELS[1::2]:
            out.append(_streaming("div", "divscalar", lambda x: torch.ops.aten.div.Scalar(x, 3.0), 1, mode, n))


def _reduction(out: list[Benchmark]) -> None:
    shapes = [(1024, 1024), (8192, 8192), (32, 2 ** 20), (2 ** 20, 32), (4096, 50257), (64, 1000),
              (4096, 64), (64, 65536), (16384, 2048)]
    both_dims = ((8192, 8192), (2 ** 20, 32), (64, 65536))
    for opname, fn in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}.items():
        for r, c in shapes:
            for dim in (-1, 0):
                if opname != "sum" and dim == 0 and (r, c) not in both_dims:
                    continue

                def build(device: torch.device, seed: int, r=r, c=c, fn=fn, dim=dim) -> Built:
                    return _simple(lambda x: fn(x, dim), [(_d(r, device), _d(c, device))], [torch.float32])(
                        device, seed)
                out.append(Benchmark(f"reduce_{opname}_fp32_{r}x{c}_dim{dim}", "reduction",
                                     {"op": opname, "dtype": "fp32", "rows": r, "cols": c, "dim": dim}, build,
                                     est_ms=_est(r * c, 4.0 * r * c)))
    # reductions of a whole tensor to one number (a loss's mean, a norm for gradient clipping)
    for mode in ("fp32", "bf16"):
        for opname, fn in {"sum": torch.sum, "mean": torch.mean}.items():
            for n in (2 ** 20, 2 ** 24, 2 ** 27):
                def build_all(device: torch.device, seed: int, n=n, fn=fn, dt=DTYPES[mode]) -> Built:
                    return _simple(lambda x: fn(x), [(_d(n, device, 1024),)], [dt])(device, seed)
                out.append(Benchmark(f"reduce_{opname}_all_{mode}_n{n}", "reduction",
                                     {"op": opname, "dtype": mode, "numel": n}, build_all,
                                     est_ms=_est(n, DTYPES[mode].itemsize * n)))
    # column sums over tokens: the bias gradient of every linear layer in training
    for mode in ("fp32", "bf16"):
        for r, c in [(8192, 768), (16384, 3072), (50176, 96), (4096, 1024)]:
            _colsum(out, mode, r, c)
    # softmax / log_softmax forward and backward (category "reduction" in the estimator)
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for opname, fn in {"softmax": F.softmax, "log_softmax": F.log_softmax}.items():
            for r, c in [(4096, 1024), (16384, 4096), (8 * 16 * 512, 512), (8192, 50257), (128, 128),
                         (65536, 64), (2048, 2048), (512, 32000),
                         # rows that are not a multiple of 4: eager attention over ViT's 197 tokens
                         (64 * 12 * 197, 197), (4096, 1001), (8192, 77),
                         # language-model heads: rows longer than a block's shared memory
                         (4096, 32000), (1024, 128256)]:
                if mode == "bf16" and opname == "log_softmax" and c not in (50257, 32000, 128256):
                    continue

                def leaves(device: torch.device, seed: int, i: int, r=r, c=c, dt=dt) -> tuple:
                    return (_randn((_d(r, device), _d(c, device)), dt, device, seed, i),)

                def fwd(x: torch.Tensor, fn=fn) -> torch.Tensor:
                    return fn(x, -1)
                nb = 2.0 * r * c * dt.itemsize
                params = {"op": opname, "dtype": mode, "rows": r, "cols": c}
                _fwd_bwd(out, opname, f"{mode}_{r}x{c}", "reduction", opname,
                         {k: v for k, v in params.items() if k != "op"}, fwd, leaves, 1,
                         _est(5.0 * r * c, nb), _est(3.0 * r * c, 1.5 * nb))
    _reduction_more(out)


def _colsum(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """A sum over the rows of an r x c matrix (dim 0)."""
    dt = DTYPES[mode]

    def build_col(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: torch.sum(x, 0), [(_d(r, device), _d(c, device))], [dt])(device, seed)
    out.append(Benchmark(f"colsum_{mode}_{r}x{c}", "reduction",
                         {"op": "sum", "dtype": mode, "rows": r, "cols": c, "dim": 0}, build_col,
                         est_ms=_est(r * c, dt.itemsize * r * c)))


def _reduction_more(out: list[Benchmark]) -> None:
    """Row reductions on bf16 data, column sums of more widths, softmax over attention-score
    rows (eager attention: 1024, 577 and 256 keys)."""
    for opname, fn in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}.items():
        for r, c in [(4096, 4096), (512, 16384), (65536, 256), (1000, 1000)]:
            def build(device: torch.device, seed: int, r=r, c=c, fn=fn) -> Built:
                return _simple(lambda x: fn(x, -1), [(_d(r, device), _d(c, device))], [torch.bfloat16])(device, seed)
            out.append(Benchmark(f"reduce_{opname}_bf16_{r}x{c}_dim-1", "reduction",
                                 {"op": opname, "dtype": "bf16", "rows": r, "cols": c, "dim": -1}, build,
                                 est_ms=_est(r * c, 2.0 * r * c)))
    for mode in ("fp32", "bf16"):
        for r, c in [(32768, 512), (2048, 4096), (131072, 64)]:
            _colsum(out, mode, r, c)
    for mode in ("fp32", "bf16"):
        for r, c in [(4 * 12 * 1024, 1024), (8 * 16 * 577, 577), (32 * 8 * 256, 256)]:
            _softmax_rows(out, mode, r, c)
    # Softmax over the 49 (7x7) keys of Swin's window attention, millions of short odd rows
    for mode, r in [("fp32", 8192 * 3 * 49), ("fp32", 512 * 12 * 49), ("bf16", 2048 * 6 * 49)]:
        _softmax_rows(out, mode, r, 49)


def _softmax_rows(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """Softmax over the last dimension of an r x c matrix, forward and backward."""
    dt = DTYPES[mode]

    def leaves(device: torch.device, seed: int, i: int) -> tuple:
        return (_randn((_d(r, device), _d(c, device)), dt, device, seed, i),)

    def fwd(x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, -1)
    nb = 2.0 * r * c * dt.itemsize
    _fwd_bwd(out, "softmax", f"{mode}_{r}x{c}", "reduction", "softmax", {"dtype": mode, "rows": r, "cols": c},
             fwd, leaves, 1, _est(5.0 * r * c, nb), _est(3.0 * r * c, 1.5 * nb))


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


def _pool(out: list[Benchmark]) -> None:
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in [(32, 64, 112), (128, 64, 112), (1, 64, 112), (16, 192, 56), (64, 256, 28)]:
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
    pools = {"maxpool": (lambda x: F.max_pool2d(x, 3, 2, 1), "max_pool2d_3x3s2",
                         [(64, 64, 112), (256, 64, 56), (32, 128, 56), (8, 96, 55)]),
             "maxpool2x2": (lambda x: F.max_pool2d(x, 2), "max_pool2d_2x2", [(32, 64, 224), (32, 256, 56), (32, 512, 28)]),
             "avgpool2x2": (lambda x: F.avg_pool2d(x, 2), "avg_pool2d_2x2", [(64, 128, 56), (64, 256, 28), (64, 512, 14)])}
    for prefix, (fn, opname, shapes) in pools.items():
        for mode in ("fp32", "bf16"):
            dt = DTYPES[mode]
            for n, c, hw in shapes:
                numel = n * c * hw * hw
                def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                    return (_randn(_nchw(device, n, c, hw), dt, device, seed, i),)
                params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
                tag = f"{mode}_n{n}_c{c}_hw{hw}"
                _fwd_bwd(out, prefix, tag, "pool", opname, params, fn, leaves, 1,
                         _est(numel, 1.25 * numel * dt.itemsize), _est(numel, 2.0 * numel * dt.itemsize))
    for n, c, hw in [(32, 2048, 7), (128, 512, 14), (1, 1280, 7), (64, 256, 56)]:
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
    # 2x upsampling of decoders and feature pyramids (U-Net, diffusion U-Nets, FPN): nearest and bilinear,
    # forward and backward (the backward sums each output pixel's gradient into its sources).
    upsample = {"upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), "upsample_nearest2d"),
                "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
                                      "upsample_bilinear2d")}
    for prefix, (fn, opname) in upsample.items():
        for mode in ("fp32", "bf16"):
            dt = DTYPES[mode]
            for n, c, hw in [(32, 256, 32), (8, 128, 128), (1, 512, 16), (64, 64, 64)]:
                numel = n * c * hw * hw
                def leaves(device: torch.device, seed: int, i: int, n=n, c=c, hw=hw, dt=dt) -> tuple:
                    return (_randn(_nchw(device, n, c, hw), dt, device, seed, i),)
                params = {"dtype": mode, "batch": n, "channels": c, "hw": hw}
                _fwd_bwd(out, prefix, f"{mode}_n{n}_c{c}_hw{hw}", "pool", opname, params, fn, leaves, 1,
                         _est(4.0 * numel, 5.0 * numel * dt.itemsize), _est(4.0 * numel, 5.0 * numel * dt.itemsize))
    # Squeeze-and-excitation blocks (RegNetY, EfficientNet, MobileNetV3): every activation is pooled to one
    # value per (sample, channel) and then scaled by one, at stage shapes and batches that fill the GPU.
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in [(256, 64, 56), (256, 144, 28), (256, 320, 14), (256, 784, 7), (128, 96, 112)]:
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


def _embedding(out: list[Benchmark]) -> None:
    for vocab, dim, tokens, mode in [(50257, 768, 8192, "fp32"), (32000, 4096, 8192, "bf16"), (1000, 64, 4096, "fp32"),
                                     (250000, 1024, 2048, "bf16"), (30522, 768, 512 * 32, "fp32"),
                                     (50257, 768, 1, "fp32"),
                                     # more widths, token counts and vocabularies, incl. a tiny vocabulary
                                     # whose backward accumulates many tokens into each row
                                     (30522, 1024, 8192, "bf16"), (50257, 1600, 4096, "bf16"),
                                     (128256, 2048, 4096, "bf16"), (1000, 256, 65536, "fp32"),
                                     (50257, 768, 512, "fp32"), (100, 512, 16384, "bf16"),
                                     (8192, 128, 262144, "fp32"), (32000, 4096, 2048, "fp32"),
                                     # position and token-type tables, short batches (the direct
                                     # backward, <= 3072 indices) and more vocabularies and widths
                                     (512, 768, 8192, "fp32"), (2, 768, 8192, "fp32"), (50257, 768, 16384, "bf16"),
                                     (32000, 4096, 512, "bf16"), (151936, 896, 4096, "bf16"),
                                     (30522, 768, 128, "fp32"), (50257, 1024, 1024, "fp32"),
                                     (10000, 300, 32768, "fp32"), (256000, 2048, 1024, "bf16"),
                                     (1000, 64, 1024, "fp32"), (49408, 512, 77 * 64, "fp32"),
                                     (65024, 4544, 2048, "bf16")]:
        dt = DTYPES[mode]
        nb = tokens * dim * dt.itemsize * 2

        def build_fwd(device: torch.device, seed: int, vocab=vocab, dim=dim, tokens=tokens, dt=dt) -> Built:
            v, d = _d(vocab, device, 64), _d(dim, device)

            def make_set(i: int) -> tuple:
                idx = torch.randint(0, v, (_d(tokens, device),), device=device, generator=_gen(device, seed, i))
                return idx, _randn((v, d), dt, device, seed, 100 + i)
            return Built(F.embedding, make_set)

        def build_bwd(device: torch.device, seed: int, vocab=vocab, dim=dim, tokens=tokens, dt=dt) -> Built:
            v, d = _d(vocab, device, 64), _d(dim, device)

            def make_set(i: int) -> tuple:
                t = _d(tokens, device)
                idx = torch.randint(0, v, (t,), device=device, generator=_gen(device, seed, i))
                return _randn((t, d), dt, device, seed, 100 + i), idx

            def fn(grad: torch.Tensor, idx: torch.Tensor, v=v) -> torch.Tensor:
                return torch.ops.aten.embedding_dense_backward(grad, idx, v, -1, False)
            return Built(fn, make_set)
        params = {"dtype": mode, "vocab": vocab, "dim": dim, "tokens": tokens}
        tag = f"{mode}_v{vocab}_d{dim}_t{tokens}"
        out.append(Benchmark(f"embedding_fwd_{tag}", "embedding", {"op": "embedding", **params}, build_fwd,
                             est_ms=_est(0, nb)))
        out.append(Benchmark(f"embedding_bwd_{tag}", "embedding", {"op": "embedding_dense_backward", **params},
                             build_bwd, est_ms=_est(0, nb + vocab * dim * 4.0)))


def _cast(out: list[Benchmark], src: str, dst: str, n: int) -> None:
    """A cast of n contiguous elements from dtype src to dst."""
    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.to(DTYPES[dst]), [(_d(n, device, 1024),)], [DTYPES[src]])(device, seed)
    out.append(Benchmark(f"cast_{src}_to_{dst}_n{n}", "copy", {"op": f"to_{dst}", "dtype": src, "numel": n},
                         build, est_ms=_est(0, 6.0 * n)))


def _transpose(out: list[Benchmark], mode: str, r: int, c: int) -> None:
    """A contiguous copy of the transpose of an r x c matrix."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.t().contiguous(), [(_d(r, device), _d(c, device))], [dt])(device, seed)
    out.append(Benchmark(f"transpose_contig_{mode}_{r}x{c}", "copy",
                         {"op": "transpose_contiguous", "dtype": mode, "rows": r, "cols": c}, build,
                         est_ms=_est(0, 2.0 * dt.itemsize * r * c)))


def _heads_transpose(out: list[Benchmark], mode: str, shape: tuple[int, int, int, int]) -> None:
    """(batch, seq, heads, dim) -> (batch, heads, seq, dim), the copies around eager attention."""
    b, sq, h, d = shape
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        return _simple(lambda x: x.transpose(1, 2).contiguous(),
                       [(_d(b, device, 2), _d(sq, device), _d(h, device, 4), _d(d, device))], [dt])(device, seed)
    out.append(Benchmark(f"heads_transpose_{mode}_b{b}_s{sq}_h{h}_d{d}", "copy",
                         {"op": "transpose_contiguous", "dtype": mode, "batch": b, "seq": sq, "heads": h, "dim": d},
                         build, est_ms=_est(0, 2.0 * dt.itemsize * b * sq * h * d)))


def _copy(out: list[Benchmark]) -> None:
    for src, dst, numels in [("fp32", "bf16", _NUMELS), ("bf16", "fp32", _NUMELS), ("fp32", "fp16", _NUMELS[::2])]:
        for n in numels:
            _cast(out, src, dst, n)
    for r, c in [(1024, 1024), (4096, 4096), (8192, 8192), (1000, 3001), (64, 65536)]:
        _transpose(out, "fp32", r, c)
    for n, c, hw in [(32, 64, 56), (128, 256, 14), (8, 3, 224)]:
        def build(device: torch.device, seed: int, n=n, c=c, hw=hw) -> Built:
            return _simple(lambda x: x.permute(0, 2, 3, 1).contiguous(),
                           [_nchw(device, n, c, hw)],
                           [torch.bfloat16])(device, seed)
        out.append(Benchmark(f"nchw_to_nhwc_bf16_n{n}_c{c}_hw{hw}", "copy",
                             {"op": "permute_contiguous", "dtype": "bf16", "batch": n, "channels": c, "hw": hw},
                             build, est_ms=_est(0, 4.0 * n * c * hw * hw)))
    # attention heads: (batch, seq, heads, dim) <-> (batch, heads, seq, dim) copies around eager attention
    for mode in ("fp32", "bf16"):
        for shape in [(32, 128, 12, 64), (8, 1024, 16, 64), (64, 197, 12, 64)]:
            _heads_transpose(out, mode, shape)
    # channels-last conversions both ways
    for mode, src, perm in [("fp32", "nchw", (0, 2, 3, 1)), ("bf16", "nhwc", (0, 3, 1, 2))]:
        for n, c, hw in [(32, 256, 56), (128, 64, 56), (64, 512, 28)]:
            def build_perm(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=DTYPES[mode], perm=perm) -> Built:
                return _simple(lambda x: x.permute(*perm).contiguous(),
                               [_nchw(device, n, c, hw)],
                               [dt])(device, seed)
            dst = "nhwc" if src == "nchw" else "nchw"
            out.append(Benchmark(f"{src}_to_{dst}_{mode}_n{n}_c{c}_hw{hw}", "copy",
                                 {"op": "permute_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_perm, est_ms=_est(0, 2.0 * DTYPES[mode].itemsize * n * c * hw * hw)))
    for parts, n in [(2, 2 ** 20), (8, 2 ** 20), (2, 2 ** 24), (32, 2 ** 14), (4, 3 * 10 ** 6 + 1)]:
        def build(device: torch.device, seed: int, parts=parts, n=n) -> Built:
            return _simple(lambda *ts: torch.cat(ts, 0), [(_d(n, device, 256),)] * parts,
                           [torch.float32] * parts)(device, seed)
        out.append(Benchmark(f"cat_fp32_{parts}x{n}", "copy", {"op": "cat", "dtype": "fp32", "parts": parts,
                                                                "numel": n}, build,
                             est_ms=_est(0, 8.0 * parts * n)))
    # along the channels of NCHW activations (SqueezeNet's fire modules, DenseNet's blocks): each part is
    # written as strided slabs of the output
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for parts, (n, c, hw) in [(2, (256, 64, 55)), (2, (256, 128, 27)), (4, (64, 128, 28)), (8, (64, 32, 56))]:
            def build_ch(device: torch.device, seed: int, parts=parts, n=n, c=c, hw=hw, dt=dt) -> Built:
                shape = _nchw(device, n, c, hw)
                return _simple(lambda *ts: torch.cat(ts, 1), [shape] * parts, [dt] * parts)(device, seed)
            out.append(Benchmark(f"cat_channels_{mode}_{parts}x{n}x{c}x{hw}x{hw}", "copy",
                                 {"op": "cat", "dtype": mode, "parts": parts, "batch": n, "channels": c, "hw": hw},
                                 build_ch, est_ms=_est(0, 2.0 * dt.itemsize * parts * n * c * hw * hw)))
    _copy_more(out)


def _copy_more(out: list[Benchmark]) -> None:
    """Copy had 8 held-out shapes. More casts, and layout changes over many channel counts at
    similar bytes (the NCHW<->NHWC transposes around cuDNN's convolutions depend on the channel count)."""
    for src, dst, numels in [("fp16", "fp32", _NUMELS[1::2]), ("fp32", "bf16", [10 ** 6 + 3, 5 * 10 ** 6 + 3]),
                             ("bf16", "fp16", [2 ** 20, 2 ** 24])]:
        for n in numels:
            _cast(out, src, dst, n)
    for r, c in [(4096, 4096), (768, 3072), (3072, 768), (50257, 768)]:
        _transpose(out, "bf16", r, c)
    for mode, src, perm in [("fp32", "nchw", (0, 2, 3, 1)), ("bf16", "nchw", (0, 2, 3, 1)),
                            ("bf16", "nhwc", (0, 3, 1, 2))]:
        for n, c, hw in [(64, 16, 112), (32, 128, 56), (16, 512, 28), (8, 2048, 14), (64, 3, 224)]:
            def build_perm(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=DTYPES[mode], perm=perm) -> Built:
                return _simple(lambda x: x.permute(*perm).contiguous(), [_nchw(device, n, c, hw)], [dt])(device, seed)
            dst = "nhwc" if src == "nchw" else "nchw"
            name = f"{src}_to_{dst}_{mode}_n{n}_c{c}_hw{hw}"
            out.append(Benchmark(name, "copy",
                                 {"op": "permute_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_perm, est_ms=_est(0, 2.0 * DTYPES[mode].itemsize * n * c * hw * hw)))
    for mode, (b, sq, h, d) in [("bf16", (16, 512, 16, 64)), ("fp32", (16, 512, 16, 64)), ("bf16", (4, 2048, 32, 128)),
                                ("bf16", (128, 77, 8, 64))]:
        _heads_transpose(out, mode, (b, sq, h, d))
    for mode, parts, (n, c, hw) in [("bf16", 3, (32, 96, 56)), ("fp32", 2, (128, 256, 28)), ("bf16", 2, (8, 512, 64))]:
        dt = DTYPES[mode]

        def build_ch(device: torch.device, seed: int, parts=parts, n=n, c=c, hw=hw, dt=dt) -> Built:
            return _simple(lambda *ts: torch.cat(ts, 1), [_nchw(device, n, c, hw)] * parts, [dt] * parts)(device, seed)
        out.append(Benchmark(f"cat_channels_{mode}_{parts}x{n}x{c}x{hw}x{hw}", "copy",
                             {"op": "cat", "dtype": mode, "parts": parts, "batch": n, "channels": c, "hw": hw},
                             build_ch, est_ms=_est(0, 2.0 * dt.itemsize * parts * n * c * hw * hw)))
    _copy_network_layouts(out)


def _permuted_copy(out: list[Benchmark], name: str, mode: str, shape: tuple[int, ...], perm: tuple[int, ...],
                   params: dict[str, Any]) -> None:
    """A contiguous copy of a permuted view of a contiguous tensor of `shape`."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        dims = tuple(_d(x, device, 4) for x in shape)
        return _simple(lambda x: x.permute(*perm).contiguous(), [dims], [dt])(device, seed)
    out.append(Benchmark(name, "copy", {"op": "permute_contiguous", "dtype": mode, "shape": list(shape),
                                        "perm": list(perm), **params},
                         build, est_ms=_est(0, 2.0 * dt.itemsize * math.prod(shape))))


def _copy_network_layouts(out: list[Benchmark]) -> None:
    """The permutations networks copy besides transposes, whose contiguous runs differ: a
    channel shuffle (ShuffleNet: (N, g, C/g, H, W) -> (N, C/g, g, H, W), runs of H * W) and Swin's window
    partition and its reverse ((N, H/w, w, W/w, w, C) <-> (N, H/w, W/w, w, w, C), runs of w * C), and the
    copy a convolution makes of one half of a channel split (ShuffleNet's x.chunk(2, dim=1), runs of C/2 * H * W)."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for n, c, hw in [(256, 116, 28), (256, 232, 14), (256, 464, 7)]:
            def build_half(device: torch.device, seed: int, n=n, c=c, hw=hw, dt=dt) -> Built:
                shape = _nchw(device, n, c, hw)
                return _simple(lambda x: x[:, x.shape[1] // 2:].contiguous(), [shape], [dt])(device, seed)
            out.append(Benchmark(f"channel_half_{mode}_n{n}_c{c}_hw{hw}", "copy",
                                 {"op": "slice_contiguous", "dtype": mode, "batch": n, "channels": c, "hw": hw},
                                 build_half, est_ms=_est(0, dt.itemsize * n * c * hw * hw)))
    for mode in ("fp32", "bf16"):
        for n, c, hw, g in [(256, 116, 28, 2), (256, 232, 14, 2), (256, 464, 7, 2), (64, 240, 28, 4),
                            (128, 480, 14, 8)]:
            _permuted_copy(out, f"channel_shuffle_{mode}_n{n}_c{c}_hw{hw}_g{g}", mode, (n, g, c // g, hw, hw),
                           (0, 2, 1, 3, 4), {"batch": n, "channels": c, "hw": hw, "groups": g})
    for mode, n, hw, c, w in [("bf16", 128, 56, 96, 7), ("bf16", 128, 28, 192, 7), ("fp32", 128, 14, 384, 7),
                              ("fp32", 64, 56, 96, 7), ("bf16", 32, 64, 128, 8)]:
        shape = (n, hw // w, w, hw // w, w, c)
        params = {"batch": n, "hw": hw, "channels": c, "window": w}
        _permuted_copy(out, f"window_partition_{mode}_n{n}_hw{hw}_c{c}_w{w}", mode, shape, (0, 1, 3, 2, 4, 5), params)
        _permuted_copy(out, f"window_reverse_{mode}_n{n}_hw{hw}_c{c}_w{w}", mode,
                       (n, hw // w, hw // w, w, w, c), (0, 1, 3, 2, 4, 5), params)
    # Swin's cyclic shift: torch.roll over the two spatial dimensions of (N, H, W, C) activations, and over one
    for mode, (n, hw, c), dims in [("bf16", (128, 56, 96), (1, 2)), ("fp32", (128, 28, 192), (1, 2)),
                                   ("bf16", (128, 14, 384), (1,)), ("fp32", (64, 56, 96), (2,))]:
        dt = DTYPES[mode]

        def build_roll(device: torch.device, seed: int, n=n, hw=hw, c=c, dims=dims, dt=dt) -> Built:
            shape = (_d(n, device, 2), _d(hw, device, 8), _d(hw, device, 8), _d(c, device, 4))
            shifts = tuple(-3 for _ in dims)
            return _simple(lambda x: torch.roll(x, shifts, dims), [shape], [dt])(device, seed)
        name = f"roll{len(dims)}d_{mode}_n{n}_hw{hw}_c{c}"
        out.append(Benchmark(name, "copy", {"op": "roll", "dtype": mode, "batch": n, "hw": hw, "channels": c,
                                            "dims": list(dims)},
                             build_roll, est_ms=_est(0, 2.0 * len(dims) * dt.itemsize * n * hw * hw * c)))


# (target rows, indices, row width): index_put with accumulate=True, balanced duplicates (indices / rows
# per target row). The sort-based kernel walks each run of equal indices with one warp, so a few rows
# hit by many indices (an MoE's expert biases: 16 rows, 8192 indices) take a serial chain of updates.
INDEX_PUT_ACCUMULATE_SHAPES = [
    (16, 8192, 1024), (16, 8192, 4096), (64, 8192, 1024), (16, 32768, 256), (128, 65536, 512),
    (4096, 16384, 1024), (32768, 32768, 256), (8, 4096, 2880),
]


def _strided_operands(out: list[Benchmark]) -> None:
    """Ops whose operands are strided views (a slice, a chunk) rather than dense tensors. TensorIterator
    then runs its non-vectorised loop, and CUDA's cat reads every element through its strides in a batched
    kernel of one element per lane or, past 4 dims (a stack of 4-d tensors), copies each input on its own.
    Networks make them in gated units (SwiGLU's chunk) and rotary embeddings (rotate_half's halves, EVA's
    class token kept apart from the rotated tokens, interleaved pairs)."""
    for mode in ("fp32", "bf16"):
        dt = DTYPES[mode]
        for rows, cols in [(32768, 2048), (8192, 8192), (131072, 512), (1024, 2048), (4096, 512)]:
            n = rows * cols // 2

            def build_chunk(device: torch.device, seed: int, rows=rows, cols=cols, dt=dt) -> Built:
                return _simple(lambda x: F.silu(x[:, : x.shape[1] // 2]), [(_d(rows, device), _d(cols, device))],
                               [dt])(device, seed)
            out.append(Benchmark(f"ew_chunk_silu_{mode}_r{rows}_c{cols}", "elementwise",
                                 {"op": "silu", "dtype": mode, "rows": rows, "cols": cols, "operands": "chunk"},
                                 build_chunk, est_ms=_est(n, 2 * n * dt.itemsize, mode)))
    halves = {"bf16": [(16, 32, 512, 128), (64, 12, 197, 64), (4, 16, 2048, 64), (128, 3, 256, 64),
                       (8, 32, 1024, 128), (256, 6, 196, 32), (1, 8, 128, 64), (4, 32, 128, 128), (1, 32, 512, 128)],
              "fp32": [(16, 32, 512, 128), (64, 12, 197, 64), (128, 3, 256, 64), (1, 32, 512, 128)]}
    for mode, shapes in halves.items():
        dt = DTYPES[mode]
        for b, h, sq, d in shapes:
            def build_halves(device: torch.device, seed: int, shape=(b, h, sq, d), dt=dt) -> Built:
                dims = tuple(_d(v, device, 4) for v in shape)
                return _simple(lambda x: torch.cat((x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), -1),
                               [dims], [dt])(device, seed)
            out.append(Benchmark(f"cat_strided_halves_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                                 {"op": "cat", "dtype": mode, "shape": [b, h, sq, d], "operands": "halves"},
                                 build_halves, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
    tokens = {"bf16": [(128, 3, 256, 64), (64, 6, 196, 64), (32, 12, 576, 64), (16, 16, 1024, 64), (8, 3, 64, 64)],
              "fp32": [(64, 6, 196, 64)]}
    for mode, shapes in tokens.items():
        dt = DTYPES[mode]
        for b, h, sq, d in shapes:
            def build_token(device: torch.device, seed: int, b=b, h=h, sq=sq, d=d, dt=dt) -> Built:
                q = tuple(_d(v, device, 4) for v in (b, h, sq + 1, d))
                return _simple(lambda q, y: torch.cat((q[:, :, :1], y), 2), [q, q[:2] + (q[2] - 1, q[3])],
                               [dt, dt])(device, seed)
            out.append(Benchmark(f"cat_strided_token_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                                 {"op": "cat", "dtype": mode, "shape": [b, h, sq, d], "operands": "token"},
                                 build_token, est_ms=_est(0, 2.0 * dt.itemsize * b * h * (sq + 1) * d)))
    for mode, (b, h, sq, d) in [("bf16", (128, 3, 256, 64)), ("bf16", (16, 32, 512, 128)),
                                ("fp32", (64, 12, 197, 64)), ("bf16", (1, 8, 128, 64))]:
        dt = DTYPES[mode]

        def build_pairs(device: torch.device, seed: int, shape=(b, h, sq, d), dt=dt) -> Built:
            dims = tuple(_d(v, device, 4) for v in shape)
            return _simple(lambda x: torch.stack((x[..., 1::2], x[..., ::2]), -1), [dims], [dt])(device, seed)
        out.append(Benchmark(f"stack_pairs_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "stack", "dtype": mode, "shape": [b, h, sq, d], "operands": "pairs"},
                             build_pairs, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))
    # a dense tensor stacked with a strided one (EVA's rotation: the negated odd half beside the even one)
    for mode, (b, h, sq, d) in [("bf16", (128, 3, 256, 64)), ("bf16", (32, 12, 197, 64)), ("bf16", (8, 32, 512, 128)),
                                ("bf16", (1, 8, 128, 64)), ("fp32", (32, 12, 197, 64))]:
        dt = DTYPES[mode]

        def build_mixed(device: torch.device, seed: int, b=b, h=h, sq=sq, d=d, dt=dt) -> Built:
            x = tuple(_d(v, device, 4) for v in (b, h, sq, d))
            return _simple(lambda x, y: torch.stack((y, x[..., ::2]), -1), [x, x[:3] + (x[3] // 2,)],
                           [dt, dt])(device, seed)
        out.append(Benchmark(f"stack_dense_strided_{mode}_b{b}_h{h}_s{sq}_d{d}", "copy",
                             {"op": "stack", "dtype": mode, "shape": [b, h, sq, d], "operands": "dense+strided"},
                             build_mixed, est_ms=_est(0, 2.0 * dt.itemsize * b * h * sq * d)))


def _index_put_accumulate(out: list[Benchmark], mode: str, targets: int, n_idx: int, width: int) -> None:
    """torch.index_put(zeros(targets, width), (idx,), values, accumulate=True), idx a shuffled balanced
    draw: every target row receives n_idx / targets of the values."""
    dt = DTYPES[mode]

    def build(device: torch.device, seed: int) -> Built:
        t, n, w = _d(targets, device, 4), _d(n_idx, device), _d(width, device)

        def make_set(i: int) -> tuple:
            order = torch.randperm(n, device=device, generator=_gen(device, seed, i))
            return (torch.zeros((t, w), dtype=dt, device=device), order % t,
                    _randn((n, w), dt, device, seed, 100 + i))

        def fn(base: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.index_put(base, [idx], values, True)
        return Built(fn, make_set)
    nbytes = dt.itemsize * (2.0 * targets * width + n_idx * width) + 16.0 * n_idx
    out.append(Benchmark(f"index_put_acc_{mode}_t{targets}_n{n_idx}_w{width}", "copy",
                         {"op": "index_put", "accumulate": True, "dtype": mode, "targets": targets,
                          "indices": n_idx, "width": width},
                         build, est_ms=_est(0, nbytes) + 4e-3 * n_idx / targets))


def _index_put(out: list[Benchmark]) -> None:
    for mode in ("fp32", "bf16"):
        for targets, n_idx, width in INDEX_PUT_ACCUMULATE_SHAPES:
            _index_put_accumulate(out, mode, targets, n_idx, width)


# ---------------------------------------------------------------- optimizers

class _Params(torch.nn.Module):
    """Parameters of given shapes on the meta device: only their shapes matter to the trace."""

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(s, device="meta")) for s in shapes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(p.sum() for p in self.ps) * x


OPTIMIZER_FACTORIES = {
    # Must match gpuest.capture.trace.OPTIMIZERS so the traced step is the timed step.
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True),
}


def _optimizer(out: list[Benchmark]) -> None:
    for opt_name, states in (("adamw", 4), ("sgd", 3)):
        for count, size in [(10, 2 ** 20), (100, 100_000), (200, 2 ** 20), (1000, 10_000), (50, 4 * 2 ** 20),
                            (150, 65_537), (4, 25_000_000),
                            # many small tensors, a few large ones, sizes off the powers of two
                            (500, 4096), (60, 3 * 2 ** 20), (300, 300_000), (20, 16 * 2 ** 20)]:
            if opt_name == "sgd" and count in (1000, 150):
                continue
            nb = count * size * 4.0 * (2 * states - 1)

            def build(device: torch.device, seed: int, opt_name=opt_name, count=count, size=size) -> Built:
                c, s = (_d(count, device, 12), _d(size, device, 64))

                def make_set(i: int) -> tuple:
                    params = [torch.zeros(s, device=device, requires_grad=True) for _ in range(c)]
                    g = _gen(device, seed, i)
                    for p in params:
                        p.grad = torch.randn(s, device=device, generator=g)
                    opt = OPTIMIZER_FACTORIES[opt_name](params)
                    opt.step()  # creates the state: the timed steps are steady-state ones
                    return (opt,)
                spec = TraceSpec(_Params([(s,)] * c), (torch.ones((), device="meta"),), mode="training",
                                 optimizer=opt_name, phases=("optimizer",))
                return Built(lambda opt: opt.step(), make_set, spec,
                             bytes_per_set=int(c * s * 4 * states))
            out.append(Benchmark(f"optim_{opt_name}_foreach_{count}x{size}", "optimizer",
                                 {"op": opt_name, "foreach": True, "dtype": "fp32", "tensors": count, "numel": size},
                                 build, est_ms=_est(0, nb) + 0.01 * count * 8 / 30,
                                 trace_cost_s=0.05 + count * 0.006, host_paced=True))


# ---------------------------------------------------------------- latency and host-dispatch probes

def _probes(out: list[Benchmark]) -> None:
    tiny = {
        "add": (torch.add, [(1,), (1,)], "elementwise"),
        "relu": (torch.relu, [(1,)], "elementwise"),
        "mm": (torch.mm, [(1, 1), (1, 1)], "matmul"),
        "sum": (torch.sum, [(1,)], "reduction"),
    }
    for opname, (fn, shapes, cat) in tiny.items():
        out.append(Benchmark(f"latency_{opname}_1elem", cat, {"op": opname, "dtype": "fp32", "numel": 1},
                             _simple(fn, shapes, [torch.float32] * len(shapes)), kind="latency", est_ms=0.005))
    probes = {
        "add": (torch.add, [(1,), (1,)], "elementwise"),
        "linear": (F.linear, [(1, 512), (512, 512), (512,)], "matmul"),
        "conv2d": (lambda x, w: F.conv2d(x, w, None, 1, 1), [(1, 16, 8, 8), (16, 16, 3, 3)], "conv"),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (512,), w, b), [(1, 512), (512,), (512,)], "norm"),
        "foreach_add_100": (lambda *ts: torch._foreach_add(list(ts), 1.0), [(16,)] * 100, "optimizer"),
    }
    for opname, (fn, shapes, cat) in probes.items():
        out.append(Benchmark(f"host_dispatch_{opname}", cat, {"op": opname, "dtype": "fp32", "shapes": shapes},
                             _simple(fn, shapes, [torch.float32] * len(shapes)), kind="host_dispatch", est_ms=0.01))


def _nhwc_spatial(out: list[Benchmark]) -> None:
    """Pooling, upsampling and per-channel elementwise ops on channels-last (NHWC) activations, the
    layout channels-last recipes hand them: their kernels index channels fastest, unlike NCHW's."""
    shapes = [(64, 64, 112), (128, 256, 28), (32, 512, 14)]
    spatial = {"maxpool": (lambda x: F.max_pool2d(x, 3, 2, 1), "max_pool2d_3x3s2"),
               "avgpool2x2": (lambda x: F.avg_pool2d(x, 2), "avg_pool2d_2x2"),
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


class _Float16ForBfloat16(torch.overrides.TorchFunctionMode):
    """Every torch call made under it gets float16 wherever it asked for bfloat16 (factories, `.to`)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        swap = lambda v: torch.float16 if v is torch.bfloat16 else v  # noqa: E731
        return func(*map(swap, args), **{k: swap(v) for k, v in (kwargs or {}).items()})


class _InFloat16(torch.nn.Module):
    """Runs a traced module with bfloat16 requests turned into float16, as its fp16 twin was built."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        with _Float16ForBfloat16():
            return self.inner(*args)


def _in_float16(spec: TraceSpec | None) -> TraceSpec | None:
    if spec is None:
        return None
    return TraceSpec(_InFloat16(spec.module), spec.inputs, spec.mode, spec.optimizer, spec.loss_fn, spec.phases,
                     _in_float16(spec.skip))


def _fp16_twin(b: Benchmark) -> Benchmark:
    """`b` (a bf16 benchmark) with float16 wherever it makes bfloat16: fp16 autocast and fp16 weights run
    their own kernels (other tile shapes, no bf16 rounding), and the suite measures both 16-bit types."""
    def build(device: torch.device, seed: int) -> Built:
        with _Float16ForBfloat16():
            built = b.build(device, seed)

        def make_set(i: int) -> tuple:
            with _Float16ForBfloat16():
                return built.make_set(i)
        return Built(built.fn, make_set, _in_float16(built.trace), built.bytes_per_set, built.max_sets)
    params = {k: v.replace("bf16", "fp16") if isinstance(v, str) else v for k, v in b.params.items()}
    return Benchmark(b.name.replace("bf16", "fp16"), b.category, params, build, kind=b.kind, est_ms=b.est_ms,
                     matmul_tf32=b.matmul_tf32, cudnn_tf32=b.cudnn_tf32, trace_cost_s=b.trace_cost_s,
                     host_paced=b.host_paced)


FP16_TWIN_CATEGORIES = ("conv", "norm", "elementwise", "reduction", "pool", "embedding")
FP16_TWIN_SHARE = 5             # one bf16 benchmark in this many (by name hash) gets an fp16 twin


def _fp16_twins(grid: list[Benchmark]) -> list[Benchmark]:
    """fp16 twins of an even, name-hashed share of the bf16 benchmarks of the categories whose bf16 rows
    have no fp16 counterpart (matmul and attention measure fp16 shapes of their own)."""
    return [_fp16_twin(b) for b in grid
            if b.category in FP16_TWIN_CATEGORIES and b.kind == "device" and "bf16" in b.name
            and "fp32" not in b.name and _stable_hash("fp16:" + b.name) % FP16_TWIN_SHARE == 0]


# ---------------------------------------------------------------- the grid

def _stable_hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:12], 16)


def all_benchmarks(categories: Iterable[str] | None = None) -> list[Benchmark]:
    """The full grid, with holdout flags and priorities assigned deterministically.

    Holdout: per category, the ~20 % of shapes with the smallest name hash (probes excluded).
    Priority: per category, a fixed pseudo-random order (by name hash), so any budget-trimmed prefix
    samples every op, dtype and size range of the category evenly; probes come first.
    """
    grid: list[Benchmark] = []
    for family in (_matmul, _conv, _attention, _rnn, _elementwise, _activations_in_place, _reduction, _norm, _pool,
                   _embedding, _copy, _optimizer, _probes, _nhwc_spatial, _index_put, _strided_operands):
        family(grid)
    grid += _fp16_twins(grid)
    by_cat: dict[str, list[Benchmark]] = {}
    for b in grid:
        by_cat.setdefault(b.category, []).append(b)
    for cat, items in by_cat.items():
        for rank, b in enumerate(sorted(items, key=lambda b: _stable_hash("priority:" + b.name))):
            b.priority = rank
        device_items = [b for b in items if b.kind == "device"]
        n_hold = round(HOLDOUT_FRACTION * len(device_items))
        for b in sorted(device_items, key=lambda b: _stable_hash(b.name))[:n_hold]:
            b.holdout = True
        for b in items:  # probes first: they are cheap and every fit needs the latency floor
            if b.kind != "device":
                b.priority = -1
    names = [b.name for b in grid]
    if len(names) != len(set(names)):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise AssertionError(f"duplicate benchmark names: {dupes}")
    if categories is not None:
        wanted = set(categories)
        grid = [b for b in grid if b.category in wanted]
    return grid


BUSY_CALLS = 5                  # calls profiled for a host-paced op's device-busy time
