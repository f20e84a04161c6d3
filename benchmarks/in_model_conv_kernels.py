"""Kernel facts: the CUDA kernels each convolution backward of one training step runs inside a model, to set
beside the same layer's kernels alone (benchmarks/conv_backward_probe.py). Prints, per aten::convolution_backward
of the profiled step, its input shapes, device time and its kernels.

    python3 benchmarks/in_model_conv_kernels.py --model timm:hrnet_w18_small_v2 --batch 128 --channels-last   (on a GPU)
"""
from __future__ import annotations

import argparse

import torch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="timm:NAME")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if not args.model.startswith("timm:") or not args.model[5:]:
        ap.error(f"--model {args.model!r}: only timm models are accepted, written timm:NAME")
    import timm
    model = timm.create_model(args.model[5:], pretrained=False).cuda()
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        if e.name == "aten::convolution_backward":
            kernels = [(k.name, k.duration) for k in getattr(e, "kernels", [])]
            rows.append((e.device_time_total, str(e.input_shapes[:3]), kernels))
    rows.sort(key=lambda r: -r[0])
    print(f"{len(rows)} convolution backwards, {sum(r[0] for r in rows):.0f} us")
    for us, shapes, kernels in rows[:args.top]:
        print(f"{us:9.1f} us  {shapes}")
        for name, d in kernels[:6]:
            print(f"      {d:8.1f} us  {name[:110]}")


if __name__ == "__main__":
    main()
