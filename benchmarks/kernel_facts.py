"""The measured kernel facts docs/DESIGN.md quotes, recomputed from the committed data (CPU only).

    python3 benchmarks/kernel_facts.py

Reads data/calibration/<GPU>.jsonl (single-op benchmarks) and data/kernels/H100-SXM-training.jsonl
(per-kernel profiles of whole steps) and prints, per GPU: causal / non-causal SDPA time ratios and how
well `executed_flops` prices them, transposing-copy and cast bandwidth, NHWC / NCHW depthwise
convolution time ratios, the mixed-dtype add against a same-dtype one, layer norms over rows that are
not a multiple of 4 elements, reductions of short rows, few long columns and whole tensors against
their roofline, casts that write more than they read, RNN elapsed against device-busy
time, 1x1 convolutions against the memory roofline per plane size, embedding lookups beyond their
bytes and the direct embedding backward's time per chunk of indices, bilinear upsampling's serial plane
walk and its gradient's 16-bit atomics, accumulating index_put's time per dependent update, the gap the
device leaves between queued tiny kernels (against the per-op decode rows), the element rate of loops over
strided operands, the share of VGG-16's bf16 inference spent in the broadcast bias adds after its
convolutions, a per-channel scale's bandwidth by plane size, bf16 grouped GEMMs' throughput and the grouped
GEMMs of an MoE training step, and (data/memory/workspace.*.jsonl) how much of cuDNN's convolution workspace is the two
transposed activations and the RNN reserve per unit tensor.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUS = ("H100-SXM", "H200")


def _rows(gpu: str) -> dict[str, dict]:
    path = REPO / "data" / "calibration" / f"{gpu}.jsonl"
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {r["name"]: r for r in rows if r.get("time_ms_median")}


def _us(row: dict) -> float:
    return row["time_ms_median"] * 1e3


def causal_pairs(gpu: str, rows: dict[str, dict]) -> str:
    from gpuest.calibrate.retrace import retrace_nodes
    from gpuest.catalog import get_gpu
    from gpuest.price.device_time import effective_math_modes, executed_flops
    from gpuest.price.node_table import NodeTable

    names = [n for n in rows if n.startswith("sdpa_") and n.endswith("_causal") and n[:-7] in rows]
    nodes = retrace_nodes(names, jobs=1)
    spec = get_gpu(gpu)
    measured, errors = [], []
    for name in names:
        table = NodeTable.from_records([d for d in nodes[name] if d["category"] == "attention"])
        priced = float(executed_flops(table, spec, effective_math_modes(table, spec)[0])[0] / table.flops[0])
        ratio = _us(rows[name]) / _us(rows[name[:-7]])
        measured.append(ratio)
        errors.append(abs(math.log(priced / ratio)))
    return (f"causal/non-causal SDPA: {len(names)} pairs, measured ratio {min(measured):.2f}-{max(measured):.2f}, "
            f"priced within {100 * (math.exp(statistics.mean(errors)) - 1):.1f} % on average (mean |log|)")


def _moved_bytes(row: dict) -> float:
    """Bytes a benchmark's nodes read and write (each tensor touched once)."""
    return sum(n["bytes_read"] + n["bytes_written"] for n in row["nodes"])


def _bandwidth_tb_s(row: dict) -> float:
    return _moved_bytes(row) / (row["time_ms_median"] * 1e-3) / 1e12


def copies(rows: dict[str, dict]) -> str:
    big = [r for n, r in rows.items() if n.startswith(("transpose_contig", "cast_")) and _us(r) > 20]
    by = {kind: [_bandwidth_tb_s(r) for r in big if r["name"].startswith(kind)] for kind in ("transpose", "cast")}
    return (f"copies over 20 us: transposing {min(by['transpose']):.2f}-{max(by['transpose']):.2f} TB/s, "
            f"casts {min(by['cast']):.2f}-{max(by['cast']):.2f} TB/s")


def _single_nodes_over_roofline(gpu: str, rows: dict[str, dict], category: str) -> list[tuple[dict, float]]:
    """The node of each suite benchmark of `category` that traces to one node, as this estimator derives it,
    with the benchmark's time over that node's memory roofline (its bytes at catalogue bandwidth)."""
    from gpuest.calibrate.retrace import retrace_nodes
    from gpuest.catalog import get_gpu

    names = [n for n, r in rows.items() if r.get("category") == category]
    nodes = retrace_nodes(names, jobs=1)
    bandwidth = get_gpu(gpu).memory_bandwidth_bytes_per_s
    out = []
    for name in names:
        if len(nodes.get(name, [])) != 1:
            continue
        (node,) = nodes[name]
        out.append((node, _us(rows[name]) / ((node["bytes_read"] + node["bytes_written"]) / bandwidth * 1e6)))
    return out


def permuted_reads(gpu: str, rows: dict[str, dict]) -> str:
    """Permuted copies' time over their memory roofline, by data type and read amplification (the sectors a
    block of the strided loop reads over those its bytes fill, Cost.read_amplification)."""
    groups: dict[tuple[str, int], list[float]] = {}
    for node, over_roofline in _single_nodes_over_roofline(gpu, rows, "copy"):
        if node["permuted"]:
            groups.setdefault((node["dtype"], round(node["read_amplification"])), []).append(over_roofline)
    shown = ", ".join(f"{dtype} x{amp}: {statistics.median(v):.1f} (n={len(v)})"
                      for (dtype, amp), v in sorted(groups.items()))
    return f"permuted copies, median time / memory roofline by dtype and read amplification: {shown}"


def broadcast_loops(gpu: str, rows: dict[str, dict]) -> str:
    """Elementwise benchmarks' time over their memory roofline, plain against those reading an operand expanded
    (TensorIterator's non-vectorised loop), by data type (features.broadcast_lowp)."""
    groups: dict[tuple[str, bool], list[float]] = {}
    for node, over_roofline in _single_nodes_over_roofline(gpu, rows, "elementwise"):
        if node["category"] == "elementwise":
            groups.setdefault((node["dtype"], bool(node["broadcast"])), []).append(over_roofline)
    cells = []
    for dtype in sorted({d for d, _ in groups}):
        plain, expanded = groups.get((dtype, False)), groups.get((dtype, True))
        if plain and expanded:
            cells.append(f"{dtype} plain {statistics.median(plain):.2f} (n={len(plain)}), expanded "
                         f"{statistics.median(expanded):.2f} (n={len(expanded)}): "
                         f"{statistics.median(expanded) / statistics.median(plain):.2f}x")
    return "elementwise, median time / memory roofline: " + "; ".join(cells)


def nhwc_depthwise(rows: dict[str, dict]) -> str:
    out = []
    for mode in ("bf16", "tf32"):
        ratios = [_us(rows[n[:-5]]) / _us(r) for n, r in rows.items()
                  if n.startswith(f"conv2d_") and f"_{mode}_" in n and n.endswith("_nhwc") and n[:-5] in rows]
        out.append(f"{mode} NCHW/NHWC time {min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f})")
    return "depthwise convolutions: " + "; ".join(out)


def fp16_depthwise(rows: dict[str, dict]) -> str:
    """NCHW depthwise convolutions in fp16 against the same shape in bf16: PyTorch gives fp16 ones with a
    1/3/5 filter to cuDNN (formulas.conv._cudnn_takes_depthwise), bf16 ones to its own kernels."""
    pairs = []
    for name, row in sorted(rows.items()):
        m = re.fullmatch(r"conv2d_(fwd|bwd)_fp16_c(\d+)_\d+_hw(\d+)_k(\d+)_s(\d+)_g(\d+)_n(\d+)", name)
        twin = rows.get(name.replace("_fp16_", "_bf16_"))
        if m and m[2] == m[6] and twin:
            pairs.append(f"{m[1]} C={m[2]} {m[3]}px k{m[4]} s{m[5]} n{m[7]} {_us(twin) / _us(row):.2f}x")
    return "fp16 NCHW depthwise, bf16 time / fp16 time: " + ", ".join(pairs)


def dilated_depthwise(rows: dict[str, dict]) -> str:
    """Dilated depthwise convolutions (shapes/conv.json dilated), forward, bf16: time on channels-last data
    against NCHW data of the same shape."""
    pairs = [f"C={m[1]} n{m[2]} {_us(row) / 1e3:.2f} ms vs {_us(rows[name[:-5]]) / 1e3:.2f} ms"
             for name, row in sorted(rows.items())
             if (m := re.fullmatch(r"conv2d_fwd_bf16_c(\d+)_\1_hw\d+_k\d+_s1_g\1_d\d+_n(\d+)_nhwc", name))
             and name[:-5] in rows]
    return "dilated depthwise, bf16 forward, NHWC vs NCHW: " + ", ".join(pairs)


def branch_sums(rows: dict[str, dict]) -> str:
    """Sums over the branches of split-attention blocks (shapes/reduction.json branch_sums): bandwidth on NCHW
    and on channels-last data, where the kept run between two summed elements is the channels alone."""
    by: dict[str, list[float]] = {}
    for name, row in rows.items():
        if name.startswith("branchsum_"):
            dtype = name.split("_")[1]
            by.setdefault(f"{dtype} {'NHWC' if name.endswith('_nhwc') else 'NCHW'}", []).append(_bandwidth_tb_s(row))
    return "branch sums (TB/s): " + ", ".join(f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in sorted(by.items()))


