"""Record every ATen op a model dispatches, with its cost, module and data dependencies.

This is the same machinery `make_fx` is built on (a `TorchDispatchMode` under fake tensors),
used directly because we need two things make_fx does not give us across torch 2.11-2.14:
the module each *backward* op differentiates (from `torch.utils.module_tracker`) and the
optimizer step as it really runs (foreach ops), all in one pass with no weights materialised.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from ..annotate.formulas.rnn import RNN_MODE_GATES, RNNWork, cudnn_rnn_work  # (also registers the formulas)
from ..annotate.math_mode import TF32Policy, dtype_name, math_mode
from ..annotate.registry import (REGISTRY, TENSOR_CORE_CATEGORIES, Cost, OpCall, bind_args, is_channels_last,
                                 node_attrs, storage_key, tensor_bytes, tensors, unique_bytes)
from .cuda_autocast import call_with_cuda_policy
from .fused_library_calls import (FUSED_MODULES, cudnn_rnn_call, cudnn_rnn_dtype, efficient_attention_call,
                                  rnn_steps_and_batch, takes_efficient_bias_path)
from .grouped_mm import FAKE_SUBSTITUTES
from .mha_fast_path import fast_path_call, takes_fast_path
from .normalize import cuda_op_name
from .routing import RoutingAssumption, RoutingValues
from .storage_events import StorageEvents


class ModulePathTracker(ModuleTracker):
    """torch's ModuleTracker, which skips its backward hooks while autograd records nothing.

    Under no_grad a view of a parameter still requires grad but has no autograd node (timm CaiT passes
    `cls_token.expand(...)` to a block), and ModuleTracker's hook registration fails on it; an inference
    step has no backward for those hooks to track, so forward tracking alone is kept there."""

    def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:
        if torch.is_grad_enabled():
            super()._fw_pre_hook(mod, input)
        else:
            self._get_append_fn(self._get_mod_name(mod), False)()

    def _fw_post_hook(self, mod: torch.nn.Module, input: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            super()._fw_post_hook(mod, input, output)
        else:
            self._get_pop_fn(self._get_mod_name(mod), False)()


# Dispatcher namespaces that carry no device work (device queries, profiler markers).
IGNORED_NAMESPACES = frozenset({"prim", "profiler"})


MAX_SHAPES_LISTED = 8


def _shapes(ts: list[torch.Tensor]) -> str:
    """'8x3x224x224;64x3x7x7'; long tensor lists (foreach ops) are cut after a few."""
    listed = ";".join("x".join(str(d) for d in t.shape) or "scalar" for t in ts[:MAX_SHAPES_LISTED])
    return listed + (f";...({len(ts)} tensors)" if len(ts) > MAX_SHAPES_LISTED else "")


def _compute_dtype(call: OpCall) -> torch.dtype | None:
    for t in call.inputs:
        if t.dtype.is_floating_point and t.dim() > 0:
            return t.dtype
    outs = call.outputs
    return outs[0].dtype if outs else None


class RNNCall(NamedTuple):
    """One call of a recurrent module: its time steps, batch and the dtype cuDNN computes in."""

    steps: int
    batch: int
    dtype: torch.dtype
    input_shape: str       # the input's shape, as node input_shapes write it
    output_shape: str      # the output sequence's shape


class RNNLaunches(NamedTuple):
    """What cuDNN runs for one recurrent module call, over all its layers and directions, the dtype it
    computes in, and the call as the node describes it."""

    work: RNNWork
    dtype: torch.dtype
    module_type: str       # the recurrent module's class, e.g. nn.LSTM
    call: RNNCall


@dataclass
class RecordedNode:
    """Attributes of one graph node; every value is a scalar or string (GraphML-safe)."""

    attrs: dict[str, Any]
    inputs: list[int] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)   # storage events during and after it (StorageEvents)


class OpRecorder(TorchDispatchMode):
    """Records ops into `nodes`; `phase` is set by the driver around forward/loss/backward/step."""

    def __init__(self, tracker: ModuleTracker, modules_by_name: dict[str, torch.nn.Module],
                 root_name: str, tf32: TF32Policy, run_op: RoutingValues | None = None) -> None:
        super().__init__()
        # Runs each op: on fake tensors, and on routing values where it has them (routing.RoutingValues).
        self.run_op = run_op or RoutingValues(RoutingAssumption(), FAKE_SUBSTITUTES)
        self.tracker = tracker
        self.modules_by_name = modules_by_name
        self.root_prefix = root_name + "."
        self.tf32 = tf32
        self.phase = "forward"
        self.autocast = False   # set by the driver while autocast is on (mixed precision forward and loss)
        self.nodes: list[RecordedNode] = []
        self.sdpa_backends: set[str] = set()
        self._writer: dict[int, int] = {}
        # Storage lifetimes; a storage's key may be reused once it dies, so state keyed by it is dropped then.
        self.storages = StorageEvents(self._forget)
        self.early_memory: list[str] = []   # storage events before the first node
        self._fused_scope = ""                     # the module of the current fused node (a library call)
        self._fused_key: tuple | None = None
        self._fused_seen: set[int] = set()       # storages the current fused node already reads or writes
        self._fused_written: dict[int, float] = {}  # storages it wrote that nothing inside it read yet
        self._fused_rnn: RNNLaunches | None = None    # what the current fused node runs, if a known RNN call
        self._entered: list[str] = []  # active modules in the order they were entered
        self._module_calls = 0  # Python module calls since the last recorded op (host overhead)
        self._rnn_calls: dict[int, RNNCall] = {}  # each recurrent module's last call, by id

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = self.run_op(func, args, kwargs)
        self.storages.drain(self.memory_events())
        if func.namespace not in IGNORED_NAMESPACES:
            call = OpCall(func, args, kwargs, out, self.run_op.numpy_of)
            for copy in REGISTRY.staged_copies(call):
                self._record(copy, staged_for=str(func))
            self._record(call)
        return out

    def count_module_call(self, module: torch.nn.Module, args: Any) -> None:
        """Forward pre-hook: eager nn.Module.__call__ costs host time of its own. Also notes the time
        steps, batch and dtype of a recurrent module's call (its fused node's kernels and work follow
        cuDNN's, not the ops the CPU path decomposes it into)."""
        self._module_calls += 1
        x = args[0] if args else None
        if isinstance(module, torch.nn.RNNBase) and isinstance(x, torch.Tensor) and x.dim() in (2, 3):
            steps, batch = rnn_steps_and_batch(x, module.batch_first)
            out_shape = (*x.shape[:-1], module.hidden_size * (2 if module.bidirectional else 1))
            self._rnn_calls[id(module)] = RNNCall(steps, batch, self._rnn_dtype(module, x),
                                                  _shapes([x]), "x".join(map(str, out_shape)))

    def _rnn_dtype(self, module: torch.nn.Module, x: torch.Tensor) -> torch.dtype:
        """The dtype cuDNN runs a recurrent module's call in (fused_library_calls.cudnn_rnn_dtype)."""
        weights = next((p.dtype for p in module.parameters() if p.dtype.is_floating_point), x.dtype)
        return cudnn_rnn_dtype(weights, self.autocast)

    def _fused_attrs(self, call: OpCall, cost: Cost, category: str, dtype: torch.dtype | None,
                     rnn: RNNLaunches | None) -> dict[str, Any]:
        """Attributes of a fused node at its first op that the library call decides, not the op: for a
        recurrent module whose steps are known, cuDNN's kernels, grid barriers, serial steps, FLOPs and
        GEMM shape, and the bytes of its first op's inputs and of the weights it re-reads (later ops add
        only their new tensors, _merge); else the op's own GEMM kernels plus one (later GEMMs add theirs
        in _merge), no barriers and its serial steps."""
        if rnn is None:
            return {"math_mode": math_mode(category, dtype, self.tf32), "grid_syncs": 0,
                    "serial_steps": float(cost.serial_steps),
                    "kernels": (cost.kernels if TENSOR_CORE_CATEGORIES & {category, cost.category} else 0) + 1}
        work = rnn.work
        # Its formula prices the whole call, whatever ops stand in for it on the CPU.
        return {"supported": True, "math_mode": self._rnn_math_mode(rnn.dtype, rnn), "dtype": dtype_name(rnn.dtype),
                "cpu_op": rnn.module_type, "input_shapes": rnn.call.input_shape, "output_shapes": rnn.call.output_shape,
                "permuted": False, "grid_syncs": work.grid_syncs, "serial_steps": work.serial_steps,
                "kernels": work.kernels, "flops": work.flops, "bytes_read": work.bytes_read,
                "bytes_written": work.bytes_written,
                "gemm_m": work.gemm_mnk[0], "gemm_n": work.gemm_mnk[1], "gemm_k": work.gemm_mnk[2]}

    def _rnn_math_mode(self, dtype: torch.dtype | None, rnn: RNNLaunches | None) -> str:
        """Math mode of a fused recurrent node: a persistent cuDNN recurrence multiplies its fp32 weights
        with FMAs (RNN_blockPersist_*_FMA), not on tensor cores, whatever TF32 allows."""
        mode = math_mode("rnn", dtype, self.tf32)
        return "fp32" if mode == "tf32" and rnn is not None and rnn.work.grid_syncs else mode

    def _rnn_launches(self) -> RNNLaunches | None:
        """What cuDNN runs for the recurrent module of the current fused node, over all its layers and
        directions, if its time steps are known."""
        mod = self.modules_by_name.get(self._fused_scope)
        call = self._rnn_calls.get(id(mod))
        if not isinstance(mod, torch.nn.RNNBase) or call is None:
            return None
        work = cudnn_rnn_work(RNN_MODE_GATES.get(mod.mode, 4), call.steps, call.batch, mod.input_size,
                              mod.hidden_size, mod.num_layers, 2 if mod.bidirectional else 1,
                              self.phase == "backward", torch.finfo(call.dtype).bits // 8)
        return RNNLaunches(work, call.dtype, f"nn.{type(mod).__name__}", call)

    # ------------------------------------------------------------------ helpers
    def memory_events(self) -> list[str]:
        """The event list storage events happening now belong to: the last recorded node's."""
        return self.nodes[-1].memory if self.nodes else self.early_memory

    def _forget(self, key: int) -> None:
        """A storage died: its key may now name a new storage, which no earlier writer produced."""
        self._writer.pop(key, None)
        self._fused_seen.discard(key)
        self._fused_written.pop(key, None)

    def current_module(self) -> str:
        """The most recently entered module that is still active.

        Not simply the deepest: in backward, ModuleTracker keeps a branch (e.g. a ResNet downsample)
        active until the gradient of its shared input is complete, while sibling modules run."""
        parents = {p for p in self.tracker.parents if p != "Global"}
        self._entered = [p for p in self._entered if p in parents]
        self._entered.extend(sorted(parents.difference(self._entered), key=lambda p: p.count(".")))
        if not self._entered:
            return ""
        top = self._entered[-1]
        return top[len(self.root_prefix):] if top.startswith(self.root_prefix) else ""

    def current_module_object(self) -> torch.nn.Module | None:
        """The module `current_module` names (None outside the model's modules)."""
        return self.modules_by_name.get(self.current_module())

    def _fused_call(self, module: str) -> tuple[str, str] | None:
        """(the fused module's name, the library call it runs as), if `module` lies inside one."""
        if self.phase not in ("forward", "backward"):
            return None    # the loss and the optimizer step run outside any module's library call
        parts = module.split(".") if module else []
        # Innermost first, down to the traced model itself ("": an nn.LSTM traced on its own).
        for scope in [".".join(parts[:depth]) for depth in range(len(parts), 0, -1)] + [""]:
            mod = self.modules_by_name.get(scope)
            for cls, (fwd, bwd) in FUSED_MODULES.items():
                if isinstance(mod, cls):
                    return scope, bwd if self.phase == "backward" else fwd
        return None

    def _record(self, call: OpCall, staged_for: str = "") -> None:
        """Add `call` as a node (or merge it into the fused node it belongs to); `staged_for`: the op whose
        kernel makes this copy of its input (REGISTRY.staged_copies), "" for an op the model dispatched."""
        cost: Cost = REGISTRY.cost(call)
        module = self.current_module()
        op, backend = cuda_op_name(call.func, call.args, call.kwargs)
        if backend:
            self.sdpa_backends.add(backend)
        inputs, outputs = call.inputs, call.outputs
        producers = sorted({self._writer[k] for k in map(storage_key, inputs) if k in self._writer})
        fused_call = self._fused_call(module)
        fused = fused_call[1] if fused_call else None
        if fused_call:
            self._fused_scope = fused_call[0]
        if fused is not None:
            key = (self._fused_scope, self.phase)
            if self._fused_key == key and self.nodes and cost.category == "view":
                # Metadata ops inside a library call do not exist on the CUDA path; what they allocate does.
                self.storages.touch(outputs, self.nodes[-1].memory)
                return
            if self._fused_key == key and self.nodes:
                self._merge(len(self.nodes) - 1, call, cost, producers, outputs)
                return
            self._fused_key = key
            self._fused_seen = {storage_key(t) for t in inputs + outputs}
            self._fused_written = {storage_key(t): tensor_bytes(t) for t in outputs}
            module = self._fused_scope
        else:
            self._fused_key = None
        dtype = _compute_dtype(call)
        category = "rnn" if fused else cost.category
        attrs = {
            "op": fused or op,
            "cpu_op": str(call.func),
            "phase": self.phase,
            "module": module,
            "input_shapes": _shapes(inputs),
            "output_shapes": _shapes(outputs),
            "dtype": dtype_name(dtype),
            "math_mode": math_mode(category, dtype, self.tf32),
            **node_attrs(cost),
            "category": category,
            "free": cost.category == "view" and not fused,
            "staged_for": staged_for,
            "fused_ops": 1,
            "module_calls": self._module_calls,
            "autocast": self.autocast,
        }
        if fused:
            self._fused_rnn = self._rnn_launches()
            attrs.update(self._fused_attrs(call, cost, category, dtype, self._fused_rnn))
        self._module_calls = 0
        self.nodes.append(RecordedNode(attrs, producers))
        index = len(self.nodes) - 1
        if cost.category != "view":
            for t in outputs:
                self._writer[storage_key(t)] = index
        self.storages.touch(inputs + outputs, self.nodes[index].memory)

    def _merge(self, index: int, call: OpCall, cost: Cost, producers: list[int], outputs: list[torch.Tensor]) -> None:
        node = self.nodes[index]
        a = node.attrs
        rnn = self._fused_rnn
        if rnn is None:   # a recurrent module's work is its own, set when it began
            a["flops"] += float(cost.flops)
        a["flops_skipped"] += float(cost.flops_skipped)
        if rnn is None:   # a known recurrent call's bytes are its formula's, _fused_attrs
            self._merge_bytes(a, call, outputs)
        a["fused_ops"] += 1
        if cost.category in TENSOR_CORE_CATEGORIES and rnn is None:
            a["kernels"] += cost.kernels
            if cost.gemm_mnk != (0, 0, 0):
                a["gemm_m"], a["gemm_n"], a["gemm_k"] = cost.gemm_mnk
            if a["math_mode"] == "int":   # a call that began with an integer op (a length, an index)
                a["math_mode"] = self._rnn_math_mode(torch.float32, None)
        a["supported"] = a["supported"] and (cost.supported or rnn is not None)
        node.inputs = sorted(set(node.inputs) | {p for p in producers if p != index})
        for t in outputs:
            self._writer[storage_key(t)] = index
        self.storages.touch(call.inputs + outputs, node.memory)

    def _merge_bytes(self, a: dict[str, Any], call: OpCall, outputs: list[torch.Tensor]) -> None:
        """One library call moves each tensor once: a value one of its ops writes and a later one reads
        stays inside the call (registers/SMEM); what is written and never read inside (outputs, saved
        activations) reaches memory."""
        a["bytes_read"] += unique_bytes(t for t in call.inputs if storage_key(t) not in self._fused_seen)
        for key in {storage_key(t) for t in call.inputs} & self._fused_written.keys():
            a["bytes_written"] -= self._fused_written.pop(key)
        new_out = {storage_key(t): t for t in outputs if storage_key(t) not in self._fused_seen}
        a["bytes_written"] += sum(tensor_bytes(t) for t in new_out.values())
        self._fused_written.update((k, tensor_bytes(t)) for k, t in new_out.items())
        self._fused_seen.update(storage_key(t) for t in call.inputs + outputs)


class CudaFunctionPaths(TorchFunctionMode):
    """Trace the fused kernels CUDA runs where the CPU takes a composite path.

    - Attention with dropout: CUDA's flash and memory-efficient SDPA kernels apply dropout inside the
      kernel; the CPU falls back to the math path (bmm, softmax, dropout, bmm) whenever dropout_p > 0.
      Calling SDPA with dropout_p=0 keeps it one kernel with the same FLOPs and traffic.
    - Dropout: on CUDA `aten::dropout` is one `native_dropout` kernel (output and mask) and its gradient
      one `native_dropout_backward`, when 0 < p < 1; the CPU composes bernoulli_, div_ and mul. In-place
      dropout takes the composite path on CUDA too and is left alone.
    - Convolution bias: cuDNN convolves without it and PyTorch adds it after, a broadcast add that reads
      and writes the whole output (a quarter of VGG-16's bf16 inference kernel time on an H100); its gradient is a
      separate reduction. The CPU fuses it. PyTorch's own depthwise kernels add it in the kernel, but
      those only take NCHW data: a depthwise convolution of channels-last activations (ConvNeXt's) runs in
      cuDNN with the separate add (one broadcast add per depthwise layer in the kernel profiles).
    - Mixed precision: ops whose autocast policy differs between the CPU (where we trace) and CUDA run
      with CUDA's (see `cuda_autocast`).
    - nn.MultiheadAttention in inference: CUDA's fused fast path (see `mha_fast_path`), which fake tensors
      never take.
    - Linear on a non-contiguous input of more than 2 dims: ATen's `linear` runs matmul and adds the bias
      in place (`output.add_`), but takes an out-of-place `add` for tensor subclasses such as fake tensors
      (aten/src/ATen/native/Linear.cpp), which would hold a second output-sized tensor.

    device_type: the device the trace runs on, whose autocast state says whether mixed precision is on.
    module_of: the module running now (None if unknown), for calls whose CUDA path its settings decide."""

    def __init__(self, device_type: str = "cpu",
                 module_of: Callable[[], torch.nn.Module | None] = lambda: None) -> None:
        super().__init__()
        self.device_type = device_type
        self.module_of = module_of

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        handled, result = call_with_cuda_policy(func, args, kwargs, self.device_type)
        if not handled:
            handled, result = cudnn_rnn_call(func, args, kwargs, self.device_type)
        if handled:
            return result
        if func is torch.nn.functional.multi_head_attention_forward:
            if takes_fast_path(self.module_of(), args, kwargs, self.device_type):
                return fast_path_call(args, kwargs)
        elif func is torch.nn.functional.scaled_dot_product_attention:
            if takes_efficient_bias_path(args, kwargs, self.device_type):
                return efficient_attention_call(args, kwargs)
            if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
                args = (*args[:4], 0.0, *args[5:])
            elif "dropout_p" in kwargs:
                kwargs["dropout_p"] = 0.0
        elif func in (torch.nn.functional.dropout, torch.dropout):
            fused = _fused_dropout_args(args, kwargs)
            if fused is not None:
                return torch.native_dropout(*fused)[0]
        elif func is torch.nn.functional.linear:
            unfused = _unfused_linear_args(args, kwargs)
            if unfused is not None:
                x, weight, bias = unfused
                out = torch.matmul(x, weight.t())
                return out.add_(bias.to(out.dtype))
        elif func in CONV_FUNCTIONS:
            split = _separate_bias_args(args, kwargs)
            if split is not None:
                (conv_args, conv_kwargs), bias = split
                out = func(*conv_args, **conv_kwargs)
                return out.add_(bias.to(out.dtype).reshape(1, -1, *([1] * (out.dim() - 2))))
        return func(*args, **kwargs)


CONV_FUNCTIONS = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)


