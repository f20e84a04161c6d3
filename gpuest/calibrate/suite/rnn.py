"""cuDNN LSTMs and GRUs (sequence-first), forward and forward+backward, fp32 and bf16, and the host
dispatch cost of one RNN call."""
from __future__ import annotations

from typing import Any

import torch

from .base import DTYPES, Benchmark, Built, TraceSpec, _d, _est, _randn


class _RNNForward(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _rnn(out: list[Benchmark]) -> None:
    configs = [(128, 32, 256, 256, 1), (64, 64, 512, 512, 2), (256, 8, 128, 1024, 1), (32, 128, 1024, 1024, 1),
               (512, 16, 64, 128, 2)]
    # More LSTM shapes (batch 1, deep, wide); the GRU's per-step CPU trace makes it slow to re-trace.
    lstm_only = [(64, 1, 512, 512, 1), (128, 64, 256, 512, 1), (32, 32, 128, 256, 3), (256, 128, 512, 512, 1),
                 (16, 256, 1024, 2048, 1)]
    for cell in ("lstm", "gru"):
        for seq, batch, fin, hid, layers in configs + (lstm_only if cell == "lstm" else []):
            _rnn_benchmarks(out, cell, seq, batch, fin, hid, layers, False)
    # (cell, seq, batch, input, hidden, layers, bidirectional): small hidden sizes (whose steps are launch-bound), language and speech models' shapes, and
    # bidirectional layers; GRUs kept to few steps (slow CPU traces).
    launch_bound_shapes = [("lstm", 35, 20, 650, 650, 2, False), ("lstm", 100, 32, 128, 128, 1, False),
                 ("lstm", 50, 1, 128, 128, 1, False), ("lstm", 20, 64, 300, 256, 2, False),
                 ("lstm", 64, 32, 256, 256, 1, True), ("lstm", 50, 16, 128, 512, 2, True),
                 ("lstm", 128, 256, 64, 64, 1, False), ("gru", 32, 64, 256, 256, 1, False),
                 ("gru", 50, 1, 128, 128, 1, False), ("gru", 20, 32, 512, 1024, 2, False),
                 ("gru", 24, 16, 128, 256, 1, True)]
    # cuDNN's persistent kernels (one launch per layer, a grid barrier per step) ran for hidden
    # 64 and 128 and cost a GRU step about half an LSTM step of the same width; more hidden sizes (32 to
    # 192, across where cuDNN stops running persistent), batches and depths of both cells.
    persistent_shapes = [
            ("lstm", 64, 8, 32, 32, 1, False), ("lstm", 96, 64, 96, 96, 1, False),
            ("lstm", 48, 16, 160, 160, 1, False), ("lstm", 48, 16, 192, 192, 1, False),
            ("lstm", 200, 4, 64, 64, 2, False), ("lstm", 64, 128, 128, 128, 1, False),
            ("lstm", 64, 1, 64, 128, 1, True), ("gru", 64, 8, 64, 64, 1, False),
            ("gru", 48, 64, 128, 128, 1, False), ("gru", 32, 16, 96, 96, 2, False),
            ("gru", 32, 4, 160, 160, 1, False), ("gru", 32, 32, 32, 32, 1, False),
            ("gru", 40, 256, 64, 64, 1, False), ("gru", 64, 1, 128, 128, 1, True)]
    for spec in launch_bound_shapes + persistent_shapes:
        _rnn_benchmarks(out, *spec)
    # 16-bit layers (bf16 weights; mixed precision runs cuDNN's RNNs in fp16, the same 16-bit
    # fits), of both cells and of widths that run persistent in fp32 and per step; without them the fits
    # extrapolated the fp32 kernels to a mode they never saw.
    sixteen_bit_shapes = [
            ("lstm", 64, 8, 32, 32, 1, False), ("lstm", 50, 1, 128, 128, 1, False),
            ("lstm", 100, 32, 128, 128, 1, False), ("gru", 48, 64, 128, 128, 1, False),
            ("lstm", 200, 4, 64, 64, 2, False), ("gru", 32, 16, 96, 96, 2, False),
            ("lstm", 48, 16, 160, 160, 1, False), ("lstm", 128, 32, 256, 256, 1, False),
            ("lstm", 64, 64, 512, 512, 2, False), ("lstm", 35, 20, 650, 650, 2, False),
            ("lstm", 32, 128, 1024, 1024, 1, False), ("lstm", 64, 1, 512, 512, 1, False),
            ("gru", 32, 64, 256, 256, 1, False), ("gru", 20, 32, 512, 1024, 2, False),
            ("lstm", 64, 32, 256, 256, 1, True), ("lstm", 256, 8, 128, 1024, 1, False),
            ("lstm", 16, 256, 1024, 2048, 1, False), ("gru", 64, 1, 128, 128, 1, True)]
    for spec in sixteen_bit_shapes:
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
