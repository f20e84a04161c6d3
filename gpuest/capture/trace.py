"""`trace`: capture a model's inference pass or full training step as an annotated ATen graph."""
from __future__ import annotations

import contextlib
import json
from collections import Counter
from typing import Any, Callable, Sequence

import networkx as nx
import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from ..annotate.math_mode import TF32Policy
from ..errors import GpuestError, TraceError
from .fake_inputs import fake_inputs
from .grouped_mm import FAKE_SUBSTITUTES
from .recorder import CudaFunctionPaths, ModulePathTracker, OpRecorder
from .routing import FormatKnownScalars, RoutingAssumption, RoutingValues, fake_kernel_log_muted, parse_routing
from .storage_events import HOST

MODES = ("inference", "training")
PRECISIONS = {
    "fp32": (None, None), "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None),
    "bf16-mixed": (None, torch.bfloat16), "fp16-mixed": (None, torch.float16),
}
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    # As torch (>= 2.0) runs them on CUDA by default: the foreach implementations.
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True),
    # One launch per op and parameter: torch < 2.0's default, foreach=False, and hand-written per-parameter
    # optimizers; on many small parameters the host's dispatch of these launches sets the step's time.
    "adamw-forloop": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=False),
    "sgd-forloop": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=False),
}
GRAPH_SCHEMA = "gpuest.graph/1"
TRACE_DEVICE = "cpu"  # fake tensors only: nothing is allocated; CPU-only kernels are renamed to CUDA ones.


def _check_choice(value: Any, accepted: Sequence, what: str) -> None:
    if value not in accepted:
        raise ValueError(f"unknown {what} {value!r}; accepted: {', '.join(map(str, accepted))}")


def default_loss(output: Any) -> torch.Tensor:
    """Mean of the first tensor output in float32 (HF outputs: `logits`, else `last_hidden_state`)."""
    for attr in ("logits", "last_hidden_state"):
        value = getattr(output, attr, None)
        if isinstance(value, torch.Tensor):
            return value.float().mean()
    leaves = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    floating = [t for t in leaves if t.dtype.is_floating_point]
    if not floating:
        raise TraceError("the model returned no floating-point tensor to build a default loss from; "
                         "pass loss_fn=lambda out: <scalar tensor>")
    return floating[0].float().mean()


def _fake_like(t: torch.Tensor, dtype: torch.dtype | None, requires_grad: bool = False) -> torch.Tensor:
    cast = dtype if (dtype is not None and t.dtype.is_floating_point) else t.dtype
    fake = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=cast, device=TRACE_DEVICE)
    return fake.requires_grad_(requires_grad and cast.is_floating_point)


def trace(model: torch.nn.Module, example_inputs: Any, *, mode: str = "inference", precision: str = "fp32",
          optimizer: str | None = "adamw", loss_fn: Callable[[Any], torch.Tensor] | None = None,
          name: str | None = None, batch: int | None = None,
          routing: "str | Sequence[float] | RoutingAssumption | None" = "balanced") -> nx.DiGraph:
    """Capture `model` at ATen level into an annotated `networkx.DiGraph` without running it.

    mode: "inference" (eval, no autograd) or "training" (forward, loss, backward, optimizer step).
    precision: fp32 (honours torch's TF32 switches), bf16/fp16 (weights cast), bf16-mixed/fp16-mixed (autocast).
    example_inputs: a tensor or tuple of positional arguments, or a dict of keyword arguments. Every tensor
        reachable from them (real, meta or fake: only shapes, strides and dtypes are used) becomes a fake
        one, also inside nested containers, dataclasses and objects such as a transformers `Cache`
        (`fake_inputs`); floating-point ones take the weight dtype of bf16/fp16.
    routing: how mixture-of-experts layers spread tokens over experts, which decides every shape that
        depends on routing values (`capture.routing`): "balanced" (default), "skewed:H" (the hottest
        expert's share H of the routed slots) or per-expert shares summing to 1. Recorded in the graph.
    Nodes carry FLOPs, bytes read/written, category, phase, module, shapes, dtype and math mode.
    """
    assumption = parse_routing(routing)
    _check_trace_args(model, mode, precision, optimizer)
    weight_dtype, autocast_dtype = PRECISIONS[precision]
    training = mode == "training"
    tf32 = TF32Policy.current()
    root = type(model).__name__
    modules = {n: m for n, m in model.named_modules()}
    tracker = ModulePathTracker()
    run_op = RoutingValues(assumption, FAKE_SUBSTITUTES)
    recorder = OpRecorder(tracker, modules, root, tf32, run_op)
    was_training = model.training
    # A real tensor a module holds outside its parameters and buffers (torchvision's cached detection anchors, a
    # constant mask) becomes a fake constant when an op meets it, as inputs and weights are made fake up front.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        model.train(training)
        with fake_mode:
            params, buffers, inputs, opt = _fake_state(model, example_inputs, weight_dtype, training, optimizer,
                                                       name or root)
        _register_persistent(recorder, params, buffers, inputs, opt)
        step = _step_fn(model, params, buffers, inputs, opt, training, autocast_dtype, loss_fn)
        with fake_mode:
            _record_step(step, recorder, run_op, f"{name or root} ({mode}, {precision})")
    finally:
        model.train(was_training)
    gradients = recorder.storages.sids(p.grad for p in {id(p): p for p in params.values()}.values()
                                       if p.grad is not None)
    return _to_graph(recorder, name=name or root, mode=mode, precision=precision, batch=batch,
                     optimizer=optimizer if training else None, tf32=tf32, gradients=gradients,
                     routing=run_op)


