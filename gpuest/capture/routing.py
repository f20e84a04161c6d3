"""The routing assumption of a mixture-of-experts trace, and the routing values it implies.

A mixture-of-experts layer decides on the device which experts each token goes to (a top-k or an argmax
over router scores), and the sizes of what follows depend on that decision: the tokens each expert
gathers (`nonzero`, one-argument `where`, masked indexing), the per-expert counts (`histc`, `bincount`)
and the offsets of a grouped GEMM. Fake tensors carry no values, so `trace` takes the decision as an
explicit assumption instead:

- "balanced" (the default): each of E experts gets tokens * top_k / E of the routed slots;
- "skewed:H": the hottest expert gets the share H of the slots, the others equal shares of the rest;
- a sequence of per-expert shares (summing to 1, one per expert).

At every routing decision the trace records (an op in ROUTING_DECISIONS whose input it has no values
for) the decision's indices get concrete values realising the assumption; every later op whose tensor
inputs all have values is also run on those values (small integer tensors: masks, sorts, counts,
offsets), so data-dependent shapes, host reads and a model's own capacity limits follow from them.
Ops on tensors without values run on fake tensors as before.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           unset_fake_temporarily)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import RoutingError

ROUTING_KINDS = ("balanced", "skewed", "fractions")
_aten = torch.ops.aten
# Allocations whose values are whatever memory held: never values a shape may depend on.
UNINITIALISED = frozenset({_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
                           _aten.new_empty.default, _aten.new_empty_strided.default})
SHARE_TOLERANCE = 1e-6
# Tensors of more elements are not run on values (a one-hot mask of 8k tokens x 8 x 129 experts is 8.5 M).
MAX_VALUE_ELEMENTS = 1 << 26
ACCEPTED = "'balanced', 'skewed:H' with 0 < H < 1 (the hottest expert's share), or per-expert shares summing to 1"


@dataclass(frozen=True)
class RoutingAssumption:
    """How a trace assumes tokens are spread over experts.

    kind: "balanced", "skewed" or "fractions".
    hot_share: for "skewed", the hottest expert's share of the routed slots (tokens * top_k).
    fractions: for "fractions", each expert's share of the routed slots, in expert order.
    """

    kind: str = "balanced"
    hot_share: float = 0.0
    fractions: tuple[float, ...] = ()

    def describe(self) -> str:
        """The assumption as `parse_routing` reads it back: 'balanced', 'skewed:0.3', '0.5,0.25,0.25'."""
        if self.kind == "skewed":
            return f"skewed:{self.hot_share:g}"
        if self.kind == "fractions":
            return ",".join(f"{f:g}" for f in self.fractions)
        return "balanced"

    def shares(self, experts: int, top_k: int) -> np.ndarray:
        """Each of `experts` experts' share of the routed slots when every token picks `top_k` distinct
        experts; raises RoutingError where the assumption cannot hold for that decision."""
        if self.kind == "fractions":
            if len(self.fractions) != experts:
                raise RoutingError(f"routing gives {len(self.fractions)} expert shares but the model routes over "
                                   f"{experts} experts; give {experts} shares summing to 1, or 'balanced'/'skewed:H'")
            shares = np.asarray(self.fractions, dtype=float)
        elif self.kind == "skewed":
            if experts < 2:
                raise RoutingError(f"routing {self.describe()} needs at least 2 experts; the model routes over {experts}")
            if self.hot_share < 1.0 / experts:
                raise RoutingError(f"routing {self.describe()}: the hottest of {experts} experts gets at least "
                                   f"1/{experts} = {1 / experts:.4g} of the slots; give H >= that, or 'balanced'")
            shares = np.full(experts, (1.0 - self.hot_share) / (experts - 1))
            shares[0] = self.hot_share
        else:
            shares = np.full(experts, 1.0 / experts)
        if top_k > 1 and shares.max() > 1.0 / top_k + SHARE_TOLERANCE:
            raise RoutingError(f"routing {self.describe()}: with top_k={top_k} each token picks an expert at most "
                               f"once, so no expert can get more than 1/{top_k} = {1 / top_k:.4g} of the slots "
                               f"(the hottest gets {shares.max():.4g})")
        return shares


def parse_routing(spec: "str | Sequence[float] | RoutingAssumption | None") -> RoutingAssumption:
    """A RoutingAssumption from 'balanced', 'skewed:0.3', 'f1,f2,...' or a sequence of per-expert shares.

    Raises RoutingError naming what was wrong and what is accepted."""
    if spec is None:
        return RoutingAssumption()
    if isinstance(spec, RoutingAssumption):
        return spec
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text == "balanced":
            return RoutingAssumption()
        if text.startswith("skewed"):
            _, sep, value = text.partition(":")
            try:
                share = float(value) if sep else math.nan
            except ValueError:
                share = math.nan
            if not 0.0 < share < 1.0:
                raise RoutingError(f"routing {spec!r}: the hottest expert's share must be a number in (0, 1), "
                                   f"e.g. 'skewed:0.3'; accepted: {ACCEPTED}")
            return RoutingAssumption("skewed", hot_share=share)
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise RoutingError(f"unknown routing {spec!r}; accepted: {ACCEPTED}") from None
        return _fractions(values, spec)
    if isinstance(spec, (list, tuple, np.ndarray)):
        try:
            values = [float(v) for v in spec]
        except (TypeError, ValueError):
            raise RoutingError(f"routing shares must be numbers, got {list(spec)!r}; accepted: {ACCEPTED}") from None
        return _fractions(values, spec)
    raise RoutingError(f"routing must be a string or a sequence of shares, got {type(spec).__name__}; "
                       f"accepted: {ACCEPTED}")


def _fractions(values: list[float], spec: Any) -> RoutingAssumption:
    if len(values) < 2:
        raise RoutingError(f"routing {spec!r}: per-expert shares need one share per expert (at least 2); "
                           f"accepted: {ACCEPTED}")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise RoutingError(f"routing {spec!r}: every expert's share must be a finite number >= 0")
    total = math.fsum(values)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise RoutingError(f"routing {spec!r}: per-expert shares must sum to 1, they sum to {total:.6g}")
    return RoutingAssumption("fractions", fractions=tuple(values))


def slot_counts(shares: np.ndarray, tokens: int, top_k: int) -> np.ndarray:
    """Routed slots per expert (ints summing to tokens * top_k, none above `tokens`): the shares rounded
    by largest remainder."""
    slots = tokens * top_k
    exact = shares * slots
    counts = np.minimum(np.floor(exact + SHARE_TOLERANCE).astype(np.int64), tokens)
    remainder = exact - counts
    for e in np.argsort(-remainder, kind="stable"):
        if counts.sum() >= slots:
            break
        if counts[e] < tokens:
            counts[e] += 1
    return counts


def spread_stride(tokens: int) -> int:
    """A stride coprime with `tokens` near its golden-ratio fraction: stepping by it visits every token
    once and spreads a run of slots evenly over the sequences of a batch."""
    start = max(1, round(tokens * 0.6180339887))
    for stride in range(start, start + tokens):
        if math.gcd(stride, tokens) == 1:
            return stride % tokens or 1
    return 1


def assignment(counts: np.ndarray, tokens: int, top_k: int) -> np.ndarray:
    """Expert ids (tokens, top_k) giving expert e exactly counts[e] slots, each token top_k distinct experts.

    Slot j holds choice j // tokens of token (j * stride) % tokens; experts take runs of consecutive slots,
    and a run no longer than `tokens` never gives one token the same expert twice."""
    experts = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    j = np.arange(tokens * top_k, dtype=np.int64)
    token = (j % tokens) * spread_stride(tokens) % tokens
    out = np.empty((tokens, top_k), dtype=np.int64)
    out[token, j // tokens] = experts
    return out


@dataclass(frozen=True)
class RoutingDecision:
    """One routing decision the trace gave values to: op, tokens, experts, top_k and slots per expert."""

    op: str
    tokens: int
    experts: int
    top_k: int
    counts: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "tokens": self.tokens, "experts": self.experts, "top_k": self.top_k,
                "tokens_per_expert": list(self.counts)}


# Routing decisions by op: (position of the indices among the outputs, (args, kwargs) -> (k, dim, keepdim)).
# Not max.dim: attention with sinks (GPT-OSS) takes a row max whose indices route nothing.
def _topk_args(args: tuple, kwargs: dict) -> tuple[int, int, bool]:
    return int(args[1] if len(args) > 1 else kwargs["k"]), int(args[2] if len(args) > 2 else kwargs.get("dim", -1)), True


def _arg_reduce_args(args: tuple, kwargs: dict) -> tuple[int, int, bool]:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    return 1, (-1 if dim is None else int(dim)), keep


ROUTING_DECISIONS: dict[Any, tuple[int, Callable[[tuple, dict], tuple[int, int, bool]]]] = {
    torch.ops.aten.topk.default: (1, _topk_args),
    torch.ops.aten.argmax.default: (0, _arg_reduce_args),   # top-1 routers (Switch)
}


@contextlib.contextmanager
def fake_kernel_log_muted() -> Iterator[None]:
    """FakeTensorMode logs a fake kernel's failure with its traceback before re-raising it. In a trace that failure
    is either expected (a substitute takes over: RoutingValues' fake_substitutes; hundreds per fp32 MoE step) or
    becomes a TraceError saying where it happened; the tracebacks would bury either."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _is_data_dependent(func: Any) -> bool:
    return torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags


class RoutingValues:
    """Runs each dispatched op for the trace: on fake tensors, and also on values where its tensor inputs
    have them (the routing decisions and what derives from them).

    fake_substitutes: op -> a function giving the fake output CUDA's kernel would, for ops whose fake
    kernel rejects arguments the CUDA kernel takes (see grouped_mm.fake_grouped_mm)."""

    def __init__(self, assumption: RoutingAssumption,
                 fake_substitutes: dict[Any, Callable[..., Any]] | None = None) -> None:
        self.assumption = assumption
        self.fake_substitutes = dict(fake_substitutes or {})
        self.values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.decisions: list[RoutingDecision] = []
        self._assignments: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, RoutingError | None]] = {}
        # Which decisions each valued tensor derives from, and which ones the trace went on to need (a shape,
        # a Python value or a cost read from their values): a greedy decoder's argmax over the vocabulary is a
        # top-1 choice whose values decide nothing.
        self._origins: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._used: set[int] = set()
        self._refused: dict[int, RoutingError] = {}

    def value_of(self, t: Any) -> torch.Tensor | None:
        """The values a fake tensor stands for, if the routing assumption determines them (reading them makes
        the decisions they derive from ones the trace needed)."""
        value = self.values.get(t) if isinstance(t, torch.Tensor) else None
        if value is not None:
            self.use([t])
        return value

    def numpy_of(self, t: Any) -> np.ndarray | None:
        """value_of(t) as a numpy array (what cost formulas read: OpCall.known_value)."""
        value = self.value_of(t)
        if value is None:
            return None
        with unset_fake_temporarily():
            return value.detach().to(torch.float64 if value.is_floating_point() else torch.int64).numpy().copy()

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        inputs = _tensors((args, kwargs))
        if inputs:
            known = all(t in self.values for t in inputs)
        else:   # a constant (arange, zeros) once routing began: one_hot compares indices with an arange
            known = bool(self.decisions) and torch.Tag.nondeterministic_seeded not in func.tags
        known = known and func not in UNINITIALISED
        try:
            out = func(*args, **kwargs)
            dynamic = False
        except (DynamicOutputShapeException, DataDependentOutputException):
            if not known:
                raise
            out, dynamic = None, True
        except RuntimeError:
            substitute = self.fake_substitutes.get(func)
            if substitute is None:
                raise
            out, dynamic = substitute(*args, **kwargs), False
        if known and (dynamic or sum(t.numel() for t in _tensors(out)) <= MAX_VALUE_ELEMENTS):
            real = self._run_on_values(func, args, kwargs)
            if dynamic:
                out = tree_map(lambda r: _fake_like(r) if isinstance(r, torch.Tensor) else r, real)
            origins = self.use(inputs) if dynamic else self.origins_of(inputs)
            self._remember(out, real, origins)
        else:
            self._forget_written(func, args, kwargs)
            decision = ROUTING_DECISIONS.get(func)
            if decision is not None and not known:
                self._decide(func, args, kwargs, out, *decision)
        return out

    def _run_on_values(self, func: Any, args: tuple, kwargs: dict) -> Any:
        real_args, real_kwargs = tree_map(lambda x: self.values[x] if isinstance(x, torch.Tensor) else x, (args, kwargs))
        with unset_fake_temporarily():
            return func(*real_args, **real_kwargs)

    def _remember(self, out: Any, real: Any, origins: frozenset[int]) -> None:
        for fake, value in zip(_tensors(out), _tensors(real)):
            self.values[fake] = value
            self._origins[fake] = origins

    def origins_of(self, tensors: Sequence[Any]) -> frozenset[int]:
        """The decisions the values of `tensors` derive from."""
        return frozenset().union(*(self._origins.get(t, frozenset()) for t in tensors
                                   if isinstance(t, torch.Tensor)))

    def use(self, tensors: Sequence[Any]) -> frozenset[int]:
        """Mark the decisions `tensors`' values derive from as needed by the trace (a shape, a Python value or
        a cost came from them); returns them. Raises the RoutingError the assumption gave such a decision,
        now that it routes."""
        origins = self.origins_of(tensors)
        for i in sorted(origins - self._used):
            if i in self._refused:
                raise self._refused[i]
        self._used |= origins
        return origins

    def routing_decisions(self) -> list[RoutingDecision]:
        """The decisions whose values the trace needed: what the routing assumption decided."""
        return [d for i, d in enumerate(self.decisions) if i in self._used]

    def _forget_written(self, func: Any, args: tuple, kwargs: dict) -> None:
        """An op without values that writes a tensor in place leaves that tensor's values unknown."""
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
                for t in _tensors(value):
                    self.values.pop(t, None)

    def _decide(self, func: Any, args: tuple, kwargs: dict, out: Any, position: int,
                parse: Callable[[tuple, dict], tuple[int, int, bool]]) -> None:
        """Give the indices a routing decision returns the values the assumption implies."""
        scores = args[0]
        k, dim, keepdim = parse(args, kwargs)
        dim = dim % max(scores.dim(), 1)
        experts = int(scores.shape[dim]) if scores.dim() else 1
        indices = _tensors(out)[position] if isinstance(out, (tuple, list)) else out
        tokens = indices.numel() // max(k, 1)
        if experts < 2 or tokens == 0:
            return
        key = (tokens, experts, k)
        if key not in self._assignments:
            refusal = None
            try:
                shares = self.assumption.shares(experts, k)
            except RoutingError as exc:   # raised only if the trace needs these values (use): they may route nothing
                refusal, shares = exc, np.full(experts, 1.0 / experts)
            counts = slot_counts(shares, tokens, k)
            self._assignments[key] = (counts, assignment(counts, tokens, k), refusal)
        counts, choice, refusal = self._assignments[key]
        if refusal is not None:
            self._refused[len(self.decisions)] = refusal
        # (tokens, k) -> the indices' layout: k along `dim` (a top-k keeps it; an argmax drops it unless keepdim).
        lead = [int(s) for i, s in enumerate(scores.shape) if i != dim]
        with unset_fake_temporarily():   # real values, built outside the fake mode
            values = torch.from_numpy(choice.reshape(*lead, k) if lead else choice.reshape(k))
            values = values.movedim(-1, dim) if keepdim else values.reshape(indices.shape)
            self.values[indices] = values.to(indices.dtype).reshape(indices.shape).contiguous()
        self._origins[indices] = frozenset({len(self.decisions)})
        self.decisions.append(RoutingDecision(str(func), tokens, experts, k, tuple(int(c) for c in counts)))


