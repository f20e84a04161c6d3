"""Device probe: the idle time the GPU leaves between kernels, when the next one is already queued and when
it waits for the host.

Validation rows show wall time about 4 % above device-busy time (the union of kernel intervals) on GPU-bound
networks, 1.4-2.7 us per kernel, while the price model leaves a queued gap only after launch-bound kernels.
This probe separates the two causes from a torch.profiler trace, pairing every kernel with the host call that
launched it (its correlation id):
  - `queued` gap: the next kernel's launch call had returned before the previous kernel ended, so the device
    idled with work in its queue (a device-side cost per kernel);
  - `starved` gap: the launch returned after the previous kernel ended (the host was behind).
Series:
  - `ops`: one op repeated back to back behind a sleep kernel (everything queued), at durations from a few
    microseconds to milliseconds, the same kernel and two different kernels alternating, launched eagerly and
    as one CUDA graph; the gap also from unprofiled CUDA-event time less the profiled kernel durations (the
    profiler's own per-kernel cost left out);
  - `networks`: validation configs of models outside every test split and held-out set, stepped as the
    validation runner steps them (gpuest.calibrate.validate_measure.make_step), three profiled iterations.

Usage (on a GPU): PYTHONPATH=. python3 benchmarks/kernel_gap_probe.py --out OUT.jsonl [--series ops,networks]
[--keys 'KEY;KEY']. One row per op series or network config: kernels per iteration, busy union, span, the sum
and quantiles of queued and starved gaps (us), and for networks the median CUDA-event wall time of unprofiled
iterations. Clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpuest.calibrate.timing import union_length

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
OP_CALLS = 200
SLEEP_CYCLES = 50_000_000          # a head kernel long enough for the host to queue OP_CALLS launches
RELU_NUMEL = (2 ** 10, 2 ** 16, 2 ** 19, 2 ** 21, 2 ** 23, 2 ** 25)
NETWORK_KEYS = (
    "resnet18|b256|i224|inference|fp32",
    "resnet50|b128|i224|inference|bf16-mixed",
    "timm:resnet50d|b128|i224|inference|bf16-mixed|channels_last",
    "hf:llama|b64|s128|inference|fp32",
    "resnet50|b128|i224|training|bf16-mixed",
    "efficientnet_b0|b128|i224|inference|bf16-mixed",
    "efficientnet_b0|b128|i224|training|fp32",
    "inception_v3|b128|i299|training|bf16-mixed|channels_last",
    "timm:fastvit_t8|b128|i224|training|bf16-mixed",
    "hf:phi-1.5|b4|s1024|inference|bf16",
    "vit_b_16|b64|i224|training|bf16-mixed",
    "hf:pythia-410m|b8|s1024|training|bf16-mixed",
    "convnext_tiny|b128|i224|training|bf16-mixed",
)
WALL_ITERS = 10


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    qs = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"n": len(values), "sum_us": sum(values), "p10_us": qs[0], "median_us": statistics.median(values),
            "p90_us": qs[8], "mean_us": statistics.mean(values)}


def trace_gaps(trace: dict, windows: list[tuple[float, float]] | None = None) -> dict:
    """Gaps between consecutive device activities of a chrome trace, split by whether the next one's launch
    call had returned before the previous ended (queued) or not (starved); per window when given."""
    events = trace["traceEvents"]
    launch_end = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {}):
            launch_end[e["args"]["correlation"]] = e["ts"] + e.get("dur", 0.0)
    dev = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    if windows:
        spans = windows
    else:
        spans = [(dev[0]["ts"], dev[-1]["ts"] + dev[-1]["dur"])] if dev else []
    queued, starved, queued_after = [], [], {"lt5us": [], "5-50us": [], "ge50us": []}
    kernels, busy, span = 0, 0.0, 0.0
    for t0, t1 in spans:
        inside = [e for e in dev if t0 <= e["ts"] < t1]
        if not inside:
            continue
        kernels += len(inside)
        span += inside[-1]["ts"] + inside[-1]["dur"] - inside[0]["ts"]
        end = -1e30
        for prev, nxt in zip(inside, inside[1:]):
            end = max(end, prev["ts"] + prev["dur"])
            gap = nxt["ts"] - end
            if gap <= 0:
                continue
            launched = launch_end.get(nxt.get("args", {}).get("correlation"))
            if launched is not None and launched <= end:
                queued.append(gap)
                d = prev["dur"]
                queued_after["lt5us" if d < 5 else "5-50us" if d < 50 else "ge50us"].append(gap)
            else:
                starved.append(gap)
        busy += union_length((e["ts"], e["ts"] + e["dur"]) for e in inside)
    n = max(len(spans), 1)
    return {"kernels_per_iter": kernels / n, "busy_us": busy / n, "span_us": span / n,
            "queued_gap": _quantiles(queued), "starved_gap": _quantiles(starved),
            "queued_gap_after": {k: _quantiles(v) for k, v in queued_after.items()},
            "queued_gap_per_kernel_us": sum(queued) / max(kernels, 1),
            "starved_gap_per_kernel_us": sum(starved) / max(kernels, 1)}


def _profiled(fn, iters: int) -> tuple[dict, list[tuple[float, float]]]:
    """Chrome trace of `iters` synchronised calls of `fn` and the host-time window of each call."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            with record_function(f"gap_iter_{i}"):
                fn()
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.load(open(path))
    marks = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                   if str(e.get("name", "")).startswith("gap_iter_") and e.get("cat") == "user_annotation")
    return trace, marks


