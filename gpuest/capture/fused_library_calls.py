"""Library calls that CUDA runs as one call where the CPU decomposes the work: cuDNN's recurrent layers, and
attention with a learned bias.

On CUDA, nn.LSTM/GRU/RNN forward is one `_cudnn_rnn` call and its gradient one `_cudnn_rnn_backward`
call. The CPU path that the trace would otherwise take runs per layer (oneDNN) or per time step
(GRU and 16-bit LSTM), which is slow to trace, and holds other tensors than cuDNN does. `cudnn_rnn_call`
runs a recurrent call as CUDA allocates it instead: the same two library calls, on fake tensors, with
the weight copy, the reserve and the casts the CUDA program makes. The recorder makes each call one
node (`FUSED_MODULES`); its time and work come from `annotate.formulas.rnn`.

`F.scaled_dot_product_attention` with a mask runs on CUDA in the memory-efficient kernel, which broadcasts any
mask and also returns the gradient of one that requires grad (BEiT's, MaxViT's and CoAtNet's relative position
bias, trained with the model). The CPU's flash kernel takes no mask that requires grad, and only 2-d or
(batch|1, heads|1, queries, keys) masks, so for the others (MaxViT's (heads, queries, keys) bias, say) a CPU
trace would take the math path (batched GEMMs, softmax, fp32 casts of every 16-bit operand).
`efficient_attention_call` makes the call CUDA makes: ATen's `convert_boolean_attn_mask` and `preprocess_mask`
(pad the bias to the kernel's alignment, expand it over batch and heads), then
`_scaled_dot_product_efficient_attention`, whose backward autograd derives.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.backends.cudnn import CUDNN_TENSOR_DTYPES

from ..annotate.registry import bind_args

# Modules that cuDNN runs as one library call on CUDA: their ops become one node, (forward, backward).
FUSED_MODULES: dict[type, tuple[str, str]] = {
    torch.nn.RNNBase: ("aten._cudnn_rnn.default", "aten._cudnn_rnn_backward.default"),
}

# cudnnRNNMode_t numbering, which `_cudnn_rnn` takes.
CUDNN_RNN_MODES = {"RNN_RELU": 0, "RNN_TANH": 1, "LSTM": 2, "GRU": 3}
# The functions nn.RNNBase subclasses call (torch._VF), by the mode they run.
VF_RNN_MODES: dict[Callable, str] = {torch._VF.rnn_relu: "RNN_RELU", torch._VF.rnn_tanh: "RNN_TANH",
                                     torch._VF.lstm: "LSTM", torch._VF.gru: "GRU"}
# The reserve cuDNN keeps from a training forward for its backward, in elements of the compute dtype per
# layer x direction x time step x batch row x hidden unit; each layer but the last adds one more (its
# output). The H200 probe measured exactly this for LSTM (5) and GRU (6) at batch >= 64, in fp32, bf16
# and fp16 (data/memory/workspace.H200.jsonl.gz; `python3 benchmarks/kernel_facts.py` prints the ratio).
# Plain RNNs were not measured: one gate and the hidden state are assumed.
RNN_RESERVE_ELEMENTS = {"LSTM": 5, "GRU": 6, "RNN_TANH": 2, "RNN_RELU": 2}


@dataclass(frozen=True)
class CudnnRNNSpec:
    """What one recurrent call asks cuDNN to run (the `_cudnn_rnn` arguments that are not tensors)."""

    mode: str
    hidden: int
    layers: int
    directions: int
    batch_first: bool
    dropout: float
    train: bool
    weight_stride0: int       # weights per layer and direction: 4 with biases, 2 without
    flat_weights: bool        # the weights already are one cuDNN buffer (nn.RNNBase.flatten_parameters)

    def reserve_bytes(self, x: torch.Tensor) -> int:
        """Bytes of the training reserve for input `x` (time-major or batch-first, unpacked)."""
        steps, batch = rnn_steps_and_batch(x, self.batch_first)
        per_layer = self.directions * steps * batch * self.hidden
        elements = RNN_RESERVE_ELEMENTS[self.mode] * self.layers * per_layer + (self.layers - 1) * per_layer
        return int(elements) * x.element_size()


def rnn_steps_and_batch(x: torch.Tensor, batch_first: bool) -> tuple[int, int]:
    """(time steps, batch rows) of an unpacked recurrent input: (L, N, H_in), (N, L, H_in) when batch-first,
    or (L, H_in) unbatched (nn.RNNBase runs it as batch 1)."""
    if x.dim() == 2:
        return int(x.shape[0]), 1
    return (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))


def cudnn_rnn_dtype(weight_dtype: torch.dtype, autocast: bool) -> torch.dtype:
    """The dtype cuDNN runs a recurrent call in: fp16 under CUDA autocast whatever autocast's own dtype
    (ATen's autocast kernel for _cudnn_rnn casts to half and re-flattens the weights: the lstm zoo model's
    bf16-mixed kernel profile, data/kernels/H100-SXM-training.jsonl, runs __half GEMMs and cells), else its
    weights' dtype."""
    return torch.float16 if autocast else weight_dtype


