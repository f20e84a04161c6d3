"""Measure the device memory cuDNN takes beyond an op's outputs: convolution workspaces and the RNN reserve.

    PYTHONPATH=. python3 -m gpuest.calibrate.workspace_probe --out data/memory/workspace.H100-SXM.jsonl
    PYTHONPATH=. python3 -m gpuest.calibrate.workspace_probe --list      # the probes, no GPU needed

`max_memory_allocated()` counts what cuDNN asks PyTorch's caching allocator for during a call: the chosen
plan's workspace (freed when the call returns) and, for a recurrent layer in training, the reserve space
that autograd keeps until the backward. Each probe runs its op once (so the plan is cached, as in a
warmed-up step), synchronises, resets the peak, runs it again and records, in bytes: allocated before,
after and the peak. Workspace = peak - after; an RNN's reserve = after - before - its outputs.

Convolutions: every distinct Conv2d of a few torchvision CNNs at the batches of data/memory/, each in
fp32, bf16 and fp16, NCHW and NHWC, forward, input gradient and weight gradient (cudnn.benchmark off,
cuDNN TF32 on: PyTorch's defaults, as in memory_validate). RNNs: nn.LSTM and nn.GRU over a grid of
sizes, fp32, bf16 weights and fp32 weights under bf16 autocast, inference and training.
Nothing here changes any GPU setting.
"""
from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROW_SCHEMA = "gpuest.workspace/1"
# (model, batch): the CNNs and batches whose convolutions are probed (memory_validate's configs and kin).
CONV_MODELS = (("vgg16", 64), ("resnet18", 256), ("resnet50", 64), ("mobilenet_v2", 128), ("efficientnet_b0", 64),
               ("convnext_tiny", 64), ("regnet_y_800mf", 128), ("densenet121", 32))
CONV_DTYPES = ("fp32", "bf16", "fp16")
CONV_LAYOUTS = ("nchw", "nhwc")
CONV_DIRECTIONS = ("forward", "input_grad", "weight_grad")
RNN_GRID = dict(mode=("LSTM", "GRU"), hidden=(256, 512, 1024), layers=(1, 2), batch=(1, 64, 256), seq=(32, 128),
                precision=("fp32", "bf16", "bf16-mixed"), bidirectional=(False, True))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ConvProbe:
    """One Conv2d call: input (N, C, H, W), weight (O, C/groups, kH, kW), its arguments, and how it runs."""

    model: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str
    layout: str
    direction: str


@dataclass(frozen=True)
class RNNProbe:
    """One nn.LSTM/nn.GRU call (batch_first=False), input size = hidden size."""

    mode: str
    hidden: int
    layers: int
    batch: int
    seq: int
    precision: str
    bidirectional: bool


@functools.cache
def conv_specs() -> tuple[tuple[str, tuple, tuple, tuple, tuple, tuple, int], ...]:
    """Distinct (model, input shape, weight shape, stride, padding, dilation, groups) of CONV_MODELS, found by
    running each model on meta tensors with forward hooks."""
    import torchvision
    seen: dict[tuple, str] = {}
    for name, batch in CONV_MODELS:
        model = getattr(torchvision.models, name)().to("meta").eval()

        def hook(mod: torch.nn.Module, args: tuple, _out: Any, name: str = name) -> None:
            key = (tuple(args[0].shape), tuple(mod.weight.shape), tuple(mod.stride), tuple(mod.padding),
                   tuple(mod.dilation), int(mod.groups))
            seen.setdefault(key, name)

        handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            model(torch.empty(batch, 3, 224, 224, device="meta"))
        for h in handles:
            h.remove()
    return tuple((model, *key) for key, model in seen.items())


def conv_probes() -> list[ConvProbe]:
    """Every probe of the convolution part, in a fixed order."""
    return [ConvProbe(m, i, w, s, p, d, g, dt, lay, dirn)
            for (m, i, w, s, p, d, g) in conv_specs()
            for dt, lay, dirn in itertools.product(CONV_DTYPES, CONV_LAYOUTS, CONV_DIRECTIONS)]


def rnn_probes() -> list[RNNProbe]:
    """Every probe of the recurrent part, in a fixed order."""
    keys = list(RNN_GRID)
    return [RNNProbe(**dict(zip(keys, values))) for values in itertools.product(*RNN_GRID.values())]


def _measured(fn: Callable[[], Any], device: torch.device) -> tuple[int, int, int]:
    """(allocated before, after, peak) bytes of the second of two calls of `fn` (the first caches the plan);
    what the call returns is held until the numbers are read."""
    out = fn()
    del out
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    after, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    del out
    return before, after, peak