def foreach_walks(gpu: str, rows: dict[str, dict]) -> str:
    """Single foreach calls over a few multi-tensor launches (shapes/optimizer.json `foreach_walks`): time per
    step of each launch's longest chunk walk once the profile's kernel latency per launch is taken off, and
    the time their bytes take at the catalogue bandwidth, per benchmark."""
    from gpuest.calibrate.retrace import retrace_nodes
    from gpuest.catalog import get_gpu
    from gpuest.profile import shipped_profiles

    names = sorted(n for n in rows if n.startswith("foreach_walk_"))
    if not names:
        return "foreach walks: none measured"
    nodes = retrace_nodes(names, jobs=1)
    latency_s = shipped_profiles()[gpu].kernel_latency_s
    bandwidth = get_gpu(gpu).memory_bandwidth_bytes_per_s
    steps, cells = [], []
    for name in names:
        node = nodes[name][0]
        moved_us = (node["bytes_read"] + node["bytes_written"]) / bandwidth * 1e6
        walk_us = _us(rows[name]) - node["kernels"] * latency_s * 1e6
        per_step = walk_us / node["chunk_walks"]
        if node["chunk_walks"] >= 8 and moved_us < walk_us / 2:   # walk-bound: its bytes take under half
            steps.append(per_step)
        cells.append(f"{name.removeprefix('foreach_walk_')} {_us(rows[name]):.1f} us "
                     f"({node['kernels']} launches, {node['chunk_walks']:.0f} steps, bytes {moved_us:.1f} us)")
    return (f"foreach walks: {statistics.median(steps):.2f} us per step of the longest chunk walk (median of "
            f"{len(steps)} walk-bound benchmarks, {min(steps):.2f}-{max(steps):.2f}); " + "; ".join(cells))


def foreach_walk_probe(gpu: str) -> str:
    """The foreach walk probe (data/kernels/<GPU>-foreach-walks.jsonl, benchmarks/foreach_walk_probe.py): time
    per step of a 32-step chunk walk beyond the profile's kernel latency, median over its ops and dtypes, on
    DRAM-cold inputs and on inputs the kernel before wrote (warm: only sets within half the L2)."""
    from gpuest.profile import shipped_profiles

    if not (REPO / "data" / "kernels" / f"{gpu}-foreach-walks.jsonl").exists():
        return f"foreach walk probe: no data for {gpu}"
    probe = _kernel_records(f"{gpu}-foreach-walks")
    latency_us = shipped_profiles()[gpu].kernel_latency_s * 1e6
    whole = [r for r in probe if r["walk_steps"] == 32 and r["launches"] == 1]
    cold = [(r["cold_us"] - latency_us) / 32 for r in whole]
    warm = [(r["warm_us"] - latency_us) / 32 for r in whole if r["set_mb"] <= r["l2_mb"] / 2]
    return (f"foreach walk probe: {statistics.median(cold):.2f} us per step cold ({min(cold):.2f}-{max(cold):.2f}, "
            f"{len(cold)} calls), {statistics.median(warm):.2f} us warm ({min(warm):.2f}-{max(warm):.2f}, "
            f"{len(warm)} calls within half the L2)")


def plane_walk_probe(gpu: str) -> str:
    """The plane walk probe (data/kernels/<GPU>-plane-walks.jsonl, benchmarks/plane_walk_probe.py): time per
    (sample, channel) plane of NCHW bilinear upsampling whose walk dominates (at least 4096 planes, at most
    64 blocks: one wave), cold and warm (inputs within half the L2); and of bicubic and 1-D linear, cold."""
    if not (REPO / "data" / "kernels" / f"{gpu}-plane-walks.jsonl").exists():
        return f"plane walk probe: no data for {gpu}"
    probe = [r for r in _kernel_records(f"{gpu}-plane-walks") if r["planes"] >= 4096 and r["blocks"] <= 64]
    bilinear = [r for r in probe if r["mode"] == "bilinear"]
    cold = [r["cold_us"] / r["planes"] for r in bilinear]
    warm = [r["warm_us"] / r["planes"] for r in bilinear if r["input_mb"] <= r["l2_mb"] / 2]
    others = [r["cold_us"] / r["planes"] for r in probe if r["mode"] != "bilinear"]
    return (f"plane walk probe: bilinear {statistics.median(cold):.2f} us per plane cold ({min(cold):.2f}-"
            f"{max(cold):.2f}, {len(cold)} calls), {statistics.median(warm):.2f} us warm ({min(warm):.2f}-"
            f"{max(warm):.2f}, {len(warm)} calls within half the L2); bicubic and 1-D linear cold "
            f"{min(others):.2f}-{max(others):.2f}")


def fold_probe(gpu: str) -> str:
    """The fold probe (data/kernels/<GPU>-folds.jsonl, benchmarks/fold_probe.py): im2col's time per sample of
    its batch for inputs under 2 MB (it grows with the batch, not the bytes), and col2im's time per column element
    read, whatever the dtype (both dtypes, 3x3 stride-1 and 2x2 stride-2 windows, calls over 100 us)."""
    if not (REPO / "data" / "kernels" / f"{gpu}-folds.jsonl").exists():
        return f"fold probe: no data for {gpu}"
    probe = _kernel_records(f"{gpu}-folds")
    per_sample = [r["cold_us"] / r["batch"] for r in probe if r["op"] == "im2col" and r["read_mb"] < 2]
    bytes_per = {"float32": 4, "bfloat16": 2}
    per_element = {(r["kernel"], r["dtype"]): [] for r in probe}
    for r in probe:
        if r["op"] == "col2im" and r["cold_us"] > 100:
            per_element[(r["kernel"], r["dtype"])].append(
                r["cold_us"] * 1e6 / (r["read_mb"] * 2 ** 20 / bytes_per[r["dtype"]]))
    cells = [f"{k}x{k} {dtype} {statistics.median(v):.1f}" for (k, dtype), v in sorted(per_element.items()) if v]
    return (f"fold probe: im2col {statistics.median(per_sample):.1f} us per sample of small inputs "
            f"({min(per_sample):.1f}-{max(per_sample):.1f}, {len(per_sample)} calls); col2im ps per column "
            f"element read: " + ", ".join(cells))


def grouped_conv_probe(gpu: str) -> str:
    """The convolution backward probe (data/kernels/<GPU>-conv-backward.jsonl, benchmarks/conv_backward_probe.py):
    for grouped (not depthwise) layers, the weight gradient's time over the forward's, by kernel size and
    channels per group (bf16 and fp32, both layouts), and the data gradient's over the forward's for 3x3 layers."""
    if not (REPO / "data" / "kernels" / f"{gpu}-conv-backward.jsonl").exists():
        return f"grouped conv: no data for {gpu}"
    probe = _kernel_records(f"{gpu}-conv-backward")
    times = {(r["case"], r["layout"], r["dtype"], r["direction"]): r["us"] for r in probe}
    wgrad: dict[tuple[int, int], list[float]] = {}
    dgrad: dict[int, list[float]] = {}
    for r in probe:
        groups, cin = r["groups"], r["input"][1]
        if r["direction"] != "forward" or groups == 1 or groups == cin or len(r["input"]) != 4:
            continue
        cpg, kernel, key = cin // groups, r["weight"][-1], (r["case"], r["layout"], r["dtype"])
        wgrad.setdefault((kernel, cpg), []).append(times[(*key, "weight_grad")] / r["us"])
        if kernel == 3:
            dgrad.setdefault(cpg, []).append(times[(*key, "input_grad")] / r["us"])
    return (f"grouped conv ({gpu}): weight gradient over forward by kernel x channels per group: "
            + ", ".join(f"{k}x{k} {cpg}/group {min(v):.1f}-{max(v):.1f}" for (k, cpg), v in sorted(wgrad.items()))
            + "; 3x3 data gradient over forward: "
            + ", ".join(f"{cpg}/group {min(v):.1f}-{max(v):.1f}" for cpg, v in sorted(dgrad.items())))


