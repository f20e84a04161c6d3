"""Device probe: what a short kernel costs in the suite's timing and in a host-paced step. For each op of a
small table (batch-1 batch norms, a ReLU), three numbers per call (us):

- `event_us`: CUDA events around a group of back-to-back calls, divided by the calls (the suite's timing);
- `b2b_kernel_us`: the profiler's kernel time of the same back-to-back calls (a GPU-bound network's busy time);
- `isolated_kernel_us`: the profiler's kernel time of calls each launched onto an idle GPU, after a
  synchronisation and a host pause (a host-bound step's busy time, as in batch-1 inference).

    python3 benchmarks/kernel_context_probe.py --out OUT.jsonl      (on a GPU)

The non-test ResNet-50 batch-1 bf16-mixed step runs its eval batch norms in 5.6-6.1 us of kernel time, and
the suite timed the same shapes at 7.2-8.3 us (data/calibration/experiments/batch_one.H100-SXM.jsonl.gz).
Clocks are left as found. Run on the H100 on 2026-12-07 (data/kernels/H100-SXM-kernel-context.jsonl): a kernel
takes the same time launched back to back or onto an idle GPU (within 0.03 us); this probe's event time per call
(8-59 us: it queues no spin ahead, unlike the suite) is the host's dispatch. The bf16-data eval batch norms take
3.4-4.3 us of kernel time here, on one tensor reused warm in L2, against the model's 5.6-6.1 us: the launch
context does not explain that gap.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

CALLS = 200          # calls per measurement
HOST_PAUSE_S = 5e-5  # host pause before each isolated call, after a synchronisation


def _batch_norm(shape: tuple[int, ...], dtype: torch.dtype, param_dtype: torch.dtype, training: bool):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    c = shape[1]
    w, b = torch.ones(c, device="cuda", dtype=param_dtype), torch.zeros(c, device="cuda", dtype=param_dtype)
    rm, rv = torch.zeros(c, device="cuda", dtype=param_dtype), torch.ones(c, device="cuda", dtype=param_dtype)
    return lambda: F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.1)


def _relu(shape: tuple[int, ...], dtype: torch.dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    return lambda: torch.relu_(x)


def cases() -> dict[str, object]:
    """Name -> a zero-argument call launching the op (its tensors allocated once)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    out: dict[str, object] = {}
    for c, hw in ((64, 56), (256, 56), (2048, 7), (320, 14)):
        out[f"bn_eval_bf16mix_n1_c{c}_hw{hw}"] = _batch_norm((1, c, hw, hw), bf16, fp32, False)
        out[f"bn_eval_fp32_n1_c{c}_hw{hw}"] = _batch_norm((1, c, hw, hw), fp32, fp32, False)
        out[f"bn_train_fp32_n1_c{c}_hw{hw}"] = _batch_norm((1, c, hw, hw), fp32, fp32, True)
    out["relu_bf16_n1_c64_hw56"] = _relu((1, 64, 56, 56), bf16)
    out["bn_eval_bf16mix_n32_c256_hw56"] = _batch_norm((32, 256, 56, 56), bf16, fp32, False)
    return out


def _kernel_us(step, isolated: bool) -> tuple[float, int]:
    """(kernel time per call in us, kernels per call) from the profiler over CALLS calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            if isolated:
                torch.cuda.synchronize()
                time.sleep(HOST_PAUSE_S)
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_time > 0 and "Memcpy" not in e.name and "Memset" not in e.name]
    return sum(e.device_time for e in kernels) / CALLS, round(len(kernels) / CALLS)


def _event_us(step) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    rows = []
    for name, step in cases().items():
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        event_us = min(_event_us(step) for _ in range(3))
        b2b_us, kernels = _kernel_us(step, isolated=False)
        isolated_us, _ = _kernel_us(step, isolated=True)
        rows.append({**meta, "case": name, "kernels_per_call": kernels, "event_us": round(event_us, 3),
                     "b2b_kernel_us": round(b2b_us, 3), "isolated_kernel_us": round(isolated_us, 3)})
        print(f"{name:34s} kernels {kernels}  event {event_us:7.2f}  b2b kernel {b2b_us:7.2f}  "
              f"isolated kernel {isolated_us:7.2f} us")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
