"""Sort and top-k are priced with the launches CUDA's kernels make (gpuest.annotate.formulas.reduce): the
in-place block sort of short rows, cub's radix sort of long ones (a pass per key byte), and top-k's single-
or multi-block radix select. Every row of the committed device probe (data/kernels/H200-sort-topk.jsonl.gz,
benchmarks/sort_topk_probe.py) is traced on fake tensors and its node's launches compared."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpuest.annotate.formulas.reduce import topk_multiblock
from gpuest.capture.trace import trace
from gpuest.jsonl import read_jsonl

PROBE = Path(__file__).resolve().parents[1] / "data" / "kernels" / "H200-sort-topk.jsonl.gz"
ROWS = [r for r in read_jsonl(PROBE) if r["op"] in ("sort", "topk")]


class _Op(torch.nn.Module):
    def __init__(self, op: str, k: int) -> None:
        super().__init__()
        self.op, self.k = op, k

    def forward(self, x: torch.Tensor):
        return torch.sort(x, dim=-1) if self.op == "sort" else torch.topk(x, self.k, dim=-1)


def _node(op: str, rows: int, length: int, dtype: torch.dtype, k: int = 0) -> dict:
    x = torch.empty((length,) if rows == 1 else (rows, length), dtype=dtype)
    graph = trace(_Op(op, k), (x,))
    (node,) = [d for _, d in graph.nodes(data=True) if d["op"].startswith(f"aten.{op}")]
    return node


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['op']}-{r['rows']}x{r['length']}-{r['dtype']}-k{r['k']}")
def test_launches_match_the_device_probe(row):
    node = _node(row["op"], row["rows"], row["length"], getattr(torch, row["dtype"]), row["k"])
    assert node["kernels"] == row["launches"]
    assert node["row_count"] == row["rows"] and node["row_len"] == row["length"]


def test_a_long_sort_moves_its_keys_once_per_radix_pass():
    """cub's radix sort reads and writes every key and index once per 8 bits of key: an int64 sort moves
    more than twice an int32 one's bytes, and a short row sorted in place moves them about once."""
    n = 1 << 20
    wide, narrow = _node("sort", 1, n, torch.int64), _node("sort", 1, n, torch.int32)
    assert wide["bytes_read"] > 2 * narrow["bytes_read"] > 0
    in_place = _node("sort", n // 1024, 1024, torch.int64)
    assert in_place["bytes_read"] < wide["bytes_read"] / 4


def test_top_k_takes_the_multi_block_select_by_torchs_row_table():
    """TensorTopK.cu's should_use_multiblock: long rows, or many rows of a few hundred elements."""
    assert topk_multiblock(1, 20000) and not topk_multiblock(1, 19999)
    assert topk_multiblock(64, 8000) and not topk_multiblock(64, 7999)
    assert topk_multiblock(5000, 400) and not topk_multiblock(5000, 399)
    assert not topk_multiblock(2048, 60)