def power_curve(gpu: str) -> str:
    """The power curve probe (data/kernels/<GPU>-power-curve.jsonl, benchmarks/power_curve_probe.py): a busy GPU
    running one-element adds; an in-place ReLU's power per TB/s above that, from DRAM-cold and from L2-warm fp32
    inputs of 1-16 MB (L2_BYTE_POWER_SHARE in gpuest/price/power.py is their ratio); and bf16 GEMMs' power at
    their share of the tensor roof."""
    if not (REPO / "data" / "kernels" / f"{gpu}-power-curve.jsonl").exists():
        return f"power curve: no data for {gpu}"
    probe = {r["name"]: r for r in _kernel_records(f"{gpu}-power-curve")}
    busy_w = probe["tiny_add_after_heat"]["avg_power_w"]
    relu = {where: [r for r in probe.values() if r["op"] == "relu_" and r["reads_from"] == where and r["size_mb"] <= 16]
            for where in ("dram", "l2")}
    per_tb_s = {where: [(r["avg_power_w"] - busy_w) / (r["bytes_per_s"] / 1e12) for r in rs] for where, rs in relu.items()}
    ratios = [lw / dw for lw, dw in zip(per_tb_s["l2"], per_tb_s["dram"])]
    dram_tb_s = [r["bytes_per_s"] / 1e12 for r in relu["dram"]]
    gemms = [f"{r['flops_per_s'] / 1e12:.0f} TFLOP/s {r['avg_power_w']:.0f} W" for r in probe.values()
             if r["op"] == "mm" and r["dtype"] == "bfloat16"]
    return (f"power curve ({gpu}): one-element adds {probe['tiny_add_after_idle']['avg_power_w']:.0f} W after "
            f"idle, {busy_w:.0f} W after load; ReLU W per TB/s above that: DRAM "
            f"{min(per_tb_s['dram']):.0f}-{max(per_tb_s['dram']):.0f} (at {min(dram_tb_s):.1f}-{max(dram_tb_s):.1f} TB/s), L2 {min(per_tb_s['l2']):.0f}-"
            f"{max(per_tb_s['l2']):.0f} (ratio {min(ratios):.2f}-{max(ratios):.2f}); bf16 GEMMs: " + ", ".join(gemms))


def kernel_gaps(gpu: str) -> str:
    """The kernel gap probe (data/kernels/<GPU>-kernel-gaps.jsonl, benchmarks/kernel_gap_probe.py): the idle time
    between back-to-back queued kernels (unprofiled CUDA-event time per call less the profiled kernel durations)
    after short (< 5 us) and longer kernels, eager and as a CUDA graph; and, in networks whose trace shows the
    host ahead (starved gaps under 1 us per kernel), unprofiled wall less busy less starved time per kernel."""
    if not (REPO / "data" / "kernels" / f"{gpu}-kernel-gaps.jsonl").exists():
        return f"kernel gaps: no data for {gpu}"
    rows = _kernel_records(f"{gpu}-kernel-gaps")
    cells = []
    for launch in ("eager", "graph"):
        for label, short in (("after < 5 us kernels", True), ("after >= 5 us kernels", False)):
            gaps = [r["unprofiled_gap_per_kernel_us"] for r in rows if r["series"] == "ops" and r["launch"] == launch
                    and (r["kernel_us_median"] < 5) == short]
            cells.append(f"{launch} {label} {min(gaps):.2f}-{max(gaps):.2f} us (median {statistics.median(gaps):.2f})")
    nets = [r for r in rows if r["series"] == "networks" and r["starved_gap_per_kernel_us"] < 1.0]
    per_kernel = {r["name"].split("|")[0] + "|" + r["name"].split("|")[3]:
                  (r["wall_us"] - r["busy_us"] - r["starved_gap_per_kernel_us"] * r["kernels_per_iter"])
                  / r["kernels_per_iter"] for r in nets}
    return (f"kernel gaps ({gpu}): queued ops " + "; ".join(cells) + "; host-ahead networks' wall less busy "
            "per kernel " + ", ".join(f"{k} {v:.2f} us" for k, v in per_kernel.items())
            + f" (median {statistics.median(per_kernel.values()):.2f})")


def grouped_conv_sweep(gpu: str) -> str:
    """The grouped convolution sweep (data/kernels/<GPU>-grouped-conv.jsonl, benchmarks/grouped_conv_sweep.py):
    a grouped 3x3 layer's time over `groups` dense layers of one group's width (same FLOPs), by direction,
    layout and channels per group: min / median / max over groups 2-32 and both spatial sizes."""
    if not (REPO / "data" / "kernels" / f"{gpu}-grouped-conv.jsonl").exists():
        return f"grouped conv sweep: no data for {gpu}"
    rows = _kernel_records(f"{gpu}-grouped-conv")
    dense = {(r["weight"][1], r["input"][2], r["layout"], r["dtype"], r["direction"]): r["us"]
             for r in rows if r["groups"] == 1}
    ratios: dict[tuple[str, str, str, int], list[float]] = {}
    for r in rows:
        if r["groups"] > 1 and r["direction"] != "both":
            key = (r["weight"][1], r["input"][2], r["layout"], r["dtype"], r["direction"])
            ratios.setdefault((r["direction"], r["layout"], r["dtype"], r["weight"][1]), []).append(
                r["us"] / (r["groups"] * dense[key]))
    return (f"grouped 3x3 conv ({gpu}) over groups x dense per group: "
            + "; ".join(f"{d} {lay} {dt} {cpg}/group {min(v):.2f}/{statistics.median(v):.2f}/{max(v):.2f}"
                        for (d, lay, dt, cpg), v in sorted(ratios.items())))


def batch_norm_scaling(gpu: str) -> str:
    """The batch norm scaling probe (data/kernels/<GPU>-batch-norm-scaling.jsonl,
    benchmarks/batch_norm_scaling_probe.py): by direction, dtype and layout, each channel count's time at batch 256
    of 112x112 planes over its time at batch 64 (4x the elements per channel: 4.0 is linear)."""
    if not (REPO / "data" / "kernels" / f"{gpu}-batch-norm-scaling.jsonl").exists():
        return f"batch norm scaling: no data for {gpu}"
    rows = _kernel_records(f"{gpu}-batch-norm-scaling")
    us = {(r["direction"], r["dtype"], r["layout"], r["channels"], r["batch"], r["plane"]): r["us"] for r in rows}
    cells = []
    for direction, dtype, layout in sorted({k[:3] for k in us}):
        ratios = [f"c{c} {us[(direction, dtype, layout, c, 256, 112)] / us[(direction, dtype, layout, c, 64, 112)]:.2f}"
                  for c in sorted({k[3] for k in us})]
        cells.append(f"{direction} {dtype} {layout}: " + ", ".join(ratios))
    return f"batch norm scaling ({gpu}), batch 256 over batch 64 at 112x112: " + "; ".join(cells)


def batch_norm_channels(gpu: str) -> str:
    """The batch norm channel sweep (data/kernels/<GPU>-batch-norm-channels.jsonl.gz,
    benchmarks/batch_norm_scaling_probe.py --series channels): the backward kernel's time over 128-396 channels
    against a full wave (ROW_BLOCKS_PER_SM blocks on each SM: 528 on the H200) fitted as
    (channels / full wave) ** a per dtype and plane, the median a (features.PARTIAL_WAVE_EXPONENT), 672 and 1024
    channels' time over a full wave's, and theirs against a full wave plus a partial one at that exponent."""
    from gpuest.catalog import get_gpu
    from gpuest.jsonl import read_jsonl
    from gpuest.price.features import ROW_BLOCKS_PER_SM

    path = REPO / "data" / "kernels" / f"{gpu}-batch-norm-channels.jsonl.gz"
    if not path.exists():
        return f"batch norm channels: no data for {gpu}"
    wave = int(get_gpu(gpu).sm_count * ROW_BLOCKS_PER_SM["norm"])
    us = {(r["dtype"], r["plane"], r["channels"]): sum(k[1] for k in r["kernels"] if "bw" in k[0] or "backward" in k[0])
          for r in read_jsonl(path) if r["direction"] == "train_backward"}
    fits = {}
    for dtype, plane in sorted({k[:2] for k in us}):
        xs = [math.log(c / wave) for c in (128, 192, 264, 396)]
        ys = [math.log(us[(dtype, plane, c)] / us[(dtype, plane, wave)]) for c in (128, 192, 264, 396)]
        fits[(dtype, plane)] = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    a = statistics.median(fits.values())
    cells = []
    for (dtype, plane), fit in fits.items():
        full = us[(dtype, plane, wave)]
        over = [us[(dtype, plane, c)] / (full * (1 + ((c - wave) / wave) ** a)) for c in (672, 1024)]
        cells.append(f"{dtype} {plane}x{plane} a={fit:.2f}, 672 and 1024 over {wave} channels "
                     f"{us[(dtype, plane, 672)] / full:.2f}/{us[(dtype, plane, 1024)] / full:.2f}x, "
                     f"672/1024 measured over priced {over[0]:.2f}/{over[1]:.2f}")
    return f"batch norm backward by channels ({gpu}), median a={a:.2f}: " + "; ".join(cells)


def sort_topk_launches(gpu: str) -> str:
    """The sort and top-k probe (data/kernels/<GPU>-sort-topk.jsonl.gz, benchmarks/sort_topk_probe.py): launches
    per call by path (rows of at most 4096 elements sorted in place; one or several longer rows radix-sorted;
    top-k's single- and multi-block radix select, k = 1 and k > 1) and dtype, and the time of a 1x8192 int64 sort."""
    path = REPO / "data" / "kernels" / f"{gpu}-sort-topk.jsonl.gz"
    if not path.exists():
        return f"sort and top-k: no data for {gpu}"
    from gpuest.annotate.formulas.reduce import SORT_IN_PLACE_MAX, topk_multiblock
    from gpuest.jsonl import read_jsonl
    rows = read_jsonl(path)

    def path_of(r: dict) -> str:
        if r["op"] == "topk":
            return f"top-k {'multi' if topk_multiblock(r['rows'], r['length']) else 'single'}-block k{min(r['k'], 2)}"
        if r["length"] <= SORT_IN_PLACE_MAX:
            return "sort in place"
        return f"sort radix {'one row' if r['rows'] == 1 else 'rows'}"
    launches: dict[str, dict[str, set]] = {}
    for r in rows:
        if r["op"] in ("sort", "topk"):
            launches.setdefault(path_of(r), {}).setdefault(r["dtype"], set()).add(r["launches"])
    example = next(r["us"] for r in rows if r["op"] == "sort" and r["rows"] == 1 and r["length"] == 8192
                   and r["dtype"] == "int64")
    cells = [f"{p}: " + ", ".join(f"{dt} {'/'.join(f'{v:g}' for v in sorted(vals))}" for dt, vals in sorted(by.items()))
             for p, by in sorted(launches.items())]
    return f"sort and top-k ({gpu}) launches per call: " + "; ".join(cells) + f"; 1x8192 int64 sort {example:.1f} us"


