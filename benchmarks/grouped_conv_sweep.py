"""Device probe: grouped 3x3 convolutions over groups and channels per group, forward and backward, to map
how far cuDNN's kernels for them run from a dense convolution of the same work.

The non-test per-op rows show grouped layers priced far from their time in both directions: ResNeSt's
two-group 3x3 layers (64-128 channels per group) take 2-4x their price, RegNet's 16-channel groups well
under it. Here every (groups, channels per group) pair of GROUPS x CHANNELS_PER_GROUP runs at two spatial
sizes, in bf16 channels-last, bf16 NCHW and fp32 NCHW, through benchmarks/conv_backward_probe.py's timing
(the profiler's kernel time per call, the kernels cuDNN chose).

Usage (on a GPU): python3 benchmarks/grouped_conv_sweep.py --out OUT.jsonl [--series resnext]
One row per (case, layout, dtype, direction), as conv_backward_probe.py writes them. cudnn.benchmark off
(PyTorch's default, as the validation runs used); clocks are left as found.

--series resnext instead times ResNeXt-50 32x4d's grouped 3x3 layers as the model runs them (32 groups of 4-32
channels, stride 1 and the stride-2 first layer of each stage, batch 128), whose backward the non-test per-op
rows of ResNeXt-50 fp32 training show priced 2-6x over (data/validation/H200-nontest-perop.run2.jsonl.gz).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv_backward_probe import _case_rows  # noqa: E402
from l2_reuse_probe import write_timed_rows  # noqa: E402

GROUPS = (1, 2, 4, 8, 16, 32)
CHANNELS_PER_GROUP = (16, 32, 64, 128)
SPATIAL = (14, 28)
BATCH = 64
MAX_CHANNELS = 1024
VARIANTS = ((torch.bfloat16, "nhwc"), (torch.bfloat16, "nchw"), (torch.float32, "nchw"))
# ResNeXt-50 32x4d's grouped 3x3 layers: (channels per group, input side, stride), batch 128.
RESNEXT_LAYERS = ((4, 56, 1), (8, 56, 2), (8, 28, 1), (16, 28, 2), (16, 14, 1), (32, 14, 2), (32, 7, 1))
RESNEXT_GROUPS, RESNEXT_BATCH = 32, 128


def _sweep_rows(dev: torch.device) -> list[dict]:
    rows = []
    for hw in SPATIAL:
        for groups in GROUPS:
            for cpg in CHANNELS_PER_GROUP:
                c = groups * cpg
                if c > MAX_CHANNELS:
                    continue
                for dtype, layout in VARIANTS:
                    rows += _case_rows(f"g{groups}_cpg{cpg}_hw{hw}", (BATCH, c, hw, hw), (c, cpg, 3, 3), 1, 1, groups,
                                       dtype, layout, dev)
    return rows


def _resnext_rows(dev: torch.device) -> list[dict]:
    rows = []
    for cpg, side, stride in RESNEXT_LAYERS:
        c = RESNEXT_GROUPS * cpg
        for dtype, layout in VARIANTS:
            rows += _case_rows(f"resnext_cpg{cpg}_hw{side}_s{stride}", (RESNEXT_BATCH, c, side, side), (c, cpg, 3, 3),
                               stride, 1, RESNEXT_GROUPS, dtype, layout, dev)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--series", choices=["sweep", "resnext"], default="sweep")
    args = ap.parse_args()
    out, dev = args.out, torch.device("cuda")
    rows = _resnext_rows(dev) if args.series == "resnext" else _sweep_rows(dev)
    write_timed_rows(out, rows, dev, cudnn_version=torch.backends.cudnn.version(),
                     cudnn_benchmark=torch.backends.cudnn.benchmark)
    for r in rows:
        print(f"{r['case']:24s} {r['layout']:5s} {r['dtype']:8s} {r['direction']:11s} {r['us']:9.1f} us")


if __name__ == "__main__":
    main()
