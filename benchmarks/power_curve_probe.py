"""Device probe: board power against the share of a roof one op achieves, with the card at a steady load
temperature, and the power of bytes served from L2 against bytes from DRAM.

The power model (gpuest.price.power) rises with each node's achieved share u of a roof as u ** e; its fit
chooses e from the calibration suite's windows, which ran in suite order at whatever temperature the windows
before left. Here one op at a time runs through sizes from launch-bound to roof-bound, every window after the
same heating load, so the curve's shape is the op's own:
  - streaming elementwise ops (in-place ReLU, out-of-place add) on inputs rotated through buffers of at least
    3x L2 (DRAM-cold, as the suite times them) and on one buffer that stays in L2 (L2-warm);
  - square GEMMs in bf16 (tensor cores) and fp32 (SIMT FMA pipes);
  - a one-element add in a loop (a busy GPU that moves and computes nothing) after 10 s idle and right after
    the heating load: how much of the static power follows the card's temperature;
  - `sustained` (not run by default): an fp32 GEMM, a DRAM-streaming ReLU and a bf16 GEMM each held for
    SUSTAINED_WINDOWS windows back to back from a cool card: how a load's power drifts as the card warms, the
    difference between a calibration window (under a second) and a validation run (seconds of the same load).

Usage (on a GPU): python3 benchmarks/power_curve_probe.py --out OUT.jsonl [--series static,gemm,elementwise]
One row per window: op, dtype, size, buffers, calls, seconds, average power (W, NVML energy counter), time per
call (s), achieved bytes/s and flop/s, SM clock and temperature at the window's end. Clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpuest.calibrate.nvml_monitor import PowerMonitor

WINDOW_S = 0.8                     # NVML's energy counter needs windows of at least 0.5 s
HEAT_S = 3.0                       # bf16 GEMM load run before every series: a steady, hot card
COLD_IDLE_S = 10.0
ELEMENTWISE_MB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMM_N = (256, 512, 1024, 2048, 4096, 8192)
SUSTAINED_WINDOWS = 20


GRAPH_MIN_S = 2e-3                 # calls captured per CUDA graph: at least this much device time per replay


def _graph(calls: list) -> tuple[torch.cuda.CUDAGraph, int]:
    """A CUDA graph of `calls` (each a no-argument callable) repeated so one replay runs >= GRAPH_MIN_S: replays
    queue back to back with no host gap, so even a launch-bound op keeps the GPU busy. Returns the graph and
    the calls it makes per replay."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for fn in calls:
        fn()
    end.record()
    torch.cuda.synchronize()
    repeat = max(1, int(GRAPH_MIN_S / max(start.elapsed_time(end) * 1e-3, 1e-7)) + 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(repeat):
            for fn in calls:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph, repeat * len(calls)


def _replay_for(graph: torch.cuda.CUDAGraph, seconds: float) -> int:
    """Replays `graph` until `seconds` of wall time have passed, synchronised; returns the replays."""
    replays, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            graph.replay()
        replays += 4
        torch.cuda.synchronize()
    return replays


def _heat(dev: torch.device) -> None:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    graph, _ = _graph([lambda: a @ a])
    _replay_for(graph, HEAT_S)


def _window(monitor: PowerMonitor, name: str, calls: list, **facts) -> dict:
    """One power window of `calls` replayed as a CUDA graph for WINDOW_S; a row of what it measured."""
    graph, per_replay = _graph(calls)
    _replay_for(graph, 0.1)
    monitor.begin_window(name)
    t0 = time.perf_counter()
    replays = _replay_for(graph, WINDOW_S)
    seconds = time.perf_counter() - t0
    m = monitor.end_window(name)
    per_call = seconds / (replays * per_replay)
    row = {"name": name, **facts, "calls": replays * per_replay, "seconds": seconds, "time_per_call_s": per_call,
           "avg_power_w": m.avg_power_w, "power_source": m.source, "reliable": m.reliable,
           "sm_clock_mhz": m.sm_clock_mhz, "sm_clock_min_mhz": m.sm_clock_min_mhz,
           "temperature_c": m.temperature_c, "throttle_reasons": m.throttle_reasons}
    if facts.get("bytes"):
        row["bytes_per_s"] = facts["bytes"] / per_call
    if facts.get("flops"):
        row["flops_per_s"] = facts["flops"] / per_call
    print(json.dumps({k: row[k] for k in ("name", "avg_power_w", "time_per_call_s", "temperature_c")}), flush=True)
    return row


def elementwise_rows(monitor: PowerMonitor, dev: torch.device, l2_bytes: int) -> list[dict]:
    ops = {"relu_": (torch.relu_, 2), "add": (lambda t: torch.add(t, t), 3)}   # op, bytes moved per element
    rows = []
    for op_name, (op, moved) in ops.items():
        _heat(dev)
        for mb in ELEMENTWISE_MB:
            n = mb * 2 ** 20 // 4
            rotate = max(2, -(-3 * l2_bytes // (n * 4)))
            for where, count in (("dram", rotate), ("l2", 1)):
                bufs = [torch.rand(n, device=dev) for _ in range(count)]
                calls = [lambda b=b, op=op: op(b) for b in bufs]
                rows.append(_window(monitor, f"{op_name}_fp32_{mb}MB_{where}", calls, op=op_name, dtype="fp32",
                                    size_mb=mb, buffers=count, reads_from=where, bytes=moved * n * 4))
                del bufs
    return rows


def gemm_rows(monitor: PowerMonitor, dev: torch.device) -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        _heat(dev)
        for n in GEMM_N:
            a = torch.randn(n, n, device=dev, dtype=dtype)
            rows.append(_window(monitor, f"mm_{str(dtype)[6:]}_{n}", [lambda a=a: a @ a], op="mm",
                                dtype=str(dtype)[6:], n=n, flops=2.0 * n ** 3, bytes=3 * n * n * a.element_size()))
    return rows


def static_rows(monitor: PowerMonitor, dev: torch.device) -> list[dict]:
    x = torch.zeros(1, device=dev)
    rows = []
    time.sleep(COLD_IDLE_S)
    rows.append(_window(monitor, "tiny_add_after_idle", [lambda: x.add_(1.0)], op="tiny_add", after="idle"))
    _heat(dev)
    rows.append(_window(monitor, "tiny_add_after_heat", [lambda: x.add_(1.0)], op="tiny_add", after="heat"))
    return rows


def sustained_rows(monitor: PowerMonitor, dev: torch.device, l2_bytes: int) -> list[dict]:
    """Each load held for SUSTAINED_WINDOWS windows in a row after COLD_IDLE_S of idle (window index in `index`)."""
    a32 = torch.randn(2048, 2048, device=dev)
    a16 = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    n = 256 * 2 ** 20 // 4
    bufs = [torch.rand(n, device=dev) for _ in range(max(2, -(-3 * l2_bytes // (n * 4))))]
    loads = {"mm_float32_2048": ([lambda: a32 @ a32], {"flops": 2.0 * 2048 ** 3}),
             "relu__fp32_256MB_dram": ([lambda b=b: torch.relu_(b) for b in bufs], {"bytes": 2 * n * 4}),
             "mm_bfloat16_4096": ([lambda: a16 @ a16], {"flops": 2.0 * 4096 ** 3})}
    rows = []
    for name, (calls, facts) in loads.items():
        time.sleep(COLD_IDLE_S)
        for i in range(SUSTAINED_WINDOWS):
            rows.append(_window(monitor, f"{name}_sustained_{i}", calls, op=name, series="sustained", index=i,
                                **facts))
    return rows


SERIES = {"static": lambda m, dev, l2: static_rows(m, dev), "gemm": lambda m, dev, l2: gemm_rows(m, dev),
          "elementwise": elementwise_rows, "sustained": sustained_rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--series", default="static,gemm,elementwise",
                    help=f"comma-separated, of: {', '.join(SERIES)}")
    args = ap.parse_args(argv)
    series = args.series.split(",")
    unknown = [s for s in series if s not in SERIES]
    if unknown:
        ap.error(f"unknown series {', '.join(unknown)}; accepted: {', '.join(SERIES)}")
    out = Path(args.out)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    with PowerMonitor() as monitor:
        rows = [row for name in series for row in SERIES[name](monitor, dev, l2)]
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "l2_bytes": l2,
            "window_s": WINDOW_S, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out.write_text("".join(json.dumps({**meta, **r}) + "\n" for r in rows))
    print(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
