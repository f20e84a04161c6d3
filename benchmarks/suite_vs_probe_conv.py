"""Kernel facts: the kernels one calibration-suite convolution benchmark runs, built as the runner builds it, beside
the same layer built as benchmarks/conv_backward_probe.py builds it, and the suite's own timing of it (inputs, weight and gradient in channels-last
order, bf16): whether cuDNN picks the same kernels for both, and how long each set takes.

    python3 benchmarks/suite_vs_probe_conv.py conv2d_bwd_bf16_c384_384_hw14_k1_s1_g24_n128_nhwc   (on a GPU)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuest.calibrate.kernel_profile import profile_kernels  # noqa: E402
from gpuest.calibrate.runner import tf32_flags  # noqa: E402
from gpuest.calibrate.suite import all_benchmarks  # noqa: E402
from gpuest.calibrate.timing import time_op  # noqa: E402


def _show(label: str, step) -> None:
    kernels, _ = profile_kernels(step, iters=5)
    print(f"{label}: {sum(k['us_per_iter'] for k in kernels):9.1f} us/call")
    for k in kernels[:6]:
        print(f"    {k['us_per_iter']:9.1f} us x{k['calls_per_iter']:.0f}  {k['name'][:100]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="names of the suite's conv benchmarks")
    names = ap.parse_args(argv).names
    by_name = {b.name: b for b in all_benchmarks(["conv"])}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"not a conv benchmark of the suite: {', '.join(unknown)} (accepted: the names of "
                 f"gpuest.calibrate.suite.all_benchmarks(['conv']), e.g. {min(by_name)})")
    dev = torch.device("cuda")
    for name in names:
        built = by_name[name].build(dev, 0)
        sets = [built.make_set(i) for i in range(3)]
        print(f"== {name}: inputs " + ", ".join(f"{tuple(t.shape)} {t.dtype} {t.stride()}" for t in sets[0]
                                              if isinstance(t, torch.Tensor)))
        b = by_name[name]
        with tf32_flags(b.matmul_tf32, b.cudnn_tf32):
            timed = time_op(built.fn, sets, rotate=len(sets))
            _show("suite-built, one set, suite's tf32 flags", lambda: built.fn(*sets[0]))
        print(f"suite timing (gpuest.calibrate.timing.time_op): {timed.median_ms * 1e3:.1f} us ({timed.method})")
        _show("suite-built, one set", lambda: built.fn(*sets[0]))
        state = {"i": 0}

        def rotating():
            state["i"] = (state["i"] + 1) % len(sets)
            built.fn(*sets[state["i"]])
        _show("suite-built, rotating sets", rotating)
        dy, x, w = (t.detach().clone().contiguous(memory_format=torch.channels_last) for t in sets[0][:3])
        p = by_name[name].params
        mask = (True, True, False)
        _show("fresh channels-last copies", lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, [p["stride"]] * 2, [p["padding"]] * 2, [1, 1], False, [0, 0], p["groups"], mask))
        dy2 = torch.randn_like(dy)
        _show("gradient from randn_like", lambda: torch.ops.aten.convolution_backward(
            dy2, x, w, None, [p["stride"]] * 2, [p["padding"]] * 2, [1, 1], False, [0, 0], p["groups"], mask))


if __name__ == "__main__":
    main()
