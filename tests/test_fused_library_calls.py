"""Recurrent layers are traced as the two cuDNN library calls CUDA runs, holding what those calls hold."""
from __future__ import annotations

import pytest
import torch

from gpuest.capture import trace
from gpuest.capture.fused_library_calls import RNN_RESERVE_ELEMENTS


def rnn_nodes(graph) -> list[dict]:
    return [d for _, d in graph.nodes(data=True) if d["category"] == "rnn"]


def allocations(node: dict) -> list[int]:
    """Bytes of each storage the node allocates, in order (mem_events tokens '+SID:BYTES')."""
    return [int(tok.split(":")[1]) for tok in node["mem_events"].split() if tok.startswith("+")]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_forward_and_one_backward_call_whatever_the_sequence_length(cell, dtype):
    """The CPU path dispatches per time step for GRU and 16-bit LSTM; the stand-in dispatches the same few
    ops at any length, and the node's work still grows with the steps."""
    rnn_cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell]
    model = rnn_cls(input_size=48, hidden_size=64, num_layers=2).to(dtype)

    def traced(steps: int) -> list[dict]:
        return rnn_nodes(trace(model, (torch.randn(steps, 3, 48, dtype=dtype),), mode="training"))

    short, long = traced(12), traced(200)
    assert [d["phase"] for d in short] == [d["phase"] for d in long] == ["forward", "backward"]
    assert [d["fused_ops"] for d in short] == [d["fused_ops"] for d in long]
    assert all(d["supported"] for d in short + long)
    assert all(b["flops"] > 10 * a["flops"] for a, b in zip(short, long))


@pytest.mark.parametrize("cell,layers,bidirectional", [("lstm", 1, False), ("lstm", 2, True), ("gru", 3, False)])
def test_training_forward_allocates_cudnns_reserve(cell, layers, bidirectional):
    """The reserve kept for backward is RNN_RESERVE_ELEMENTS per layer, direction, step, batch row and hidden
    unit, plus one for each layer's output but the last's (the H200 probe's measurement)."""
    steps, batch, hidden = 40, 16, 96
    rnn_cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell]
    model = rnn_cls(32, hidden, num_layers=layers, bidirectional=bidirectional)
    x = torch.randn(steps, batch, 32)
    directions = 2 if bidirectional else 1
    unit = directions * steps * batch * hidden
    reserve = 4 * (RNN_RESERVE_ELEMENTS[cell.upper()] * layers * unit + (layers - 1) * unit)
    forward = rnn_nodes(trace(model, (x,), mode="training"))[0]
    assert reserve in allocations(forward)
    assert reserve not in allocations(rnn_nodes(trace(model, (x,), mode="inference"))[0])


def test_batch_first_output_is_cudnns_transposed_view():
    """cuDNN runs time-major: a batch-first call copies its input and returns its output as a transposed
    view, so a Linear after it sees a non-contiguous input (matmul with a copy, then the bias added in place)."""
    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(32, 64, batch_first=True)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    graph = trace(Tagger(), (torch.randn(8, 50, 32),), mode="inference")
    ops = [d["op"] for _, d in graph.nodes(data=True) if not d["free"]]
    assert ops[0] == "aten._cudnn_rnn.default"
    assert "aten.addmm.default" not in ops and "aten.add_.Tensor" in ops
    (rnn,) = rnn_nodes(graph)
    assert 8 * 50 * 32 * 4 in allocations(rnn)   # the time-major copy of the input


@pytest.mark.parametrize("weights,autocast", [(torch.bfloat16, False), (torch.float32, True)])
def test_weights_cudnn_cannot_flatten_are_copied_each_call(weights, autocast):
    """bf16 weights are not cuDNN-flattenable, and CUDA autocast re-flattens fp32 weights to fp16: either way
    the call copies them (one weights-sized allocation); fp32 weights without autocast are used in place."""
    model = torch.nn.GRU(64, 128).to(weights)
    weight_bytes = sum(p.numel() for p in model.parameters()) * 2
    x = torch.randn(20, 4, 64, dtype=weights)
    precision = "bf16-mixed" if autocast else None
    kwargs = {"precision": precision} if precision else {}
    (node,) = rnn_nodes(trace(model, (x,), mode="inference", **kwargs))
    assert sum(allocations(node)) >= weight_bytes
    (plain,) = rnn_nodes(trace(torch.nn.GRU(64, 128), (torch.randn(20, 4, 64),), mode="inference"))
    assert sum(allocations(plain)) < weight_bytes
