"""The numeric columns of an annotated graph, as numpy arrays, for vectorised pricing."""
from __future__ import annotations

import weakref
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Iterable, Mapping

import networkx as nx
import numpy as np

from ..annotate.registry import CATEGORIES, TENSOR_CORE_CATEGORIES, Cost
from ..capture.trace import GRAPH_SCHEMA
from ..errors import GraphNotAnnotatedError
from ..profile import is_in_place, op_variants, variant_op
from .arrays import map_values

REQUIRED_NODE_ATTRS = ("op", "category", "phase", "flops", "bytes_read", "bytes_written", "math_mode",
                       "kernels", "free", "host_only")
PHASES = ("forward", "loss", "backward", "optimizer")
LOW_PRECISION_MODES = ("bf16", "fp16", "fp8")   # math modes of nodes whose data is under 32 bits


@dataclass(frozen=True, eq=False)   # compared and hashed by identity: pricing caches key on the table
class NodeTable:
    """One entry per graph node, in execution order."""

    node_ids: np.ndarray      # graph node keys
    op: np.ndarray            # str
    category: np.ndarray      # str
    phase: np.ndarray         # str
    module: np.ndarray        # str
    math_mode: np.ndarray     # str
    flops: np.ndarray         # FLOP (torch's count)
    flops_skipped: np.ndarray # FLOP counted in `flops` that a causal kernel skips
    bytes: np.ndarray         # bytes read + written
    bytes_written: np.ndarray
    kernels: np.ndarray       # CUDA kernels launched
    gemm: np.ndarray          # (n, 4): M, N, K, batch
    gemm_row_bytes: np.ndarray  # a matmul's row alignment in bytes, up to 16 (Cost.gemm_row_bytes); 16 otherwise
    gemm_bias: np.ndarray     # bool: the GEMM adds a bias vector in its epilogue (Cost.gemm_bias)
    gemm_mn_major: np.ndarray # a matmul's operands stored with K not contiguous, 0-2 (Cost.gemm_mn_major)
    rowwise: np.ndarray       # (n, 2): independent rows, elements per row (row-wise ops; else 0)
    row_segment: np.ndarray   # elements per contiguous run of a row made of strided runs; 0 if contiguous
    kept_run: np.ndarray      # kept elements between two reduced ones of a column-style reduction; 0 otherwise
    permuted: np.ndarray      # bool: reads an input in another memory order than it writes (transposing copy)
    read_amplification: np.ndarray  # sectors a permuted op's loop block reads / sectors its bytes fill (>= 1)
    window: np.ndarray        # sliding-window area of convolutions and pooling (kh * kw); 0 otherwise
    channels_last: np.ndarray # bool: the op reads NHWC-stored activations (Cost.channels_last)
    gemm_plane: np.ndarray    # H * W of a 1x1 stride-1 ungrouped convolution (a GEMM over NCHW planes); else 0
    relayout_bytes: np.ndarray  # activation bytes a convolution's cuDNN calls transpose into a workspace (NCHW data)
    mixed_dtypes: np.ndarray  # bool: reads floating tensors of more than one dtype
    broadcast: np.ndarray     # bool: a streaming op reading a smaller tensor expanded to the output
    broadcast_run: np.ndarray # output elements over which the expanded tensor keeps one value; 0 if none
    host_syncs: np.ndarray    # times the op waits on the host for a value from the GPU
    grid_syncs: np.ndarray    # grid-wide barriers inside its kernels (a persistent RNN's steps)
    reduce_kernel: np.ndarray # bool: runs ATen's generic reduction kernel (launch: gpuest.price.reduce_launch)
    table_lookup: np.ndarray  # bool: looks table rows up by index (an embedding)
    serial_steps: np.ndarray  # memory round trips its kernel makes one after another
    fit_op: np.ndarray        # str: the op qualified by its kernel variant (Cost.variant), as fits key it
    atomic_adds: np.ndarray   # bool: accumulates into its output with atomic adds (a scatter)
    dependent_updates: np.ndarray  # serial read-modify-writes of one output row (Cost.dependent_updates)
    sums_columns: np.ndarray  # bool: also sums its gradient over the rows per column (Cost.sums_columns)
    chunk_walks: np.ndarray   # steps of a multi-tensor op's longest chunk walk per launch, summed (Cost.chunk_walks)
    plane_walks: np.ndarray   # planes each thread of an NCHW interpolation walks in turn (Cost.plane_walks)
    walk_blocks: np.ndarray   # 1024-thread blocks of that walking grid (Cost.walk_blocks)
    list_tensors: np.ndarray  # tensors in each list of a multi-tensor op; 0 for other ops (Cost.list_tensors)
    free: np.ndarray          # bool: metadata-only, no kernel, no host dispatch worth pricing
    host_only: np.ndarray     # bool: runs on the CPU only
    supported: np.ndarray     # bool
    tensor_core: np.ndarray   # bool: FLOPs run on tensor cores (peak depends on the math mode)
    module_calls: np.ndarray  # Python nn.Module calls dispatched just before this node
    autocast: np.ndarray      # bool: dispatched with autocast on (mixed precision forward)
    staged: np.ndarray        # bool: a copy an op makes of its own input inside its C++ call (staged_for)
    in_place: np.ndarray      # bool: writes into its own input (ATen's trailing-underscore ops)
    # Bytes of its reads that the kernel right before it wrote, and that kernel's bytes written: the graph's
    # producer-consumer adjacency (warm_reads); 0 in tables of separate rows (the calibration's benchmarks).
    warm_read_bytes: np.ndarray
    warm_producer_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.op)

    def low_precision(self) -> np.ndarray:
        """bool per node: its data is 16-bit or narrower (LOW_PRECISION_MODES)."""
        return np.isin(self.math_mode, LOW_PRECISION_MODES)

    def has_variant(self, variant: str) -> np.ndarray:
        """bool per node: its kernel variant (Cost.variant, "+"-joined) includes `variant`."""
        return np.asarray([variant in op_variants(op) for op in self.fit_op.tolist()], dtype=bool)

    def map_category(self, values: Mapping[str, float], default: float) -> np.ndarray:
        """One value per node looked up by its category (vectorised over the few distinct categories)."""
        return map_values(self.category, values, default)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], node_ids: Iterable[Any] | None = None) -> "NodeTable":
        rows = list(records)
        col = lambda key, default=0: [r.get(key, default) for r in rows]  # noqa: E731
        # Every Cost field the table keeps under its own name is read as the schema declares it.
        from_cost = {f.name: np.asarray(col(f.name, 0 if f.default is MISSING else f.default),
                                        dtype=bool if f.type == "bool" else float)
                     for f in fields(Cost) if f.name in TABLE_COLUMNS and f.type in ("float", "int", "bool")}
        return cls(
            node_ids=np.asarray(list(node_ids) if node_ids is not None else range(len(rows))),
            op=np.asarray(col("op", ""), dtype=object),
            category=np.asarray(col("category", "other"), dtype=object),
            phase=np.asarray(col("phase", "forward"), dtype=object),
            module=np.asarray(col("module", ""), dtype=object),
            math_mode=np.asarray(col("math_mode", "fp32"), dtype=object),
            bytes=np.asarray(col("bytes_read"), dtype=float) + np.asarray(col("bytes_written"), dtype=float),
            gemm=np.asarray([[r.get("gemm_m", 0), r.get("gemm_n", 0), r.get("gemm_k", 0), r.get("gemm_batch", 1)]
                             for r in rows], dtype=float).reshape(len(rows), 4),
            rowwise=np.asarray([[r.get("row_count", 0), r.get("row_len", 0)] for r in rows],
                               dtype=float).reshape(len(rows), 2),
            fit_op=np.asarray([variant_op(str(r.get("op", "")), str(r.get("variant") or "")) for r in rows],
                              dtype=object),
            free=np.asarray(col("free", False), dtype=bool),
            tensor_core=np.asarray([runs_on_tensor_cores(r) for r in rows], dtype=bool),
            module_calls=np.asarray(col("module_calls", 0), dtype=float),
            autocast=np.asarray(col("autocast", False), dtype=bool),
            staged=np.asarray([bool(r.get("staged_for")) for r in rows], dtype=bool),
            in_place=np.asarray([is_in_place(str(r.get("op", ""))) for r in rows], dtype=bool),
            warm_read_bytes=np.zeros(len(rows)), warm_producer_bytes=np.zeros(len(rows)),
            **from_cost,
        )


