"""cuDNN LSTMs and GRUs (sequence-first), forward and forward+backward, fp32 and bf16, and the host
dispatch cost of one RNN call."""
from __future__ import annotations

from typing import Any

import torch

from .base import DTYPES, Benchmark, Built, TraceSpec, _d, _est, _randn
from .shape_tables import shape_table


class _RNNForward(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _rnn(out: list[Benchmark]) -> None:
    for cell in ("lstm", "gru"):
        tables = ("layers", "lstm_only") if cell == "lstm" else ("layers",)  # a GRU's CPU trace is slow
        for seq, batch, fin, hid, layers in shape_table("rnn", *tables):
            _rnn_benchmarks(out, cell, seq, batch, fin, hid, layers, False)
    for spec in shape_table("rnn", "launch_bound", "persistent"):
        _rnn_benchmarks(out, *spec)
    for spec in shape_table("rnn", "sixteen_bit"):
        _rnn_benchmarks(out, *spec, dtype="bf16")
    for cell in ("lstm", "gru"):
        # One cuDNN RNN call costs the host far more than one elementwise op (weight and descriptor
        # checks); at batch 1 that is most of a step, so "rnn" gets its own measured dispatch cost.
        def build_probe(device: torch.device, seed: int, cell=cell) -> Built:
            cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
            torch.manual_seed(seed)
            rnn = cls(_d(64, device, 8), _d(64, device, 8), 1, device=device).eval()
            meta = _RNNForward(cls(_d(64, device, 8), _d(64, device, 8), 1, device="meta"))
            shape = (16, 1, _d(64, device, 8))
            return Built(lambda x: rnn(x)[0], lambda i: (_randn(shape, torch.float32, device, seed, i),),
                         TraceSpec(meta, (torch.empty(shape, device="meta"),)))
        out.append(Benchmark(f"host_dispatch_{cell}", "rnn", {"op": cell, "dtype": "fp32", "seq": 16, "batch": 1,
                                                              "hidden": 64}, build_probe, kind="host_dispatch",
                             est_ms=0.05, trace_cost_s=0.2))


def _rnn_benchmarks(out: list[Benchmark], cell: str, seq: int, batch: int, fin: int, hid: int, layers: int,
                    bidir: bool, dtype: str = "fp32") -> None:
    """The forward and the forward+backward benchmark of one cuDNN LSTM/GRU (sequence-first input), its
    weights and input in `dtype` ("fp32" names carry no dtype, others end in it)."""
    gates = 4 if cell == "lstm" else 3
    dirs = 2 if bidir else 1
    tdtype = DTYPES[dtype]
    fl = 2.0 * dirs * seq * batch * gates * hid * (fin + hid + (layers - 1) * (dirs + 1) * hid)
    nb = tdtype.itemsize * (seq * batch * (fin + dirs * hid) + dirs * gates * hid * (fin + hid) * layers)
    params = {"cell": cell, "seq": seq, "batch": batch, "input": fin, "hidden": hid, "layers": layers,
              "dtype": dtype, **({"bidirectional": True} if bidir else {})}
    tag = f"{cell}_t{seq}_b{batch}_in{fin}_h{hid}_l{layers}{'_bi' if bidir else ''}"
    tag += "" if dtype == "fp32" else f"_{dtype}"

    def make(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
        cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
        rnn = cls(_d(fin, device, 8), _d(hid, device, 8), layers, bidirectional=bidir, device=device, dtype=tdtype)
        trace_copy = _RNNForward(cls(_d(fin, device, 8), _d(hid, device, 8), layers, bidirectional=bidir,
                                     device="meta", dtype=tdtype))
        return rnn, trace_copy

    def xshape(device: torch.device) -> tuple:
        return (_d(seq, device, 4), _d(batch, device, 2), _d(fin, device, 8))

    def build_fwd(device: torch.device, seed: int) -> Built:
        torch.manual_seed(seed)
        rnn, meta = make(device)
        rnn.eval()
        return Built(lambda x: rnn(x)[0], lambda i: (_randn(xshape(device), tdtype, device, seed, i),),
                     TraceSpec(meta, (torch.empty(xshape(device), device="meta", dtype=tdtype),)))

    def build_fb(device: torch.device, seed: int) -> Built:
        torch.manual_seed(seed)
        rnn, meta = make(device)
        rnn.train()
        params_ = list(rnn.parameters())

        def fn(x: torch.Tensor) -> Any:
            with torch.enable_grad():
                return torch.autograd.grad(rnn(x)[0].sum(), params_)
        return Built(fn, lambda i: (_randn(xshape(device), tdtype, device, seed, i),),
                     TraceSpec(meta, (torch.empty(xshape(device), device="meta", dtype=tdtype),), mode="training",
                               loss_fn=lambda y: y.sum()))
    # On the CPU (where we trace) a GRU is not one op but a few per time step: its trace is
    # slow (~7 ms per step and layer forward, ~20 ms forward+backward, measured).
    steps = dirs * seq * layers if cell == "gru" else 0
    out.append(Benchmark(f"rnn_fwd_{tag}", "rnn", {"op": f"{cell}_forward", **params}, build_fwd,
                         est_ms=_est(fl, nb, "tf32" if dtype == "fp32" else dtype) + 0.005 * seq * layers,
                         trace_cost_s=0.03 + 0.007 * steps, host_paced=True))
    if steps > 512:  # a 10-20 s trace for one point: leave it to the forward benchmark
        return
    out.append(Benchmark(f"rnn_fwdbwd_{tag}", "rnn", {"op": f"{cell}_forward_backward", **params}, build_fb,
                         est_ms=3 * (_est(fl, nb, "tf32" if dtype == "fp32" else dtype) + 0.005 * seq * layers),
                         trace_cost_s=0.05 + 0.02 * steps, host_paced=True))
