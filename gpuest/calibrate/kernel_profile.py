"""Which CUDA kernels one step of a model runs, and for how long (torch.profiler), as JSON.

Whole-network validation says how far a prediction is off; this says where. Each record lists every
kernel name with its device time and launches per iteration, so a category the estimator misprices
(e.g. depthwise convolutions on NHWC data, fp32 GELU under autocast) shows up as named kernels.

    python3 -m gpuest.calibrate.kernel_profile resnet50 --batch 128 --precision bf16-mixed --out k.jsonl
    python3 -m gpuest.calibrate.kernel_profile --benchmark rnn_fwd_gru_t50_b1_in128_h128_l1 --out k.jsonl
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from .timing import is_device_work

WARMUP_ITERS = 3
PROFILE_ITERS = 2


def profile_step(model: str, *, batch: int, precision: str, mode: str = "training", seq: int | None = None,
                 image_size: int | None = None, by_op: bool = False,
                 memory_format: str = "contiguous") -> dict[str, Any]:
    """One record: the kernels of `PROFILE_ITERS` steps on the current CUDA device, per iteration (us);
    by_op: also the device time per ATen op and input shapes (CPU activity recorded too)."""
    from gpuest.capture.models import load_model

    from .validate import _precision, make_step
    from ..evaluate.validation_set import ValidationConfig

    device = torch.device("cuda")
    # weights and layout as the validation run builds them (pure bf16/fp16 weights, channels-last)
    loaded = load_model(model, batch=batch, seq=seq, image_size=image_size, device=device,
                        dtype=_precision(precision)[0], memory_format=memory_format)
    cfg = ValidationConfig(model, loaded.family, batch, mode, precision,
                           seq=seq, image_size=image_size, memory_format=memory_format)
    step, _ = make_step(loaded, cfg, device)
    kernels, ops = profile_kernels(step, by_op)
    return {"schema": "gpuest.kernel-profile/1", "model": model, "batch": batch, "mode": mode,
            "precision": precision, "seq": seq, "image_size": image_size, "memory_format": memory_format,
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "kernel_sum_ms": round(sum(k["us_per_iter"] for k in kernels) / 1e3, 4), "kernels": kernels,
            **({"ops": ops} if by_op else {})}


def profile_kernels(step: Callable[[], Any], by_op: bool = False, iters: int = PROFILE_ITERS,
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kernels, ops) of `step` per call: each kernel's device time (us) and launches, slowest first, and with
    by_op the device time per ATen op and input shapes, averaged over `iters` calls after WARMUP_ITERS."""
    for _ in range(WARMUP_ITERS):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if by_op else [])
    with torch.profiler.profile(activities=activities, record_shapes=by_op) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if is_device_work(event):
            per_kernel[event.name][0] += event.device_time / iters
            per_kernel[event.name][1] += 1 / iters
    kernels = [{"name": name, "us_per_iter": round(us, 3), "calls_per_iter": calls}
               for name, (us, calls) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])]
    ops = []
    if by_op:
        # Device time of the kernels each ATen op launched itself (a cuDNN convolution's layout transposes
        # included), per op and input shapes: which node of the estimate to compare with.
        for avg in prof.key_averages(group_by_input_shape=True):
            if avg.self_device_time_total > 0 and avg.key.startswith("aten::"):
                ops.append({"op": avg.key, "shapes": str(avg.input_shapes),
                            "us_per_iter": round(avg.self_device_time_total / iters, 3),
                            "calls_per_iter": avg.count / iters})
        ops.sort(key=lambda o: -o["us_per_iter"])
    return kernels, ops


def suite_benchmark(name: str) -> Any:
    """The calibration-suite Benchmark called `name`; SystemExit naming the closest names if none is."""
    from .suite import all_benchmarks

    found = {b.name: b for b in all_benchmarks()}
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3)
        raise SystemExit(f"no suite benchmark {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    return found[name]


def profile_benchmark(name: str, *, by_op: bool = False) -> dict[str, Any]:
    """One record for a calibration-suite benchmark (gpuest.calibrate.suite): the kernels one call of it runs
    on the current CUDA device, e.g. how many launches a cuDNN RNN makes per time step."""
    from .runner import tf32_flags

    b = suite_benchmark(name)
    with tf32_flags(b.matmul_tf32, b.cudnn_tf32):
        built = b.build(torch.device("cuda"), 0)
        inputs = built.make_set(0)
        kernels, ops = profile_kernels(lambda: built.fn(*inputs), by_op)
    return {"schema": "gpuest.kernel-profile/1", "benchmark": name, "category": b.category, "params": b.params,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "kernel_sum_ms": round(sum(k["us_per_iter"] for k in kernels) / 1e3, 4), "kernels": kernels,
            **({"ops": ops} if by_op else {})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.kernel_profile", description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="a model spec (as for gpuest estimate); or use --benchmark")
    p.add_argument("--benchmark", help="comma-separated calibration-suite benchmark names, instead of a model")
    p.add_argument("--batch", type=int)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--mode", default="training", choices=["training", "inference"])
    p.add_argument("--seq", type=int)
    p.add_argument("--image-size", type=int)
    p.add_argument("--memory-format", default="contiguous", choices=["contiguous", "channels_last"])
    p.add_argument("--out", type=Path, required=True, help="JSON lines file; the record is appended")
    p.add_argument("--by-op", action="store_true",
                   help="also attribute device time to ATen ops and their input shapes")
    args = p.parse_args(argv)
    # Bad arguments are reported before the GPU is looked for, so they fail the same way everywhere.
    if (args.model is None) == (args.benchmark is None):
        p.error("give a model or --benchmark NAMES, not both")
    if args.model is not None and args.batch is None:
        p.error("a model needs --batch")
    names = [n.strip() for n in (args.benchmark or "").split(",") if n.strip()]
    for name in names:
        suite_benchmark(name)
    if not torch.cuda.is_available():
        print("kernel_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    command = " ".join(["python3 -m gpuest.calibrate.kernel_profile", *(argv or sys.argv[1:])])
    if args.benchmark:
        records = [profile_benchmark(name, by_op=args.by_op) for name in names]
    else:
        records = [profile_step(args.model, batch=args.batch, precision=args.precision, mode=args.mode,
                                seq=args.seq, image_size=args.image_size, by_op=args.by_op,
                                memory_format=args.memory_format)]
    for record in records:
        record["command"] = command
        with args.out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        what = record.get("benchmark") or f"{args.model} b{args.batch} {args.precision} {args.mode}"
        print(f"{what}: {len(record['kernels'])} kernels, {record['kernel_sum_ms']:.3f} ms/iter")
        for k in record["kernels"][:8]:
            print(f"  {k['us_per_iter']:10.1f} us {k['calls_per_iter']:6.1f}x  {k['name'][:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