TABLE_COLUMNS = frozenset(f.name for f in fields(NodeTable))


def warm_reads(graph: nx.DiGraph, order: list[Any], table: NodeTable) -> tuple[np.ndarray, np.ndarray]:
    """Per node of `table` (graph nodes `order`): the bytes it reads that the kernel right before it wrote
    (at most what that kernel wrote), and that kernel's bytes written; 0 where the kernel before it is not
    among its producers. Producers are looked through metadata-only nodes (views) to the kernels behind them."""
    pos = {n: i for i, n in enumerate(order)}
    kernel = ~(table.free | table.host_only)
    producers: dict[Any, frozenset[int]] = {}
    warm, written = np.zeros(len(order)), np.zeros(len(order))
    reads = table.bytes - table.bytes_written
    previous = -1
    for i, n in enumerate(order):   # execution order: every producer is resolved before its consumers
        producers[n] = frozenset().union(*({pos[src]} if kernel[pos[src]] else producers.get(src, frozenset())
                                           for src in graph.predecessors(n)))
        if not kernel[i]:
            continue
        if previous in producers[n]:
            warm[i] = min(table.bytes_written[previous], reads[i])
            written[i] = table.bytes_written[previous]
        previous = i
    return warm, written


# cuDNN runs a grouped convolution with fewer output channels per group than a tensor-core MMA is wide
# (depthwise convolutions: one) on CUDA cores, in fp32 arithmetic, whatever the math mode allows.
MIN_TENSOR_CORE_GROUP_WIDTH = 8