def power_sustained(gpu: str) -> str:
    """The power curve probe's sustained series (data/kernels/<GPU>-power-sustained.jsonl, `--series sustained`):
    each load's median power over 20 back-to-back windows from a cool card, its range, and the card's warming."""
    if not (REPO / "data" / "kernels" / f"{gpu}-power-sustained.jsonl").exists():
        return f"power sustained: no data for {gpu}"
    by_load: dict[str, list[dict]] = {}
    for r in _kernel_records(f"{gpu}-power-sustained"):
        by_load.setdefault(r["op"], []).append(r)
    cells = []
    for load, rs in by_load.items():
        watts = [r["avg_power_w"] for r in rs]
        cells.append(f"{load} median {statistics.median(watts):.0f} W (window 0 {watts[0]:.0f}, range "
                     f"{min(watts):.0f}-{max(watts):.0f}), {rs[0]['temperature_c']:.0f}->{rs[-1]['temperature_c']:.0f} C")
    return f"power sustained ({gpu}): " + "; ".join(cells)


def mixed_add(rows: dict[str, dict]) -> str:
    ratios = [_us(r) / _us(rows[n.replace("bf16xfp32", "bf16")]) for n, r in rows.items()
              if "_bf16xfp32_" in n and _us(r) > 20]
    return f"bf16 + fp32 elementwise over 20 us: {min(ratios):.2f}-{max(ratios):.2f}x the bf16 + bf16 time"


def channel_scales(rows: dict[str, dict]) -> str:
    """A per-channel scale over NCHW planes (TensorIterator's broadcast loop): bandwidth by plane size."""
    by: dict[tuple[str, int], float] = {}
    for name, row in rows.items():
        match = re.fullmatch(r"ew_channel_scale_(bf16|fp32)_n\d+_c\d+_hw(\d+)", name)
        if match:
            by[(match[1], int(match[2]))] = _bandwidth_tb_s(row)
    return "NCHW channel scale, TB/s by plane: " + "; ".join(
        f"{mode} {hw}x{hw} {tb:.2f}" for (mode, hw), tb in sorted(by.items()))


def tiny_inner_gemms(rows: dict[str, dict]) -> str:
    """The suite's 16-bit GEMMs with an inner dimension below 32 (shapes/matmul.json `tiny_*`): time and the
    bandwidth of their bytes (formulas.matmul.TINY_INNER)."""
    out = []
    for name, r in sorted(rows.items()):
        m = re.fullmatch(r"(mm|linear|bmm)_bf16_(?:b\d+_)?[mt](\d+)_(?:n|in)(\d+)_(?:k|out)(\d+)", name)
        if not m:
            continue
        dims = [int(v) for v in m.groups()[1:]]
        n = dims[2] if m.group(1) == "linear" else dims[1]
        k = dims[1] if m.group(1) == "linear" else dims[2]
        if min(n, k) < 32:
            out.append(f"{name} {_us(r):.0f} us {_bandwidth_tb_s(r):.2f} TB/s")
    return "bf16 GEMMs with N or K below 32: " + "; ".join(out)


def mask_adds(rows: dict[str, dict]) -> str:
    """Attention-mask adds (a mask broadcast over the heads, shapes/elementwise.json `mask_add`): bandwidth
    by data type."""
    by = {mode: [_bandwidth_tb_s(r) for n, r in rows.items() if n.startswith(f"ew_mask_add_{mode}_")]
          for mode in ("fp32", "bf16", "fp16")}
    return "attention-mask adds: " + ", ".join(f"{mode} {min(v):.2f}-{max(v):.2f} TB/s" for mode, v in by.items() if v)


def nhwc_eval_batch_norms(rows: dict[str, dict]) -> str:
    """Eval-mode batch norm on channels-last activations (shapes/norm.json batch_norm_channels_last*): bandwidth
    by channel count, bf16 and fp32 (formulas.norm prices each pixel as a row of C channels)."""
    found = [(m[1], int(m[3]), _bandwidth_tb_s(row)) for name, row in rows.items()
             if (m := re.fullmatch(r"batchnorm_eval_nhwc_(bf16|fp32)_(\d+)x(\d+)x(\d+)x(\d+)", name))]
    by = {mode: [f"C={c} {rate:.2f}" for m, c, rate in sorted(found) if m == mode] for mode in ("bf16", "fp32")}
    return "channels-last eval batch norm (TB/s): " + "; ".join(f"{mode} {', '.join(v)}" for mode, v in by.items())


def expanded_divides(rows: dict[str, dict]) -> str:
    """An expanded gradient divided by a number (shapes/elementwise.json expanded_divide): bandwidth, the same
    on GPUs of the same SMs and clock but different memory (its strided loop is not bandwidth-bound)."""
    rates = [_bandwidth_tb_s(r) for n, r in rows.items() if n.startswith("ew_expdiv_")]
    return f"expanded divides: {min(rates):.2f}-{max(rates):.2f} TB/s over {len(rates)} benchmarks" if rates else ""


def gathers_last_dim(rows: dict[str, dict]) -> str:
    """torch.gather along the last dim (shapes/copy.json gather_last_dim): bandwidth per benchmark."""
    return "last-dim gathers (TB/s): " + ", ".join(f"{n.removeprefix('gather_lastdim_')} {_bandwidth_tb_s(r):.2f}"
                                                  for n, r in sorted(rows.items()) if n.startswith("gather_lastdim_"))


def per_op_totals() -> str:
    """Top-level ATen ops' device time in the per-op rows of three non-test H100 architectures-set configs,
    against the step's device-busy time: CaiT's talking-heads mm calls, BLOOM's ALiBi baddbmm calls and its
    training step's divisions (its loss gradient)."""
    from gpuest.jsonl import read_jsonl
    wanted = {"timm:cait_xxs24_224|b128|i224|training|bf16-mixed": "aten::mm",
              "hf:bloom-560m|b8|s1024|inference|bf16": "aten::baddbmm",
              "hf:bloom-560m|b8|s1024|training|bf16-mixed": "aten::div"}
    out = []
    for row in read_jsonl(REPO / "data" / "validation" / "H100-SXM-architectures.jsonl.gz"):
        op = wanted.get(row["key"])
        if op:
            total_ms = sum(o[1] for o in row["per_op"]["ops"] if o[0] == op) / 1e3
            out.append(f"{row['key']}: {op} {total_ms:.1f} ms of {row['device_busy_s'] * 1e3:.1f} ms busy")
    return "per-op totals (H100): " + "; ".join(out)


def grouped_gemms(rows: dict[str, dict]) -> str:
    """bf16 torch._grouped_mm (MoE experts): achieved TFLOP/s of the forward and of the backward (2x FLOPs)."""
    rates = {"fwd": [], "bwd": []}
    for name, row in rows.items():
        match = re.fullmatch(r"grouped_mm_(fwd|bwd)_bf16_g\d+_t(\d+)_h(\d+)_n(\d+)", name)
        if match:
            flops = 2.0 * int(match[2]) * int(match[3]) * int(match[4]) * (2 if match[1] == "bwd" else 1)
            rates[match[1]].append(flops / (row["time_ms_median"] * 1e-3) / 1e12)
    return "bf16 grouped GEMMs, TFLOP/s: " + "; ".join(
        f"{d} {min(v):.0f}-{max(v):.0f} ({len(v)})" for d, v in rates.items() if v) if any(rates.values()) else \
        "bf16 grouped GEMMs: no data"


def moe_grouped_gemm_step() -> str:
    """The grouped GEMMs of the non-test qwen3-MoE training step's per-op profile (kernel_profile --by-op)."""
    (r,) = _kernel_records("H100-SXM-qwen3-moe-training")
    ops = [o for o in r["ops"] if o["op"] == "aten::_grouped_mm"]
    return (f"{r['model']} b{r['batch']} {r['mode']} {r['precision']}: _grouped_mm {len(ops)} shapes, "
            f"{sum(o['us_per_iter'] for o in ops) / 1e3:.2f} ms per step of {r['kernel_sum_ms']:.2f} ms")


