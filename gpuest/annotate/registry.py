"""One registry of per-ATen-op cost formulas.

Formulas are registered with the `register_cost` decorator, keyed by ATen overload packet
(`aten.mm`) or by a single overload (`aten.add.Tensor`), in the spirit of
`torch.utils.flop_counter.register_flop_formula`. A formula receives the op's real (fake)
arguments and outputs and returns a `Cost`. Ops without a formula fall back to
`generic_cost`, which prices their tensor traffic and says they are unsupported.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from ..errors import OpArgumentError

CATEGORIES = (
    "matmul", "conv", "attention", "rnn", "elementwise", "reduction", "norm", "pool",
    "embedding", "copy", "optimizer", "view", "other",
)
# Categories whose FLOPs run on tensor cores (their peak depends on the math mode).
TENSOR_CORE_CATEGORIES = frozenset({"matmul", "conv", "attention", "rnn"})

# Variants whose kernels share nothing with their op's others (a GEMM with a tiny inner dimension,
# formulas.matmul.TINY_INNER; batch norm on channels-last data): the residual fit prices them from their own
# benchmarks alone and leaves them out of their op's and category's fits, whose slopes they would bend
# (gpuest.calibrate.fit.fit_residuals).
TINY_INNER_VARIANT = "tiny_inner"
# Batch norm on channels-last data runs other kernels (channels-last reductions, TensorIterator's flat affine
# loop) whose rate follows the channel count, not the plane (formulas.norm): pooled, its few-channel rows
# moved the channels-first fits' slopes.
NHWC_VARIANT = "nhwc"
DILATED_VARIANT = "dilated"   # a convolution with dilation > 1: other kernels than an undilated one's
# A grouped 1x1 convolution: cuDNN runs other kernels than a dense one's, one per group; the weight-gradient kernels
# of one with 4-16 channels per group sum to up to 500x its forward (benchmarks/kernel_facts.py `grouped conv`).
GROUPED_POINTWISE_VARIANT = "grouped_pointwise"
ISOLATED_VARIANTS = frozenset({TINY_INNER_VARIANT, NHWC_VARIANT, DILATED_VARIANT, GROUPED_POINTWISE_VARIANT})


# The bytes of the widest vector load a GEMM kernel makes along a row (Hopper's TMA, Ampere's cp.async).
ROW_VECTOR_BYTES = 16


@dataclass(frozen=True)
class Cost:
    """What one ATen op costs on the device.

    flops: floating-point operations (a multiply-add is 2).
    bytes_read / bytes_written: DRAM traffic assuming each tensor is touched once.
    gemm_mnk: the implicit GEMM (M, N, K) for matmul-like ops, (0, 0, 0) otherwise.
    gemm_batch: independent GEMMs of that shape (batch / groups).
    gemm_row_bytes: for a matmul, the largest power of two up to 16 dividing the row stride, in bytes, of every
        matrix its kernel reads or writes (each operand's leading dimension and batch stride, the output's):
        below 16 no tensor-core kernel can load its rows in 16-byte vectors (formulas.gemm.row_alignment_bytes).
        16 for any other op.
    gemm_bias: the GEMM adds a bias vector in its epilogue (addmm with a 1-D bias: cublasLt's bias-epilogue
        kernels, slower than plain ones on rows of 2 bytes' alignment).
    gemm_m_max: for a grouped GEMM (mixture-of-experts experts), the rows of its largest group (the
        hottest expert's tokens), where gemm_mnk holds the mean group; 0 for any other op.
    gemm_mn_major: for a matmul, how many of its two operands are stored with the reduction dimension K not
        the contiguous one (formulas.gemm.mn_major_operands): a linear layer's forward x @ w.t() has none, its
        data gradient g @ w one, its weight gradient g.t() @ x two. 0 for any other op.
    row_count / row_len: for row-wise ops (norms, softmax, reductions) the independent rows a kernel reduces
        and the elements in each; 0 otherwise. How a row-wise kernel spreads over the GPU (and how much
        fixed work each row costs) depends on these, not on the total bytes alone.
    row_segment: for a row-wise op whose rows are made of several strided runs, the elements of one
        contiguous run (a batch-norm channel of NCHW data is N runs of H * W, a column sum's row single
        elements); 0 where each row is contiguous. A kernel reading short runs leaves most of each memory transaction unused.
        Eval-mode batch norm of NCHW data, which reduces nothing, records the plane its per-channel kernel
        walks (H * W) here too, with no rows.
    kept_run: for a reduction that keeps the innermost dimension (a column sum, a sum over the branches of
        channels-last data), the kept elements that lie contiguously between two reduced ones (a column
        sum's width, the channels of an NHWC branch sum); 0 otherwise.
    kernels: CUDA kernels the op launches.
    flops_skipped: FLOPs counted in `flops` (torch's convention, so totals agree with FlopCounterMode)
        that the kernel never computes: a causal attention kernel skips the tiles above the diagonal.
        Time is priced on flops - flops_skipped.
    permuted: the op reads an input in a different memory order from the one it writes (a transpose or
        a layout change such as NCHW -> NHWC), so one side of the copy cannot be coalesced.
    read_amplification: for a permuted op, the memory sectors one block of its strided loop touches in
        the permuted inputs over the sectors their bytes fill (read_amplification()): 1 where the order
        differs only above a long contiguous run (the head transposes around attention), up to
        SECTOR_BYTES / element size for a real transpose, whose every element lies in another sector.
    window: for sliding-window ops (convolution, pooling) the kernel's spatial area (3x3 -> 9), 0
        otherwise. A 1x1 convolution is a plain GEMM; a larger window gathers its operand (implicit
        im2col) and re-reads each input element window/stride^2 times.
    channels_last: the op's activation is stored channels-innermost (NHWC), which selects other kernels
        than NCHW data does: convolutions and norms, and (records_layout) pooling/resampling and
        elementwise ops that broadcast a per-channel operand.
    gemm_plane: for a 1x1 convolution that keeps the spatial size (stride 1, no padding) and is not
        grouped, the elements of one activation plane (H * W); 0 otherwise. Such a convolution of NCHW
        data is a batched GEMM over the planes as stored, which cuDNN runs in place when a plane is a
        whole number of tensor-core loads; any other tensor-core convolution of NCHW data has cuDNN
        transpose its operands to NHWC and back.
    mixed_dtypes: the op reads floating tensors of more than one dtype (bf16 activations with fp32
        weights or a fp32 residual under autocast): elementwise ops then cast per element on their
        non-vectorised path, and batch norm leaves cuDNN for PyTorch's own kernels.
    broadcast: a streaming op reads a smaller tensor expanded to its output's shape (a per-channel bias
        added to an NCHW activation), which takes TensorIterator's strided, non-vectorised path.
    broadcast_run: for a broadcast op, the output elements innermost in memory over which the expanded
        tensor's value stays the same (H * W for a per-channel value over NCHW data, 1 for a bias along
        the last dimension); 0 otherwise. Short runs re-read the small tensor at every few elements.
    host_syncs: times the op copies a value from the GPU to the host and waits for it (an output size
        that depends on the data, `.item()`): the host cannot run ahead of the GPU past such an op, and
        the kernels it launches after each wait start on an idle GPU.
    grid_syncs: grid-wide barriers inside the op's kernels, where every block waits for the others (a
        persistent recurrent kernel meets once per time step): serial steps a roofline does not see.
    reduce_kernel: the op runs ATen's generic reduction kernel (Reduce.cuh: sum, mean, amax, var, ...),
        whose launch over the GPU follows from its rows alone (gpuest.price.reduce_launch); softmax
        and the losses reduce rows with kernels of their own.
    table_lookup: the op looks rows of a table up by index (an embedding): ATen's index_select kernel
        moves one element per thread, finding its source row for each, so a lookup of short rows, or of
        rows that stay in cache, is bound by elements and rows rather than bytes.
    serial_steps: round trips to memory that the op's kernel makes one after another whatever the GPU's
        width (a block walking its indices in chunks, each chunk waiting on the last): latency a roofline
        does not see.
    variant: which family of the op's kernels its arguments select where the families differ in kind
        (a transposed or a 1-D convolution: data-gradient kernels, height-1 planes; a backward that computes
        the weight gradient alone), "" for the op's usual one, several joined by "+"; the residual fit
        gives a variant with enough benchmarks a fit of its own (an ISOLATED_VARIANTS one nothing else).
    atomic_adds: the kernel accumulates into its output with atomic adds (a scatter): 16-bit atomic
        adds take about twice the time of fp32 ones (compare-and-swap loops or paired adds).
    dependent_updates: updates of one output row the kernel makes one after another, each reading what
        the last one wrote: an index_put that accumulates walks each run of equal indices with one warp
        (Indexing.cu, indexing_backward_kernel), so its longest run is a serial chain whatever the GPU's width.
    sums_columns: the op also sums its incoming gradient over all rows for each column (layer and RMS
        norm's weight and bias gradients): ATen gives each 32 columns a block that walks the rows in turn
        until there are enough rows to split them (gpuest.price.reduce_launch.column_walk_steps).
    chunk_walks: for a multi-tensor op (foreach ops, fused optimizers: ATen's MultiTensorApply), the steps of
        the longest chunk walk of each of its launches, summed over the launches: each block walks one chunk
        of a tensor (up to 65536 elements) a block's width of elements at a time, each step waiting on its
        loads, so a launch whose blocks are too few to fill the DRAM interface lasts as long as that walk
        (formulas.optimizer). 0 for other ops.
    plane_walks: for ATen's interpolation kernels over contiguous (NCHW) data, the (sample, channel) planes each
        thread walks in turn: the grid has one thread per output position, and each step waits on its loads,
        so a small output of many planes lasts as long as that walk (price.device_time.walk_floor_s). 0 for
        other ops.
    walk_blocks: the 1024-thread blocks of that grid: blocks beyond what the SMs hold at once walk again.
    list_tensors: for a multi-tensor op, the tensors in each of its lists: its host side handles them one by one
        (grouping them by device and dtype, a step size per tensor, the launch metadata), so its host time
        follows them, not its launches (price.host_timeline.later_host_work). 0 for other ops.
    relayout_bytes: for a convolution cuDNN runs (not PyTorch's own depthwise kernels), the bytes of the two
        activations each of its cuDNN calls transposes when it computes NCHW data in NHWC (forward: input and
        output; backward: output gradient and input); they are held in a workspace during the call
        (gpuest.price.memory; whether cuDNN transposes is the `relayout` feature's rule). 0 for other ops.
    """

    flops: float
    bytes_read: float
    bytes_written: float
    category: str
    gemm_mnk: tuple[int, int, int] = (0, 0, 0)
    gemm_batch: int = 1
    gemm_row_bytes: int = ROW_VECTOR_BYTES
    gemm_bias: bool = False
    gemm_m_max: int = 0
    gemm_mn_major: int = 0
    row_count: int = 0
    row_len: int = 0
    row_segment: int = 0
    kept_run: int = 0
    kernels: int = 1
    supported: bool = True
    host_only: bool = False
    flops_skipped: float = 0.0
    permuted: bool = False
    read_amplification: float = 1.0
    window: int = 0
    channels_last: bool = False
    gemm_plane: int = 0
    mixed_dtypes: bool = False
    broadcast: bool = False
    broadcast_run: int = 0
    host_syncs: int = 0
    grid_syncs: int = 0
    reduce_kernel: bool = False
    table_lookup: bool = False
    serial_steps: float = 0.0
    variant: str = ""
    atomic_adds: bool = False
    dependent_updates: float = 0.0
    sums_columns: bool = False
    chunk_walks: float = 0.0
    plane_walks: float = 0.0
    walk_blocks: int = 0
    list_tensors: int = 0
    relayout_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown cost category {self.category!r}; accepted: {CATEGORIES}")


# Cost is the node schema: every field is a graph-node attribute (and a key of the nodes a calibration row
# stores) of the same name and declared type, but gemm_mnk, stored as its three dimensions.
SPLIT_FIELDS = {"gemm_mnk": ("gemm_m", "gemm_n", "gemm_k")}
_CASTS = {"float": float, "int": int, "bool": bool, "str": str}


def node_attr_names() -> tuple[str, ...]:
    """The graph-node attributes a Cost sets, in declaration order."""
    return tuple(n for f in fields(Cost) for n in SPLIT_FIELDS.get(f.name, (f.name,)))


def node_attrs(cost: Cost) -> dict[str, Any]:
    """The graph-node attributes of `cost`, each cast to its declared type."""
    attrs: dict[str, Any] = {}
    for f in fields(Cost):
        value = getattr(cost, f.name)
        if f.name in SPLIT_FIELDS:
            attrs.update(zip(SPLIT_FIELDS[f.name], value))
        else:
            attrs[f.name] = _CASTS[f.type](value)
    return attrs


# OpCall.arg's `default` when its caller gives none: fall back to the schema's default.
_SCHEMA_DEFAULT: Any = object()


@dataclass(frozen=True)
class OpCall:
    """One dispatched ATen op with its (fake) arguments and result."""

    func: Any
    args: tuple
    kwargs: dict
    out: Any
    # The values a fake argument stands for where the trace knows them (routing indices, counts, offsets).
    value_of: Callable[[Any], "np.ndarray | None"] | None = None

    def known_value(self, t: Any) -> "np.ndarray | None":
        """Values of tensor `t` if the trace determined them (capture.routing), else None."""
        return self.value_of(t) if self.value_of is not None and t is not None else None

    def arg(self, name: str, default: Any = _SCHEMA_DEFAULT) -> Any:
        """The argument the op's schema calls `name` (positions differ between torch versions and between
        the ops a formula serves): as passed, else `default` if given, else the schema's default.
        Raises OpArgumentError if the schema has no such argument."""
        return schema_arg(self.func, self.args, self.kwargs, name, default)

    def has_arg(self, name: str) -> bool:
        """Whether the op's schema declares an argument `name` (ops sharing a formula differ)."""
        return any(a.name == name for a in self.func._schema.arguments)

    @property
    def first_arg(self) -> Any:
        """The op's first argument, its main operand whatever the schema calls it (`self`, `input`,
        `grad_output`): what formulas shared by many ops read."""
        return self.args[0] if self.args else None

    @property
    def inputs(self) -> list[torch.Tensor]:
        return tensors((self.args, self.kwargs))

    @property
    def outputs(self) -> list[torch.Tensor]:
        """Returned tensors, or the tensors written in place when the op returns nothing."""
        outs = tensors(self.out)
        return outs if outs else mutated_args(self.func, self.args, self.kwargs)


Formula = Callable[[OpCall], Cost]


def schema_arg(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str,
               default: Any = _SCHEMA_DEFAULT) -> Any:
    """Argument `name` of a call of `func`, read through its schema (OpCall.arg). The dispatcher drops
    trailing arguments equal to their default, so an absent argument takes `default` if given, else the
    schema's default; a required argument that is absent (or one the schema lacks) raises OpArgumentError."""
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.name != name:
            continue
        if not arg.kwarg_only and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        if default is not _SCHEMA_DEFAULT:
            return default
        if arg.has_default_value():
            return arg.default_value
        raise OpArgumentError(f"{func} was called without its required argument {name!r}")
    accepted = ", ".join(a.name for a in schema.arguments)
    raise OpArgumentError(f"{func} has no argument {name!r}; its schema declares: {accepted}")


def bind_args(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
    """A Python function's call arguments by parameter name, `names` being its positional parameters in order
    (schema_arg's counterpart for torch.nn.functional calls, which have no op schema)."""
    return {**dict(zip(names, args)), **kwargs}


@dataclass
class CostRegistry:
    """Maps ATen ops to cost formulas; overload-specific entries win over packet entries."""

    by_overload: dict[Any, Formula] = field(default_factory=dict)
    by_packet: dict[Any, Formula] = field(default_factory=dict)
    # Arguments (by schema name) an op's CUDA kernel makes contiguous before it runs (`.contiguous()` inside
    # the ATen implementation), by overload packet, and whether a dense channels-last tensor passes as is.
    staged_args: dict[Any, tuple[tuple[str, ...], bool]] = field(default_factory=dict)
    # The argument an op's CUDA kernel first copies, expanded to the output's shape, into its output (ops
    # that accumulate into their result), by overload packet, with the argument that skips the copy when 0.
    staged_into_output: dict[Any, tuple[str, str]] = field(default_factory=dict)

    def register(self, *ops: Any) -> Callable[[Formula], Formula]:
        """Decorator registering a formula for `ops` (overloads or overload packets); an op registered
        twice is an error, as one of the two formulas would silently never run."""
        def decorate(fn: Formula) -> Formula:
            for op in ops:
                table = self.by_overload if isinstance(op, torch._ops.OpOverload) else self.by_packet
                if op in table:
                    raise ValueError(f"cost formula for {op} registered twice ({table[op].__name__} and {fn.__name__})")
                table[op] = fn
            return fn
        return decorate

    def lookup(self, func: torch._ops.OpOverload) -> Formula | None:
        fn = self.by_overload.get(func) or self.by_packet.get(func.overloadpacket)
        if fn is not None:
            return fn
        # Tags let ops this registry has never seen still be priced by their kind.
        if torch.Tag.pointwise in func.tags:
            return pointwise_cost
        if torch.Tag.reduction in func.tags:
            return REDUCTION_BY_TAG
        return None

    def stage_contiguous(self, *ops: Any, args: tuple[str, ...], channels_last_ok: bool = False) -> None:
        """Declare that `ops` copy the tensor arguments named `args` to a contiguous layout first (or, with
        `channels_last_ok`, to the memory format they suggest, which a dense channels-last tensor already
        has): a copy kernel of its own, which a trace of the op alone never sees."""
        for op in ops:
            self.staged_args[op] = (tuple(args), channels_last_ok)

    def stage_into_output(self, *ops: Any, arg: str, unless_zero: str) -> None:
        """Declare that `ops` copy their argument `arg`, expanded to the output's shape, into the output
        before they accumulate into it (a copy kernel of its own), unless their argument `unless_zero` is 0."""
        for op in ops:
            self.staged_into_output[op] = (arg, unless_zero)

    def staged_copies(self, call: OpCall) -> list[OpCall]:
        """The copies `call` makes of its staged arguments not already in the layout its kernel needs (as
        clone calls on fake tensors; each writes a fresh tensor), and of the argument it copies into its
        output (a copy_ into the output itself); the caller records them before the op."""
        names, channels_last_ok = self.staged_args.get(call.func.overloadpacket, ((), False))
        copies = self._copies_into_output(call)
        for name in names:
            t = call.arg(name)
            if not isinstance(t, torch.Tensor) or t.numel() <= 1 or t.is_contiguous():
                continue
            layout = torch.channels_last if channels_last_ok and t.dim() == 4 and is_channels_last(t) \
                else torch.contiguous_format
            if t.is_contiguous(memory_format=layout):
                continue
            copies.append(OpCall(torch.ops.aten.clone.default, (t,), {"memory_format": layout},
                                 torch.empty_like(t, memory_format=layout)))
        return copies

    def _copies_into_output(self, call: OpCall) -> list[OpCall]:
        arg, unless_zero = self.staged_into_output.get(call.func.overloadpacket, ("", ""))
        if not arg or call.arg(unless_zero) == 0:
            return []
        src, out = call.arg(arg), call.out
        if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor) \
                or storage_key(src) == storage_key(out):
            return []
        return [OpCall(torch.ops.aten.copy_.default, (out, src.expand(out.shape)), {}, out)]

    def known_ops(self) -> list[str]:
        return sorted({str(k) for k in self.by_overload} | {str(k) for k in self.by_packet})

    def cost(self, call: OpCall) -> Cost:
        """Price one op call; unknown ops are priced by their tensor bytes and marked unsupported."""
        if is_free(call.func):
            return Cost(0.0, 0.0, 0.0, "view", kernels=0)
        fn = self.lookup(call.func)
        if fn is None:
            return generic_cost(call, category="other", supported=False)
        cost = fn(call)
        if not cost.channels_last and records_layout(cost) and is_channels_last(next(iter(call.inputs), None)):
            cost = replace(cost, channels_last=True)
        return cost


def records_layout(cost: Cost) -> bool:
    """Whether the kernel behind `cost` indexes by channel, so an NHWC input selects another kernel: pooling
    and resampling windows, and elementwise ops that broadcast a per-channel operand."""
    return cost.category == "pool" or (cost.category == "elementwise" and cost.broadcast)


REGISTRY = CostRegistry()
register_cost = REGISTRY.register


# ---------------------------------------------------------------- tensor helpers

def tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def tensor_bytes(t: torch.Tensor) -> float:
    """Bytes a kernel must move for `t`: its elements, but no more than its storage (expanded views)."""
    logical = t.numel() * t.element_size()
    try:
        storage = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return float(logical)
    return float(min(logical, storage)) if storage > 0 else float(logical)


def unique_bytes(ts: Iterable[torch.Tensor]) -> float:
    """Bytes of tensors, counting each storage once (the same tensor passed twice is read once)."""
    seen: set[int] = set()
    total = 0.0
    for t in ts:
        key = storage_key(t)
        if key in seen:
            continue
        seen.add(key)
        total += tensor_bytes(t)
    return total


def storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def shape_of(t: Any) -> tuple[int, ...]:
    """The shape of `t` if it is a tensor, else () (an optional argument left out)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def numel(tree: Any) -> int:
    return sum(t.numel() for t in tensors(tree))


def mutated_args(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors the op writes in place, read off its schema (`Tensor(a!)`)."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        out.extend(tensors(value))
    return out


def is_free(func: torch._ops.OpOverload) -> bool:
    """Metadata-only ops launch no kernel: views, aliases, allocations without init."""
    return func.is_view or func in FREE_OPS or func.overloadpacket in FREE_OPS


FREE_OPS: set[Any] = set()


def mark_free(*ops: Any) -> None:
    FREE_OPS.update(ops)


# ---------------------------------------------------------------- generic formulas

# Categories whose kernels stream tensors element by element: their speed depends on whether inputs and
# outputs share a memory order. GEMM-like kernels choose their own access pattern (a transposed operand is
# a layout flag to cuBLAS, not a slower copy).
LAYOUT_SENSITIVE_CATEGORIES = frozenset({"elementwise", "copy", "other"})


def layout_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """Dimensions of `t` (those longer than 1) from outermost to innermost in memory; None for a
    broadcast (stride-0) tensor, whose order says nothing about how it is read."""
    if is_expanded(t):
        return None
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    return tuple(sorted(dims, key=lambda d: -t.stride(d)))


def is_dense(t: torch.Tensor) -> bool:
    """Whether `t` fills its memory without gaps in some order of its dimensions (contiguous, channels-last,
    a transpose) rather than being a strided view into a larger tensor (a slice, a chunk)."""
    dims = sorted((d for d in range(t.dim()) if t.shape[d] > 1), key=lambda d: t.stride(d))
    expected = 1
    for d in dims:
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def is_channels_last(x: Any) -> bool:
    """Whether an activation (N, C, spatial...) has its channels innermost in memory (NHWC/NDHWC)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 4 or x.shape[1] <= 1:
        return False
    order = layout_order(x)
    return order is not None and order[-1] == 1


def is_permuted(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> bool:
    """Whether an input of an output's shape is laid out in a different memory order from it, or either
    is a strided view with gaps: TensorIterator then runs its strided loop, one element per lane,
    instead of its vectorised one."""
    for out in outputs:
        order = layout_order(out)
        if order is None:
            continue
        for t in inputs:
            if t.shape == out.shape and storage_key(t) != storage_key(out):
                if layout_order(t) is not None and (reads_strided(t, order) or not is_dense(out)):
                    return True
    return False


def reads_strided(t: torch.Tensor, order: tuple[int, ...]) -> bool:
    """Whether `t` (not broadcast), read in memory `order`, is laid out in another order or has gaps."""
    return layout_order(t) != order or not is_dense(t)


# TensorIterator's strided (non-vectorised) loop gives each block of 128 threads 4 consecutive output
# elements per thread, and DRAM and L2 move data in 32-byte sectors. A block's loads that share a sector
# are served once; a sector the block uses only in part is fetched again by the blocks that need the rest.
LOOP_BLOCK_ELEMENTS = 512
SECTOR_BYTES = 32
# Blocks sampled (as fractions of the output) for the read pattern: where a dimension is not a multiple
# of the block, blocks at different offsets straddle its rows differently.
SAMPLED_BLOCK_AT = (0.0, 0.37, 0.71)


def read_amplification(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    """Sectors that blocks of LOOP_BLOCK_ELEMENTS consecutive output elements (in the output's memory
    order) read from the inputs of the output's shape laid out in another order, over the sectors the
    bytes they read would fill if contiguous (>= 1; 1 when no input is permuted)."""
    out = max(outputs, key=lambda t: t.numel(), default=None)
    order = layout_order(out) if out is not None else None
    if not order:
        return 1.0
    permuted = [t for t in inputs if t.shape == out.shape and layout_order(t) is not None and reads_strided(t, order)]
    return strided_read_amplification(permuted, order)


def strided_read_amplification(ts: list[torch.Tensor], order: tuple[int, ...]) -> float:
    """Sectors that blocks of LOOP_BLOCK_ELEMENTS consecutive elements, walked in the dimension `order` of
    the writer (outermost first), read from each of `ts` through its strides, over the sectors those bytes
    would fill if contiguous (>= 1; 1 for no tensors)."""
    touched = ideal = 0.0
    for t in ts:
        sizes = [int(t.shape[d]) for d in order]
        n = math.prod(sizes)
        for at in SAMPLED_BLOCK_AT:
            start = int(at * n) // LOOP_BLOCK_ELEMENTS * LOOP_BLOCK_ELEMENTS
            index = np.arange(start, min(start + LOOP_BLOCK_ELEMENTS, n), dtype=np.int64)
            coords = np.unravel_index(index, sizes)
            offset = sum(c * int(t.stride(d)) for c, d in zip(coords, order))
            touched += len(np.unique(offset * t.element_size() // SECTOR_BYTES))
            ideal += max(len(index) * t.element_size() / SECTOR_BYTES, 1.0)
    return max(touched / ideal, 1.0) if ideal else 1.0


def generic_cost(call: "OpCall", *, category: str, flops: float = 0.0, supported: bool = True,
                 kernels: int = 1) -> Cost:
    """Traffic of every input read once and every output (or in-place target) written once."""
    inputs, outputs = call.inputs, call.outputs
    streaming = category in LAYOUT_SENSITIVE_CATEGORIES
    broadcast = streaming and is_broadcast(inputs, outputs)
    permuted = streaming and is_permuted(inputs, outputs)
    return Cost(float(flops), unique_bytes(inputs), unique_bytes(outputs), category,
                supported=supported, kernels=kernels, permuted=permuted,
                read_amplification=read_amplification(inputs, outputs) if permuted else 1.0,
                mixed_dtypes=has_mixed_dtypes(inputs), broadcast=broadcast,
                broadcast_run=broadcast_run(inputs, outputs) if broadcast else 0)


def is_broadcast(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> bool:
    """Whether an input of more than one element is smaller than the output it is expanded to, or is an
    expanded view (autograd's backward of a mean: the gradient expanded, then divided by the count)."""
    size = max((t.numel() for t in outputs), default=0)
    return any(is_broadcast_input(t, size) for t in inputs)


def is_broadcast_input(t: torch.Tensor, size: int) -> bool:
    """Whether `t` (more than one element) is read expanded to an output of `size` elements: smaller than it,
    or an expanded view."""
    return 1 < t.numel() < size or (t.numel() > 1 and is_expanded(t))


def is_expanded(t: torch.Tensor) -> bool:
    """Whether `t` is a view that repeats its values along a dimension (stride 0, size > 1)."""
    return any(t.stride(d) == 0 and t.shape[d] > 1 for d in range(t.dim()))


def source_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape of the values `t` holds: 1 along the dimensions an expanded view repeats."""
    return tuple(1 if t.stride(d) == 0 else int(size) for d, size in enumerate(t.shape))


def broadcast_run(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Cost.broadcast_run of inputs expanded to the largest output by PyTorch's broadcasting rule
    (shapes aligned at the right): the shortest run over the expanded inputs, 0 if none is expanded."""
    out = max(outputs, key=lambda t: t.numel(), default=None)
    order = layout_order(out) if out is not None else None
    if not order:
        return 0
    runs = []
    for t in inputs:
        if not is_broadcast_input(t, out.numel()) or t.dim() > out.dim():
            continue
        runs.append(expanded_run((1,) * (out.dim() - t.dim()) + source_shape(t), out, order))
    return min(runs, default=0)


def expanded_run(shape: tuple[int, ...], out: torch.Tensor, order: tuple[int, ...] | None = None) -> int:
    """Elements of `out`, innermost in memory, over which a tensor of `shape` (one size per dimension of
    `out`, 1 where it is expanded) keeps one value."""
    return innermost_run(out, {d for d, size in enumerate(shape) if size == 1}, order)


def innermost_run(t: torch.Tensor, dims: set[int], order: tuple[int, ...] | None = None) -> int:
    """Elements of `t` in its innermost memory dimensions for as long as they are among `dims` (`order`:
    layout_order(t), when the caller has it)."""
    run = 1
    for d in reversed(order if order is not None else layout_order(t) or ()):
        if d not in dims:
            break
        run *= t.shape[d]
    return run


def has_mixed_dtypes(inputs: list[torch.Tensor]) -> bool:
    """Whether tensors of more than one floating dtype are read. A single-element tensor counts: on the GPU it is
    an operand of its own (only Python numbers and CPU scalars become kernel constants), and a 0-dim fp32
    parameter scaling a bf16 activation sends TensorIterator to its casting, non-vectorised path (NFNet-F0's
    scalar gains took 4x the vectorised time, data/kernels/H200-in-model-ops.jsonl.gz)."""
    return len({t.dtype for t in inputs if t.is_floating_point()}) > 1


def pointwise_cost(call: "OpCall", flops_per_element: float = 1.0) -> Cost:
    n = sum(t.numel() for t in call.outputs)
    return generic_cost(call, category="elementwise", flops=flops_per_element * n)


# (independent rows, elements per row[, elements per contiguous run of a row[, kept run (Cost.kept_run)]])
RowShape = Callable[["OpCall"], "tuple[int, ...]"]


def by_category(category: str, flops_per_output: float = 0.0, flops_per_input: float = 0.0,
                kernels: int = 1, rows: RowShape | None = None) -> "Formula":
    """A formula whose FLOPs scale with the elements of the outputs and/or of the first input.
    rows: for row-wise ops, gives (independent rows, elements per row[, elements per contiguous run of a
    row[, kept run]]) of the call (Cost.row_count, row_len, row_segment, kept_run)."""
    def formula(call: "OpCall") -> Cost:
        n_in = sum(t.numel() for t in tensors(call.first_arg))
        n_out = sum(t.numel() for t in call.outputs)
        cost = generic_cost(call, category=category,
                            flops=flops_per_output * n_out + flops_per_input * n_in, kernels=kernels)
        if rows is None:
            return cost
        n_rows, length, *segment = rows(call)
        return replace(cost, row_count=int(n_rows), row_len=int(length), row_segment=int(segment[0]) if segment else 0,
                       kept_run=int(segment[1]) if len(segment) > 1 else 0)
    return formula


def with_atomic_adds(formula: "Formula") -> "Formula":
    """`formula` for an op whose CUDA kernel scatters into its output with atomic adds (Cost.atomic_adds)."""
    def with_atomics(call: "OpCall") -> Cost:
        return replace(formula(call), atomic_adds=True)
    return with_atomics


def reduced_rows(call: "OpCall") -> tuple[int, int, int, int]:
    """Rows of a reduction: one per element of its (first) result, each as long as the input is
    larger than that result, the contiguous run of a row (Cost.row_segment): the reduced dimensions
    innermost in memory, or single elements when the innermost dimension is kept (a column sum), and then
    the kept elements between two reduced ones (Cost.kept_run)."""
    source = tensors(call.first_arg)
    outs = call.outputs
    n_in = source[0].numel() if source else 0
    n_out = max(outs[0].numel(), 1) if outs else 1
    length = n_in // n_out if n_in else 0
    run, kept = _reduced_runs(call, source[0]) if source else (0, 0)
    segmented = 0 < run < length
    return n_out, length, run if segmented else 0, kept if segmented and run == 1 else 0


def _reduced_runs(call: "OpCall", x: torch.Tensor) -> tuple[int, int]:
    """Elements of `x` that one contiguous run of a reduced row holds, and those of the kept dimensions
    innermost in memory (0, 0 when the call names no dims)."""
    # A dim the dispatcher dropped as default (topk's -1) counts as none, as the profiles were fitted so.
    dim = call.arg("dim", default=None) if call.has_arg("dim") else None
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return 0, 0
    reduced = {int(d) % max(x.dim(), 1) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    order = layout_order(x)
    if not order:
        return 0, 0
    return innermost_run(x, reduced, order), innermost_run(x, set(order) - reduced, order)


# ATen ops that exist in some of the torch versions gpuest supports (2.11-2.14) and not in others: the
# only names registration may skip. Any other unknown name is a typo or a removed op, and fails loudly.
VERSION_DEPENDENT_OPS = frozenset({"_unsafe_view_copy"})


def iter_ops(names: Iterable[str]) -> Iterator[Any]:
    """ATen overload packets by name; a name this torch lacks is skipped only if VERSION_DEPENDENT_OPS
    lists it."""
    for name in names:
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            yield op
        elif name not in VERSION_DEPENDENT_OPS:
            raise ValueError(f"aten.{name} does not exist in torch {torch.__version__}: fix the name, or list it in "
                             "VERSION_DEPENDENT_OPS if only some supported torch versions have it")


REDUCTION_BY_TAG = by_category("reduction", flops_per_input=1.0, rows=reduced_rows)
