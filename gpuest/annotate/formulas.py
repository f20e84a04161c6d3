"""Cost formulas for ATen ops, registered into `registry.REGISTRY`.

FLOP counts for matmul, convolution and attention are torch's own
(`torch.utils.flop_counter.flop_registry`), so they agree with `FlopCounterMode`; this
module adds the traffic, the implicit GEMM shape and the categories torch does not give,
and formulas for everything torch does not count (elementwise, reductions, norms, pooling,
embeddings, copies, foreach optimizer ops, RNN layers). A multiply-add counts 2 FLOPs.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import conv_flop_count, flop_registry

from .registry import (
    REGISTRY, Cost, OpCall, by_category, expanded_run, generic_cost, is_channels_last, iter_ops, mark_free,
    reduced_rows, register_cost, schema_arg, tensors, unique_bytes,
)

aten = torch.ops.aten


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def torch_flops(call: OpCall, packet: Any = None) -> float:
    """FLOPs by torch's own formula for `packet` (defaults to the call's op)."""
    fn = flop_registry[packet or call.func.overloadpacket]
    return float(fn(*call.args, **call.kwargs, out_val=call.out))


# ---------------------------------------------------------------- matmul

def _with_gemm(call: OpCall, category: str, flops: float, mnk: tuple[int, int, int], batch: int = 1,
               kernels: int = 1) -> Cost:
    return replace(generic_cost(call, category=category, flops=flops, kernels=kernels),
                   gemm_mnk=tuple(int(v) for v in mnk), gemm_batch=int(batch))


@register_cost(aten.mm)
def _mm(call: OpCall) -> Cost:
    (m, k), (_, n) = _shape(call.arg("self")), _shape(call.arg("mat2"))
    return _with_gemm(call, "matmul", torch_flops(call), (m, n, k))


@register_cost(aten.addmm)
def _addmm(call: OpCall) -> Cost:
    (m, k), (_, n) = _shape(call.arg("mat1")), _shape(call.arg("mat2"))
    return _with_gemm(call, "matmul", torch_flops(call), (m, n, k))


@register_cost(aten.bmm)
def _bmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = _shape(call.arg("self")), _shape(call.arg("mat2"))
    return _with_gemm(call, "matmul", torch_flops(call), (m, n, k), b)


@register_cost(aten.baddbmm)
def _baddbmm(call: OpCall) -> Cost:
    (b, m, k), (_, _, n) = _shape(call.arg("batch1")), _shape(call.arg("batch2"))
    return _with_gemm(call, "matmul", torch_flops(call), (m, n, k), b)


@register_cost(*iter_ops(["_scaled_mm"]))
def _scaled_mm(call: OpCall) -> Cost:
    (m, k), (_, n) = _shape(call.arg("self")), _shape(call.arg("mat2"))
    return _with_gemm(call, "matmul", torch_flops(call), (m, n, k))


# ---------------------------------------------------------------- convolution

def _conv_gemm(x: tuple, w: tuple, y: tuple, groups: int, transposed: bool) -> tuple[tuple, int]:
    """Implicit-GEMM shape of a forward convolution producing `y` from `x`: M = N * output spatial,
    N = output channels per group, K = input channels per group * kernel area. A transposed convolution's
    weight is (Cin, Cout/groups, kernel...), a normal one's (Cout, Cin/groups, kernel...)."""
    n = x[0] if x else 1
    kernel = math.prod(w[2:]) if len(w) > 2 else 1
    g = max(groups, 1)
    out_g, in_g = (w[1], w[0] // g) if transposed else (w[0] // g, w[1])
    spatial_out = math.prod(y[2:]) if len(y) > 2 else 1
    return (n * spatial_out, out_g, in_g * kernel), groups


@register_cost(aten.convolution, aten._convolution, *iter_ops(["cudnn_convolution", "convolution_overrideable"]))
def _convolution(call: OpCall) -> Cost:
    # cudnn_convolution has no `transposed` (cudnn_convolution_transpose is an op of its own).
    x, w = call.first_arg, call.arg("weight")
    transposed = bool(call.arg("transposed")) if call.has_arg("transposed") else False
    groups = int(call.arg("groups"))
    y = _shape(tensors(call.out)[0])
    mnk, g = _conv_gemm(_shape(x), _shape(w), y, groups, transposed)
    return replace(_with_gemm(call, "conv", torch_flops(call), mnk, g), window=math.prod(_shape(w)[2:]),
                   channels_last=is_channels_last(x), gemm_plane=_gemm_plane(_shape(x), _shape(w), y, groups),
                   variant=_conv_variant(_shape(w), transposed))


def _conv_variant(w: tuple, transposed: bool) -> str:
    """Cost.variant of a convolution with weight `w`: "transposed" (cuDNN runs it with data-gradient
    kernels), "1d"/"3d" by its spatial dimensions, "" for a plain 2-D one."""
    if transposed:
        return "transposed"
    dims = len(w) - 2
    return "" if dims == 2 else f"{dims}d"


def _gemm_plane(x: tuple, w: tuple, y: tuple, groups: int) -> int:
    """Cost.gemm_plane of a convolution from `x` to `y` with weight `w`: H * W when it is a 1x1, ungrouped
    one that keeps the input's spatial size (a GEMM over the activation as stored), else 0."""
    plain = groups <= 1 and len(x) > 2 and math.prod(w[2:]) == 1 and tuple(x[2:]) == tuple(y[2:])
    return math.prod(x[2:]) if plain else 0


@register_cost(aten.convolution_backward)
def _convolution_backward(call: OpCall) -> Cost:
    grad_out, x, w = call.arg("grad_output"), call.arg("input"), call.arg("weight")
    transposed, groups = bool(call.arg("transposed")), int(call.arg("groups"))
    mask = call.arg("output_mask")
    mnk, g = _conv_gemm(_shape(x), _shape(w), _shape(grad_out), groups, transposed)
    window = math.prod(_shape(w)[2:])
    # Data gradient: M = N*spatial_in, N = Cin/g, K = Cout/g*kernel. Use it as the representative GEMM.
    m_in = (_shape(x)[0] * math.prod(_shape(x)[2:])) if len(_shape(x)) > 2 else mnk[0]
    dgrad = (m_in, mnk[2] // max(window, 1), mnk[1] * window)
    kernels = max(1, sum(bool(v) for v in mask))
    flops = torch_flops(call)
    if groups > 1 and mask[1]:
        flops -= _weight_grad_overcount(grad_out, x, w, groups, transposed)
    cost = replace(_with_gemm(call, "conv", flops, dgrad if mask[0] else mnk, g, kernels),
                   window=window, channels_last=is_channels_last(x),
                   gemm_plane=_gemm_plane(_shape(x), _shape(w), _shape(grad_out), groups),
                   variant=_conv_variant(_shape(w), transposed))
    if mask[1] and not transposed and _runs_native_depthwise(_shape(w), groups, is_channels_last(x)):
        # PyTorch's own depthwise weight gradient gives each weight a block that reduces over the batch
        # and the output positions: a row-wise reduction (Cost.row_count / row_len), not a GEMM.
        cost = replace(cost, row_count=math.prod(_shape(w)), row_len=_shape(grad_out)[0] * math.prod(_shape(grad_out)[2:]))
    return cost


def _runs_native_depthwise(w: tuple, groups: int, channels_last: bool) -> bool:
    """Whether PyTorch runs a convolution with weight `w` in its own depthwise kernels rather than cuDNN:
    2-D, one input channel per group, NCHW data (cuDNN takes channels-last depthwise convolutions)."""
    return groups > 1 and len(w) == 4 and w[1] == 1 and not channels_last


def _weight_grad_overcount(grad_out: Any, x: Any, w: Any, groups: int, transposed: bool) -> float:
    """What torch's count of a grouped convolution's weight gradient holds too much: torch prices that
    gradient as a convolution over all input channels, not the Cin/groups each group sees, so a depthwise
    convolution's weight gradient would count `groups` times the work it does."""
    t = lambda shape: [shape[1], shape[0], *shape[2:]]  # noqa: E731 (channels <-> batch, as torch does)
    first, second = (grad_out, x) if transposed else (x, grad_out)
    weight_grad = conv_flop_count(t(_shape(first)), t(_shape(second)), t(_shape(w)), transposed=False)
    return weight_grad * (1.0 - 1.0 / groups)


# ---------------------------------------------------------------- attention

ATTENTION_FORWARD = [
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
]
ATTENTION_BACKWARD = [name + "_backward" for name in ATTENTION_FORWARD[:3]] + [
    "_flash_attention_backward", "_efficient_attention_backward"]
# CPU-only kernels carry the formula of the CUDA kernel they stand in for (see capture.normalize).
CPU_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu": aten._scaled_dot_product_flash_attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": aten._scaled_dot_product_flash_attention_backward,
}


ATTENTION_TILE = 128  # query/key block edge of the flash and memory-efficient kernels


def causal_mask_kind(call: OpCall) -> int:
    """0: no causal mask; 1: causal, aligned top-left (torch's is_causal); 2: aligned bottom-right
    (the memory-efficient kernel's custom_mask_type 2)."""
    # The memory-efficient kernels take a custom_mask_type where the others take is_causal.
    if call.has_arg("is_causal") and call.arg("is_causal", default=False) is True:
        return 1
    kind = call.arg("custom_mask_type", default=0) if call.has_arg("custom_mask_type") else 0
    return int(kind) if isinstance(kind, int) and kind in (1, 2) else 0


def causal_kept_fraction(s_q: int, s_k: int, kind: int) -> float:
    """Share of the s_q x s_k score matrix a causal mask keeps (query i sees keys up to i, plus
    s_k - s_q when the mask is aligned bottom-right)."""
    if kind == 0 or s_q <= 0 or s_k <= 0:
        return 1.0
    shift = s_k - s_q if kind == 2 else 0
    # sum over queries i of clip(i + 1 + shift, 0, s_k), in closed form over the three ranges of i
    lo = min(max(-shift, 0), s_q)                      # rows that see no key
    hi = min(max(s_k - shift, lo), s_q)                # rows before the mask saturates at s_k
    ramp = (hi - lo) * (lo + 1 + shift + hi + shift) / 2.0
    full = (s_q - hi) * s_k
    return (ramp + full) / float(s_q * s_k)


def _attention(call: OpCall, packet: Any, backward: bool) -> Cost:
    q, k = call.arg("query"), call.arg("key")
    *lead, s_q, d = _shape(q)
    s_k = _shape(k)[-2]
    flops = torch_flops(call, packet)
    # Flash-style kernels keep the S x S scores on chip: traffic is the operands, not S^2. Under a causal
    # mask they skip the tiles wholly above the diagonal and compute the diagonal ones in full; torch's
    # count (kept as the FLOPs) includes them all.
    kept = causal_kept_fraction(-(-s_q // ATTENTION_TILE), -(-s_k // ATTENTION_TILE), causal_mask_kind(call))
    return replace(_with_gemm(call, "attention", flops, (s_q, s_k, d), math.prod(lead), kernels=3 if backward else 1),
                   flops_skipped=flops * (1.0 - kept))


for _name in ATTENTION_FORWARD + ATTENTION_BACKWARD:
    for _op in iter_ops([_name]):
        register_cost(_op)(lambda call, _p=_op, _b=_name.endswith("backward"): _attention(call, _p, _b))
for _name, _cuda in CPU_ATTENTION.items():
    for _op in iter_ops([_name]):
        register_cost(_op)(lambda call, _p=_cuda, _b=_name.endswith("backward"): _attention(call, _p, _b))


# Inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer (eval, no grad): one ATen op
# that runs the projections, attention and (for the layer) the feed-forward block. FLOPs are those of its
# GEMMs and attention, as FlopCounterMode counts them on the decomposed (slow) path; the traffic adds the
# intermediates (qkv, attention output, FFN hidden) each written and read once.

def _mha_parts(q: Any, k: Any, embed_dim: int) -> tuple[int, int, int, int]:
    """(batch, query length, key length, embed dim) of a batch-first (or unbatched) MHA input."""
    qs, ks = _shape(q), _shape(k)
    lead = math.prod(qs[:-2]) if len(qs) > 2 else 1
    s_q = qs[-2] if len(qs) >= 2 else 1
    s_k = ks[-2] if len(ks) >= 2 else 1
    return lead, s_q, s_k, int(embed_dim)


@register_cost(*iter_ops(["_native_multi_head_attention"]))
def _native_mha(call: OpCall) -> Cost:
    q, k = call.arg("query"), call.arg("key")
    b, s_q, s_k, e = _mha_parts(q, k, call.arg("embed_dim"))
    proj = 2.0 * b * e * e * (s_q + 2 * s_k) + 2.0 * b * s_q * e * e  # q, k, v and output projections
    attn = 4.0 * b * s_q * s_k * e  # QK^T and PV over all heads
    base = generic_cost(call, category="attention")
    extra = (b * (s_q + 2 * s_k) * e + b * s_q * e) * 2.0 * q.element_size()
    return Cost(proj + attn, base.bytes_read + extra / 2, base.bytes_written + extra / 2, "attention",
                gemm_mnk=(b * s_q, 3 * e, e), gemm_batch=1, kernels=4)


@register_cost(*iter_ops(["_transformer_encoder_layer_fwd"]))
def _transformer_layer_fast(call: OpCall) -> Cost:
    src = call.arg("src")
    b, s, _, e = _mha_parts(src, src, call.arg("embed_dim"))
    ffn = _shape(call.arg("ffn_weight_1"))[0]
    flops = 2.0 * b * s * e * 3 * e + 4.0 * b * s * s * e + 2.0 * b * s * e * e + 4.0 * b * s * e * ffn
    base = generic_cost(call, category="attention")
    extra = (b * s * (3 * e + e + e + ffn + e)) * 2.0 * src.element_size()
    return Cost(flops, base.bytes_read + extra / 2, base.bytes_written + extra / 2, "attention",
                gemm_mnk=(b * s, ffn, e), gemm_batch=1, kernels=10)


# ---------------------------------------------------------------- recurrent layers

# Listed in the order of the mkldnn/cuDNN mode numbers (0 RNN_RELU ... 3 GRU).
RNN_MODE_GATES = {"RNN_RELU": 1, "RNN_TANH": 1, "LSTM": 4, "GRU": 3}   # nn.RNNBase.mode
RNN_GATES = dict(enumerate(RNN_MODE_GATES.values()))                     # by mkldnn/cudnn mode number


# cuDNN (9.x, fp32, Hopper) runs the recurrence of a layer this narrow as one persistent kernel per
# layer and direction (RNN_blockPersist_fp_* / _bp_*), whose blocks meet at a grid-wide barrier each
# step, instead of a GEMM and a cell kernel per step: hidden 32 to 192 ran persistent, 256 and wider
# did not (data/kernels/H100-SXM-benchmarks.jsonl; 224 is not measured). In 16 bits it never does: a bf16
# LSTM of hidden 128 ran a GEMM and a cell kernel per step like a wide one (the session-15 kernel
# profiles there). A step's time grows with the
# recurrent weights it multiplies (gates x hidden^2), slowly up to the 49152 a step keeps in registers
# (192 KB of fp32; gpuest.price.device_time.PERSISTENT_REGISTER_STEPS) and steeply beyond: 0.33 us at
# 4096, 1.2 us at 49152 (GRU, hidden 128), 1.9-2.3 us at 65536 (LSTM, 128), 7.7 us at 147456 (LSTM, 192)
# on the H100 (python3 benchmarks/kernel_facts.py), so a step counts gates x hidden^2 /
# PERSISTENT_STEP_WEIGHTS serial steps (Cost.serial_steps) beside its barrier.
PERSISTENT_RNN_MAX_HIDDEN = 192
PERSISTENT_STEP_WEIGHTS = 65536
# A per-step recurrent GEMM has a batch of rows and a few dozen CTAs: its time is its main loop's chain
# of dependent loads, not its FLOPs or bytes (on the H100 a 20 x 2600 x 650 TF32 step GEMM took 10.8 us and
# a 128 x 2048 x 512 one 5.6 us; in bf16 the first took 6.1 us and the backward's 20 x 650 x 2600 one, four
# times as deep with as many weights, 7.6 us: benchmarks/kernel_facts.py). Each RNN_STEP_K_DEPTH of the
# hidden size counts as a serial
# step (Cost.serial_steps), forward and backward (5-fold cross-validation,
# benchmarks/cross_validate.py, rnn median H100/H200: 9.6/8.4 % at 128, 9.7/9.4 % at 64, 9.3/8.9 % at 256;
# gates x hidden for the backward's deeper data-gradient GEMM gave 10.1/9.0 %).
RNN_STEP_K_DEPTH = 128
# Launch latencies a per-step layer exposes per step: its GEMM and its cell kernel, which cuDNN's host
# loop enqueues right behind the GEMM (a bf16 LSTM of hidden 32 took 4.2 us a step on the H100,
# benchmarks/kernel_facts.py, under the profiles' two kernel latencies of 2.4 us). 5-fold cross-validation chose 1.5 over 1 and 2
# (rnn median
# H100/H200 9.6/8.4 % against 11.9/10.6 % at 1 and 12.6/12.8 % at 2).
RNN_STEP_LAUNCHES = 1.5


def cudnn_rnn_persistent(hidden: int, element_bytes: int) -> bool:
    """Whether cuDNN runs a recurrent layer of `hidden` units computing in `element_bytes`-byte floats as
    one persistent kernel (fp32 and at most PERSISTENT_RNN_MAX_HIDDEN wide) rather than per-step kernels."""
    return hidden <= PERSISTENT_RNN_MAX_HIDDEN and element_bytes >= 4


def cudnn_rnn_kernels(steps: int, backward: bool = False, persistent: bool = False) -> int:
    """Kernel launches priced for one layer and direction of a cuDNN recurrent layer over `steps` time
    steps: RNN_STEP_LAUNCHES per step (a recurrent GEMM and a pointwise cell kernel), plus the input
    projection GEMM (in backward also the weight-gradient GEMM) over all steps; for a persistent layer
    (cudnn_rnn_persistent) the input GEMM, the persistent kernel and a bias kernel (in backward the
    persistent kernel, two pointwise kernels and three GEMMs), whatever the steps (data/kernels/)."""
    if persistent:
        return 6 if backward else 3
    return round(RNN_STEP_LAUNCHES * steps) + (2 if backward else 1)


def cudnn_rnn_grid_syncs(steps: int, persistent: bool) -> int:
    """Grid-wide barriers of one layer and direction of a cuDNN recurrent layer: one per step when it
    runs persistent, none otherwise."""
    return steps if persistent else 0


def cudnn_rnn_serial_steps(steps: int, hidden: int, gates: int, persistent: bool) -> float:
    """Serial work of one layer and direction of a cuDNN recurrent layer (Cost.serial_steps), forward or
    backward. A persistent layer multiplies the recurrent weights (gates x hidden x hidden) by the last
    state each step before the next can start, PERSISTENT_STEP_WEIGHTS weights counted as one serial
    step. Another layer's step is a GEMM of its own over a batch too small to hide its main loop: each
    RNN_STEP_K_DEPTH of the hidden size counts as one serial step."""
    if persistent:
        return float(steps * gates * hidden * hidden / PERSISTENT_STEP_WEIGHTS)
    return float(steps * math.ceil(hidden / RNN_STEP_K_DEPTH))


class RNNWork(NamedTuple):
    """What one cuDNN recurrent call computes, moves and launches over all its layers and directions."""

    flops: float
    recurrent_rereads: float          # bytes of recurrent weights its per-step kernels read again
    bytes_read: float                 # its inputs, weights and states once, plus recurrent_rereads
    bytes_written: float              # its outputs and final states (backward: the input and weight gradients)
    gemm_mnk: tuple[int, int, int]    # one step's GEMM of the first layer: the unit that fills the GPU
    kernels: int                      # launches priced (cudnn_rnn_kernels)
    grid_syncs: int
    serial_steps: float


def cudnn_rnn_work(gates: int, steps: int, batch: int, in_size: int, hidden: int, layers: int = 1,
                   directions: int = 1, backward: bool = False, element_bytes: int = 4) -> RNNWork:
    """FLOPs, weight traffic and launches of a cuDNN recurrent call (nn.LSTM/GRU/RNN) computing in
    `element_bytes`-byte floats, whatever path the CPU trace takes (mkldnn's fused LSTM layer, or per-step
    GEMMs and cell ops for a GRU): per layer and direction, each step multiplies [x_t, h_(t-1)] by the
    gates x hidden weights and applies the cell pointwise; its backward computes the data and the weight
    gradients of the same GEMMs. A persistent layer (cudnn_rnn_persistent) keeps its recurrent weights on
    chip; a per-step one reads them every step."""
    persistent = cudnn_rnn_persistent(hidden, element_bytes)
    chains = layers * directions
    flops = rereads = weights = 0.0
    for layer in range(layers):
        width = in_size if layer == 0 else hidden * directions
        gemm = 2.0 * steps * batch * gates * hidden * (width + hidden)
        flops += directions * ((2.0 if backward else 1.0) * gemm + 8.0 * steps * batch * gates * hidden)
        weights += directions * gates * hidden * (width + hidden + 2) * element_bytes   # with both biases
        if not persistent:
            rereads += directions * max(steps - 1, 0) * gates * hidden * hidden * element_bytes
    # Bytes follow the call's tensors, never the ops the CPU trace decomposes it into: those depend on
    # the host's ISA (mkldnn takes bf16 layers only on CPUs with AVX512-BF16) and would make the trace,
    # and every profile fitted on it, differ between machines.
    x = steps * batch * in_size * element_bytes
    y = steps * batch * hidden * directions * element_bytes
    states = chains * batch * hidden * element_bytes * (2 if gates == 4 else 1)   # h (and an LSTM's c)
    if backward:   # reads dy, x, y, weights and the states; writes dx, the weight and the state gradients
        moved = (y + x + y + weights + states + rereads, float(x + weights + states))
    else:
        moved = (x + weights + rereads, float(y + states))
    return RNNWork(flops, rereads, *moved, (batch, gates * hidden, in_size + hidden),
                   chains * cudnn_rnn_kernels(steps, backward, persistent),
                   chains * cudnn_rnn_grid_syncs(steps, persistent),
                   chains * cudnn_rnn_serial_steps(steps, hidden, gates, persistent))


@register_cost(*iter_ops(["mkldnn_rnn_layer"]))
def _rnn_layer(call: OpCall) -> Cost:
    x, w_ih = call.arg("input"), call.arg("weight0")
    hidden = int(call.arg("hidden_size"))
    # ATen hands the layer a time-major input whatever the module's batch_first flag says.
    steps, batch = _shape(x)[:2]
    gates = RNN_GATES.get(int(call.arg("mode")), 4)
    work = cudnn_rnn_work(gates, steps, batch, _shape(w_ih)[1], hidden, element_bytes=w_ih.element_size())
    # The time steps run one after another, each a recurrent GEMM and a pointwise gate kernel (cuDNN,
    # data/kernels/): one step's GEMM is all the GPU has to fill its SMs with, hence gemm batch 1.
    cost = _with_gemm(call, "rnn", work.flops, work.gemm_mnk, 1, kernels=work.kernels)
    return replace(cost, bytes_read=cost.bytes_read + work.recurrent_rereads, grid_syncs=work.grid_syncs,
                   serial_steps=work.serial_steps)


@register_cost(*iter_ops(["mkldnn_rnn_layer_backward"]))
def _rnn_layer_backward(call: OpCall) -> Cost:
    x, w_ih = call.arg("input"), call.arg("weight1")
    hidden = _shape(call.arg("hx_"))[-1]
    steps, batch = _shape(x)[:2]
    gates = max(1, _shape(w_ih)[0] // max(hidden, 1))
    work = cudnn_rnn_work(gates, steps, batch, _shape(w_ih)[1], hidden, backward=True,
                          element_bytes=w_ih.element_size())
    base = generic_cost(call, category="rnn", flops=work.flops)
    return Cost(base.flops, base.bytes_read + work.recurrent_rereads, unique_bytes(tensors(call.out)), "rnn",
                gemm_mnk=work.gemm_mnk, gemm_batch=1, kernels=work.kernels, grid_syncs=work.grid_syncs,
                serial_steps=work.serial_steps)


# ---------------------------------------------------------------- normalisation

BATCH_NORM_OPS = ("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm",
                  "_native_batch_norm_legit_no_training", "_batch_norm_no_update")


# Batch-norm ops whose name, not a `training` argument, says whether they compute batch statistics.
BATCH_NORM_FIXED_MODE = {"_native_batch_norm_legit_no_training": False, "_batch_norm_no_update": False}


def batch_norm_training(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a batch-norm call computes batch statistics (its `training` argument)."""
    fixed = BATCH_NORM_FIXED_MODE.get(func.overloadpacket.__name__)
    if fixed is not None:
        return fixed
    return bool(schema_arg(func, args, kwargs, "training"))


def _channel_rows(call: OpCall) -> tuple[int, int, int]:
    """Batch norm reduces each channel (dim 1) over batch and space; on channels-first data a channel is
    N runs of one plane each (channels-last data reads across channels, every run the whole row)."""
    x = tensors(call.first_arg)
    shape = _shape(x[0]) if x else ()
    channels = shape[1] if len(shape) > 1 else 1
    plane = math.prod(shape[2:])
    segmented = len(shape) > 2 and shape[0] > 1 and not is_channels_last(x[0])
    return channels, math.prod(shape) // max(channels, 1), plane if segmented else 0


def _trailing_rows(call: OpCall) -> tuple[int, int]:
    """Layer/RMS norm reduce the trailing `normalized_shape` of each row."""
    x = tensors(call.first_arg)
    total = x[0].numel() if x else 0
    normalized = call.arg("normalized_shape")
    length = math.prod(normalized) if isinstance(normalized, (list, tuple)) else 1
    return total // max(length, 1), length


def _group_rows(call: OpCall) -> tuple[int, int]:
    """Group norm reduces each (sample, group): N * group rows of C / group * HxW elements."""
    n, c, hw, groups = (int(call.arg(name)) for name in ("N", "C", "HxW", "group"))
    return n * groups, c // max(groups, 1) * hw


def _dim_rows(call: OpCall) -> tuple[int, int]:
    """Softmax-like ops normalise along their `dim` of their first input."""
    x = tensors(call.first_arg)
    shape = _shape(x[0]) if x else ()
    if not shape:
        return 1, 1
    length = shape[int(call.arg("dim")) % len(shape)]
    return math.prod(shape) // max(length, 1), length


_norm_statistics = by_category("norm", flops_per_input=5.0, rows=_channel_rows)
_affine = by_category("elementwise", flops_per_input=2.0)


@register_cost(*iter_ops(BATCH_NORM_OPS))
def _batch_norm(call: OpCall) -> Cost:
    # With running statistics (eval) batch norm is one per-channel affine pass, a different kernel
    # from the reduce-then-normalise one training runs.
    if batch_norm_training(call.func, call.args, call.kwargs):
        return _norm_statistics(call)
    # The per-channel scale and shift are expanded along dimension 1, not by the right-aligned rule.
    cost, x = _affine(call), tensors(call.first_arg)
    if not cost.broadcast or not x or x[0].dim() < 2:
        return cost
    per_channel = tuple(x[0].shape[1] if d == 1 else 1 for d in range(x[0].dim()))
    return replace(cost, broadcast_run=expanded_run(per_channel, x[0]))


for _names, _flops_in, _rows in [
    (["native_layer_norm", "_fused_rms_norm"], 5.0, _trailing_rows),
    (["native_layer_norm_backward", "_fused_rms_norm_backward"], 8.0, _trailing_rows),
    (["_batch_norm_with_update"], 5.0, _channel_rows),
    (["native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward"], 8.0, _channel_rows),
    (["native_group_norm"], 5.0, _group_rows),
    (["native_group_norm_backward"], 8.0, _group_rows),
    (["instance_norm"], 5.0, None),  # composite: traces as batch norm; registered in case a backend keeps it
]:
    register_cost(*iter_ops(_names))(by_category("norm", flops_per_input=_flops_in, rows=_rows))


# PyTorch's layer norm and softmax kernels copy a non-contiguous input (and, backward, the incoming
# gradient) to a contiguous one first: after nn.MultiheadAttention with batch_first, whose output is a
# transposed view, every layer norm of a ViT block pays a copy of its activation (the profiler shows it
# inside native_layer_norm).
REGISTRY.stage_contiguous(*iter_ops(["native_layer_norm"]), args=("input", "weight", "bias"))
REGISTRY.stage_contiguous(*iter_ops(["native_layer_norm_backward"]), args=("grad_out", "input", "weight", "bias"))
REGISTRY.stage_contiguous(*iter_ops(["_softmax", "_log_softmax"]), args=("self",))
REGISTRY.stage_contiguous(*iter_ops(["_softmax_backward_data", "_log_softmax_backward_data"]),
                          args=("grad_output", "output"))
# Every convolution backend takes its input and weight (backward: also the output gradient) in one dense
# memory format: ShuffleNet convolves one half of a channel split, a strided view, and copies it first
# (forward and backward; the profiler shows the copy inside aten::convolution).
REGISTRY.stage_contiguous(aten.convolution, aten._convolution, args=("input", "weight"), channels_last_ok=True)
REGISTRY.stage_contiguous(aten.convolution_backward, args=("grad_output", "input", "weight"), channels_last_ok=True)


# ---------------------------------------------------------------- softmax and reductions

register_cost(*iter_ops(["_softmax", "_log_softmax", "_safe_softmax"]))(
    by_category("reduction", flops_per_input=5.0, rows=_dim_rows))
register_cost(*iter_ops(["_softmax_backward_data", "_log_softmax_backward_data"]))(
    by_category("reduction", flops_per_input=3.0, rows=_dim_rows))
_REDUCED_ROWS = by_category("reduction", flops_per_input=1.0, rows=reduced_rows)


def _reduce_kernel(call: OpCall) -> Cost:
    return replace(_REDUCED_ROWS(call), reduce_kernel=True)


register_cost(*iter_ops([
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "all", "any", "norm",
    "linalg_vector_norm", "var", "std", "var_mean", "std_mean", "nansum", "aminmax",
]))(_reduce_kernel)
register_cost(*iter_ops([
    "logsumexp", "cumsum", "cumprod", "count_nonzero", "topk", "sort", "nll_loss_forward", "nll_loss2d_forward",
    "nll_loss_backward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "smooth_l1_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss", "kl_div",
    "_cdist_forward", "dist", "trace", "median", "kthvalue", "mode",
]))(_REDUCED_ROWS)


# ---------------------------------------------------------------- pooling and resampling

def _pool(backward: bool):
    def formula(call: OpCall) -> Cost:
        kernel = call.arg("kernel_size")
        window = math.prod(kernel) if isinstance(kernel, (list, tuple)) and kernel else 1
        big = max((t.numel() for t in call.inputs), default=0)
        cost = generic_cost(call, category="pool", flops=float(window * sum(t.numel() for t in call.outputs)
                                                                if not backward else big * window))
        return replace(cost, window=int(window))
    return formula


register_cost(*iter_ops(["max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
                         "max_pool1d", "avg_pool1d", "max_pool2d"]))(_pool(False))
register_cost(*iter_ops(["max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
                         "avg_pool2d_backward", "avg_pool3d_backward"]))(_pool(True))
register_cost(*iter_ops([
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
]))(by_category("pool", flops_per_input=1.0))
_RESAMPLE = by_category("pool", flops_per_output=4.0)
register_cost(*iter_ops([
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact2d",
    "upsample_nearest2d_backward", "_upsample_bilinear2d_aa", "grid_sampler_2d", "im2col", "col2im",
]))(_RESAMPLE)


def _atomic(formula):
    """`formula` for an op whose CUDA kernel scatters into its output with atomic adds."""
    def with_atomics(call: OpCall) -> Cost:
        return replace(formula(call), atomic_adds=True)
    return with_atomics


# Interpolation and sampling gradients scatter each output gradient into the inputs it was read from;
# index_add and scatter_add scatter by index (2x bilinear upsampling backward took 2.1x as long in bf16
# as in fp32 on the H100, 2.2x on the H200; python3 benchmarks/kernel_facts.py).
register_cost(*iter_ops(["upsample_bilinear2d_backward", "upsample_bicubic2d_backward", "upsample_linear1d_backward",
                         "upsample_trilinear3d_backward", "grid_sampler_2d_backward"]))(_atomic(_RESAMPLE))


@register_cost(*iter_ops(["upsample_bilinear2d", "upsample_bicubic2d", "upsample_linear1d", "upsample_trilinear3d"]))
def _interpolate(call: OpCall) -> Cost:
    # PyTorch's CUDA kernel for interpolating contiguous (NCHW) data gives each thread one output
    # position and loops over every (sample, channel) plane in turn: 2x bilinear upsampling of
    # 32 x 256 fp32 planes of 32x32 took 3.2 ms on the H100, of 8 x 128 planes of 128x128 (as many
    # outputs, 16x the positions) 0.46 ms (python3 benchmarks/kernel_facts.py). Channels-last data takes
    # a kernel parallel over all outputs.
    cost = _RESAMPLE(call)
    x = call.first_arg
    shape = _shape(x)
    if len(shape) < 3 or is_channels_last(x):
        return cost
    return replace(cost, serial_steps=float(shape[0] * shape[1]))


# ---------------------------------------------------------------- embeddings, gathers, copies

register_cost(*iter_ops(["_embedding_bag", "embedding_bag", "_embedding_bag_forward_only"]))(by_category("embedding"))


def expected_distinct(draws: float, population: float) -> float:
    """Distinct items among `draws` drawn uniformly with replacement from `population`: the rows of a
    table that `draws` lookups touch (8192 tokens of a 50257-word vocabulary touch ~7600 rows, 8192 of a
    512-word one all 512)."""
    if draws <= 0 or population <= 0:
        return 0.0
    if population <= 1:
        return 1.0
    return float(-population * math.expm1(draws * math.log1p(-1.0 / population)))


def _gather(category: str, table_lookup: bool = False):
    """A gather reads the rows it selects, not its whole source (an embedding lookup of 8 tokens touches
    8 rows of a 250k-row table), plus its indices. A table lookup (indices into dim 0 of its first
    argument) reads a row selected twice from cache the second time."""
    def formula(call: OpCall) -> Cost:
        source = tensors(call.first_arg)
        keys = {id(t) for t in source}
        indices = [t for t in call.inputs if id(t) not in keys]
        written = unique_bytes(call.outputs)
        rows = sum(t.numel() for t in indices)
        n_out = sum(t.numel() for t in call.outputs)
        distinct = 1.0
        if table_lookup and rows and source and _shape(source[0]):
            distinct = expected_distinct(rows, _shape(source[0])[0]) / rows
        read = min(unique_bytes(source), written * distinct) + unique_bytes(indices)
        # Rows: one per index, as long as the output per index (a row of the table for a lookup); the
        # row length decides how well each gathered row coalesces.
        return Cost(0.0, read, written, category, row_count=rows if n_out else 0, row_len=n_out // max(rows, 1),
                    table_lookup=table_lookup)
    return formula


register_cost(*iter_ops(["embedding"]))(_gather("embedding", table_lookup=True))
register_cost(*iter_ops(["index_select", "gather", "index", "_unsafe_index"]))(_gather("copy"))


# PyTorch's CUDA embedding backward (aten/src/ATen/native/cuda/Embedding.cu) zeroes the whole weight
# gradient, then takes one of two paths. Up to EMBEDDING_BWD_DIRECT_MAX indices (and without
# scale_grad_by_freq) one kernel accumulates every gradient row into its weight row directly: a block per
# 32 columns walks all indices in chunks of EMBEDDING_BWD_CHUNK (a warp per index), each chunk loading its
# gradient rows, then loading and storing the weight rows it adds them to, before the next
# (EMBEDDING_BWD_CHUNK_TRIPS serial round trips to memory; the ceil(width / 32) blocks of 1024 threads
# fit in one wave up to a width of 64 per SM, 8448 on an H100). Beyond, it sorts the indices, finds the
# segments of equal indices, sums each segment's rows into an fp32 buffer of partial sums and scatters
# those into the weight gradient: some ten kernels, and twice a segment count is copied to the host,
# which waits for it before it can size the next launches. Embedding bags always take the sorting path.
EMBEDDING_BWD_DIRECT_MAX = 3072
EMBEDDING_BWD_SORT_KERNELS = 10
EMBEDDING_BWD_SORT_SYNCS = 2
RADIX_BITS = 8                   # index bits a radix-sort pass consumes
EMBEDDING_BWD_ROWS_PER_PARTIAL = 10   # NROWS_PER_THREAD in EmbeddingBackwardKernel.cu
EMBEDDING_BWD_CHUNK = 32              # BLOCKDIMY in Embedding.cu
EMBEDDING_BWD_CHUNK_TRIPS = 3        # gradient load, weight load, weight store


@register_cost(*iter_ops(["embedding_dense_backward", "_embedding_bag_backward", "_embedding_bag_dense_backward"]))
def _embedding_backward(call: OpCall) -> Cost:
    grad, indices = call.first_arg, call.arg("indices")
    out = call.outputs[0]
    vocab, width = _shape(out)[0], _shape(out)[-1]
    n_idx = indices.numel()
    size = out.element_size()
    # Rows of the weight gradient the indices touch.
    touched = expected_distinct(n_idx, vocab) * width
    zero_fill = float(out.numel() * size)
    grad_bytes = float(grad.numel() * grad.element_size())
    index_bytes = float(n_idx * indices.element_size())
    dense = call.func.overloadpacket is torch.ops.aten.embedding_dense_backward
    scale_by_freq = dense and bool(call.arg("scale_grad_by_freq"))
    if dense and n_idx <= EMBEDDING_BWD_DIRECT_MAX and not scale_by_freq:
        read = grad_bytes + index_bytes + touched * size
        written = zero_fill + touched * size
        kernels, syncs = 2, 0
        serial = math.ceil(n_idx / EMBEDDING_BWD_CHUNK) * EMBEDDING_BWD_CHUNK_TRIPS
    else:
        passes = max(1, math.ceil(math.log2(max(vocab, 2)) / RADIX_BITS))
        sort_bytes = passes * n_idx * 2.0 * 2 * indices.element_size()   # keys and positions, read + written
        # fp32 sums of partial segments: each run of equal indices is cut into pieces of at most
        # EMBEDDING_BWD_ROWS_PER_PARTIAL rows, one thread per piece and column.
        partial_sums = (touched + n_idx / EMBEDDING_BWD_ROWS_PER_PARTIAL * width) * 4.0
        read = grad_bytes + index_bytes + partial_sums + sort_bytes / 2
        written = zero_fill + partial_sums + touched * size + sort_bytes / 2
        kernels, syncs = 1 + EMBEDDING_BWD_SORT_KERNELS + passes, EMBEDDING_BWD_SORT_SYNCS
        serial = 0
    # One row per index, as wide as the embedding (an embedding bag's gradient has a row per bag).
    return Cost(float(grad.numel()), read, written, "embedding", row_count=n_idx, row_len=_shape(grad)[-1],
                kernels=kernels, host_syncs=syncs, serial_steps=float(serial))


register_cost(*iter_ops(["scatter_add", "index_add"]))(_atomic(by_category("copy")))
register_cost(*iter_ops([
    "_to_copy", "copy_", "clone", "cat", "stack", "scatter",
    "scatter_reduce", "index_put", "index_put_", "_index_put_impl_",
    "index_copy", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    "constant_pad_nd", "reflection_pad2d", "replication_pad2d", "reflection_pad1d", "fill", "fill_",
    "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
    "new_full", "arange", "repeat", "flip", "masked_scatter", "_unsafe_view_copy",
    "select_backward", "slice_backward", "index_select_backward", "unfold_backward", "narrow_copy",
    "tril_indices", "triu_indices", "_reshape_copy", "expand_copy", "permute_copy", "view_copy",
    "embedding_renorm_", "eye", "linspace", "scalar_tensor", "_unsafe_masked_index",
    "_unsafe_masked_index_put_accumulate", "lift_fresh_copy",
    "randperm", "searchsorted", "bucketize", "one_hot", "_pin_memory", "resize_",
]))(by_category("copy"))


@register_cost(*iter_ops(["roll"]))
def _roll(call: OpCall) -> Cost:
    # CUDA's roll shifts one dimension per kernel: a roll over k dimensions (Swin's shifted windows roll
    # two) recurses dimension by dimension inside the op, k passes over the tensor. Its kernel maps every
    # element's index on its own, one element per lane (the suite's rolls run at the same element rate in
    # bf16 as in fp32), like TensorIterator's strided loop: priced as a permuted copy.
    dims = call.arg("dims")
    passes = max(len(dims), 1) if isinstance(dims, (list, tuple)) else 1
    cost = generic_cost(call, category="copy")
    return replace(cost, bytes_read=cost.bytes_read * passes, bytes_written=cost.bytes_written * passes,
                   kernels=passes, permuted=True)


@register_cost(*iter_ops(["nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"]))
def _data_dependent_size(call: OpCall) -> Cost:
    # The output's size depends on the data: the op counts on the GPU and copies the count to the host,
    # which waits for it before it can allocate the output and launch the rest.
    return replace(generic_cost(call, category="copy", kernels=2), host_syncs=1)


register_cost(*iter_ops([
    "native_dropout", "native_dropout_backward", "bernoulli", "bernoulli_", "rand_like", "randn_like",
    "rand", "randn", "randint", "randint_like", "normal_", "uniform_", "exponential_", "random_",
    "normal", "multinomial", "tril", "triu", "_masked_softmax", "_assert_async",
]))(by_category("elementwise", flops_per_output=1.0))


# Activations, selects and fills not all of whose overloads carry the `pointwise` tag
# (e.g. hardswish, the *_backward ops, where, masked_fill): FLOPs per output element.
for _names, _fl in [
    (["hardswish", "hardswish_", "hardswish_backward", "hardsigmoid", "hardsigmoid_", "hardsigmoid_backward",
      "relu", "relu_", "threshold", "threshold_backward", "hardtanh", "hardtanh_", "hardtanh_backward",
      "leaky_relu", "leaky_relu_", "leaky_relu_backward", "prelu", "_prelu_kernel", "rrelu_with_noise",
      "hardshrink", "softshrink", "where", "masked_fill", "masked_fill_", "rsub", "sign", "sgn"], 1.0),
    (["_prelu_kernel_backward", "glu", "glu_backward", "_fused_dropout"], 2.0),
    (["gelu", "gelu_", "gelu_backward", "elu", "elu_", "elu_backward", "celu", "celu_", "selu", "selu_",
      "softplus", "softplus_backward", "log_sigmoid_forward", "log_sigmoid_backward", "erf", "pow"], 4.0),
    (["mish", "mish_", "mish_backward"], 8.0),
]:
    register_cost(*iter_ops(_names))(by_category("elementwise", flops_per_output=_fl))

# ---------------------------------------------------------------- foreach optimizer ops

# Elements one foreach kernel launch covers per tensor list depth (ATen's MultiTensorApply limits).
FOREACH_TENSORS_PER_LAUNCH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}


def _foreach(flops_per_element: float):
    def formula(call: OpCall) -> Cost:
        lists = [a for a in call.args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        n_tensors = len(lists[0]) if lists else 1
        depth = len(lists) + (0 if tensors(call.out) == [] else 1)
        per_launch = FOREACH_TENSORS_PER_LAUNCH.get(min(max(depth, 1), 5), 30)
        elements = sum(t.numel() for t in (lists[0] if lists else call.inputs))
        return generic_cost(call, category="optimizer", flops=flops_per_element * elements,
                            kernels=max(1, math.ceil(n_tensors / per_launch)))
    return formula


_FOREACH_FLOPS = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "addcmul": 2, "addcdiv": 2, "lerp": 2, "sqrt": 1,
    "maximum": 1, "minimum": 1, "neg": 1, "abs": 1, "exp": 1, "sign": 1, "reciprocal": 1, "pow": 1,
    "clamp_max": 1, "clamp_min": 1, "norm": 2, "zero": 0, "copy": 0, "rsqrt": 1,
}
_FOREACH_WITHOUT_IN_PLACE = {"norm"}   # a norm reduces each tensor to a new one
for _base, _fl in _FOREACH_FLOPS.items():
    _names = [f"_foreach_{_base}"] + ([] if _base in _FOREACH_WITHOUT_IN_PLACE else [f"_foreach_{_base}_"])
    register_cost(*iter_ops(_names))(_foreach(float(_fl)))
register_cost(*iter_ops(["_fused_adamw_", "_fused_adam_", "_fused_sgd_", "_fused_adagrad_"]))(_foreach(12.0))


# ---------------------------------------------------------------- host-only and metadata-only ops

@register_cost(*iter_ops(["_local_scalar_dense", "item", "is_nonzero", "equal"]))
def _host_read(call: OpCall) -> Cost:
    # Reading a GPU value on the host waits for everything queued before it; a CPU tensor's (the
    # optimizer's step count) is read at once.
    on_device = any(t.device.type != "cpu" for t in call.inputs)
    return Cost(0.0, unique_bytes(call.inputs), 0.0, "copy", kernels=0, host_only=True, host_syncs=int(on_device))


mark_free(*iter_ops([
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "detach_",
    "lift_fresh", "alias", "_unsafe_view", "_reshape_alias", "set_", "resolve_conj", "resolve_neg",
    "_conj", "_neg_view", "conj", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "_assert_tensor_metadata", "_functional_assert_async", "record_stream", "_nested_tensor_size",
    "as_strided", "unsqueeze_", "squeeze_", "t_", "transpose_", "as_strided_",
]))
# Splits that alias their input without view tracking (GRU/LSTM cells on the CPU use them): no kernel.
mark_free(*iter_ops(["unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk"]))


from . import moe_formulas  # noqa: E402,F401  (registers grouped-GEMM and routing formulas in REGISTRY)
