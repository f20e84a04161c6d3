"""transformers models traced on fake tensors call SDPA as they do on the GPU.

With no padding mask, transformers (>= 5) skips the causal mask and calls SDPA with attn_mask=None,
is_causal=True, so CUDA runs the flash kernel for fp16/bf16. On fake tensors its packed-sequence check
cannot read the generated position ids and would materialise a mask (memory-efficient kernel);
`load_model` makes that check answer as it does on real tensors.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from gpuest.capture import trace
from gpuest.capture.models import load_model

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

FLASH = "aten._scaled_dot_product_flash_attention.default"
FLASH_BWD = "aten._scaled_dot_product_flash_attention_backward.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
EFFICIENT_BWD = "aten._scaled_dot_product_efficient_attention_backward.default"


def attention_ops(graph) -> Counter:
    return Counter(d["op"] for _, d in graph.nodes(data=True) if "scaled_dot_product" in d["op"])


@pytest.mark.parametrize("spec,layers", [("hf:llama", 4), ("hf:gpt2", 12)])
@pytest.mark.parametrize("precision", ["bf16", "fp16-mixed"])
def test_causal_lm_half_inference_is_flash(spec, layers, precision):
    lm = load_model(spec, batch=2, seq=32)
    graph = trace(lm.model, lm.example_inputs, precision=precision)
    assert graph.graph["sdpa_backend"] == "flash"
    assert attention_ops(graph) == {FLASH: layers}


def test_causal_lm_bf16_mixed_training_is_flash_both_ways():
    lm = load_model("hf:llama", batch=2, seq=32)
    graph = trace(lm.model, lm.example_inputs, mode="training", precision="bf16-mixed")
    assert attention_ops(graph) == {FLASH: 4, FLASH_BWD: 4}


def test_causal_lm_fp32_stays_efficient():
    """Flash has no fp32 kernel: the mask skip changes nothing there."""
    lm = load_model("hf:llama", batch=2, seq=32)
    graph = trace(lm.model, lm.example_inputs, mode="training")
    assert attention_ops(graph) == {EFFICIENT: 4, EFFICIENT_BWD: 4}


def test_no_causal_mask_is_built():
    """The skipped mask's construction (arange/le/where over (seq, seq)) is gone; the packed-sequence check's
    own small ops, which the device runs too, stay."""
    lm = load_model("hf:llama", batch=2, seq=32)
    graph = trace(lm.model, lm.example_inputs, precision="bf16")
    ops = Counter(d["op"] for _, d in graph.nodes(data=True))
    assert ops["aten.where.self"] == 0 and ops["aten.le.Tensor"] == 0
    assert ops["aten.cumsum.default"] == 1 and ops["aten.all.default"] == 1


def test_encoder_still_traces_without_mask():
    lm = load_model("hf:bert-base-uncased", batch=2, seq=32)
    assert attention_ops(trace(lm.model, lm.example_inputs, precision="bf16")) == {FLASH: 12}
    assert attention_ops(trace(lm.model, lm.example_inputs)) == {EFFICIENT: 12}


def test_transformers_function_restored_after_trace_and_error():
    original = masking_utils.find_packed_sequence_indices
    lm = load_model("hf:llama", batch=1, seq=8)
    trace(lm.model, lm.example_inputs, mode="training", precision="bf16-mixed")
    assert masking_utils.find_packed_sequence_indices is original
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
        ids = torch.empty((1, 8), dtype=torch.int64)
        with pytest.raises(ValueError, match="exactly one of"):
            lm.model(input_ids=ids, inputs_embeds=torch.empty(1, 8, 512))
    assert masking_utils.find_packed_sequence_indices is original


def test_real_forward_untouched():
    """On real tensors (the calibration runs) transformers' own check runs unchanged."""
    original = masking_utils.find_packed_sequence_indices
    lm = load_model("hf:llama", batch=1, seq=8, device="cpu")
    seen = []
    lm.model.model.layers[0].register_forward_pre_hook(
        lambda *_: seen.append(masking_utils.find_packed_sequence_indices))
    with torch.no_grad():
        out = lm.model(**lm.example_inputs)
    assert seen == [original] and out.logits.shape == (1, 8, 32000)
    assert masking_utils.find_packed_sequence_indices is original