def runs_on_tensor_cores(node: Mapping[str, Any]) -> bool:
    """Whether a node's FLOPs run on tensor cores (its peak then depends on the math mode)."""
    category = node.get("category")
    if category not in TENSOR_CORE_CATEGORIES:
        return False
    width, groups = node.get("gemm_n", 0) or 0, node.get("gemm_batch", 1) or 1
    return not (category == "conv" and groups > 1 and 0 < width < MIN_TENSOR_CORE_GROUP_WIDTH)


def check_annotated(graph: nx.DiGraph) -> None:
    """Raise `GraphNotAnnotatedError` unless `graph` came from `gpuest.trace` (or a faithful copy)."""
    if not isinstance(graph, nx.DiGraph):
        raise GraphNotAnnotatedError(f"expected a networkx.DiGraph from gpuest.trace, got {type(graph).__name__}")
    schema = graph.graph.get("schema")
    if schema != GRAPH_SCHEMA:
        raise GraphNotAnnotatedError(
            f"this graph was not produced by gpuest.trace (graph attribute schema={schema!r}, expected "
            f"{GRAPH_SCHEMA!r}); trace the model with gpuest.trace(model, inputs) or pass the model itself")
    for node, data in graph.nodes(data=True):
        missing = [k for k in REQUIRED_NODE_ATTRS if k not in data]
        if missing:
            raise GraphNotAnnotatedError(f"node {node!r} lacks the annotations {missing}; the graph was not "
                                         "produced by gpuest.trace or was edited")
        if data["category"] not in CATEGORIES:
            raise GraphNotAnnotatedError(f"node {node!r} has unknown category {data['category']!r}")
        break  # one node checked fully; the table build checks the rest by type


_CACHE: "weakref.WeakKeyDictionary[nx.DiGraph, tuple[int, NodeTable]]" = weakref.WeakKeyDictionary()


def node_table(graph: nx.DiGraph) -> NodeTable:
    """Columns of a traced graph, in execution order (cached per graph object and size)."""
    check_annotated(graph)
    cached = _CACHE.get(graph)
    if cached is not None and cached[0] == graph.number_of_nodes():
        return cached[1]
    items = sorted(graph.nodes(data=True), key=lambda kv: kv[1].get("order", 0))
    table = NodeTable.from_records((d for _, d in items), (n for n, _ in items))
    warm, written = warm_reads(graph, [n for n, _ in items], table)
    table = replace(table, warm_read_bytes=warm, warm_producer_bytes=written)
    _CACHE[graph] = (graph.number_of_nodes(), table)
    return table