def _check_trace_args(model: Any, mode: str, precision: str, optimizer: str | None) -> None:
    """Raises ValueError for an unknown mode, precision or (training) optimizer, TypeError for a non-Module."""
    _check_choice(mode, MODES, "mode")
    _check_choice(precision, list(PRECISIONS), "precision")
    if mode == "training" and optimizer is not None:
        _check_choice(optimizer, list(OPTIMIZERS), "optimizer")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"trace() needs a torch.nn.Module, got {type(model).__name__}")


def _fake_state(model: torch.nn.Module, example_inputs: Any, weight_dtype: torch.dtype | None, training: bool,
                optimizer: str | None, label: str) \
        -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], Any, torch.optim.Optimizer | None]:
    """Fake parameters, buffers and inputs of the step and its optimizer (training), made under fake mode."""
    # Tied parameters (shared embeddings) must stay one tensor: one fake per parameter object. They
    # require grad as the model's do, in inference too: autocast then keeps each weight's cast until
    # the autocast region ends (its cache takes leaves that require grad, whatever the grad mode).
    fakes: dict[int, torch.Tensor] = {}
    params = {n: fakes.setdefault(id(p), _fake_like(p, weight_dtype, p.requires_grad))
              for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: _fake_like(b, weight_dtype if weight_dtype and b.is_floating_point() else None)
               for n, b in model.named_buffers(remove_duplicate=False)}
    inputs = fake_inputs(example_inputs, lambda x: _fake_like(x, weight_dtype), TRACE_DEVICE, weight_dtype)
    if training and not any(p.requires_grad for p in params.values()):
        raise TraceError(f"cannot trace a training step of {label}: it has no parameter that "
                         "requires grad, so backward has nothing to differentiate; use mode='inference' "
                         "(no --train), or leave some of its parameters trainable")
    opt = _make_optimizer(params, optimizer) if training else None
    return params, buffers, inputs, opt


def _step_fn(model: torch.nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
             inputs: Any, opt: torch.optim.Optimizer | None, training: bool, autocast_dtype: torch.dtype | None,
             loss_fn: Callable[[Any], torch.Tensor] | None) -> Callable[[OpRecorder], None]:
    """The traced step: forward (inference), or forward, loss, backward and optimizer step, naming each phase."""
    if isinstance(inputs, dict):
        args, kwargs = (), inputs
    else:
        args, kwargs = (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}

    def step(rec: OpRecorder) -> None:
        grad_ctx = contextlib.nullcontext() if training else torch.no_grad()
        amp = (torch.autocast(TRACE_DEVICE, dtype=autocast_dtype) if autocast_dtype
               else contextlib.nullcontext())
        with grad_ctx:
            with amp:
                rec.autocast = autocast_dtype is not None
                rec.phase = "forward"
                output = torch.func.functional_call(model, {**params, **buffers}, args, kwargs,
                                                    tie_weights=True, strict=False)
                if not training:
                    rec.autocast = False
                    return
                rec.phase = "loss"
                loss = (loss_fn or default_loss)(output)
            rec.autocast = False
            rec.phase = "backward"
            loss.backward()
            if opt is not None:
                rec.phase = "optimizer"
                opt.step()
    return step


def _record_step(step: Callable[[OpRecorder], None], recorder: OpRecorder, run_op: RoutingValues,
                 what: str) -> None:
    """Runs `step` under the recorder (inside fake mode); a failure becomes a TraceError saying where."""
    try:
        hook = torch.nn.modules.module.register_module_forward_pre_hook(recorder.count_module_call)
        try:
            cuda_paths = CudaFunctionPaths(TRACE_DEVICE, recorder.current_module_object)
            with fake_kernel_log_muted(), recorder.tracker, recorder, cuda_paths, FormatKnownScalars(run_op):
                step(recorder)
        finally:
            hook.remove()
        recorder.storages.drain(recorder.memory_events())   # what the step's return let go
    except GpuestError:   # already says what was wrong (a routing assumption that cannot hold)
        raise
    except Exception as exc:  # any failure inside the user's model: say where it happened
        where = recorder.current_module() or "<top level>"
        last = recorder.nodes[-1].attrs["cpu_op"] if recorder.nodes else "none"
        raise TraceError(
            f"could not trace {what}: {type(exc).__name__}: {exc}\n"
            f"  while in module {where!r} during {recorder.phase}, after op {last}. " + _trace_failure_hint(exc)
        ) from exc


