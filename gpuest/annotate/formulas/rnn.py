"""Cost formulas of recurrent layers (nn.LSTM/GRU/RNN), priced as cuDNN runs them whatever path the CPU
trace takes: per-step GEMM and cell kernels, or one persistent kernel for a narrow fp32 layer."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from ..registry import Cost, OpCall, generic_cost, iter_ops, register_cost, shape_of, tensors, unique_bytes
from .gemm import with_gemm

# Listed in the order of the mkldnn/cuDNN mode numbers (0 RNN_RELU ... 3 GRU).
RNN_MODE_GATES = {"RNN_RELU": 1, "RNN_TANH": 1, "LSTM": 4, "GRU": 3}   # nn.RNNBase.mode
RNN_GATES = dict(enumerate(RNN_MODE_GATES.values()))                     # by mkldnn/cudnn mode number


# cuDNN (9.x, fp32, Hopper) runs the recurrence of a layer this narrow as one persistent kernel per
# layer and direction (RNN_blockPersist_fp_* / _bp_*), whose blocks meet at a grid-wide barrier each
# step, instead of a GEMM and a cell kernel per step: hidden 32 to 192 ran persistent, 256 and wider
# did not (data/kernels/H100-SXM-benchmarks.jsonl; 224 is not measured). In 16 bits it never does: a bf16
# LSTM of hidden 128 ran a GEMM and a cell kernel per step like a wide one (the bf16 kernel
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
# hidden size counts as a serial step (Cost.serial_steps), forward and backward (chosen by 5-fold
# cross-validation, benchmarks/cross_validate.py; docs/CV_HISTORY.md).
RNN_STEP_K_DEPTH = 128
# Launch latencies a per-step layer exposes per step: its GEMM and its cell kernel, which cuDNN's host
# loop enqueues right behind the GEMM (a bf16 LSTM of hidden 32 took 4.2 us a step on the H100,
# benchmarks/kernel_facts.py, under the profiles' two kernel latencies of 2.4 us). 5-fold cross-validation
# chose 1.5 over 1 and 2 (benchmarks/cross_validate.py; docs/CV_HISTORY.md).
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
    steps, batch = shape_of(x)[:2]
    gates = RNN_GATES.get(int(call.arg("mode")), 4)
    work = cudnn_rnn_work(gates, steps, batch, shape_of(w_ih)[1], hidden, element_bytes=w_ih.element_size())
    # The time steps run one after another, each a recurrent GEMM and a pointwise gate kernel (cuDNN,
    # data/kernels/): one step's GEMM is all the GPU has to fill its SMs with, hence gemm batch 1.
    cost = with_gemm(call, "rnn", work.flops, work.gemm_mnk, 1, kernels=work.kernels)
    return replace(cost, bytes_read=cost.bytes_read + work.recurrent_rereads, grid_syncs=work.grid_syncs,
                   serial_steps=work.serial_steps)


@register_cost(*iter_ops(["mkldnn_rnn_layer_backward"]))
def _rnn_layer_backward(call: OpCall) -> Cost:
    x, w_ih = call.arg("input"), call.arg("weight1")
    hidden = shape_of(call.arg("hx_"))[-1]
    steps, batch = shape_of(x)[:2]
    gates = max(1, shape_of(w_ih)[0] // max(hidden, 1))
    work = cudnn_rnn_work(gates, steps, batch, shape_of(w_ih)[1], hidden, backward=True,
                          element_bytes=w_ih.element_size())
    base = generic_cost(call, category="rnn", flops=work.flops)
    return Cost(base.flops, base.bytes_read + work.recurrent_rereads, unique_bytes(tensors(call.out)), "rnn",
                gemm_mnk=work.gemm_mnk, gemm_batch=1, kernels=work.kernels, grid_syncs=work.grid_syncs,
                serial_steps=work.serial_steps)