def odd_rows(rows: dict[str, dict]) -> str:
    out = []
    for mode in ("fp32", "bf16"):
        per_elem = {d: _us(rows[f"layernorm_fwd_{mode}_t16384_d{d}"]) / (16384 * d) for d in (50, 64)}
        out.append(f"{mode} {per_elem[50] / per_elem[64]:.1f}x")
    return "layer norm over 16384 rows, time per element with 50 vs 64 elements per row: " + ", ".join(out)


def reductions(gpu: str, rows: dict[str, dict]) -> str:
    """Reductions against their memory roofline: short contiguous rows, few long columns, and the fixed
    cost of a full reduction whatever its dtype (gpuest/price/reduce_launch.py)."""
    from gpuest.catalog import get_gpu
    bw = get_gpu(gpu).memory_bandwidth_bytes_per_s

    def x_roof(name: str) -> float:
        return _us(rows[name]) / (_moved_bytes(rows[name]) / bw * 1e6)
    short = {n: x_roof(n) for n in ("reduce_sum_fp32_1048576x32_dim-1", "adaptive_avgpool_fp32_n32_c2048_hw7")}
    columns = {n: x_roof(n) for n in ("colsum_fp32_131072x64", "colsum_fp32_50176x96", "colsum_fp32_16384x3072")}
    full = {n: _us(rows[n]) for n in ("reduce_sum_all_fp32_n1048576", "reduce_sum_all_bf16_n1048576")}
    show = lambda d, f: ", ".join(f"{n} {f.format(v)}" for n, v in d.items())  # noqa: E731
    return (f"reductions, time / memory roofline: short rows {show(short, '{:.1f}x')}; columns "
            f"{show(columns, '{:.1f}x')}; full reductions {show(full, '{:.1f} us')}")


def layer_norm_weight_gradients(rows: dict[str, dict]) -> str:
    """Layer norm's backward per row: up to 65536 rows ATen's weight/bias-gradient kernel gives each 32
    columns one block that walks all the rows in turn, past that it splits the rows over blocks
    (gpuest/price/reduce_launch.py, GAMMA_BETA_SPLIT_ROWS)."""
    shapes = ((16384, 64), (32768, 30), (50176, 128), (65536, 256), (100352, 192), (200704, 96), (401408, 96))
    out = [f"{m}x{n} {_us(rows[f'layernorm_bwd_bf16_t{m}_d{n}']) * 1e3 / m:.1f}" for m, n in shapes]
    return "layer norm backward (bf16), ns per row: " + ", ".join(out)


def permuted_elementwise(rows: dict[str, dict]) -> str:
    """Binary ops with a permuted operand, time per byte against a whole-row permuted add of the same dtype
    (a transposed operand, nothing wasted), by the share of fetched sectors unused, 1 - 1 / amplification
    (gpuest.price.features read_waste)."""
    out = []
    for mode in ("fp32", "bf16"):
        def per_byte(name: str) -> float:
            node = next(n for n in rows[name]["nodes"] if not n.get("free"))
            return _us(rows[name]) / (node["bytes_read"] + node["bytes_written"])
        base = statistics.median(per_byte(n) for n in rows if n.startswith(f"ew_add_transposed_{mode}_"))
        by_waste: dict[float, list[float]] = {}
        for n in rows:
            if n.startswith("ew_add_mixed_") and f"_{mode}_" in n:
                node = next(x for x in rows[n]["nodes"] if not x.get("free"))
                waste = round(1.0 - 1.0 / max(node.get("read_amplification", 1.0), 1.0), 2)
                by_waste.setdefault(waste, []).append(per_byte(n) / base)
        out.append(f"{mode} " + ", ".join(f"{w:.2f}: {statistics.median(v):.1f}x" for w, v in sorted(by_waste.items())))
    return "permuted adds, time per byte over a whole-row permuted add, by unused sector share: " + "; ".join(out)


def embedding_lookups(rows: dict[str, dict]) -> str:
    """Embedding lookups beyond their bytes (GATHER_* in gpuest/price/device_time.py) and the direct
    embedding backward's serial chunks (EMBEDDING_BWD_CHUNK in gpuest/annotate/formulas/embedding.py)."""
    from gpuest.annotate.formulas.embedding import EMBEDDING_BWD_CHUNK
    out_mb = lambda r: sum(n["bytes_written"] for n in r["nodes"]) / 1e6  # noqa: E731
    hot, spread = rows["embedding_fwd_bf16_v100_d512_t16384"], rows["embedding_fwd_bf16_v30522_d1024_t8192"]
    wide = rows["embedding_fwd_bf16_v50257_d1600_t4096"]
    short = rows["embedding_fwd_fp32_v8192_d128_t262144"]
    chunks = math.ceil(512 / EMBEDDING_BWD_CHUNK) - math.ceil(1 / EMBEDDING_BWD_CHUNK)   # 512 indices against 1
    chunk_us = (_us(rows["embedding_bwd_fp32_v50257_d768_t512"])
                - _us(rows["embedding_bwd_fp32_v50257_d768_t1"])) / chunks
    return (f"embedding forward: {out_mb(hot):.0f} MB out of a 100-row table {_us(hot):.1f} us, of a 30522-row one "
            f"{_us(spread):.1f} us; 4096 x 1600 bf16 rows move {_bandwidth_tb_s(wide):.2f} TB/s; 262144 rows of 128 "
            f"fp32 {262144 / _us(short) / 1e3:.2f} G rows/s; direct backward {chunk_us:.2f} us per 32-index chunk")


def write_heavy_casts(rows: dict[str, dict]) -> str:
    ratios = [_us(r) / _us(rows[n.replace("bf16_to_fp32", "fp32_to_bf16")]) for n, r in rows.items()
              if n.startswith("cast_bf16_to_fp32") and _us(r) > 10 and n.replace("bf16_to_fp32", "fp32_to_bf16") in rows]
    return (f"bf16->fp32 cast (2 B read, 4 B written per element) over 10 us: {min(ratios):.2f}-{max(ratios):.2f}x "
            f"the fp32->bf16 time")


def rgb_stems(rows: dict[str, dict]) -> str:
    """3-input-channel convolutions: bf16 time over TF32 time for the same shape (1.0 at twice the peak:
    the channels are padded to 8 in bf16, to 4 in TF32)."""
    ratios = []
    for name, row in rows.items():
        if "_bf16_c3_" in name and name.startswith("conv2d_fwd"):
            other = rows.get(name.replace("_bf16_", "_tf32_"))
            if other and not name.endswith("_n1"):
                ratios.append(_us(row) / _us(other))
    return (f"3-channel stems, forward, batch >= 32: bf16 / TF32 time {min(ratios):.2f}-{max(ratios):.2f} "
            f"(n={len(ratios)})") if ratios else "no 3-channel stem pairs"


def pointwise_planes(gpu: str, rows: dict[str, dict]) -> str:
    """1x1 stride-1 convolutions of NCHW data: time over the memory roofline per plane size and math mode
    (a GEMM over the planes as stored when a plane is a whole number of tensor-core loads; the same
    convolution through cuDNN's NHWC transposes otherwise)."""
    from gpuest.catalog import get_gpu

    bandwidth = get_gpu(gpu).memory_bandwidth_bytes_per_s
    ratios: dict[tuple[str, int], list[float]] = {}
    for name, row in rows.items():
        match = re.fullmatch(r"conv2d_(?:fwd|bwd)_(bf16|tf32)_c\d+_\d+_hw(\d+)_k1_s1_g1_n(\d+)", name)
        if match and int(match[3]) >= 32:
            ratios.setdefault((match[1], int(match[2])), []).append(_us(row) * 1e-6 * bandwidth / _moved_bytes(row))
    return ("1x1 stride-1 NCHW convolutions, batch >= 32, time / memory roofline: "
            + "; ".join(f"{mode} {hw}x{hw} {min(v):.1f}-{max(v):.1f}" for (mode, hw), v in sorted(
                ratios.items(), key=lambda kv: (kv[0][0], -kv[0][1]))))


def rnn_gaps(rows: dict[str, dict]) -> str:
    ratios = [r["time_ms_median"] / r["busy_ms"] for r in rows.values() if r.get("busy_ms")]
    return (f"RNN benchmarks: elapsed / device-busy {min(ratios):.2f}-{max(ratios):.2f} "
            f"(median {statistics.median(ratios):.2f}, n={len(ratios)})")


def bilinear_upsampling(rows: dict[str, dict]) -> str:
    """NCHW bilinear upsampling's serial walk over the planes (formulas.pool._interpolate) and its gradient's
    16-bit atomic adds (Cost.atomic_adds)."""
    fwd = lambda dt, n, c, hw: _us(rows[f"upsample_bilinear_fwd_{dt}_n{n}_c{c}_hw{hw}"])  # noqa: E731
    bwd = lambda dt: _us(rows[f"upsample_bilinear_bwd_{dt}_n32_c256_hw32"])               # noqa: E731
    return (f"2x bilinear upsampling, fp32: 32 x 256 planes of 32x32 {fwd('fp32', 32, 256, 32) / 1e3:.2f} ms, "
            f"8 x 128 planes of 128x128 (as many outputs) {fwd('fp32', 8, 128, 128) / 1e3:.2f} ms; its backward "
            f"(32 x 256 x 32x32) takes {bwd('bf16') / bwd('fp32'):.1f}x as long in bf16 as in fp32")