def _trace_failure_hint(exc: Exception) -> str:
    """What a trace on fake tensors cannot do, for the failure `exc`."""
    if isinstance(exc, DynamicOutputShapeException):   # .item() and `if tensor:` raise DataDependentOutputException
        return ("That op's output shape depends on the values of its input, which fake tensors do not "
                "have. gpuest assumes such values only for mixture-of-experts routing (`routing=`); other "
                "value-dependent selection (detection post-processing: score thresholds, NMS) is not supported: "
                "trace the model without it (e.g. its backbone and heads).")
    return ("Tracing runs on fake tensors: data-dependent Python control flow (e.g. `if x.sum() > 0`, "
            "`.item()`, `.tolist()`) cannot be traced; make it shape-dependent or pass a smaller model.")


def _register_persistent(recorder: OpRecorder, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                         inputs: Any, opt: torch.optim.Optimizer | None) -> None:
    """Tell the recorder which storages exist before the step: they are allocated once, not by its ops."""
    recorder.storages.add_persistent([*params.values(), *buffers.values()], "weights")
    recorder.storages.add_persistent([t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)], "inputs")
    if opt is not None:
        state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        recorder.storages.add_persistent([t for t in state if t.dim() > 0], "optimizer_state")
        # 0-dim state (Adam's step counts) lives on the host unless the optimizer is capturable or fused.
        recorder.storages.add_persistent([t for t in state if t.dim() == 0], HOST)


def _make_optimizer(params: dict[str, torch.Tensor], name: str | None) -> torch.optim.Optimizer | None:
    """The optimizer with its state initialised, so the traced step is a steady-state one."""
    if name is None:
        return None
    trainable = list({id(p): p for p in params.values() if p.requires_grad}.values())
    if not trainable:
        return None
    opt = OPTIMIZERS[name](trainable)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def _to_graph(recorder: OpRecorder, *, name: str, mode: str, precision: str, batch: int | None,
              optimizer: str | None, tf32: TF32Policy, gradients: list[int],
              routing: RoutingValues) -> nx.DiGraph:
    graph = nx.DiGraph()
    unsupported: Counter[str] = Counter()
    for i, node in enumerate(recorder.nodes):
        events = (recorder.early_memory if i == 0 else []) + node.memory
        graph.add_node(i, order=i, mem_events=" ".join(events), **node.attrs)
        for src in node.inputs:
            graph.add_edge(src, i)
        if not node.attrs["supported"]:
            unsupported[node.attrs["op"]] += 1
    attrs = [n.attrs for n in recorder.nodes]
    tensor_core = sum(a["flops"] for a in attrs if a["category"] in ("matmul", "conv", "attention", "rnn"))
    graph.graph.update(
        schema=GRAPH_SCHEMA, model=name, mode=mode, precision=precision, batch=int(batch or 0),
        optimizer=optimizer or "none", torch_version=str(torch.__version__),
        cudnn_allow_tf32=tf32.cudnn_allow_tf32, matmul_allow_tf32=tf32.matmul_allow_tf32,
        sdpa_backend="+".join(sorted(recorder.sdpa_backends)) or "none",
        total_flops=float(sum(a["flops"] for a in attrs)),
        total_tensor_core_flops=float(tensor_core),
        total_bytes=float(sum(a["bytes_read"] + a["bytes_written"] for a in attrs)),
        num_ops=sum(1 for a in attrs if not a["free"]),
        unsupported_ops=json.dumps(dict(unsupported), sort_keys=True),
        # Storage facts of the step (gpuest.price.memory replays them): [[id, bytes, kind], ...] alive before
        # it, and the ids of the gradients it leaves, which the next step's zero_grad frees.
        memory_persistent=json.dumps([list(p) for p in recorder.storages.persistent]),
        memory_gradients=json.dumps(gradients),
        # The routing assumption, and each routing decision it gave values to (empty for a dense model).
        routing=routing.assumption.describe(),
        routing_decisions=json.dumps([d.as_dict() for d in routing.routing_decisions()]),
    )
    return graph


def unsupported_ops(graph: nx.DiGraph) -> dict[str, int]:
    """Op name -> count of nodes priced by bytes only because no formula exists."""
    return json.loads(graph.graph.get("unsupported_ops", "{}"))


def routing_decisions(graph: nx.DiGraph) -> list[dict[str, Any]]:
    """The routing decisions of a mixture-of-experts trace: op, tokens, experts, top_k, tokens_per_expert."""
    return json.loads(graph.graph.get("routing_decisions", "[]"))
