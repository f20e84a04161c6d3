"""Cost formulas of elementwise ops not all of whose overloads carry torch's `pointwise` tag (activations,
their gradients, selects, random fills): FLOPs per output element."""
from __future__ import annotations

from dataclasses import replace

from ..registry import Cost, OpCall, by_category, iter_ops, register_cost, unique_bytes

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
      "hardshrink", "softshrink", "where", "masked_fill_", "rsub", "sign", "sgn"], 1.0),
    (["_prelu_kernel_backward", "glu", "glu_backward", "_fused_dropout"], 2.0),
    (["gelu", "gelu_", "gelu_backward", "elu", "elu_", "elu_backward", "celu", "celu_", "selu", "selu_",
      "softplus", "softplus_backward", "log_sigmoid_forward", "log_sigmoid_backward", "erf", "pow"], 4.0),
    (["mish", "mish_", "mish_backward"], 8.0),
]:
    register_cost(*iter_ops(_names))(by_category("elementwise", flops_per_output=_fl))


# Out-of-place masked_fill runs on CUDA as a clone of self and masked_fill_ on the clone, which reads it back:
# two kernels, the output crossing memory three times more (the profiler nests aten::clone and
# aten::masked_fill_ under every aten::masked_fill of the per-op validation rows: DeBERTa-v3, the MoE decoders).
_FILL = by_category("elementwise", flops_per_output=1.0)


@register_cost(*iter_ops(["masked_fill"]))
def _masked_fill(call: OpCall) -> Cost:
    cost = _FILL(call)
    out = unique_bytes(call.outputs)
    return replace(cost, bytes_read=cost.bytes_read + out, bytes_written=cost.bytes_written + out, kernels=2)