def _rnn_step_chains(p: dict) -> int:
    """Time steps times layers times directions of a suite RNN benchmark's params: its recurrent steps."""
    return p["seq"] * p["layers"] * (2 if p.get("bidirectional") else 1)


def _kernel_records(name: str) -> list[dict]:
    """The records of one committed kernel-profile file (data/kernels/<name>.jsonl)."""
    path = REPO / "data" / "kernels" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def persistent_rnn_steps() -> str:
    """Device time per time step of cuDNN's persistent RNN kernels (forward), per suite benchmark."""
    per_cell: dict[str, dict[int, list[float]]] = {}
    for rec in _kernel_records("H100-SXM-benchmarks"):
        p = rec.get("params", {})
        us = sum(k["us_per_iter"] for k in rec["kernels"] if "RNN_blockPersist_fp" in k["name"])
        if us and p.get("cell"):
            per_cell.setdefault(p["cell"], {}).setdefault(p["hidden"], []).append(us / _rnn_step_chains(p))
    from gpuest.annotate.formulas.rnn import RNN_MODE_GATES
    cells = "; ".join(cell + " " + ", ".join(
        f"h{h} ({RNN_MODE_GATES[cell.upper()] * h * h} weights) {min(v):.2f}-{max(v):.2f} us"
        for h, v in sorted(by_h.items())) for cell, by_h in sorted(per_cell.items()))
    return f"persistent RNN kernels (H100-SXM-benchmarks), forward time per step and layer: {cells}"


def per_step_rnn_gemms() -> str:
    """The step GEMMs of the profiled cuDNN RNNs that ran no persistent kernel (all bf16 ones, even at
    hidden 128), time per call."""
    out = []
    for rec in _kernel_records("H100-SXM-benchmarks"):
        name, p = rec.get("benchmark", ""), rec.get("params", {})
        if not p.get("cell") or any("blockPersist" in k["name"] for k in rec["kernels"]):
            continue
        steps = _rnn_step_chains(p)
        gemms = [k for k in rec["kernels"] if k["calls_per_iter"] >= steps
                 and ("gemm" in k["name"].lower() or "nvjet" in k["name"])]
        per_call = ", ".join(f"{k['us_per_iter'] / k['calls_per_iter']:.1f}" for k in gemms)
        out.append(f"{name} ({p.get('dtype', 'fp32')}): {per_call} us a call")
    return "RNNs without a persistent kernel (H100-SXM-benchmarks), step GEMMs: " + "; ".join(out)


def rnn_step_times(rows: dict[str, dict]) -> str:
    """Device-busy time per time step of the suite's narrow (hidden <= 64, launch-bound) bf16 RNN forward
    benchmarks, which run a GEMM and a cell kernel per step."""
    out = []
    for name, r in sorted(rows.items()):
        p = r.get("params", {})
        if name.startswith("rnn_fwd_") and name.endswith("_bf16") and r.get("busy_ms") and p.get("hidden", 0) <= 64:
            out.append(f"{name} {1e3 * r['busy_ms'] / _rnn_step_chains(p):.1f} us")
    return "bf16 RNN forward, device-busy time per step and layer: " + "; ".join(out)


def vgg_bias_share() -> str:
    for r in _kernel_records("H100-SXM-training"):
        if r["model"] == "vgg16" and r["mode"] == "inference" and r["precision"] == "bf16-mixed":
            adds = [k for k in r["kernels"]
                    if "CUDAFunctor_add" in k["name"] and "elementwise_kernel<128, 4" in k["name"]]
            ms = sum(k["us_per_iter"] for k in adds) / 1e3
            calls = sum(k["calls_per_iter"] for k in adds)
            return (f"VGG-16 b{r['batch']} bf16 inference (H100): broadcast adds {calls:.0f} calls, {ms:.2f} of "
                    f"{r['kernel_sum_ms']:.2f} ms ({100 * ms / r['kernel_sum_ms']:.0f} %)")
    return "VGG-16 kernel profile not found"


def layout_transform_shares(name: str) -> str:
    """cuDNN's NCHW<->NHWC transposes around tensor-core convolutions, as a share of each profiled step."""
    shares = []
    for r in _kernel_records(name):
        us = sum(k["us_per_iter"] for k in r["kernels"] if "nchwToNhwc" in k["name"] or "nhwcToNchw" in k["name"])
        shares.append(f"{r['model']} {r['mode']} {r['precision']} {100 * us / 1e3 / r['kernel_sum_ms']:.1f} %")
    return f"cuDNN layout transposes, share of kernel time per step ({name}): " + "; ".join(shares)


def by_op_leaders(top: int = 3) -> str:
    """The ATen ops and input shapes that took the most device time per step (kernel_profile --by-op)."""
    lines = []
    for r in _kernel_records("H100-SXM-by-op"):
        leaders = ", ".join(f"{o['op']} {o['shapes']} {o['us_per_iter'] / 1e3:.2f} ms" for o in r["ops"][:top])
        lines.append(f"  {r['model']} b{r['batch']} {r['mode']} {r['precision']} "
                     f"({r['kernel_sum_ms']:.2f} ms per step): {leaders}")
    return "largest ops by input shape (H100-SXM-by-op):\n" + "\n".join(lines)