def _events_per_call_us(run, calls: int) -> float:
    """CUDA-event time of one `run` (sleep head excluded) per call, unprofiled (us)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    a.record()
    run()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def op_rows(dev: torch.device) -> list[dict]:
    rows = []
    for numel in RELU_NUMEL:
        x, y = torch.rand(numel, device=dev), torch.rand(numel, device=dev)
        series = {"relu": [lambda: torch.relu(x)], "relu_add": [lambda: torch.relu(x), lambda: torch.add(x, y)]}
        for name, calls in series.items():
            def eager(calls=calls):
                for i in range(OP_CALLS):
                    calls[i % len(calls)]()
            eager()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                eager()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for launch, run in (("eager", eager), ("graph", graph.replay)):
                per_call_us = statistics.median(_events_per_call_us(run, OP_CALLS) for _ in range(5))

                def headed(run=run):
                    torch.cuda._sleep(SLEEP_CYCLES)
                    run()
                trace, _ = _profiled(headed, 1)
                dev_events = sorted((e for e in trace["traceEvents"] if e.get("cat") in DEVICE_CATS),
                                    key=lambda e: e["ts"])
                window = [(dev_events[1]["ts"], dev_events[-1]["ts"] + 1.0)]   # the sleep kernel left out
                durations = [e["dur"] for e in dev_events[1:]]
                row = {"series": "ops", "name": f"{name}_{numel}_{launch}", "numel": numel, "launch": launch,
                       "kernel_us_median": statistics.median(durations),
                       "events_per_call_us": per_call_us,
                       "unprofiled_gap_per_kernel_us": per_call_us - statistics.mean(durations),
                       **trace_gaps(trace, window)}
                print(json.dumps({k: row[k] for k in ("name", "kernel_us_median", "events_per_call_us",
                                                       "unprofiled_gap_per_kernel_us", "queued_gap_per_kernel_us",
                                                       "starved_gap_per_kernel_us")}), flush=True)
                rows.append(row)
            del graph
    return rows


def network_configs(keys: list[str]) -> tuple[list, list[str]]:
    """The validation configs of `keys`, and what is wrong with the keys: unknown ones, and any of a model in a
    frozen test split, which this probe may not look at."""
    from gpuest.evaluate.validation_set import get_set, test_split_models
    by_key = {}
    for name in ("full", "generalisation", "architectures", "families", "recipes"):
        by_key.update({c.key: c for c in get_set(name)})
    unknown = [k for k in keys if k not in by_key]
    test = [k for k in keys if k in by_key and (by_key[k].split == "test" or by_key[k].model in test_split_models())]
    problems = ([f"unknown config {', '.join(unknown)} (keys of the full, generalisation, architectures, families "
                 "and recipes sets are accepted)"] if unknown else []) + (
        [f"{', '.join(test)}: in a frozen test split, which this probe may not look at"] if test else [])
    return [by_key[k] for k in keys if k in by_key], problems


def network_rows(dev: torch.device, configs: list) -> list[dict]:
    from gpuest.calibrate.validate_context import RunContext
    from gpuest.calibrate.validate_measure import _precision, make_step
    ctx = RunContext(window_s=0.5)
    rows = []
    for cfg in configs:
        key = cfg.key
        loaded = ctx.model_for(cfg, _precision(cfg.precision)[0])
        step, _ = make_step(loaded, cfg, ctx.device)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        walls = []
        for _ in range(WALL_ITERS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            walls.append(a.elapsed_time(b) * 1e3)
        trace, marks = _profiled(step, 3)
        row = {"series": "networks", "name": key, "wall_us": statistics.median(walls), **trace_gaps(trace, marks)}
        print(json.dumps({k: row[k] for k in ("name", "wall_us", "busy_us", "span_us", "kernels_per_iter",
                                               "queued_gap_per_kernel_us", "starved_gap_per_kernel_us")}), flush=True)
        rows.append(row)
        del step
        ctx.drop_model()
    ctx.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--series", default="ops,networks", help="comma-separated, of: ops, networks")
    ap.add_argument("--keys", default=";".join(NETWORK_KEYS), help="validation config keys, ';'-separated")
    args = ap.parse_args(argv)
    series = args.series.split(",")
    unknown = [s for s in series if s not in ("ops", "networks")]
    if unknown:
        ap.error(f"unknown series {', '.join(unknown)}; accepted: ops, networks")
    configs, problems = network_configs([k for k in args.keys.split(";") if k]) if "networks" in series else ([], [])
    if problems:
        ap.error("; ".join(problems))
    dev = torch.device("cuda")
    rows = []
    if "ops" in series:
        rows += op_rows(dev)
    if "networks" in series:
        rows += network_rows(dev, configs)
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).write_text("".join(json.dumps({**meta, **r}) + "\n" for r in rows))
    print(f"wrote {args.out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
