"""Device probe: which kernels cuDNN runs for a convolution's forward, input gradient and weight gradient,
and how long each takes, for layers whose backward the non-test per-op rows show far from its price (HRNet's
narrow channels-last branches, EfficientViT's grouped 1x1 layers, NFNet's grouped 3x3 layers, S3D's
temporal 3x1x1 layers) and for sweeps around them (channels, groups, spatial size, layout, dtype).

Usage (on a GPU): python3 benchmarks/conv_backward_probe.py --out OUT.jsonl
One row per (case, layout, dtype, direction): device time per call (us, the profiler's kernel time) and each
kernel's name and time. cudnn.benchmark off and cuDNN TF32 on (PyTorch's defaults, as the validation runs
used); clocks are left as found.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from l2_reuse_probe import probe_setup, write_timed_rows  # noqa: E402
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402

# (label, input shape, weight shape, stride, padding, groups)
LAYERS = [
    ("hrnet_18_s2", (128, 18, 28, 28), (18, 18, 3, 3), 2, 1, 1),
    ("hrnet_72", (128, 72, 14, 14), (72, 72, 3, 3), 1, 1, 1),
    ("hrnet_144", (128, 144, 7, 7), (144, 144, 3, 3), 1, 1, 1),
    ("hrnet_256", (128, 256, 7, 7), (256, 256, 3, 3), 1, 1, 1),
    ("hrnet_72_144_s2", (128, 72, 14, 14), (144, 72, 3, 3), 2, 1, 1),
    ("hrnet_1x1_72_128", (128, 72, 14, 14), (128, 72, 1, 1), 1, 0, 1),
    ("hrnet_1x1_1024_2048", (128, 1024, 7, 7), (2048, 1024, 1, 1), 1, 0, 1),
    ("hrnet_18_56", (128, 18, 56, 56), (18, 18, 3, 3), 1, 1, 1),
    ("evit_g24_1x1", (128, 384, 14, 14), (384, 16, 1, 1), 1, 0, 24),
    ("evit_g48_1x1", (128, 768, 7, 7), (768, 16, 1, 1), 1, 0, 48),
    ("evit_1x1_128_384", (128, 128, 14, 14), (384, 128, 1, 1), 1, 0, 1),
    ("evit_1x1_128_512", (128, 128, 14, 14), (512, 128, 1, 1), 1, 0, 1),
    ("nfnet_g6_3x3", (64, 768, 16, 16), (768, 128, 3, 3), 1, 1, 6),
    ("nfnet_1x1_1536_3072", (64, 1536, 8, 8), (3072, 1536, 1, 1), 1, 0, 1),
    ("nfnet_1x1_128", (64, 128, 64, 64), (128, 128, 1, 1), 1, 0, 1),
    ("resnet_512_7", (128, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ("resnet_64_56", (128, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
]
# 3x3 layers over channel counts at 14x14 and 7x7, and grouped 1x1 layers over channels per group.
LAYERS += [(f"sweep_3x3_c{c}_{hw}", (128, c, hw, hw), (c, c, 3, 3), 1, 1, 1)
           for hw in (7, 14) for c in (32, 64, 96, 128, 192, 512)]
LAYERS += [(f"sweep_g1x1_cpg{cpg}", (128, 384, 14, 14), (384, cpg, 1, 1), 1, 0, 384 // cpg) for cpg in (4, 8, 32, 64)]
LAYERS += [(f"sweep_g3x3_cpg{cpg}", (128, 384, 14, 14), (384, cpg, 3, 3), 1, 1, 384 // cpg) for cpg in (16, 64)]
LAYERS_3D = [  # S3D's separable temporal and pointwise layers (NCDHW)
    ("s3d_t3_128_T2", (8, 128, 2, 7, 7), (128, 128, 3, 1, 1), 1, (1, 0, 0), 1),
    ("s3d_t3_128_T4", (8, 128, 4, 14, 14), (128, 128, 3, 1, 1), 1, (1, 0, 0), 1),
    ("s3d_t3_192_T8", (8, 192, 8, 28, 28), (192, 192, 3, 1, 1), 1, (1, 0, 0), 1),
    ("s3d_pw_832_128", (8, 832, 2, 7, 7), (128, 832, 1, 1, 1), 1, 0, 1),
    ("s3d_s33_32_96", (8, 32, 8, 28, 28), (96, 32, 1, 3, 3), 1, (0, 1, 1), 1),
]
DIRECTIONS = {"forward": None, "input_grad": (True, False, False), "weight_grad": (False, True, False),
              "both": (True, True, False)}


def _case_rows(label, xs, ws, stride, padding, groups, dtype, layout, dev) -> list[dict]:
    dims = len(xs) - 2
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}[dims]
    x = torch.randn(xs, device=dev, dtype=dtype)
    w = torch.randn(ws, device=dev, dtype=dtype) * 0.01
    if layout != "nchw":
        x = x.contiguous(memory_format=fmt)
        w = w.contiguous(memory_format=fmt) if layout == "nhwc" else w
    conv = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv3d
    y = conv(x, w, None, stride, padding, 1, groups)
    gy = torch.randn_like(y)
    pad = (padding,) * dims if isinstance(padding, int) else padding
    rows = []
    for direction, mask in DIRECTIONS.items():
        if mask is None:
            step = lambda: conv(x, w, None, stride, padding, 1, groups)  # noqa: E731
        else:
            step = lambda mask=mask: torch.ops.aten.convolution_backward(  # noqa: E731
                gy, x, w, None, (stride,) * dims, pad, (1,) * dims, False, (0,) * dims, groups, mask)
        kernels, _ = profile_kernels(step, iters=5)
        rows.append({"case": label, "input": list(xs), "weight": list(ws), "stride": stride,
                     "padding": list(pad), "groups": groups, "dtype": str(dtype).split(".")[-1], "layout": layout,
                     "direction": direction, "us": round(sum(k["us_per_iter"] for k in kernels), 2),
                     "kernels": [[k["name"][:140], k["us_per_iter"]] for k in kernels[:6]]})
    return rows


def main() -> None:
    out, dev, _ = probe_setup(__doc__)
    rows = []
    for label, xs, ws, stride, padding, groups in LAYERS:
        for dtype, layouts in ((torch.bfloat16, ("nhwc", "nchw", "nhwc_x_nchw_w")), (torch.float32, ("nhwc", "nchw"))):
            for layout in layouts:
                rows += _case_rows(label, xs, ws, stride, padding, groups, dtype, layout, dev)
    for label, xs, ws, stride, padding, groups in LAYERS_3D:
        for dtype in (torch.float32, torch.bfloat16):
            for layout in ("nchw", "nhwc"):
                rows += _case_rows(label, xs, ws, stride, padding, groups, dtype, layout, dev)
    write_timed_rows(out, rows, dev, cudnn_version=torch.backends.cudnn.version(),
                     cudnn_benchmark=torch.backends.cudnn.benchmark)
    for r in rows:
        top = r["kernels"][0][0][:70] if r["kernels"] else ""
        print(f"{r['case']:22s} {r['layout']:13s} {r['dtype']:8s} {r['direction']:11s} {r['us']:9.1f} us  {top}")


if __name__ == "__main__":
    main()