def index_put_chains(rows: dict[str, dict]) -> str:
    """Accumulating index_put's time per dependent update (ACCUMULATE_UPDATE_S in
    gpuest/price/device_time.py): per element size, the least-squares slope of time over the balanced
    run length minus one (suite benchmarks index_put_acc_*, every target row hit indices / rows times)."""
    out = []
    for mode in ("fp32", "bf16"):
        pts = []
        for name, row in rows.items():
            m = re.fullmatch(rf"index_put_acc_{mode}_t(\d+)_n(\d+)_w(\d+)", name)
            if m:
                t, n = int(m.group(1)), int(m.group(2))
                pts.append((math.ceil(n / t) - 1, _us(row)))
        if len(pts) < 2:
            continue
        mx = statistics.mean(p[0] for p in pts)
        my = statistics.mean(p[1] for p in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        out.append(f"{mode} {slope:.3f} us/update (n={len(pts)}, {my - slope * mx:.0f} us at no duplicate)")
    return "accumulating index_put per dependent update: " + ("; ".join(out) or "no data")


TINY_OPS = ("aten::add", "aten::mul", "aten::pow", "aten::rsqrt", "aten::neg")


def queued_kernel_gap(gpu: str, rows: dict[str, dict]) -> str:
    """What the device adds between back-to-back kernels: the `events_queued` time per tiny kernel
    (latency_add_1elem, which the profile's kernel_latency_s is a median of) against the profiler
    durations of the tiny elementwise kernels of batch-1 decode steps (data/generation/<GPU>-per-op.jsonl),
    which device-busy time (the union of kernel intervals) counts without that gap."""
    path = REPO / "data" / "generation" / f"{gpu}-per-op.jsonl"
    if not path.exists() or "latency_add_1elem" not in rows:
        return "queued kernel gap: no data"
    durations = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("status") == "ok" and r.get("batch") == 1 and r.get("per_op"):
            durations += [op[1] for op in r["per_op"]["ops"] if op[0] in TINY_OPS and 0 < op[1] < 5]
    if not durations:
        return "queued kernel gap: no batch-1 per-op rows"
    queued, duration = _us(rows["latency_add_1elem"]), statistics.median(durations)
    return (f"tiny kernel: {queued:.2f} us queued (latency_add_1elem), {duration:.2f} us profiled duration "
            f"(median of {len(durations)} batch-1 decode add/mul/pow/rsqrt/neg), gap {queued - duration:.2f} us")


def strided_operands(gpu: str, rows: dict[str, dict]) -> str:
    """Ops on strided views (suite._strided_operands) in output elements per SM per cycle at the max clock,
    and in bandwidth: TensorIterator's non-vectorised loop and cat's strided batched kernel run at an
    element rate, so 16-bit ones take about the time of fp32 ones. Also the fastest of the permuted
    single-op benchmarks, the ceiling such a loop has shown."""
    from gpuest.catalog import get_gpu
    from gpuest.price.features import MODE_ELEMENT_BYTES
    spec = get_gpu(gpu)
    per_cycle = spec.sm_count * spec.max_clock_mhz * 1e6

    def rate(elements: float, row: dict) -> float:
        return elements / (row["time_ms_median"] * 1e-3) / per_cycle
    out = []
    for family, pattern, share in (("chunk silu", r"ew_chunk_silu_(bf16|fp32)_r(\d+)_c(\d+)", 2),
                                   ("cat of strided halves", r"cat_strided_halves_(bf16|fp32)_b(\d+)_h(\d+)_s(\d+)_d(\d+)", 1)):
        for mode in ("bf16", "fp32"):
            rates, bws = [], []
            for name, r in rows.items():
                m = re.fullmatch(pattern, name)
                if m and m.group(1) == mode:
                    rates.append(rate(math.prod(int(v) for v in m.groups()[1:]) // share, r))
                    bws.append(_moved_bytes(r) / (r["time_ms_median"] * 1e-3) / 1e12)
            if rates:
                out.append(f"{family} {mode}: {statistics.median(rates):.2f} elements/SM/cycle, "
                           f"{statistics.median(bws):.2f} TB/s (n={len(rates)})")
    permuted = [(rate(n["bytes_written"] / MODE_ELEMENT_BYTES.get(n["math_mode"], 4.0), r), name)
                for name, r in rows.items() if len(r.get("nodes") or []) == 1
                for n in r["nodes"] if n.get("permuted")]
    if permuted:
        fastest, name = max(permuted)
        out.append(f"fastest of the {len(permuted)} permuted single-op benchmarks: {fastest:.2f} "
                   f"elements/SM/cycle ({name})")
    return "strided operands: " + ("; ".join(out) or "no data")


def _workspace_rows(kind: str) -> list[dict]:
    rows = []
    from gpuest.jsonl import read_jsonl
    for path in sorted((REPO / "data" / "memory").glob("workspace.*.jsonl*")):
        rows += [r for r in read_jsonl(path) if r.get("kind") == kind and "error" not in r]
    return rows


def conv_workspaces() -> str:
    """How much of cuDNN's per-call convolution workspace is the two transposed activations."""
    rows = _workspace_rows("conv")
    elem = {"fp32": 4, "bf16": 2, "fp16": 2}
    forward_out = {(json.dumps(r["input_shape"]), json.dumps(r["weight_shape"]), json.dumps(r["stride"]),
                    json.dumps(r["padding"]), r["groups"], r["dtype"], r["layout"]): r["output_bytes"]
                   for r in rows if r["direction"] == "forward"}
    out = []
    for layout in ("nchw", "nhwc"):
        big = total = 0
        near = 0
        for r in rows:
            if r["layout"] != layout:
                continue
            total += 1
            if r["workspace_bytes"] < (1 << 20):
                continue
            big += 1
            key = (json.dumps(r["input_shape"]), json.dumps(r["weight_shape"]), json.dumps(r["stride"]),
                   json.dumps(r["padding"]), r["groups"], r["dtype"], r["layout"])
            both = math.prod(r["input_shape"]) * elem[r["dtype"]] + forward_out[key]
            near += abs(r["workspace_bytes"] / both - 1.0) <= 0.1
        out.append(f"{layout}: {big} of {total} calls hold >= 1 MiB, {near} of them within 10 % of input + output bytes")
    return "cuDNN convolution workspace: " + ("; ".join(out) if rows else "no data")


def rnn_reserves() -> str:
    """cuDNN's RNN training reserve in elements of the compute dtype per layer x direction x step x batch x
    hidden unit, less one such element per layer but the last (gpuest.capture.fused_library_calls.
    RNN_RESERVE_ELEMENTS), batch >= 64. What the probe saw kept after a training forward, less the zero
    states nn.RNNBase made, the weight copy (bf16 weights, which cuDNN cannot flatten, or fp16 under
    autocast) and autocast's fp16 copy of the input."""
    rows = [r for r in _workspace_rows("rnn") if r["batch"] >= 64]
    gates = {"LSTM": 4, "GRU": 3}
    out = []
    for mode in ("LSTM", "GRU"):
        ratios = []
        for r in (r for r in rows if r["mode"] == mode):
            directions, layers = 2 if r["bidirectional"] else 1, r["layers"]
            elem = 4 if r["precision"] == "fp32" else 2
            unit = directions * r["seq"] * r["batch"] * r["hidden"]
            states = (2 if mode == "LSTM" else 1) * layers * directions * r["batch"] * r["hidden"]
            weights = sum(gates[mode] * r["hidden"] * ((r["hidden"] if layer == 0 else r["hidden"] * directions)
                                                       + r["hidden"] + 2) * directions for layer in range(layers))
            copied = weights if r["precision"] != "fp32" else 0
            cast = r["seq"] * r["batch"] * r["hidden"] if r["precision"] == "bf16-mixed" else 0
            reserve = r["train_saved_bytes"] / elem - states - copied - cast
            ratios.append((reserve - (layers - 1) * unit) / (layers * unit))
        if ratios:
            out.append(f"{mode} {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} calls)")
    return "cuDNN RNN reserve, elements per layer x direction x step x batch x hidden: " + ("; ".join(out) or "no data")


def bandwidth_scaling() -> str:
    """H100 -> H200 time ratios of the suite's memory-bound benchmarks (under 2 FLOP a byte, over 200 us on
    the H100) by the bandwidth they reach on the H100, against the catalogue's DRAM ratio and the ratio the
    transfer of a correction to another GPU prices (device_time.moved_correction: the time beyond the DRAM
    roofline keeps its length, the two GPUs holding as many threads)."""
    from gpuest.catalog import get_gpu

    h100, h200 = _rows("H100-SXM"), _rows("H200")
    bw100, bw200 = (get_gpu(g).memory_bandwidth_bytes_per_s / 1e12 for g in ("H100-SXM", "H200"))
    buckets: dict[tuple[float, float], list[tuple[float, float]]] = {
        (0.0, 1.0): [], (1.0, 2.0): [], (2.0, 2.7): [], (2.7, 9.9): []}
    compute: list[float] = []
    for name, a in h100.items():
        b = h200.get(name)
        if b is None or a.get("kind") != "device" or _us(a) < 200:
            continue
        intensity = sum(n.get("flops", 0.0) for n in a["nodes"]) / max(_moved_bytes(a), 1.0)
        if intensity > 300:
            compute.append(_us(a) / _us(b))
        if intensity > 2:
            continue
        achieved = _bandwidth_tb_s(a)
        dram_share = min(achieved / bw100, 1.0)
        priced = 1.0 / (dram_share * bw100 / bw200 + 1.0 - dram_share)
        for (lo, hi), got in buckets.items():
            if lo <= achieved < hi:
                got.append((_us(a) / _us(b), priced))
    parts = [f"{lo:g}-{hi:g} TB/s: {statistics.median(r for r, _ in got):.2f}x measured, "
             f"{statistics.median(p for _, p in got):.2f}x priced (n={len(got)})"
             for (lo, hi), got in buckets.items() if got]
    q1, _, q3 = statistics.quantiles(compute, n=4)
    return (f"H100 -> H200 speed-up of memory-bound suite ops by the H100's achieved bandwidth (DRAM "
            f"{bw200 / bw100:.2f}x): " + "; ".join(parts) + f"; compute-bound ops (over 300 FLOP a byte): "
            f"{statistics.median(compute):.2f}x (quartiles {q1:.2f}-{q3:.2f}, n={len(compute)})")


def fp32_prefill_gemms() -> str:
    """Share of the H100's fp32 peak its SIMT GEMMs reach: the prefill-sized ones (kept out of the fit,
    data/calibration/experiments/prefill_fp32.H100-SXM.jsonl) against the weight-gradient ones
    (shapes/matmul.json `weight_gradients`), which land at as many output tiles per SM."""
    from gpuest.calibrate.suite.shape_tables import shape_table
    from gpuest.catalog import get_gpu

    peak = get_gpu("H100-SXM").peak_flops_per_s("fp32")
    path = REPO / "data" / "calibration" / "experiments" / "prefill_fp32.H100-SXM.jsonl"
    prefill = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = _rows("H100-SXM")
    # The weight gradients whose output (M x N) fills at least a third of a wave of 128x128 tiles.
    grads = [rows[f"mm_fp32_m{m}_n{n}_k{k}"] for m, n, k in shape_table("matmul", "weight_gradients")
             if m * n >= 768 * 768]

    def share(rows: list[dict]) -> str:
        got = [2 * r["params"]["m"] * r["params"]["n"] * r["params"]["k"] / (r["time_ms_median"] * 1e-3) / peak
               for r in rows]
        return f"{min(got):.2f}-{max(got):.2f}, median {statistics.median(got):.2f} (n={len(got)})"
    return f"H100 fp32 GEMMs, share of peak: prefill-sized {share(prefill)}, weight gradients {share(grads)}"


def l2_warm_savings(gpu: str) -> str:
    """Per op of the L2 reuse probe (data/kernels/<gpu>-l2-reuse.jsonl, benchmarks/l2_reuse_probe.py): warm over
    cold time of tensors over 4 MB and at most L2_ABSORBED_SHARE of L2, and the share of a DRAM byte's time
    each warm byte saves (half the bytes of a ReLU or scalar multiply are its warm input)."""
    from gpuest.price.device_time import L2_ABSORBED_SHARE
    rows = _kernel_records(f"{gpu}-l2-reuse")
    by_op: dict[str, list[float]] = {}
    for r in rows:
        if "op" in r and 4 < r["tensor_mb"] <= L2_ABSORBED_SHARE * r["l2_mb"]:
            by_op.setdefault(r["op"], []).append(r["warm_over_cold"])
    return (f"{gpu} L2 reuse, warm over cold time (tensors over 4 MB, up to {L2_ABSORBED_SHARE:g} of L2) and "
            "the saving per warm byte: "
            + "; ".join(f"{op} {min(v):.2f}-{max(v):.2f}, {2 * (1 - statistics.mean(v)):.2f}"
                        for op, v in sorted(by_op.items()) if op != "add_self"))


def l2_warm_copy_savings(gpu: str) -> str:
    """The L2 reuse probe's copies (data/kernels/<gpu>-l2-reuse-copies.jsonl, `--ops cast,clone`): warm over cold
    time of inputs over 4 MB and at most L2_ABSORBED_SHARE of L2, and the share of a DRAM byte's time each
    warm byte saves (a cast's warm input is 1/3 of its bytes from bf16, 2/3 from fp32; a clone's half)."""
    from gpuest.price.device_time import L2_ABSORBED_SHARE
    rows = _kernel_records(f"{gpu}-l2-reuse-copies")
    warm_share = {("cast", "bfloat16"): 1 / 3, ("cast", "float32"): 2 / 3, ("clone", "bfloat16"): 0.5,
                  ("clone", "float32"): 0.5}
    by_op: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if 4 < r["tensor_mb"] <= L2_ABSORBED_SHARE * r["l2_mb"]:
            by_op.setdefault((r["op"], r["dtype"]), []).append(r["warm_over_cold"])
    return (f"{gpu} L2 reuse of copies, warm over cold time and the saving per warm byte: "
            + "; ".join(f"{op} from {dtype} {min(v):.2f}-{max(v):.2f}, "
                        f"{(1 - statistics.mean(v)) / warm_share[op, dtype]:.2f}"
                        for (op, dtype), v in sorted(by_op.items())))


# Bytes per element of the probe's math modes (tf32 runs on fp32 data).
_MODE_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


def _misaligned_gemm_rows(gpu: str) -> list[dict]:
    """Rows of both misaligned-GEMM probe series of `gpu` (the `row_bytes` one where measured)."""
    rows = _kernel_records(f"{gpu}-misaligned-gemms")
    extra = REPO / "data" / "kernels" / f"{gpu}-misaligned-gemms.row-bytes.jsonl"
    return rows + (_kernel_records(f"{gpu}-misaligned-gemms.row-bytes") if extra.exists() else [])


def misaligned_gemms(gpu: str) -> str:
    """The misaligned-GEMM probe (data/kernels/<gpu>-misaligned-gemms[.row-bytes].jsonl,
    benchmarks/misaligned_gemm_probe.py): per math mode and the alignment in bytes of the misaligned width's
    rows (the largest power of two up to 16 dividing out x element bytes), median and range of misaligned over
    aligned time; and the time per token of an odd token count (197, 4095, 16383) over that of the next even
    one, aligned widths: the tokens are M of the forward and the data gradient and K of the weight gradient,
    and no stored operand's rows run along them."""
    rows = _kernel_records(f"{gpu}-misaligned-gemms")
    by_class: dict[tuple[str, int], list[float]] = {}
    aligned = {(r["mode"], r["pass"], r["tokens"], r["out"]): r["aligned_us"] for r in rows}
    odd_tokens = []
    for r in _misaligned_gemm_rows(gpu):
        by_class.setdefault((r["mode"], math.gcd(r["out"] * _MODE_BYTES[r["mode"]], 16)), []).append(r["ratio"])
    for r in rows:
        if r["tokens"] % 2:   # against the next even token count measured, per token
            even = min(t for m, p, t, o in aligned if t > r["tokens"] and t % 2 == 0)
            odd_tokens.append(r["aligned_us"] / r["tokens"]
                         / (aligned[(r["mode"], r["pass"], even, r["out"])] / even))
    return (f"{gpu} misaligned GEMMs over aligned ones, by mode and row alignment: "
            + "; ".join(f"{mode} {align} B {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, n={len(v)})"
                        for (mode, align), v in sorted(by_class.items()))
            + f"; odd token counts over even ones {min(odd_tokens):.2f}-{max(odd_tokens):.2f} per token "
              f"(n={len(odd_tokens)})")


def misaligned_gemm_peak_shares() -> str:
    """The share of its mode's dense catalogue peak a misaligned GEMM of 4096 to 16384 tokens reaches, by kind
    (plain: the gradients' mm; bias: the forward's addmm with a bias vector), mode and row alignment in bytes,
    pooled over both GPUs' probe rows: MISALIGNED_GEMM_PEAK_SHARE (gpuest/price/features.py) holds these
    medians."""
    from gpuest.catalog import get_gpu
    shares: dict[tuple[str, str, int], list[float]] = {}
    for gpu in GPUS:
        spec = get_gpu(gpu)
        for r in _misaligned_gemm_rows(gpu):
            align = math.gcd(r["out"] * _MODE_BYTES[r["mode"]], 16)
            if r["tokens"] >= 4095 and align < 16:
                flops = 2.0 * r["tokens"] * r["in"] * r["out"]
                kind = "bias" if r["pass"] == "forward" else "plain"
                shares.setdefault((kind, r["mode"], align), []).append(
                    flops / (r["misaligned_us"] * 1e-6) / spec.peak_flops_per_s(r["mode"]))
    return ("misaligned GEMMs' share of the dense peak, 4096-16384 tokens, H100 and H200: "
            + "; ".join(f"{kind} {mode} {align} B {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f}, n={len(v)})"
                        for (kind, mode, align), v in sorted(shares.items())))


def gemm_layouts(gpu: str) -> str:
    """The GEMM layout probe (data/kernels/<gpu>-gemm-layouts.jsonl, benchmarks/gemm_layout_probe.py): per math
    mode and operand layout, the time over that of the data-gradient layout (one operand, B, N-major: the
    layout the suite times every mm and bmm in) on the same (M, N, K), median and range; listed by the output
    tiles' fill of their waves (features.wave_busy_share of GEMM_TILE-wide tiles), since a kernel without
    stream-K scheduling loses the idle SMs of a partial last wave."""
    from gpuest.catalog import get_gpu
    from gpuest.price.features import GEMM_TILE, wave_busy_share
    path = REPO / "data" / "kernels" / f"{gpu}-gemm-layouts.jsonl"
    if not path.exists():
        return f"{gpu} GEMM layouts: not measured"
    sms = get_gpu(gpu).sm_count
    rows = _kernel_records(f"{gpu}-gemm-layouts")
    base = {(r["mode"], r["m"], r["n"], r["k"]): r["us"] for r in rows if r["layout"] == "data_grad"}
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        fill = wave_busy_share(math.ceil(r["m"] / GEMM_TILE) * math.ceil(r["n"] / GEMM_TILE), sms)
        band = "fill >= 0.9" if fill >= 0.9 else f"fill {fill:.2f}"
        ratios.setdefault((r["mode"], r["layout"], band), []).append(r["us"] / base[r["mode"], r["m"], r["n"], r["k"]])
    return (f"{gpu} GEMM layouts, time over the data-gradient layout's: "
            + "; ".join(f"{mode} {layout} {band} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, n={len(v)})"
                        for (mode, layout, band), v in sorted(ratios.items()) if layout != "data_grad"))


def main() -> None:
    for gpu in GPUS:
        rows = _rows(gpu)
        print(f"== {gpu}")
        for line in (causal_pairs(gpu, rows), copies(rows), permuted_reads(gpu, rows), broadcast_loops(gpu, rows),
                     nhwc_depthwise(rows),
                     mixed_add(rows),
                     odd_rows(rows), reductions(gpu, rows), layer_norm_weight_gradients(rows),
                     permuted_elementwise(rows), write_heavy_casts(rows), rnn_gaps(rows), rgb_stems(rows),
                     pointwise_planes(gpu, rows), embedding_lookups(rows), bilinear_upsampling(rows),
                     rnn_step_times(rows), index_put_chains(rows), queued_kernel_gap(gpu, rows),
                     strided_operands(gpu, rows), channel_scales(rows), grouped_gemms(rows), tiny_inner_gemms(rows),
                     mask_adds(rows), nhwc_eval_batch_norms(rows), fp16_depthwise(rows), branch_sums(rows),
                     dilated_depthwise(rows), expanded_divides(rows), gathers_last_dim(rows),
                     foreach_walks(gpu, rows)):
            print("  " + line)
    print(bandwidth_scaling())
    print(misaligned_gemm_peak_shares())
    print(foreach_walk_probe("H200"))
    print(plane_walk_probe("H200"))
    print(fold_probe("H200"))
    print(grouped_conv_probe("H200"))
    print(power_curve("H200"))
    print(power_sustained("H200"))
    print(kernel_gaps("H200"))
    print(grouped_conv_sweep("H200"))
    print(batch_norm_scaling("H200"))
    print(sort_topk_launches("H200"))
    print(batch_norm_channels("H200"))
    print(fp32_prefill_gemms())
    print(persistent_rnn_steps())
    print(per_step_rnn_gemms())
    print(vgg_bias_share())
    print(layout_transform_shares("H100-SXM-training"))
    print(layout_transform_shares("H100-SXM-inference"))
    print(by_op_leaders())
    print(moe_grouped_gemm_step())
    print(per_op_totals())
    print(conv_workspaces())
    print(rnn_reserves())
    for gpu in GPUS:
        print(l2_warm_savings(gpu))
    print(l2_warm_copy_savings("H200"))
    for gpu in GPUS:
        print(misaligned_gemms(gpu))
    for gpu in GPUS:
        print(gemm_layouts(gpu))


if __name__ == "__main__":
    main()