def cudnn_rnn_call(func: Any, args: tuple, kwargs: dict, device_type: str) -> tuple[bool, Any]:
    """(True, result) when `func` is a recurrent layer's torch._VF call that cuDNN runs as one library call,
    run as CUDA allocates it; (False, None) for anything else, including packed sequences and LSTM
    projections, which keep the CPU path."""
    mode = VF_RNN_MODES.get(func) if callable(func) else None
    if mode is None or kwargs or len(args) != 9 or not isinstance(args[2], (list, tuple)):
        return False, None
    x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
    h0, c0 = hx if mode == "LSTM" else (hx, None)
    if x.dim() != 3 or (c0 is not None and h0.shape[-1] != c0.shape[-1]):
        return False, None
    autocast = torch.is_autocast_enabled(device_type)
    with torch.autocast(device_type, enabled=False):
        if autocast:
            dtype = cudnn_rnn_dtype(params[0].dtype, autocast)
            x, h0, c0, *params = (t.to(dtype) if t is not None else None for t in (x, h0, c0, *params))
        spec = CudnnRNNSpec(mode, int(c0.shape[-1] if c0 is not None else h0.shape[-1]), int(layers),
                            2 if bidirectional else 1, bool(batch_first), float(dropout), bool(train),
                            4 if has_biases else 2, not autocast and params[0].dtype in CUDNN_TENSOR_DTYPES)
        out, hy, cy = _CudnnRNN.apply(spec, x, h0, c0, *params)
    return True, ((out, hy, cy) if mode == "LSTM" else (out, hy))


