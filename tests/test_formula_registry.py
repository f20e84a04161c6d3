"""Registration of cost formulas and residual features fails loudly (torch's flop_counter registry
does the same): a second formula for one op, an op name this torch lacks that is not declared
version-dependent, a feature registered twice or without the reason it exists."""
from __future__ import annotations

import pytest
import torch

from gpuest.annotate.registry import VERSION_DEPENDENT_OPS, CostRegistry, by_category, iter_ops
from gpuest.price import features


def test_a_second_formula_for_one_op_is_refused():
    registry = CostRegistry()
    registry.register(torch.ops.aten.relu)(by_category("elementwise"))
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(torch.ops.aten.relu)(by_category("elementwise"))


def test_an_unknown_op_name_is_refused_unless_declared_version_dependent():
    with pytest.raises(ValueError, match="aten.relux does not exist"):
        list(iter_ops(["relu", "relux"]))
    missing = sorted(VERSION_DEPENDENT_OPS)[0]
    assert [str(op) for op in iter_ops(["relu", missing])][0] == "aten.relu"


def test_the_feature_registry_refuses_duplicates_and_undocumented_features():
    with pytest.raises(ValueError, match="registered twice"):
        features.feature("const")(lambda x: x)

    def undocumented(x):
        return x
    with pytest.raises(ValueError, match="no docstring"):
        features.feature("a_new_feature")(undocumented)
    assert "a_new_feature" not in features.FEATURES


def test_profiles_use_the_registry_order():
    assert features.RESIDUAL_FEATURES == tuple(features.FEATURES) and features.RESIDUAL_FEATURES[0] == "const"
    assert all(len(f.reason) > 20 for f in features.FEATURES.values())


def test_the_decision_log_matches_the_code():
    """docs/DECISIONS.md is generated from the constants' comments; regenerate it when they change."""
    from pathlib import Path

    from gpuest.report.decisions import render
    committed = (Path(__file__).resolve().parents[1] / "docs/DECISIONS.md").read_text()
    assert committed == render(), "docs/DECISIONS.md is stale: python3 -m gpuest.report.decisions -o docs/DECISIONS.md"


def test_formulas_read_arguments_by_schema_name():
    """OpCall.arg finds an argument wherever the call put it, falls back to the schema's default for one the
    dispatcher dropped (it omits trailing defaults), and refuses a name the schema lacks."""
    from gpuest.annotate.registry import OpCall
    from gpuest.errors import OpArgumentError
    x = torch.empty(2, 3)
    roll = torch.ops.aten.roll.default
    assert OpCall(roll, (x, [1], [0]), {}, x).arg("dims") == [0]
    assert OpCall(roll, (x, [1]), {}, x).arg("dims") == []              # int[1] dims=[]
    assert OpCall(roll, (x, [1]), {}, x).arg("dims", default=None) is None
    topk = torch.ops.aten.topk.default
    assert OpCall(topk, (x, 2), {"largest": False}, None).arg("largest") is False
    call = OpCall(roll, (x,), {}, x)
    with pytest.raises(OpArgumentError, match="required argument 'shifts'"):
        call.arg("shifts")
    with pytest.raises(OpArgumentError, match="no argument 'dimz'.*self, shifts, dims"):
        call.arg("dimz")
    assert call.has_arg("dims") and not call.has_arg("dimz")


def test_baddbmm_with_beta_copies_its_input_into_the_output_and_reads_it_back():
    """baddbmm(self, b1, b2) with beta != 0 first copies (broadcast) `self` into the output, a staged copy_
    node of its own that reads the expanded bias and writes the output, then the GEMM reads the output back:
    one more output-sized read than with beta = 0, which makes no copy."""
    from gpuest.capture import trace

    class AlibiScores(torch.nn.Module):
        def forward(self, bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple:
            return torch.baddbmm(bias, q, k, beta=1.0, alpha=0.125), torch.baddbmm(bias, q, k, beta=0.0)
    g = trace(AlibiScores(), (torch.randn(8, 1, 64), torch.randn(8, 64, 32), torch.randn(8, 32, 64)))
    nodes = [d for _, d in g.nodes(data=True)]
    with_beta, without = [d for d in nodes if d["op"] == "aten.baddbmm.default"]
    out_bytes = 8 * 64 * 64 * 4
    assert with_beta["bytes_written"] == without["bytes_written"] == out_bytes
    assert with_beta["bytes_read"] - without["bytes_read"] == out_bytes
    staged = [d for d in nodes if d.get("staged_for")]
    assert [(d["op"], d["staged_for"]) for d in staged] == [("aten.copy_.default", "aten.baddbmm.default")]
    assert staged[0]["bytes_written"] == out_bytes and staged[0]["bytes_read"] == 8 * 64 * 4
    assert nodes.index(staged[0]) == nodes.index(with_beta) - 1


def test_an_in_place_scatter_moves_only_the_elements_its_index_names():
    """index_copy_ (a static KV cache's per-token update), scatter_, index_fill_ and put_ write what their index
    names into a target they do not read: the traffic of the updates and the index, not of the whole target."""
    from gpuest.capture import trace

    class Scatters(torch.nn.Module):
        def forward(self, cache, token, pos, rows, cols):
            cache.index_copy_(2, pos, token)
            return (cache, torch.zeros(64, 100).scatter_(1, cols, rows), torch.zeros(64, 100).scatter_(1, cols, 1.0),
                    torch.zeros(64, 100).index_fill_(1, pos.repeat(3), 0.5), torch.zeros(1000).put_(cols[0], rows[0]))
    g = trace(Scatters(), (torch.empty(8, 4, 4096, 64), torch.empty(8, 4, 1, 64), torch.zeros(1, dtype=torch.long),
                           torch.empty(64, 5), torch.zeros(64, 5, dtype=torch.long)))
    cost = {d["op"]: (d["bytes_read"], d["bytes_written"], d["supported"]) for _, d in g.nodes(data=True)
            if d["op"].split(".")[1] in ("index_copy_", "scatter_", "index_fill_", "put_")}
    token, index = 8 * 4 * 64 * 4, 64 * 5 * 8
    assert cost["aten.index_copy_.default"] == (token + 8, token, True)       # one token of a 4096-token cache
    assert cost["aten.scatter_.src"] == (index + 320 * 4, 320 * 4, True)
    assert cost["aten.scatter_.value"] == (index, 320 * 4, True)
    assert cost["aten.index_fill_.int_Scalar"] == (3 * 8, 3 * 64 * 4, True)   # three whole columns
    assert cost["aten.put_.default"] == (5 * 8 + 5 * 4, 5 * 4, True)
