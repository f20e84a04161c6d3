"""`gpuest.capture.models.load_model`: spec forms, devices, dtypes, input shapes and errors."""
from __future__ import annotations

import subprocess
import json
import sys
import textwrap
from pathlib import Path

import networkx as nx
import pytest
import torch
import torchvision

import gpuest
from gpuest.capture.models import LoadedModel, list_models, load_model
from gpuest.capture.zoo import RecurrentLM
from gpuest.errors import ModelSpecError


def _all_meta(model: torch.nn.Module) -> bool:
    return all(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers()))


# ---------------------------------------------------------------- torchvision

def test_torchvision_default_is_meta_at_224():
    lm = load_model("resnet50", batch=3)
    assert isinstance(lm, LoadedModel)
    assert (lm.name, lm.family, lm.batch) == ("resnet50", "vision", 3)
    assert _all_meta(lm.model)
    (x,) = lm.example_inputs
    assert x.shape == (3, 3, 224, 224) and x.device.type == "meta" and x.dtype == torch.float32
    assert sum(p.numel() for p in lm.model.parameters()) == 25_557_032  # resnet50's published count


def test_inception_uses_its_own_input_size():
    lm = load_model("inception_v3")
    assert lm.example_inputs[0].shape == (1, 3, 299, 299)


