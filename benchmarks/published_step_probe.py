"""Device probe: docs/PUBLISHED.md's H100-SXM steps run here, as gpuest traces them, with today's software.

For each Lambda H100-SXM row (BERT-base/large SQuAD fine-tuning and ResNet-50, fp32 as TF32 and fp16) it
builds the model `benchmarks/published.py` traces, on the GPU with random weights, and measures:

- `step_s`: wall time per step, the mean of back-to-back steps after warm-up (CUDA-synchronised at the ends);
- `device_busy_s`: the union of kernel time per step under torch.profiler (gpuest.calibrate.validate_profile).

This splits the rows' published-vs-predicted gap into what gpuest misprices on a calibrated GPU (prediction vs
this measurement) and what the source's 2022-2024 software and counting add (this measurement vs the
published figure).

    PYTHONPATH=. python3 benchmarks/published_step_probe.py --out OUT.jsonl     (on an H100-SXM)

Clocks and power limits are left as found.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published  # noqa: E402  (the rows and their model builders)

WARMUP_STEPS = 3
MIN_TIMED_S = 2.0
PROFILED_STEPS = 2


def build_step(row: published.PublishedRow, device: str = "cuda"):
    """A zero-argument function running one training step of `row` on `device`."""
    from gpuest.capture.models import load_model
    from gpuest.capture.trace import OPTIMIZERS, PRECISIONS
    weight_dtype, autocast_dtype = PRECISIONS[row.precision]
    torch.backends.cuda.matmul.allow_tf32 = row.tf32_matmul
    torch.backends.cudnn.allow_tf32 = True
    if row.model in published.BERT_SQUAD:
        model, inputs = published.bert_squad(row.model, row.batch, row.seq or 384, device=device)
        loss_of = lambda out: out.loss  # noqa: E731
    else:
        loaded = load_model(row.model, batch=row.batch, memory_format=row.memory_format, device=device)
        model, inputs = loaded.model, loaded.example_inputs
        loss_of = lambda out: out.float().mean()  # noqa: E731
    if weight_dtype is not None:
        model = model.to(weight_dtype)
    model.train()
    opt = OPTIMIZERS[row.optimizer]([p for p in model.parameters() if p.requires_grad])
    if isinstance(inputs, dict):
        args, kwargs = (), inputs
    else:
        args, kwargs = ((inputs,) if torch.is_tensor(inputs) else tuple(inputs)), {}

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss = loss_of(model(*args, **kwargs))
        loss.backward()
        opt.step()
    return step


def measure(row: published.PublishedRow, per_op: bool = False) -> dict:
    from gpuest.calibrate.validate_profile import profile_iterations
    step = build_step(row)
    for _ in range(WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < MIN_TIMED_S:
        step()
        n += 1
        if n % 5 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / n
    busy = profile_iterations(step, PROFILED_STEPS, torch.device("cuda"), per_op=per_op)
    return {"table": row.table, "gpu": row.gpu, "model": row.model, "precision": row.precision,
            "batch": row.batch, "optimizer": row.optimizer, "tf32_matmul": row.tf32_matmul,
            "published_per_s": row.published_per_s, "steps_timed": n, "step_s": step_s,
            "measured_per_s": row.batch / step_s, "device_busy_s": busy.get("device_busy_s"),
            **({"per_op": busy["per_op"]} if per_op else {}), "torch": torch.__version__, "device_name": torch.cuda.get_device_name(0),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file to append one row per measured config to")
    ap.add_argument("--source-row", default="H100 80GB SXM5", help="the Lambda CSV row whose configs to run")
    ap.add_argument("--per-op", action="store_true", help="also record the last profiled step's ATen ops and their "
                    "device time (gpuest.calibrate.validate_profile)")
    ap.add_argument("--only", default=None, help="comma-separated models and precisions to run, e.g. "
                    "bert_large_squad:fp16,resnet50:fp16-mixed (default: all the row's configs)")
    args = ap.parse_args(argv)
    rows = [r for r in published.ROWS if r.source == "lambda" and r.table.endswith(": " + args.source_row)]
    if args.only:
        wanted = {tuple(x.split(":")) for x in args.only.split(",")}
        rows = [r for r in rows if (r.model, r.precision) in wanted]
    with open(args.out, "a") as f:
        for row in rows:
            try:
                rec = measure(row, per_op=args.per_op)
            except torch.OutOfMemoryError as exc:
                rec = {"table": row.table, "error": f"out of memory: {exc}"[:300]}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps({k: v for k, v in rec.items() if k != "per_op"}), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
