"""Import public per-kernel timings (the NeuSight dataset) as calibration rows of this suite.

    python3 -m gpuest.calibrate.import_kernels DIR -o data/calibration/external/<GPU>.jsonl.gz [--per-op N] [--seed S]

DIR is one GPU's folder of `<op>.csv.gz` files (../shared/external/neusight-kernels/<device>/; its README gives
how they were measured). Each kernel's op is rebuilt on meta tensors and traced with the runner's own machinery
(gpuest.calibrate.runner.built_nodes), so an imported row carries exactly the nodes a suite benchmark of that op
would: the fit regresses on features identical to the estimator's.

The source times one Python-level call between CUDA events (the mean of the 5 fastest of 25), with the same
input reused: the figure includes the call's host dispatch and launch, and a small working set stays in L2.
Every row records those conditions, and the GPU's launch floor (the time of a call that does almost nothing,
LAUNCH_FLOOR_QUANTILE of all its rows) less the prior's kernel latency as `host_overhead_ms`, which
gpuest.calibrate.fit subtracts to get the device's time. Rows within LAUNCH_BOUND_FACTOR of that floor measured the
launch, not the kernel: they are imported as kind "latency" and never enter a residual fit.

Configurations are sub-sampled deterministically: a seeded hash of the op and its shape picks the same shapes on
every GPU (so leave-one-GPU-out compares like with like), at most `--per-op` of each op file.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from gpuest.catalog import get_gpu
from gpuest.errors import MeasuredDataError
from gpuest.jsonl import write_text
from gpuest.profile import prior_profile

from .runner import META_SCHEMA, ROW_SCHEMA, built_nodes, tf32_flags
from .suite import Built

META = torch.device("meta")
SOURCE = ("NeuSight dataset (Lee, Phanishayee, Mahajan, 'Forecasting GPU Performance for Deep Learning Training and "
          "Inference', ASPLOS 2025), sitar-lab/NeuSight commit 6945927d9afcca2b9daf021f8395e53edc5b4eef, "
          "scripts/asplos/data/dataset/train/collect/<op>/p2.1.0/<GPU>.csv; MIT licence")
# How every source row was measured (the source's README, from the authors' neusight/Dataset/collect.py).
CONDITIONS = {
    "timing": "CUDA events around one Python-level call; the figure is the mean of the 5 fastest of 25 back-to-back "
              "calls (stored in time_ms_median); it includes the call's host dispatch and kernel launch",
    "cache": "the same input is reused on every call: working sets that fit L2 are L2-warm",
    "torch_version": "2.1.0+cu121", "cuda_version": "12.1", "cudnn_version": 8902, "cudnn_benchmark": True,
    "tf32": "off (torch.backends.cudnn.allow_tf32 = False; matmul at torch's default, off)", "dtype": "fp32",
    "mode": "forward only, torch.no_grad()", "power": "not measured",
}
TIMING_METHOD = "events_single_call_launch_inclusive"
# What each row says of its conditions (CONDITIONS, in the meta, spells them out).
ROW_CONDITIONS = "one launch-inclusive call (mean of 5 fastest of 25); inputs reused, L2-warm when they fit; " \
    "torch 2.1.0+cu121, cuDNN 8902, TF32 off, no power"
DRIVER_UNKNOWN = "unknown (public data)"
LAUNCH_FLOOR_QUANTILE = 0.01    # share of a GPU's rows at or below its launch floor (a call doing ~nothing)
LAUNCH_BOUND_FACTOR = 2.0       # rows faster than this many launch floors measured the launch, not the kernel
HOLDOUT_SHARE = 0.2             # rows held out of the residual fit (by seeded hash), for its holdout errors
DEFAULT_PER_OP = {"bmm": 600, "linear": 500, "conv": 500, "ln": 150, "softmax": 150}
DEFAULT_PER_ELEMENTWISE_OP = 50
DEFAULT_SEED = 27
TORCH_PIN = "p2.1.0"            # the source's `Torch Version` column: the only version its README describes
CUDNN_PIN = "8902"


@dataclass(frozen=True)
class KernelOp:
    """One op file of the source: its shape columns and how to build the call on tensors of `device`."""

    columns: tuple[str, ...]
    build: Callable[[dict[str, int], torch.device], tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]


def _empty(device: torch.device, *shape: int) -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=torch.float32)


def _binary(fn: Callable[..., Any]) -> KernelOp:
    return KernelOp(("B", "H"), lambda p, d: (fn, (_empty(d, p["B"], p["H"]), _empty(d, p["B"], p["H"]))))


def _with_scalar(fn: Callable[..., Any]) -> KernelOp:
    # The source calls the op with a Python scalar; its value does not change the kernel.
    return KernelOp(("B", "H"), lambda p, d: (lambda x: fn(x, 2.0), (_empty(d, p["B"], p["H"]),)))


def _unary(fn: Callable[..., Any]) -> KernelOp:
    return KernelOp(("B", "H"), lambda p, d: (fn, (_empty(d, p["B"], p["H"]),)))


def _conv(p: dict[str, int], d: torch.device) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    x = _empty(d, p["B"], p["Input_Channel"], p["Input_Size"], p["Input_Size"])
    w = _empty(d, p["Output_Channel"], p["Input_Channel"], p["Kernel_Szie"], p["Kernel_Szie"])
    return (lambda x, w: F.conv2d(x, w, None, p["Stride"], p["Padding"])), (x, w)


# The source README's op meanings, one entry per op file.
OPS: dict[str, KernelOp] = {
    "bmm": KernelOp(("B", "M", "N", "K"), lambda p, d: (torch.bmm, (_empty(d, p["B"], p["M"], p["N"]),
                                                                      _empty(d, p["B"], p["N"], p["K"])))),
    "linear": KernelOp(("B", "M", "N", "K"), lambda p, d: (F.linear, (_empty(d, p["B"], p["M"], p["N"]),
                                                                        _empty(d, p["K"], p["N"]), _empty(d, p["K"])))),
    "conv": KernelOp(("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"), _conv),
    "add": _binary(torch.add), "mul": _binary(torch.mul), "pow": _binary(torch.pow), "div": _binary(torch.div),
    "addu": _with_scalar(torch.add), "mulu": _with_scalar(torch.mul), "powu": _with_scalar(torch.pow),
    "divu": _with_scalar(torch.div),
    "relu": _unary(torch.relu), "gelu": _unary(F.gelu), "tanh": _unary(torch.tanh),
    "ln": KernelOp(("B", "H"), lambda p, d: ((lambda x, w, b: F.layer_norm(x, (p["H"],), w, b)),
                                             (_empty(d, p["B"], p["H"]), _empty(d, p["H"]), _empty(d, p["H"])))),
    "softmax": KernelOp(("B", "H"), lambda p, d: ((lambda x: F.softmax(x, dim=-1)), (_empty(d, p["B"], p["H"]),))),
}
# Columns every op file has besides its shape columns.
COMMON_COLUMNS = ("OPName", "Latency", "Device", "Torch Version", "CUDNN Version")
# Shape columns that may be zero (a convolution without padding); every other one is a positive size.
ZERO_ALLOWED = {"Padding"}


@dataclass(frozen=True)
class SourceRow:
    op: str
    params: dict[str, int]
    time_ms: float
    device: str
    file: str
    line: int          # line of the CSV file (the header is line 1)


def _bad(file: str, line: int, why: str) -> MeasuredDataError:
    return MeasuredDataError(f"{file}, line {line}: {why}")


def read_op_file(path: Path, op: str, device: str | None = None) -> Iterator[SourceRow]:
    """Rows of one source file (`<op>.csv.gz` or `.csv`), validated: MeasuredDataError names the file, line and
    what was wrong (a missing column, a non-positive or non-numeric time or size, another device or op, a torch or
    cuDNN version other than the README's)."""
    spec = OPS[op]
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COMMON_COLUMNS + spec.columns if c not in (reader.fieldnames or [])]
        if missing:
            raise _bad(path.name, 1, f"header lacks column(s) {', '.join(missing)}; an {op!r} file needs "
                                     f"{', '.join(COMMON_COLUMNS + spec.columns)}")
        for line, rec in enumerate(reader, start=2):
            if rec["OPName"] != op:
                raise _bad(path.name, line, f"OPName is {rec['OPName']!r}, expected {op!r} (the file's op)")
            try:
                time_ms = float(rec["Latency"])
            except (TypeError, ValueError):
                raise _bad(path.name, line, f"Latency {rec['Latency']!r} is not a number (milliseconds)") from None
            if not math.isfinite(time_ms) or time_ms <= 0:
                raise _bad(path.name, line, f"Latency {time_ms!r} must be a positive finite number of milliseconds")
            params = {}
            for col in spec.columns:
                raw = rec[col]
                if raw is None or not raw.strip().isdigit():
                    raise _bad(path.name, line, f"{col} {raw!r} is not a non-negative integer")
                params[col] = int(raw)
                if params[col] == 0 and col not in ZERO_ALLOWED:
                    raise _bad(path.name, line, f"{col} is 0; sizes must be positive")
            device = device or rec["Device"]  # the first row names the folder's device
            if rec["Device"] != device:
                raise _bad(path.name, line, f"Device {rec['Device']!r} differs from the folder's {device!r}")
            if rec["Torch Version"] != TORCH_PIN or rec["CUDNN Version"] != CUDNN_PIN:
                raise _bad(path.name, line, f"measured with torch {rec['Torch Version']!r} / cuDNN "
                                            f"{rec['CUDNN Version']!r}; the importer carries only the README's "
                                            f"conditions ({TORCH_PIN}, cuDNN {CUDNN_PIN})")
            yield SourceRow(op, params, time_ms, rec["Device"], path.name, line)