def _separate_bias_args(args: tuple, kwargs: dict) -> tuple[tuple[tuple, dict], torch.Tensor] | None:
    """((args, kwargs) without the bias, bias) for a convolution call (F.convNd signature) whose bias CUDA
    adds as a separate kernel, else None."""
    bound = bind_args(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args, kwargs)
    weight, bias, groups = bound.get("weight"), bound.get("bias"), bound.get("groups", 1)
    if not isinstance(bias, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return None
    depthwise = isinstance(groups, int) and groups > 1 and weight.shape[1] == 1
    if depthwise and not is_channels_last(bound.get("input")):
        return None  # depthwise on NCHW data: PyTorch's kernel adds the bias itself
    positional = tuple(None if i == 2 else a for i, a in enumerate(args))
    return (positional, {k: (None if k == "bias" else v) for k, v in kwargs.items()}), bias


def _unfused_linear_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(input, weight, bias) of an F.linear call that ATen computes as matmul plus an in-place bias add (a
    bias, and an input that is neither 2-D, where addmm fuses the bias, nor contiguous, where it is
    flattened into one addmm), else None."""
    bound = bind_args(("input", "weight", "bias"), args, kwargs)
    x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, bias)) or x.dim() == 2 or x.is_contiguous():
        return None
    return x, weight, bias


def _fused_dropout_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, float, bool] | None:
    """(input, p, train) when a dropout call (F.dropout or torch.dropout signature) takes CUDA's
    fused kernel, else None."""
    bound = bind_args(("input", "p", "training", "inplace"), args, kwargs)
    x = bound.get("input")
    p = float(bound.get("p", 0.5))
    train = bound.get("training", bound.get("train", True))
    if not isinstance(x, torch.Tensor) or bound.get("inplace", False) or not train or not 0.0 < p < 1.0:
        return None
    return x, p, True
