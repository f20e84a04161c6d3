"""Device probe: every call of the named ATen ops inside one inference step of a timm model, with the tensors
it really got (shapes, strides, dtypes, the scalar arguments' types), replayed alone: its device time per call
and the kernels it launches. For ops whose per-op rows sit far from their price though the same op elsewhere
does not (NFNet-F0's in-place scalar mul_, constant_pad_nd), to see what the model hands the kernel.

    python3 benchmarks/in_model_op_probe.py --model timm:dm_nfnet_f0 --batch 64 --size 256 --channels-last \\
        --precision bf16-mixed --ops mul_,constant_pad_nd --out OUT.jsonl     (on a GPU)

One row per distinct (op, shapes, strides, dtypes, scalar types): calls in the step, replayed time per call (us,
the profiler's kernel time) and each kernel's name and time. Clocks are left as found.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def _describe(value) -> object:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype).split(".")[-1],
                "contiguous": value.is_contiguous(),
                "channels_last": value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last)}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    return type(value).__name__ if isinstance(value, (int, float, bool)) else repr(value)[:40]


class _Collect(TorchDispatchMode):
    """Keeps the first call of each distinct (op, argument description) among `names`, with clones of its
    tensor arguments to replay, and counts the calls."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names, self.calls = names, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in self.names:
            key = json.dumps([str(func), _describe(args), _describe(kwargs)])
            if key in self.calls:
                self.calls[key][1] += 1
            else:
                keep = lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).copy_(v) \
                    if isinstance(v, torch.Tensor) else v  # noqa: E731
                self.calls[key] = [(func, [keep(a) for a in args], {k: keep(v) for k, v in kwargs.items()}), 1]
        return func(*args, **kwargs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="timm:NAME")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--precision", default="fp32", choices=["fp32", *AUTOCAST])
    ap.add_argument("--ops", required=True, help="comma-separated ATen op names (overload packets), e.g. mul_,add")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not args.model.startswith("timm:") or not args.model[5:]:
        ap.error(f"--model {args.model!r}: only timm models are accepted, written timm:NAME")
    import timm
    model = timm.create_model(args.model[5:], pretrained=False).cuda().eval()
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    collect = _Collect(set(args.ops.split(",")))
    with torch.no_grad(), torch.autocast("cuda", dtype=AUTOCAST.get(args.precision, torch.float32),
                                         enabled=args.precision in AUTOCAST):
        model(x)
        with collect:
            model(x)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
            "batch": args.batch, "size": args.size, "channels_last": args.channels_last, "precision": args.precision,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    rows = []
    for key, ((func, fargs, fkwargs), calls) in collect.calls.items():
        kernels, _ = profile_kernels(lambda: func(*fargs, **fkwargs), iters=5)
        op, described_args, described_kwargs = json.loads(key)
        rows.append({**meta, "op": op, "args": described_args, "kwargs": described_kwargs, "calls": calls,
                     "us": round(sum(k["us_per_iter"] for k in kernels), 2),
                     "kernels": [[k["name"][:120], k["us_per_iter"], k["calls_per_iter"]] for k in kernels[:6]]})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for r in rows:
        print(f"{r['op']:28s} x{r['calls']:<3d} {r['us']:9.1f} us  {json.dumps(r['args'])[:150]}")
        for name, us, n in r["kernels"][:3]:
            print(f"      {us:8.1f} us x{n:g} {name[:100]}")


if __name__ == "__main__":
    main()
