"""Device probe: how much faster a streaming op runs when its input was just written by the kernel before
it (still in L2) than when it reads it from DRAM, by tensor size. The calibration suite rotates its inputs
through buffers of at least 3x L2, so every fit is of DRAM-cold reads; in a network an op often reads what
the previous kernel wrote (an in-place ReLU after a batch norm).

Usage (on a GPU): python3 benchmarks/l2_reuse_probe.py --out OUT.jsonl [--ops cast,clone]
One row per (op, dtype, size): the median time of the op on a cold input (one of several buffers together
at least 3x L2, untouched since it was last used) and on a warm one (written by a producer kernel right
before it), each timed alone between CUDA events queued behind a spin; the GPU's clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

SIZES_MB = (4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128)
REPEATS = 40


# The streaming ops timed; `cast` flips the dtype (a bf16 input is written as fp32 and back), `clone` copies.
OPS = {"relu_": torch.relu_, "mul_scalar": lambda t: t.mul(2.0), "add_self": lambda t: torch.add(t, t),
       "cast": lambda t: t.to(torch.float32 if t.dtype == torch.bfloat16 else torch.bfloat16),
       "clone": torch.clone}


def _time_ms(before, op, x) -> float:
    """Median ms of op(x) alone, with before(x) run just ahead of it (outside the timed span). All calls
    are queued before one synchronisation, so the GPU runs them back to back and no launch gap enters."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPEATS + 5)]
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # keep the GPU busy while the host queues every call
    for i, (start, end) in enumerate(events):
        t = x[i % len(x)]
        before(t)
        start.record()
        op(t)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events[5:])


def probe_setup(doc: str) -> tuple[str, torch.device, int]:
    """A probe's one argument, --out, parsed with its docstring's first line as description; the CUDA
    device it times on and that device's L2 size in bytes."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    dev = torch.device("cuda")
    return out, dev, torch.cuda.get_device_properties(dev).L2_cache_size


def write_timed_rows(out: str, rows: list[dict], device: torch.device, **extra) -> None:
    """Write a probe's rows to `out` (JSON lines), each with the GPU, torch, REPEATS and the UTC date."""
    meta = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "repeats": REPEATS, **extra,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps({**meta, **r}) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default="relu_,mul_scalar,add_self",
                    help=f"comma-separated, of {', '.join(OPS)} (default: the three of the committed runs)")
    args = ap.parse_args(argv)
    unknown = [name for name in args.ops.split(",") if name not in OPS]
    if unknown:
        ap.error(f"unknown --ops {', '.join(unknown)}; accepted: {', '.join(OPS)}")
    ops = {name: OPS[name] for name in args.ops.split(",")}
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = props.L2_cache_size
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for mb in SIZES_MB:
            n = mb * 2 ** 20 // torch.tensor([], dtype=dtype).element_size()
            sets = max(2, -(-3 * l2 // (mb * 2 ** 20)) + 1)
            bufs = [torch.randn(n, device=dev).to(dtype) for _ in range(sets)]
            for name, op in ops.items():
                cold = _time_ms(lambda t: None, op, bufs)
                warm = _time_ms(lambda t: t.mul_(1.0), op, bufs[:1])
                rows.append({"op": name, "dtype": str(dtype).split(".")[-1], "tensor_mb": mb, "l2_mb": l2 / 2 ** 20,
                             "cold_us": cold * 1e3, "warm_us": warm * 1e3, "warm_over_cold": warm / cold})
            del bufs
            torch.cuda.empty_cache()
    meta = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "repeats": REPEATS,
            "command": f"python3 benchmarks/l2_reuse_probe.py --out OUT.jsonl --ops {args.ops}"}
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps({**meta, **r}) + "\n")
    for r in rows:
        print(f"{r['op']:10s} {r['dtype']:9s} {r['tensor_mb']:4d} MB  cold {r['cold_us']:8.1f} us  "
              f"warm {r['warm_us']:8.1f} us  {r['warm_over_cold']:.2f}")


if __name__ == "__main__":
    main()