def _fake_like(real: torch.Tensor) -> torch.Tensor:
    """A fake tensor of `real`'s shape, strides and dtype (called while the fake mode is current)."""
    return torch.empty_strided(tuple(real.shape), tuple(real.stride()), dtype=real.dtype, device=real.device)


class ValuedOps(TorchDispatchMode):
    """Runs every op through `run_op` (a RoutingValues, inside FakeTensorMode) as a trace does, recording
    nothing: a forward run only for the shapes it leaves (a KV cache's) passes mixture-of-experts routing."""

    def __init__(self, run_op: RoutingValues) -> None:
        super().__init__()
        self.run_op = run_op

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.run_op(func, args, kwargs or {})


class FormatKnownScalars(TorchFunctionMode):
    """Format a 0-d tensor whose value the trace knows as that value, as a real tensor formats (a layer
    that looks its expert up by name, `self[f"expert_{idx}"]`); `Tensor.__format__` reaches no ATen op,
    so the dispatch-level RoutingValues cannot see it."""

    def __init__(self, values: RoutingValues) -> None:
        super().__init__()
        self.values = values

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.__format__ and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 0:
            value = self.values.value_of(args[0])
            if value is not None:
                with unset_fake_temporarily():
                    return format(value.item(), *args[1:])
        return func(*args, **kwargs)