def _unit_hash(seed: int, *parts: Any) -> float:
    """A number in [0, 1) fixed by the seed and the parts (sha256): the same on every machine and GPU."""
    digest = hashlib.sha256(json.dumps([seed, *parts], sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def op_files(src: Path) -> dict[str, Path]:
    """The known op files of a GPU folder, by op; MeasuredDataError if there is none."""
    found = {}
    for op in OPS:
        for name in (f"{op}.csv.gz", f"{op}.csv"):
            if (src / name).exists():
                found[op] = src / name
                break
    if not found:
        raise MeasuredDataError(f"{src}: no kernel files; expected some of "
                                f"{', '.join(f'{op}.csv.gz' for op in OPS)}")
    return found


def read_device(src: Path) -> tuple[str, dict[str, list[SourceRow]]]:
    """The device name and every row of a GPU folder, by op (each config once: the first row that measured it)."""
    files = op_files(src)
    device: str | None = None
    by_op: dict[str, list[SourceRow]] = {}
    for op, path in files.items():
        seen: set[tuple[int, ...]] = set()
        rows = []
        for row in read_op_file(path, op, device):
            device = device or row.device
            key = tuple(row.params[c] for c in OPS[op].columns)
            if key not in seen:
                seen.add(key)
                rows.append(row)
        by_op[op] = rows
    if device is None:
        raise MeasuredDataError(f"{src}: the kernel files hold no rows")
    return device, by_op


def launch_floor_ms(by_op: dict[str, list[SourceRow]]) -> float:
    """The time (ms) of a call that does almost nothing on this GPU: LAUNCH_FLOOR_QUANTILE of all its rows."""
    times = sorted(r.time_ms for rows in by_op.values() for r in rows)
    return times[int(LAUNCH_FLOOR_QUANTILE * (len(times) - 1))]


def sample(by_op: dict[str, list[SourceRow]], per_op: dict[str, int], seed: int) -> list[SourceRow]:
    """At most per_op[op] rows of each op, those whose seeded hash of (op, shape) is smallest."""
    out = []
    for op in sorted(by_op):
        ranked = sorted(by_op[op], key=lambda r: _unit_hash(seed, op, r.params))
        out.extend(ranked[:per_op.get(op, DEFAULT_PER_ELEMENTWISE_OP)])
    return out


_NODES: dict[tuple[str, str], tuple[list[dict[str, Any]], bool, int]] = {}


def kernel_nodes(op: str, params: dict[str, int]) -> tuple[list[dict[str, Any]], bool, int]:
    """The nodes the runner records for this op at these sizes (TF32 off, as measured); cached per process."""
    key = (op, json.dumps(params, sort_keys=True))
    if key not in _NODES:
        fn, inputs = OPS[op].build(params, META)
        with tf32_flags(False, False):
            _NODES[key] = built_nodes(Built(fn=fn, make_set=lambda i: inputs), inputs)
    return _NODES[key]


def calibration_row(r: SourceRow, floor_ms: float, latency_ms: float, seed: int) -> dict[str, Any]:
    """A calibration row (runner ROW_SCHEMA) of one source row."""
    nodes, aggregated, traced = kernel_nodes(r.op, r.params)
    cats = [n["category"] for n in nodes if not n.get("host_only")] or ["other"]
    shape = "_".join(f"{k.lower()}{v}" for k, v in r.params.items())
    return {
        "schema": ROW_SCHEMA, "name": f"neusight_{r.op}_{shape}", "category": max(set(cats), key=cats.count),
        "kind": "latency" if r.time_ms < LAUNCH_BOUND_FACTOR * floor_ms else "device",
        "params": {"op": r.op, "dtype": "fp32", **r.params},
        "holdout": _unit_hash(seed, "holdout", r.op, r.params) < HOLDOUT_SHARE, "dry_run": False, "session": 0,
        "matmul_tf32": False, "cudnn_tf32": False, "nodes": nodes, "n_nodes_traced": traced,
        "nodes_aggregated": aggregated, "trace_error": None,
        "time_ms_median": r.time_ms, "time_ms_p10": None, "time_ms_p90": None, "repeats": 5,
        "timing_method": TIMING_METHOD, "conditions": ROW_CONDITIONS, "host_overhead_ms": max(floor_ms - latency_ms, 0.0),
        "energy_j": None, "avg_power_w": None, "error": None, "source_row": f"{r.file}:{r.line}",
    }


def import_kernels(src: str | Path, out: str | Path, *, per_op: dict[str, int] | None = None,
                   seed: int = DEFAULT_SEED, command: str = "") -> dict[str, Any]:
    """Write the sampled calibration rows of one GPU folder to `out` (JSONL) and its provenance to
    `<out>.meta.json`; returns the meta. Raises MeasuredDataError on a malformed source row and UnknownGPUError
    if the device is not in the catalogue."""
    src, out = Path(src), Path(out)
    device, by_op = read_device(src)
    gpu = get_gpu(device)
    floor = launch_floor_ms(by_op)
    latency_ms = prior_profile().kernel_latency_s * 1e3
    picked = sample(by_op, {**DEFAULT_PER_OP, **(per_op or {})}, seed)
    rows = [calibration_row(r, floor, latency_ms, seed) for r in picked]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    meta = {
        "schema": META_SCHEMA, "gpu_name": device, "catalog_gpu": gpu.name, "driver_version": DRIVER_UNKNOWN,
        "torch_version": "2.1.0", "torch_cuda_version": "12.1", "cudnn_version": 8902,
        "measured_dates": "unknown (public data; published with the ASPLOS 2025 paper)",
        "command": f"NeuSight neusight/Dataset/collect.py, imported by: {command or 'gpuest import-kernels'}",
        "source": SOURCE, "conditions": CONDITIONS, "predicts": ["time"], "seed": seed,
        "launch_floor_ms": floor, "launch_floor_rule": f"{LAUNCH_FLOOR_QUANTILE:.0%} quantile of all {device} rows",
        "source_rows": {op: len(v) for op, v in sorted(by_op.items())},
        "imported_rows": len(rows), "latency_rows": sum(r["kind"] == "latency" for r in rows),
    }
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuest import-kernels",
                                     description="Import public per-kernel timings of one GPU as calibration rows.")
    parser.add_argument("src", help="one GPU's folder of <op>.csv.gz files (neusight-kernels/<device>/)")
    parser.add_argument("-o", "--out", required=True, help="calibration JSONL to write, gzipped if it ends in .gz (meta beside it)")
    parser.add_argument("--per-op", type=int, default=None,
                        help="rows kept per op file (default: bmm 600, linear/conv 500, ln/softmax 150, others 50)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the deterministic sub-sample")
    args = parser.parse_args(argv)
    if args.per_op is not None and args.per_op <= 0:
        parser.error(f"--per-op must be a positive number of rows, got {args.per_op}")
    per_op = {op: args.per_op for op in OPS} if args.per_op else None
    command = f"gpuest import-kernels {args.src} -o {args.out}" + (f" --per-op {args.per_op}" if args.per_op else "") \
        + (f" --seed {args.seed}" if args.seed != DEFAULT_SEED else "")
    meta = import_kernels(args.src, args.out, per_op=per_op, seed=args.seed, command=command)
    print(f"wrote {args.out}: {meta['imported_rows']} rows of {meta['catalog_gpu']} ({meta['latency_rows']} "
          f"launch-bound), launch floor {meta['launch_floor_ms'] * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