@pytest.mark.parametrize("size", [None, 64])
def test_vit_image_size_reaches_constructor(size):
    lm = load_model("vit_b_16", batch=2, image_size=size)
    expected = size or 224
    assert lm.model.image_size == expected
    assert lm.example_inputs[0].shape == (2, 3, expected, expected)
    # the position embedding has one token per 16x16 patch plus the class token
    assert lm.model.encoder.pos_embedding.shape[1] == (expected // 16) ** 2 + 1


def test_image_size_for_plain_cnn_only_changes_inputs():
    lm = load_model("resnet18", batch=2, image_size=96)
    assert lm.example_inputs[0].shape == (2, 3, 96, 96)


def test_cpu_device_builds_a_real_model_that_runs():
    lm = load_model("resnet18", batch=2, image_size=64, device="cpu")
    assert all(p.device.type == "cpu" for p in lm.model.parameters())
    assert lm.model.conv1.weight.abs().sum() > 0  # randomly initialised, not empty
    with torch.no_grad():
        out = lm.model.eval()(*lm.example_inputs)
    assert out.shape == (2, 1000) and torch.isfinite(out).all()


def test_dtype_casts_floating_params_and_inputs():
    lm = load_model("resnet18", batch=1, image_size=32, dtype=torch.bfloat16)
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    assert lm.model.bn1.num_batches_tracked.dtype == torch.int64  # integer buffers are left alone
    assert lm.example_inputs[0].dtype == torch.bfloat16


def test_list_models_torchvision():
    assert list_models() == torchvision.models.list_models(module=torchvision.models)
    assert "resnet50" in list_models("torchvision")
    assert set(list_models("builtin")) == {"lstm", "gru"}
    with pytest.raises(ValueError, match="torchvision, timm, hf"):
        list_models("nope")


def test_unknown_torchvision_name_suggests_close_matches():
    with pytest.raises(ModelSpecError) as err:
        load_model("resnet5")
    msg = str(err.value)
    assert "resnet5" in msg and "resnet50" in msg and "timm:" in msg


# ---------------------------------------------------------------- timm

def test_timm_input_size_from_pretrained_cfg():
    pytest.importorskip("timm")
    lm = load_model("timm:mobilevitv2_050", batch=2)
    assert lm.name == "timm:mobilevitv2_050" and lm.family == "vision"
    assert lm.example_inputs[0].shape == (2, *lm.model.pretrained_cfg["input_size"]) == (2, 3, 256, 256)
    assert _all_meta(lm.model)


def test_timm_unknown_name():
    pytest.importorskip("timm")
    with pytest.raises(ModelSpecError, match="convnext_tiny"):
        load_model("timm:convnext_tinny")


def test_timm_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` raise ImportError
    with pytest.raises(ModelSpecError, match=r'pip install "gpuest\[timm\]"'):
        load_model("timm:resnet18")


# ---------------------------------------------------------------- transformers

@pytest.mark.parametrize("spec,cls_name,vocab", [
    ("hf:gpt2", "GPT2LMHeadModel", 50257),
    ("hf:bert-base-uncased", "BertForMaskedLM", 30522),
    ("hf:llama", "LlamaForCausalLM", 32000),
])
def test_hf_shipped_configs(spec, cls_name, vocab):
    pytest.importorskip("transformers")
    lm = load_model(spec, batch=2, seq=24)
    assert lm.name == spec and lm.family == "transformer" and type(lm.model).__name__ == cls_name
    assert lm.model.config._attn_implementation == "sdpa"
    assert lm.model.config.vocab_size == vocab
    assert set(lm.example_inputs) == {"input_ids"}
    ids = lm.example_inputs["input_ids"]
    assert ids.shape == (2, 24) and ids.dtype == torch.int64 and ids.device.type == "meta"
    assert _all_meta(lm.model)


def test_hf_default_seq_and_real_ids_within_vocab():
    pytest.importorskip("transformers")
    assert load_model("hf:gpt2").example_inputs["input_ids"].shape == (1, 128)
    lm = load_model("hf:llama", batch=2, seq=16, device="cpu")
    ids = lm.example_inputs["input_ids"]
    assert ids.min() >= 0 and ids.max() < lm.model.config.vocab_size
    with torch.no_grad():
        logits = lm.model.eval()(**lm.example_inputs).logits
    assert logits.shape == (2, 16, 32000)


def test_hf_llama_3b_is_about_3b_params_on_meta():
    pytest.importorskip("transformers")
    lm = load_model("hf:llama-3b")
    n = sum(p.numel() for p in lm.model.parameters())
    assert 3.0e9 < n < 3.4e9
    assert _all_meta(lm.model)


def test_hf_encoder_decoder_gets_decoder_ids_and_traces_both_stacks(tmp_path):
    """A seq2seq config (T5-shaped, tiny) gets decoder_input_ids as long as input_ids, and a training trace
    runs encoder and decoder, forward and backward."""
    pytest.importorskip("transformers")
    from gpuest.capture.trace import trace
    cfg = {"model_type": "t5", "auto_class": "AutoModelForSeq2SeqLM", "attn_implementation": "eager",
           "vocab_size": 96, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
           "decoder_start_token_id": 0, "pad_token_id": 0, "use_cache": False}
    path = tmp_path / "t5-tiny.json"
    path.write_text(json.dumps(cfg))
    lm = load_model(f"hf:{path}", batch=2, seq=12)
    assert set(lm.example_inputs) == {"input_ids", "decoder_input_ids"}
    assert lm.example_inputs["decoder_input_ids"].shape == (2, 12)
    g = trace(lm.model, lm.example_inputs, mode="training")
    modules = {d["module"] for _, d in g.nodes(data=True) if d["phase"] == "backward"}
    assert {"encoder", "decoder"} <= {m.split(".")[0] for m in modules}


def test_segmentation_model_builds_without_downloading_backbone_weights(monkeypatch):
    """weights=None alone leaves torchvision's segmentation backbones at their ImageNet default (a
    download); the loader asks for none."""
    import torch.hub
    def no_download(*args, **kwargs):
        raise AssertionError("tried to download weights")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    lm = load_model("lraspp_mobilenet_v3_large", batch=1, image_size=64)
    assert _all_meta(lm.model)


def test_hf_unknown_config_lists_shipped():
    with pytest.raises(ModelSpecError) as err:
        load_model("hf:gpt3")
    msg = str(err.value)
    for shipped in ("gpt2", "bert-base-uncased", "llama", "llama-3b"):
        assert shipped in msg
    assert set(list_models("hf")) >= {"hf:gpt2", "hf:bert-base-uncased", "hf:llama", "hf:llama-3b"}


def test_hf_seq_beyond_positions_rejected():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="1024"):
        load_model("hf:gpt2", seq=2048)


def test_transformers_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelSpecError, match=r'pip install "gpuest\[transformers\]"'):
        load_model("hf:gpt2")


def test_no_optional_imports_at_module_import():
    code = ("import sys, gpuest.capture.models, gpuest.capture.zoo; "
            "bad = [m for m in ('timm', 'transformers') if m in sys.modules]; assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- built-in recurrent models

@pytest.mark.parametrize("cell,rnn_cls", [("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)])
def test_zoo_recurrent(cell, rnn_cls):
    lm = load_model(cell, batch=4)
    assert lm.name == cell and lm.family == "recurrent" and isinstance(lm.model, RecurrentLM)
    rnn = lm.model.rnn
    assert type(rnn) is rnn_cls and rnn.num_layers == 2 and rnn.hidden_size == 512 and rnn.batch_first
    assert lm.model.embedding.num_embeddings == 10000 and lm.model.head.out_features == 10000
    (ids,) = lm.example_inputs
    assert ids.shape == (4, 64) and ids.dtype == torch.int64
    real = load_model(cell, batch=2, seq=8, device="cpu")
    assert real.example_inputs[0].max() < 10000
    with torch.no_grad():
        assert real.model(*real.example_inputs).shape == (2, 8, 10000)


# ---------------------------------------------------------------- path/to/file.py:factory

def _write(tmp_path, body: str):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_file_factory_returning_module_and_inputs(tmp_path):
    path = _write(tmp_path, """
        import torch
        def build():
            return torch.nn.Linear(8, 4), (torch.randn(5, 8),)
    """)
    lm = load_model(f"{path}:build")
    assert lm.name == "my_model.py:build" and lm.batch == 5
    assert _all_meta(lm.model)
    assert lm.example_inputs[0].shape == (5, 8)


def test_file_factory_gets_the_batch_it_asks_for_and_a_fixed_batch_is_not_overridden_silently(tmp_path):
    path = _write(tmp_path, """
        import torch
        def sized(batch, seq=16):
            return torch.nn.Linear(8, 4), (torch.randn(batch, seq, 8),)
        def fixed():
            return torch.nn.Linear(8, 4), (torch.randn(1, 8),)
    """)
    lm = load_model(f"{path}:sized", batch=6, seq=3)
    assert lm.batch == 6 and lm.example_inputs[0].shape == (6, 3, 8)
    assert load_model(f"{path}:fixed").batch == 1
    with pytest.raises(ModelSpecError, match="batch 6 was asked for.*batch 1.*`batch` parameter"):
        load_model(f"{path}:fixed", batch=6)


def test_file_factory_returning_module_only_gets_guessed_inputs(tmp_path):
    path = _write(tmp_path, """
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    """)
    lm = load_model(f"{path}:build", batch=2)
    assert lm.family == "vision" and lm.example_inputs[0].shape == (2, 3, 224, 224)


def test_file_errors(tmp_path):
    path = _write(tmp_path, """
        import torch
        def build():
            return torch.nn.Linear(2, 2)
        def not_a_model():
            return 42
    """)
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model(f"{tmp_path / 'missing.py'}:build")
    with pytest.raises(ModelSpecError, match="no callable 'biuld'.*build"):
        load_model(f"{path}:biuld")
    with pytest.raises(ModelSpecError, match="returned int"):
        load_model(f"{path}:not_a_model")
    with pytest.raises(ModelSpecError, match="no factory"):
        load_model(str(path))


def test_an_hf_sequence_beyond_its_position_table_is_refused_and_an_unbounded_one_is_not():
    """A sequence longer than max_position_embeddings is a ModelSpecError naming the limit; XLNet's -1
    (relative positions, no table) bounds nothing."""
    from gpuest.errors import ModelSpecError
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="exceeds hf:bert-base-uncased's max_position_embeddings 512"):
        load_model("hf:bert-base-uncased", batch=1, seq=513)
    loaded = load_model("hf:xlnet-base", batch=1, seq=4096)
    assert loaded.example_inputs["input_ids"].shape == (1, 4096)


def test_parameters_made_by_a_legacy_constructor_land_on_the_requested_device():
    """XLNet makes its attention weights with torch.FloatTensor(...), which ignores the default device: built
    for the GPU they stayed on the CPU and its first einsum failed there (the H200 families run). The loader
    moves every parameter to the device it was asked for."""
    pytest.importorskip("transformers")
    lm = load_model("hf:xlnet-base", batch=1, seq=16)
    assert _all_meta(lm.model)


def test_cli_channels_last_traces_nhwc_kernels(tmp_path, capsys):
    """--channels-last builds the model as a channels-last recipe does: the convolutions the graph records take
    NHWC activations, and the estimate differs from the contiguous one."""
    from gpuest.cli import main
    words = ["resnet18", "--batch", "2", "--image-size", "64", "--precision", "bf16-mixed", "--gpu", "H100", "--json"]
    assert main(["estimate", *words]) == 0
    contiguous = json.loads(capsys.readouterr().out)
    assert main(["estimate", *words, "--channels-last"]) == 0
    nhwc = json.loads(capsys.readouterr().out)
    assert nhwc["device_time_s"] != contiguous["device_time_s"]
    assert main(["graph", "resnet18", "--batch", "2", "--image-size", "64", "--channels-last",
                 "-o", str(tmp_path / "g.graphml")]) == 0
    g = nx.read_graphml(tmp_path / "g.graphml")
    convs = [d for _, d in g.nodes(data=True) if d["op"] == "aten.convolution.default"]
    assert convs and all(d["channels_last"] for d in convs)


@pytest.mark.parametrize("name, size", [("r3d_18", 112), ("s3d", 224), ("mvit_v2_s", 224), ("swin3d_t", 224)])
def test_video_models_take_the_frames_they_were_trained_on(name, size):
    """S3D's and MViT's pooling needs 224-pixel frames (112 failed to trace); the ResNet-3D family takes 112."""
    loaded = load_model(name, batch=1)
    assert tuple(loaded.example_inputs[0].shape) == (1, 3, 16, size, size)
    if name == "s3d":
        assert gpuest.trace(loaded.model, loaded.example_inputs).number_of_nodes() > 0