class _CudnnRNN(torch.autograd.Function):
    """`_cudnn_rnn` forward and a stand-in for `_cudnn_rnn_backward` (which has no fake kernel), each one
    dispatched op holding the tensors the real call holds."""

    @staticmethod
    def forward(ctx: Any, spec: CudnnRNNSpec, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor | None,
                *weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Weights cuDNN cannot take in place (bf16) are copied into one buffer per call, kept for backward.
        weight_buf = None if spec.flat_weights else x.new_empty(sum(w.numel() for w in weights), dtype=weights[0].dtype)
        # cuDNN runs time-major: a batch-first input is copied, and the output returned as a transposed view.
        out, hy, cy, _, _ = torch.ops.aten._cudnn_rnn(
            _time_major(x, spec), list(weights), spec.weight_stride0, None, h0, c0, CUDNN_RNN_MODES[spec.mode],
            spec.hidden, 0, spec.layers, False, spec.dropout, spec.train, spec.directions == 2, [], None)
        reserve = x.new_empty(spec.reserve_bytes(x), dtype=torch.uint8) if spec.train else None
        ctx.spec = spec
        ctx.set_materialize_grads(False)
        if c0 is None:
            ctx.mark_non_differentiable(cy)
        ctx.save_for_backward(x, h0, c0, out, reserve, weight_buf, *weights)
        return (out.transpose(0, 1) if spec.batch_first else out), hy, cy

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_hy: torch.Tensor | None,
                 grad_cy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        spec: CudnnRNNSpec = ctx.spec
        x, h0, c0, out, reserve, weight_buf, *weights = ctx.saved_tensors
        # As _cudnn_rnn_backward does for gradients that autograd leaves undefined.
        grad_out = torch.zeros_like(out) if grad_out is None else _time_major(grad_out, spec)
        grad_hy = torch.zeros_like(h0) if grad_hy is None else grad_hy
        if c0 is not None and grad_cy is None:
            grad_cy = torch.zeros_like(c0)
        needs = ctx.needs_input_grad
        dx, dh0, dc0, dw = cudnn_rnn_backward_op()(
            _time_major(x, spec), h0, c0, out, reserve, weight_buf, list(weights), grad_out, grad_hy, grad_cy,
            [needs[1], needs[2], needs[3], any(needs[4:])])
        # cuDNN writes all weight gradients into one buffer; each weight's is a view of it.
        offsets = itertools.accumulate(w.numel() for w in weights)
        dws = [dw[end - w.numel():end].view(w.shape) if dw.numel() else None for w, end in zip(weights, offsets)]
        dx = dx.transpose(0, 1) if spec.batch_first and needs[1] else dx
        return (None, dx if needs[1] else None, dh0 if needs[2] else None,
                dc0 if needs[3] and c0 is not None else None, *dws)


def _time_major(t: torch.Tensor, spec: CudnnRNNSpec) -> torch.Tensor:
    """`t` as the contiguous time-major tensor cuDNN reads (a copy when it is batch-first)."""
    return (t.transpose(0, 1) if spec.batch_first else t).contiguous()


@functools.cache
def cudnn_rnn_backward_op() -> Any:
    """The stand-in op for `_cudnn_rnn_backward`: its inputs and its results' sizes (input, hidden and
    cell gradients, and the flat weight gradient), each left empty where `output_mask` says it is not
    needed. Defined at first use; it has no kernel, only a fake one."""

    # The schema is spelled out: inferring it from annotations differs across torch versions.
    @torch.library.custom_op("gpuest::cudnn_rnn_backward", mutates_args=(), schema=(
        "(Tensor input, Tensor hx, Tensor? cx, Tensor output, Tensor? reserve, Tensor? weight_buf, Tensor[] weights, "
        "Tensor grad_output, Tensor grad_hy, Tensor? grad_cy, bool[] output_mask) -> (Tensor, Tensor, Tensor, Tensor)"))
    def cudnn_rnn_backward(input, hx, cx, output, reserve, weight_buf, weights, grad_output, grad_hy, grad_cy,
                           output_mask):
        raise NotImplementedError("gpuest::cudnn_rnn_backward only stands in for cuDNN while tracing")

    @cudnn_rnn_backward.register_fake
    def _(input, hx, cx, output, reserve, weight_buf, weights, grad_output, grad_hy, grad_cy, output_mask):
        def result(like: torch.Tensor | None, needed: bool, numel: int | None = None) -> torch.Tensor:
            if like is None or not needed:
                return input.new_empty(0)
            return like.new_empty(numel) if numel is not None else torch.empty_like(like)
        return (result(input, output_mask[0]), result(hx, output_mask[1]), result(cx, output_mask[2]),
                result(weights[0], output_mask[3], sum(w.numel() for w in weights)))

    return cudnn_rnn_backward


# ---------------------------------------------------------------- attention with a learned bias
# The memory-efficient kernel's alignment, in elements: ATen pads a bias whose strides are not multiples of it
# (aten/src/ATen/native/transformers/attention.cpp, preprocess_mask's mem_eff_alignment) ...
MEM_EFF_BIAS_ALIGNMENT = 8
# ... and the head dims it takes (sdp_utils: check_head_dim_size_mem_efficient, 16-bit and fp32 alike).
MEM_EFF_HEAD_DIM_MULTIPLE = 8
# F.scaled_dot_product_attention's parameters, in order (torch >= 2.5).
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def cpu_flash_takes_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether the CPU's flash kernel accepts this mask (sdp_utils_cpp.cpp, check_attn_mask_shape): none that
    requires grad, last two dims (queries|1, keys|1), and 2-d or (batch|1, heads|1, ...) 4-d."""
    if mask.requires_grad and torch.is_grad_enabled():
        return False
    if mask.dim() < 2 or mask.shape[-2] not in (query.shape[2], 1) or mask.shape[-1] not in (key.shape[2], 1):
        return False
    return mask.dim() == 2 or (mask.dim() == 4 and mask.shape[0] in (1, query.shape[0])
                               and mask.shape[1] in (1, query.shape[1]))


def takes_efficient_bias_path(args: tuple, kwargs: dict, device_type: str) -> bool:
    """Whether an SDPA call is one CUDA runs as memory-efficient attention with a mask and a CPU trace would
    decompose (cpu_flash_takes_mask fails): 4-d q/k/v of one dtype and head count, head dims the kernel takes,
    a floating or boolean mask, no GQA."""
    a = bind_args(_SDPA_PARAMS, args, kwargs)
    q, k, v, mask = a.get("query"), a.get("key"), a.get("value"), a.get("attn_mask")
    if device_type != "cpu" or not all(isinstance(t, torch.Tensor) for t in (q, k, v, mask)):
        return False
    if not (mask.is_floating_point() or mask.dtype == torch.bool) or a.get("enable_gqa"):
        return False
    return (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float32, torch.float16, torch.bfloat16) and q.shape[1] == k.shape[1] == v.shape[1]
            and q.shape[-1] % MEM_EFF_HEAD_DIM_MULTIPLE == 0 and v.shape[-1] % MEM_EFF_HEAD_DIM_MULTIPLE == 0
            and not cpu_flash_takes_mask(mask, q, k))


def aligned_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """ATen's preprocess_mask: a bias with a stride off the kernel's alignment is padded (one copy) and
    sliced back; then expanded over (batch, heads, queries, keys)."""
    if any(s % MEM_EFF_BIAS_ALIGNMENT for s in mask.stride()[:-1]):
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, MEM_EFF_BIAS_ALIGNMENT - last % MEM_EFF_BIAS_ALIGNMENT))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def efficient_attention_call(args: tuple, kwargs: dict) -> torch.Tensor:
    """The SDPA call as CUDA makes it for a mask (takes_efficient_bias_path): dropout off, as the trace prices
    every step; a boolean mask made additive (-inf where False), a floating one in the query's dtype, as
    autocast or the kernel requires."""
    a = bind_args(_SDPA_PARAMS, args, kwargs)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if mask.dtype == torch.bool:
        mask = torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=q.dtype, device=q.device))
    bias = aligned_bias(mask.to(q.dtype), q, k)
    lse = any(t.requires_grad for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, lse, 0.0,
                                                                 bool(a.get("is_causal", False)), scale=a.get("scale"))
    return out[0]