def measure_conv(p: ConvProbe, device: torch.device) -> dict[str, Any]:
    """Workspace of one convolution call (bytes): peak less what stays allocated after it."""
    dtype = DTYPES[p.dtype]
    fmt = torch.channels_last if p.layout == "nhwc" else torch.contiguous_format
    x = torch.randn(p.input_shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(p.weight_shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
    args = (p.stride, p.padding, p.dilation, False, (0, 0), p.groups)
    y = torch.ops.aten.convolution(x, w, None, *args)
    if p.direction == "forward":
        fn = lambda: torch.ops.aten.convolution(x, w, None, *args)  # noqa: E731
    else:
        mask = [p.direction == "input_grad", p.direction == "weight_grad", False]
        gy = torch.randn_like(y)
        fn = lambda: torch.ops.aten.convolution_backward(gy, x, w, None, *args, mask)  # noqa: E731
    del y
    before, after, peak = _measured(fn, device)
    return {"allocated_before_bytes": before, "allocated_after_bytes": after, "peak_bytes": peak,
            "workspace_bytes": peak - after, "output_bytes": after - before}


def measure_rnn(p: RNNProbe, device: torch.device) -> dict[str, Any]:
    """Inference workspace, training forward workspace and reserve, backward peak over its results (bytes)."""
    cls = torch.nn.LSTM if p.mode == "LSTM" else torch.nn.GRU
    weight_dtype = torch.bfloat16 if p.precision == "bf16" else torch.float32
    rnn = cls(p.hidden, p.hidden, num_layers=p.layers, bidirectional=p.bidirectional).to(device, weight_dtype)
    x = torch.randn(p.seq, p.batch, p.hidden, device=device, dtype=weight_dtype)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if p.precision == "bf16-mixed"
           else torch.autocast("cuda", enabled=False))
    row: dict[str, Any] = {}

    def outputs_bytes(out: Any) -> int:
        ts = [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
        return sum(t.untyped_storage().nbytes() for t in ts)

    with torch.no_grad(), amp:
        before, after, peak = _measured(lambda: rnn(x), device)
        row["inference_output_bytes"] = outputs_bytes(rnn(x))
    row.update(inference_before_bytes=before, inference_after_bytes=after, inference_peak_bytes=peak,
               inference_workspace_bytes=peak - after)
    xg = x.detach().requires_grad_(True)
    with amp:
        out = rnn(xg)
    del out
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with amp:
        out = rnn(xg)
    torch.cuda.synchronize(device)
    after, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    out_bytes = outputs_bytes(out)
    row.update(train_before_bytes=before, train_after_bytes=after, train_peak_bytes=peak,
               train_output_bytes=out_bytes, train_workspace_bytes=peak - after,
               train_saved_bytes=after - before - out_bytes)
    grad = torch.ones_like(out[0])
    torch.cuda.synchronize(device)
    before_bwd = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out[0].backward(grad)
    torch.cuda.synchronize(device)
    row.update(backward_before_bytes=before_bwd, backward_after_bytes=torch.cuda.memory_allocated(device),
               backward_peak_bytes=torch.cuda.max_memory_allocated(device))
    del out, grad
    rnn.zero_grad(set_to_none=True)
    return row


def _all_probes(only: str) -> Iterator[ConvProbe | RNNProbe]:
    if only in ("all", "conv"):
        yield from conv_probes()
    if only in ("all", "rnn"):
        yield from rnn_probes()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.workspace_probe", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSONL file to append rows to")
    ap.add_argument("--only", choices=("all", "conv", "rnn"), default="all")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new probes after this many seconds")
    ap.add_argument("--list", action="store_true", help="print the number of probes of each kind and exit")
    args = ap.parse_args(argv)
    probes = list(_all_probes(args.only))
    if args.list:
        kinds = {k: sum(type(p).__name__ == k for p in probes) for k in ("ConvProbe", "RNNProbe")}
        print(f"{len(probes)} probes: {kinds['ConvProbe']} convolution, {kinds['RNNProbe']} recurrent")
        return 0
    if not args.out:
        ap.error("--out is required (or --list)")
    if not torch.cuda.is_available():
        print("gpuest.calibrate.workspace_probe needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    from .validate import run_provenance
    prov = run_provenance("gpuest.calibrate.workspace_probe", argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start, done = time.perf_counter(), 0
    with out.open("a", encoding="utf-8") as f:
        for probe in probes:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: {len(probes) - done} probes not run", file=sys.stderr)
                break
            kind = "conv" if isinstance(probe, ConvProbe) else "rnn"
            row: dict[str, Any] = {"schema": ROW_SCHEMA, "kind": kind, **asdict(probe)}
            try:
                row.update(measure_conv(probe, device) if kind == "conv" else measure_rnn(probe, device))
            except Exception as exc:  # noqa: BLE001 - a probe cuDNN rejects is recorded, the run goes on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["provenance"] = prov if done == 0 else {"same_as": "first row"}
            f.write(json.dumps(row) + "\n")
            done += 1
            if done % 100 == 0:   # hand cached segments back now and then; peaks are relative to each probe
                gc.collect()
                torch.cuda.empty_cache()
    print(f"{done} of {len(probes)} probes in {time.perf_counter() - start:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
