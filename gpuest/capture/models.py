"""Resolve a model spec string into a model and example inputs.

Spec forms:
  resnet50, vit_b_16, ...        a torchvision classification (or segmentation / video) model
  timm:NAME                      a timm model (`pip install "gpuest[timm]"`)
  hf:NAME                        a transformers model from a config shipped in `hf_configs/` (gpt2,
                                 bert-base-uncased, llama, llama-3b) or a JSON config file path
  lstm, gru                      built-in recurrent language models (`zoo.py`)
  path/to/file.py:factory        `factory()` from a Python file: a module, or (module, example_inputs);
                                 a factory with parameters named batch, seq or image_size is given them

By default the model is built on the meta device: no weights are materialised, so even
multi-billion-parameter models load instantly; `trace` needs only shapes and dtypes. With
device="cpu"/"cuda" a real, randomly initialised model and real inputs are built instead.
No weights are ever downloaded.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from ..errors import ModelSpecError
from . import zoo

HF_CONFIG_DIR = Path(__file__).with_name("hf_configs")
FAMILIES = ("vision", "transformer", "recurrent", "other")
DEFAULT_IMAGE_SIZE = 224
DEFAULT_HF_SEQ = 128
DEFAULT_RNN_SEQ = 64
DEFAULT_VIDEO_FRAMES = 16
DEFAULT_VIDEO_SIZE = 112
# torchvision models whose default (weights=None) construction expects another input size.
TORCHVISION_IMAGE_SIZE = {"inception_v3": 299}
# torchvision builders that take the input size as a constructor argument: name prefix -> kwarg.
TORCHVISION_SIZE_KWARG = {"vit_": "image_size", "maxvit_": "input_size"}
HF_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM", "AutoModel")


@dataclass
class LoadedModel:
    name: str  # canonical: "resnet50", "timm:convnext_tiny", "hf:gpt2", "lstm", "file.py:factory"
    family: str  # "vision" | "transformer" | "recurrent" | "other"
    model: nn.Module
    example_inputs: tuple | dict  # positional args, or keyword args
    batch: int


# ---------------------------------------------------------------- public API

MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def load_model(spec: str, *, batch: int = 1, seq: int | None = None, image_size: int | None = None,
               device: str | torch.device = "meta", dtype: torch.dtype | None = None,
               memory_format: str = "contiguous") -> LoadedModel:
    """Build the model named by `spec` with example inputs of batch size `batch`.

    seq: sequence length for transformers (default 128) and recurrent models (default 64).
    image_size: input height/width for vision models; passed to constructors that take it (ViT, MaxViT).
    device: "meta" (default: no weights materialised) or a real device for a randomly initialised model.
    dtype: cast floating-point parameters, buffers and inputs to this dtype.
    memory_format: "channels_last" puts 4-D weights and inputs in NHWC, as `model.to(memory_format=...)` does
        in a channels-last recipe (the trace then records the kernels' NHWC layouts).
    """
    if memory_format not in MEMORY_FORMATS:
        raise ModelSpecError(f"unknown memory_format {memory_format!r}; accepted: {', '.join(MEMORY_FORMATS)}")
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"a model spec must be a non-empty string, got {spec!r}")
    if batch < 1:
        raise ModelSpecError(f"batch must be >= 1, got {batch}")
    if seq is not None and seq < 1:
        raise ModelSpecError(f"seq must be >= 1, got {seq}")
    if image_size is not None and image_size < 1:
        raise ModelSpecError(f"image_size must be >= 1, got {image_size}")
    device = torch.device(device)
    spec = spec.strip()
    if spec.startswith("timm:"):
        loaded = _load_timm(spec[5:], batch, image_size, device)
    elif spec.startswith("hf:"):
        loaded = _load_hf(spec[3:], batch, seq, device)
    elif spec in zoo.ZOO:
        loaded = _load_zoo(spec, batch, seq, device)
    elif _is_file_spec(spec):
        loaded = _load_file(spec, batch, device, seq=seq, image_size=image_size)
    else:
        loaded = _load_torchvision(spec, batch, image_size, device)
    if dtype is not None:
        loaded.model.to(dtype=dtype)  # nn.Module.to(dtype) casts only floating-point tensors
        loaded.example_inputs = _cast_inputs(loaded.example_inputs, dtype)
    if memory_format != "contiguous":
        fmt = MEMORY_FORMATS[memory_format]
        loaded.model.to(memory_format=fmt)   # converts 4-D parameters and buffers only
        loaded.example_inputs = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.contiguous(memory_format=fmt) if t.dim() == 4 else t, loaded.example_inputs)
    return loaded


def list_models(source: str = "torchvision") -> list[str]:
    """Model specs `load_model` accepts from `source`: torchvision, timm, hf, builtin (or all)."""
    if source == "torchvision":
        import torchvision
        return list(torchvision.models.list_models(module=torchvision.models))
    if source == "timm":
        return ["timm:" + n for n in _import_timm().list_models()]
    if source == "hf":
        return ["hf:" + n for n in _shipped_hf_configs()]
    if source in ("builtin", "zoo"):
        return sorted(zoo.ZOO)
    if source == "all":
        out = list_models("torchvision") + list_models("hf") + list_models("builtin")
        with contextlib.suppress(ModelSpecError):
            out += list_models("timm")
        return out
    raise ValueError(f"unknown model source {source!r}; accepted: torchvision, timm, hf, builtin, all")


# ---------------------------------------------------------------- construction helpers

@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Fallback for constructors that read tensor values (e.g. `torch.linspace(...).tolist()`) and so
    fail under `torch.device("meta")`: build on the CPU but move each parameter and buffer to meta as
    soon as it is registered, so at most one tensor is ever materialised at a time."""
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer

    def reg_param(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    def reg_buffer(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        register_buffer(module, name, tensor if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter = reg_param  # type: ignore[method-assign]
    nn.Module.register_buffer = reg_buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def _construct(build: Any, device: torch.device) -> nn.Module:
    """`build()` on `device`; on meta, falls back to per-parameter meta placement if needed. A parameter made
    by a legacy constructor (`torch.FloatTensor(...)`, XLNet's attention weights) ignores the default device
    and is moved there after the build."""
    if device.type != "meta":
        with torch.device(device):
            return build().to(device)
    try:
        with torch.device("meta"):
            return build().to(device)
    except (NotImplementedError, RuntimeError) as exc:
        if "meta" not in str(exc).lower():
            raise
    with _params_on_meta():
        model = build()
    return model.to("meta")


def _image(batch: int, size: int | tuple[int, int], device: torch.device, channels: int = 3,
           frames: int | None = None) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    shape = (batch, channels, h, w) if frames is None else (batch, channels, frames, h, w)
    if device.type == "meta":
        return torch.empty(shape, device=device)
    return torch.randn(shape, device=device)


def _ids(batch: int, seq: int, vocab: int, device: torch.device) -> torch.Tensor:
    if device.type == "meta":
        return torch.empty((batch, seq), dtype=torch.int64, device=device)
    return torch.randint(0, vocab, (batch, seq), dtype=torch.int64, device=device)


def _cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    return torch.utils._pytree.tree_map(
        lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, inputs)


def _close(name: str, candidates: list[str], n: int = 5) -> str:
    matches = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    return f"; did you mean {', '.join(matches)}?" if matches else ""


# ---------------------------------------------------------------- torchvision

def _load_torchvision(name: str, batch: int, image_size: int | None, device: torch.device) -> LoadedModel:
    import torchvision
    classification = torchvision.models.list_models(module=torchvision.models)
    segmentation = torchvision.models.list_models(module=torchvision.models.segmentation)
    video = torchvision.models.list_models(module=torchvision.models.video)
    if name not in classification + segmentation + video:
        known = torchvision.models.list_models()
        if name in known:
            raise ModelSpecError(f"torchvision model {name!r} is not supported (detection, optical flow and "
                                 "quantized models take non-image inputs); pass a file.py:factory that returns "
                                 "(model, example_inputs) instead")
        raise ModelSpecError(
            f"unknown model {name!r}{_close(name, classification + segmentation + video + sorted(zoo.ZOO))} "
            "Accepted: a torchvision classification model name (see `list_models()`), timm:NAME, hf:NAME, "
            "lstm, gru, or path/to/file.py:factory")
    kwargs: dict[str, Any] = {}
    if name in segmentation:
        kwargs["weights_backbone"] = None   # the default would download ImageNet weights for the backbone
    if name in video:
        size: int | tuple[int, int] = image_size or _video_crop_size(name)
    else:
        size = image_size or TORCHVISION_IMAGE_SIZE.get(name, DEFAULT_IMAGE_SIZE)
    if image_size is not None:
        for prefix, kwarg in TORCHVISION_SIZE_KWARG.items():
            if name.startswith(prefix):
                kwargs[kwarg] = image_size if kwarg == "image_size" else (image_size, image_size)
    try:
        model = _construct(lambda: torchvision.models.get_model(name, weights=None, **kwargs), device)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ModelSpecError(f"could not build torchvision model {name!r} with {kwargs or 'defaults'}: {exc}") from exc
    frames = DEFAULT_VIDEO_FRAMES if name in video else None
    x = _image(batch, size, device, frames=frames)
    return LoadedModel(name=name, family=_family(model, default="vision"), model=model, example_inputs=(x,),
                       batch=batch)


def _video_crop_size(name: str) -> int:
    """The frame size a torchvision video model was trained at (its default weights' crop; nothing is downloaded):
    112 for the ResNet-3D family, 224 for S3D, MViT and Swin3D, whose pooling needs it."""
    import torchvision
    crop = torchvision.models.get_model_weights(name).DEFAULT.transforms.keywords.get("crop_size")
    return int(crop[0]) if crop else DEFAULT_VIDEO_SIZE


# ---------------------------------------------------------------- timm

def _import_timm() -> Any:
    try:
        import timm
    except ImportError as exc:
        raise ModelSpecError('timm models need the timm package: pip install "gpuest[timm]"') from exc
    return timm


def _load_timm(name: str, batch: int, image_size: int | None, device: torch.device) -> LoadedModel:
    timm = _import_timm()
    if not name:
        raise ModelSpecError("timm: needs a model name, e.g. timm:convnext_tiny")
    if not timm.is_model(name):
        raise ModelSpecError(f"unknown timm model {name!r}{_close(name, timm.list_models())} "
                             "(see `timm.list_models()`)")
    kwargs: dict[str, Any] = {}
    if image_size is not None:
        kwargs["img_size"] = image_size
    try:
        model = _construct(lambda: timm.create_model(name, pretrained=False, **kwargs), device)
    except TypeError:
        if not kwargs:
            raise
        model = _construct(lambda: timm.create_model(name, pretrained=False), device)  # no img_size argument
    cfg = getattr(model, "pretrained_cfg", None) or {}
    channels, h, w = tuple(cfg.get("input_size", (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)))
    size = (image_size, image_size) if image_size is not None else (h, w)
    x = _image(batch, size, device, channels=channels)
    return LoadedModel(name="timm:" + name, family=_family(model, default="vision"), model=model,
                       example_inputs=(x,), batch=batch)


# ---------------------------------------------------------------- transformers

def _shipped_hf_configs() -> list[str]:
    return sorted(p.stem for p in HF_CONFIG_DIR.glob("*.json"))


def _hf_config_fields(name: str) -> tuple[str, dict[str, Any]]:
    path = HF_CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        candidate = Path(name)
        if candidate.suffix == ".json" and candidate.is_file():
            path = candidate
        else:
            shipped = _shipped_hf_configs()
            raise ModelSpecError(f"unknown hf config {name!r}{_close(name, shipped)} shipped configs: "
                                 f"{', '.join(shipped)} (or give the path of a config .json file)")
    try:
        fields = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSpecError(f"cannot read hf config {path}: {exc}") from exc
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ModelSpecError(f"hf config {path} must be a JSON object with a 'model_type' field")
    return path.stem, fields


def _load_hf(name: str, batch: int, seq: int | None, device: torch.device) -> LoadedModel:
    canonical, fields = _hf_config_fields(name)
    try:
        import transformers
    except ImportError as exc:
        raise ModelSpecError('hf: models need the transformers package: pip install "gpuest[transformers]"') from exc
    fields = {k: v for k, v in fields.items() if not k.startswith("_")}
    model_type = fields.pop("model_type")
    auto_class = fields.pop("auto_class", "AutoModelForCausalLM")
    attention = fields.pop("attn_implementation", "sdpa")   # eager for architectures without an SDPA path
    if auto_class not in HF_AUTO_CLASSES:
        raise ModelSpecError(f"hf config {name!r}: auto_class {auto_class!r} not accepted; "
                             f"accepted: {', '.join(HF_AUTO_CLASSES)}")
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ModelSpecError(f"hf config {name!r}: {exc}") from exc
    seq = seq or DEFAULT_HF_SEQ
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if max_pos is not None and 0 < max_pos < seq:   # XLNet's -1: relative positions, no limit
        raise ModelSpecError(f"seq {seq} exceeds hf:{canonical}'s max_position_embeddings {max_pos}")
    cls = getattr(transformers, auto_class)
    model = _construct(lambda: cls.from_config(config, attn_implementation=attention), device)
    _hf_mask_as_on_device(model)
    inputs = {"input_ids": _ids(batch, seq, int(config.vocab_size), device)}
    if config.is_encoder_decoder:
        # A step of teacher-forced training or scoring: the decoder runs as many tokens as the encoder.
        inputs["decoder_input_ids"] = _ids(batch, seq, int(config.vocab_size), device)
    return LoadedModel(name="hf:" + canonical, family="transformer", model=model,
                       example_inputs=inputs, batch=batch)


# transformers' packed-sequence check, swapped for the duration of a traced forward (innermost last).
_HF_PACKED_CHECK_STACK: list[Any] = []


def _hf_mask_as_on_device(model: nn.Module) -> None:
    """Make a forward on fake tensors build the attention mask a forward on the device builds.

    With no padding mask and no cache, a transformers (>= 5) causal model checks whether the position ids
    it generated itself (an arange) describe several packed sequences; on real tensors they never do, so
    the causal mask is skipped and SDPA is called with attn_mask=None, is_causal=True, which lets CUDA run
    a mask-free kernel (flash) for fp16/bf16. On FakeTensors the check cannot read the values and assumes
    packing, so the mask is materialised and `trace` would record masked (memory-efficient) attention.
    For a forward on fake inputs whose caller passed no position ids (so the model generates the arange),
    the check answers "not packed", as on the device, after running the same ops. Forwards on real
    tensors (calibration runs), under torch.compile, or with caller-given position ids are untouched, and
    transformers' function is restored when the forward returns or raises.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        return
    if not callable(getattr(masking_utils, "find_packed_sequence_indices", None)):
        return  # transformers without the check: nothing to align
    model.register_forward_pre_hook(_hf_forward_enter, with_kwargs=True)
    model.register_forward_hook(_hf_forward_exit, with_kwargs=True, always_call=True)


def _is_fake(x: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(x, FakeTensor)


def _hf_forward_enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
    from transformers import masking_utils
    current = masking_utils.find_packed_sequence_indices
    _HF_PACKED_CHECK_STACK.append(current)  # restored by _hf_forward_exit, whether swapped or not
    if torch.compiler.is_compiling() or not any(_is_fake(x) for x in (*args, *kwargs.values())):
        return
    try:
        given = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return
    if given.get("position_ids") is not None or kwargs.get("position_ids") is not None:
        return

    def find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
        packed = current(position_ids)
        if packed is None or not _is_fake(packed):
            return packed
        (packed[:, -1] == 0).all()  # the ops the device runs before reading the answer (no packing)
        return None

    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices


def _hf_forward_exit(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    if _HF_PACKED_CHECK_STACK:
        from transformers import masking_utils
        masking_utils.find_packed_sequence_indices = _HF_PACKED_CHECK_STACK.pop()


# ---------------------------------------------------------------- built-in zoo

def _load_zoo(name: str, batch: int, seq: int | None, device: torch.device) -> LoadedModel:
    model = _construct(zoo.ZOO[name], device)
    ids = _ids(batch, seq or DEFAULT_RNN_SEQ, model.vocab_size, device)
    return LoadedModel(name=name, family="recurrent", model=model, example_inputs=(ids,), batch=batch)


# ---------------------------------------------------------------- file.py:factory

def _is_file_spec(spec: str) -> bool:
    path = spec.rsplit(":", 1)[0] if ":" in spec else spec
    return path.endswith(".py") or "/" in spec or "\\" in spec


def _load_file(spec: str, batch: int, device: torch.device, seq: int | None = None,
               image_size: int | None = None) -> LoadedModel:
    path_str, sep, factory_name = spec.rpartition(":")
    if not sep or not path_str.endswith(".py"):
        path_str, factory_name = spec, ""
    path = Path(path_str).expanduser()
    if not path.is_file() or path.suffix != ".py":
        raise ModelSpecError(f"model file {str(path)!r} does not exist or is not a .py file "
                             "(expected path/to/file.py:factory)")
    module_name = f"_gpuest_user_{abs(hash(str(path.resolve())))}"
    mod_spec = importlib.util.spec_from_file_location(module_name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise ModelSpecError(f"cannot import {path}")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[module_name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ModelSpecError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    callables = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
    if not factory_name:
        raise ModelSpecError(f"no factory named in {spec!r}: write {path}:FACTORY; "
                             f"callables in the file: {', '.join(callables) or 'none'}")
    factory = getattr(module, factory_name, None)
    if factory is None or not callable(factory):
        raise ModelSpecError(f"{path} has no callable {factory_name!r}{_close(factory_name, callables)} "
                             f"callables in the file: {', '.join(callables) or 'none'}")
    sizes = {"batch": batch, "seq": seq, "image_size": image_size}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):   # a builtin or C callable without an inspectable signature
        accepted = {}
    with torch.device(device):
        result = factory(**{k: v for k, v in sizes.items() if k in accepted and v is not None})
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        model, inputs = result
    elif isinstance(result, nn.Module):
        model, inputs = result, _guess_inputs(result, batch, device)
        if inputs is None:
            raise ModelSpecError(f"{spec}: cannot guess example inputs for {type(result).__name__}; "
                                 "make the factory return (module, example_inputs)")
    else:
        raise ModelSpecError(f"{spec} returned {type(result).__name__}; the factory must return a "
                             "torch.nn.Module or a (module, example_inputs) tuple")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, (tuple, dict)):
        raise ModelSpecError(f"{spec}: example_inputs must be a tensor, a tuple of args or a dict of kwargs, "
                             f"got {type(inputs).__name__}")
    if device.type == "meta":
        model = model.to("meta")
    first = next((t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)), None)
    inferred = int(first.shape[0]) if first is not None and first.dim() > 0 else batch
    if batch > 1 and inferred != batch:
        raise ModelSpecError(f"{spec}: batch {batch} was asked for but the factory's example inputs have batch "
                             f"{inferred}; give {factory_name}() a `batch` parameter (gpuest passes --batch to it) "
                             "or build its inputs at that batch")
    return LoadedModel(name=f"{path.name}:{factory_name}", family=_family(model, default="other"),
                       model=model, example_inputs=inputs, batch=inferred)


def _guess_inputs(model: nn.Module, batch: int, device: torch.device) -> tuple | None:
    """Inputs for a module returned alone, from its first layer: image, feature vector or token ids."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            return (_image(batch, DEFAULT_IMAGE_SIZE, device, channels=m.in_channels),)
        if isinstance(m, nn.Conv1d):
            shape = (batch, m.in_channels, DEFAULT_RNN_SEQ)
            return (torch.empty(shape, device=device) if device.type == "meta" else torch.randn(shape, device=device),)
        if isinstance(m, nn.Embedding):
            return (_ids(batch, DEFAULT_RNN_SEQ, m.num_embeddings, device),)
        if isinstance(m, nn.Linear):
            shape = (batch, m.in_features)
            return (torch.empty(shape, device=device) if device.type == "meta" else torch.randn(shape, device=device),)
    return None


def _family(model: nn.Module, default: str) -> str:
    kinds = [type(m) for m in model.modules()]
    if any(issubclass(k, nn.RNNBase) for k in kinds):
        return "recurrent"
    if default == "vision":
        return default
    if any(issubclass(k, (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))
           or "attention" in k.__name__.lower() for k in kinds):
        return "transformer"
    if any(issubclass(k, nn.modules.conv._ConvNd) for k in kinds):
        return "vision"
    return default


__all__ = ["FAMILIES", "LoadedModel", "list_models", "load_model"]
