"""`gpuest` command line: graph, estimate, compare, sweep, memory, generate, host-probe, gpus, calibrate, fit,
validate, report, export, plot."""
from __future__ import annotations

import argparse
import functools
import json
import sys
import warnings
from typing import Any, Callable, Sequence

from .capture.generation import CACHES
from .errors import GpuestError
from .price.generation import GENERATION_OBJECTIVES
from .price.host_timeline import LAUNCHES
from .price.sweep import OBJECTIVES

MODEL_HELP = ("torchvision name (resnet50), timm:NAME, hf:gpt2|bert-base-uncased|llama|llama-3b|qwen2-0.5b, lstm, gru, "
              "or path/to/file.py:factory")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--seq", type=int, default=None, help="sequence length for text models")
    p.add_argument("--image-size", type=int, default=None, help="input resolution for vision models")
    p.add_argument("--train", action="store_true", help="a full training step (forward, backward, AdamW)")
    p.add_argument("--channels-last", action="store_true",
                   help="4-D weights and inputs in NHWC, as model.to(memory_format=torch.channels_last) does")
    p.add_argument("--precision", default="fp32", help="fp32 | bf16-mixed | fp16-mixed | bf16 | fp16")
    p.add_argument("--optimizer", default="adamw",
                   help="adamw | sgd (foreach, as torch >= 2.0 runs them) | adamw-forloop | sgd-forloop (one launch "
                        "per parameter and op: foreach=False, torch < 2.0's default); training only")
    _routing_arg(p)


def _routing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--routing", default="balanced",
                   help="mixture-of-experts routing: balanced (default) | skewed:H (the hottest expert's share H "
                        "of the routed slots) | f1,f2,... (one share per expert, summing to 1)")


def _graph(args: argparse.Namespace):
    from .capture.models import load_model
    from .capture.trace import trace
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    loaded = load_model(args.model, batch=args.batch, seq=args.seq, image_size=args.image_size,
                        memory_format=_memory_format(args))
    return trace(loaded.model, loaded.example_inputs, mode="training" if args.train else "inference",
                 precision=args.precision, optimizer=args.optimizer, name=loaded.name, batch=loaded.batch,
                 routing=getattr(args, "routing", "balanced"))


def _memory_format(args: argparse.Namespace) -> str:
    return "channels_last" if args.channels_last else "contiguous"


def _parse_range(text: str) -> list[float]:
    """'100:300:25' -> [100, 125, ..., 300]; '100,150' -> [100, 150]."""
    if ":" in text:
        parts = [float(v) for v in text.split(":")]
        if len(parts) != 3 or parts[2] <= 0:
            raise ValueError(f"range {text!r} must be START:STOP:STEP with STEP > 0")
        start, stop, step = parts
        n = int(round((stop - start) / step)) + 1
        return [start + i * step for i in range(max(n, 0))]
    return [float(v) for v in text.split(",") if v]


# ------------------------------------------------------------------------------------------ commands

def cmd_graph(args: argparse.Namespace) -> int:
    from .report.graph_summary import graph_summary
    g = _graph(args)
    print(graph_summary(g))
    if args.output:
        from .report.export import export
        export(g, args.output)
        print(f"wrote {args.output}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from .price.estimate import estimate_graph
    est = estimate_graph(_graph(args), args.gpu, args.clock, launch=args.launch, power_limit=args.power_limit,
                         profile=args.profile, host_scale=args.host_scale)
    if args.json:
        data = est.to_dict()
        if not args.per_node:
            data.pop("per_node")
        print(json.dumps(data, indent=1, default=str))
    else:
        print(est)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .price.sweep import compare
    prices = dict(kv.split("=") for kv in args.price_per_hour.split(",")) if args.price_per_hour else None
    gpus = args.gpus.split(",") if args.gpus else None
    df = compare(_graph(args), gpus, args.clock, by=args.by, price_per_hour=prices, launch=args.launch)
    print(df.to_json(orient="records", indent=1) if args.json else df.to_string(index=False))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from .price.sweep import best_setting, sweep
    if args.max_slowdown is not None and args.optimal is None:
        raise ValueError("--max-slowdown bounds the --optimal choice; give --optimal energy|edp|time too")
    clocks = _parse_range(args.clocks) if args.clocks else None
    limits = _parse_range(args.power_limits) if args.power_limits else None
    df = sweep(_graph(args), args.gpu, clocks, limits, launch=args.launch)
    if args.optimal is None:
        print(df.to_json(orient="records", indent=1) if args.json else df.to_string(index=False))
    else:
        best = best_setting(df, args.optimal, args.max_slowdown)
        if args.json:
            print(json.dumps({"settings": df.to_dict(orient="records"), "optimal": best.to_dict(),
                              "objective": args.optimal, "max_slowdown": args.max_slowdown}, indent=1, default=float))
        else:
            print(df.to_string(index=False))
            within = "" if args.max_slowdown is None else f" within {100 * args.max_slowdown:g} % of the fastest"
            setting = (f"SM clock {best['clock_mhz']:.0f} MHz" if best["setting"] == "clock"
                       else f"power limit {best['power_limit_w']:.0f} W")
            print(f"\nlowest {args.optimal}{within}: {setting}: {1e3 * best['time_s']:.3f} ms, {best['energy_j']:.4g} J, "
                  f"{best['avg_power_w']:.0f} W average, EDP {best['edp_js']:.4g} J s")
    if args.plot:
        from .report.plots import sweep_plot
        sweep_plot(df, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    from .catalog import get_gpu
    from .price.memory import max_batch, memory_estimate
    from .report.text import table
    gpu = get_gpu(args.gpu)  # an unknown name fails here, before any tracing
    mem = memory_estimate(_graph(args), gpu)
    data: dict[str, Any] = {"model": args.model, "gpu": gpu.name, "mode": "training" if args.train else "inference",
                            "precision": args.precision, "batch": args.batch, "peak_memory_bytes": mem.peak_bytes,
                            "peak_reserved_bytes": mem.peak_reserved_bytes, "capacity_bytes": mem.capacity_bytes,
                            "fits": mem.fits, "memory_breakdown": mem.breakdown_bytes}
    if args.max_batch:
        found = max_batch(args.model, gpu, mode=data["mode"], precision=args.precision, optimizer=args.optimizer,
                          seq=args.seq, image_size=args.image_size, memory_format=_memory_format(args))
        data.update(max_batch=found.batch, max_batch_limited=found.limited,
                    max_batch_peak_bytes=found.memory.peak_bytes if found.memory else None)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    gb = lambda b: f"{b / 1e9:.3f} GB"  # noqa: E731
    print(f"gpuest memory: {args.model} [{data['mode']}, {args.precision}, batch {args.batch}] on {gpu.name}")
    rows = [[k, gb(v), f"{100 * v / max(mem.peak_bytes, 1):.1f}%"] for k, v in mem.breakdown_bytes.items()]
    print(table(rows + [["peak allocated", gb(mem.peak_bytes), "100.0%"]], ["at the peak", "bytes", "share"]))
    print(f"peak reserved {gb(mem.peak_reserved_bytes)}; usable on {gpu.name} {gb(mem.capacity_bytes)}: "
          + ("fits" if mem.fits else "DOES NOT FIT (out of memory)"))
    if args.max_batch:
        more = " (search limit reached)" if data["max_batch_limited"] else ""
        print(f"largest batch that fits: {data['max_batch']}{more}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .price.generation import compare_generation, price_generation, trace_generation
    graphs = trace_generation(args.model, batch=args.batch, prompt_tokens=args.prompt, new_tokens=args.new_tokens,
                              precision=args.precision, cache=args.cache, routing=args.routing)
    est = price_generation(graphs, args.gpu, args.clock, launch=args.launch, power_limit=args.power_limit,
                           profile=args.profile, host_scale=args.host_scale)
    print(json.dumps(est.to_dict(), indent=1, default=str) if args.json else est)
    if args.compare:
        gpus = [args.gpu] + [g for g in args.compare.split(",") if g]
        df = compare_generation(graphs, gpus, args.clock, by=args.by, launch=args.launch, profile=args.profile,
                                host_scale=args.host_scale)
        print(df.to_json(orient="records", indent=1) if args.json else "\n" + df.to_string(index=False))
    return 0


def cmd_host_probe(args: argparse.Namespace) -> int:
    from pathlib import Path
    from .calibrate.fit_host_scale import probe_host_scale
    from .errors import HostProbeError
    if args.from_file:
        try:
            record = json.loads(Path(args.from_file).read_text())
        except json.JSONDecodeError as exc:
            raise HostProbeError(f"{args.from_file} is not JSON ({exc}); accepted: a record of "
                                 "`gpuest host-probe -o`") from exc
    else:
        import torch
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}; accepted: 1 or more")
        if not torch.cuda.is_available():
            raise HostProbeError("gpuest host-probe times small steps on this machine's GPU, and "
                                 "torch.cuda.is_available() is False; accepted: run it where the GPU is, or "
                                 "price a saved record with --from FILE")
        from .calibrate.host_probe import HostProbe
        probe = HostProbe("cuda")
        # a host's speed drifts over seconds to minutes: one record of every repeat's steps, averaged
        records = [probe.measure() for _ in range(args.repeats)]
        record = dict(records[0], steps=[step for r in records for step in r["steps"]])
        if args.output:
            Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    scale = probe_host_scale(record, args.gpu, args.profile)
    print(json.dumps({"gpu": scale.gpu, "host_scale": scale.host_scale}) if args.json else scale)
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from .catalog import list_gpus
    from .catalog.chips import full_load_power_w
    from .profile import shipped_profiles
    calibrated = shipped_profiles()
    rows = [[g.name, g.architecture, g.chip or "-", str(g.sm_count), f"{g.max_clock_mhz:.0f}", f"{g.memory_gb:g}",
             f"{g.memory_bandwidth_gb_s:.0f}", f"{g.peak_tflops.get('bf16') or '-'}",
             f"{g.peak_tflops.get('fp32')}", f"{g.tdp_w:.0f}", f"{full_load_power_w(g):.0f}",
             "yes" if g.name in calibrated else "-"]
            for g in list_gpus()]
    from .report.text import table
    print(table(rows, ["gpu", "arch", "chip", "SMs", "boost MHz", "mem GB", "GB/s", "bf16 TFLOPS", "fp32 TFLOPS",
                       "TDP W", "full load W", "calibrated"]))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from gpuest.calibrate.runner import main as runner_main
    return runner_main(args.argv, prog="gpuest calibrate")


def cmd_fit(args: argparse.Namespace) -> int:
    from gpuest.calibrate.fit import main as fit_main
    return fit_main([args.raw, "-o", args.out] + (["--validation", *args.validation] if args.validation else [])
                    + (["--stored-nodes"] if args.stored_nodes else []) + ["--shape-prior", args.shape_prior])


def cmd_import_kernels(args: argparse.Namespace) -> int:
    from gpuest.calibrate.import_kernels import main as import_main
    return import_main([args.src, "-o", args.out] + (["--per-op", str(args.per_op)] if args.per_op else [])
                       + (["--seed", str(args.seed)] if args.seed is not None else []))


def cmd_validate(args: argparse.Namespace) -> int:
    from gpuest.calibrate.validate import main as validate_main
    return validate_main(args.rest)


def cmd_report(args: argparse.Namespace) -> int:
    from .report.accuracy import main as report_main
    return report_main(args.rest)


def cmd_export(args: argparse.Namespace) -> int:
    from .price.estimate import estimate_graph
    from .report.export import export
    est = estimate_graph(_graph(args), args.gpu, args.clock, launch=args.launch)
    export(est, args.output)
    print(f"wrote {args.output}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .price.estimate import estimate_graph
    from .report.plots import roofline_plot
    if args.kind != "roofline":
        raise ValueError(f"unknown plot {args.kind!r}; accepted: roofline")
    est = estimate_graph(_graph(args), args.gpu, args.clock, launch=args.launch)
    roofline_plot(est, args.output)
    print(f"wrote {args.output}")
    return 0


# ------------------------------------------------------------------------------------------ parser

def _add_subcommand(sub: Any, name: str, fn: Callable[[argparse.Namespace], int], help_: str,
                    model: bool = True, gpu: bool = False, add_help: bool = True) -> argparse.ArgumentParser:
    """The subcommand's parser, with the model arguments and/or the GPU, clock and launch arguments."""
    p = sub.add_parser(name, help=help_, description=help_, add_help=add_help)
    if model:
        _add_model_args(p)
    if gpu:
        p.add_argument("--gpu", required=True, help="GPU name from `gpuest gpus` (e.g. A100, H100, T4)")
        p.add_argument("--clock", type=float, default=None, help="SM clock in MHz (default: max boost)")
        p.add_argument("--launch", default="eager", choices=LAUNCHES,
                       help="eager (per-op host dispatch) or graph (CUDA graphs / compiled)")
    p.set_defaults(func=fn)
    return p


def _estimate_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest estimate`'s own arguments."""
    p.add_argument("--power-limit", type=float, default=None, help="board power limit in W (default TDP)")
    p.add_argument("--profile", default=None, help="profile JSON, 'prior' or 'roofline' (default: automatic)")
    _host_scale_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--per-node", action="store_true", help="include per-node rows in --json output")


def _host_scale_arg(p: argparse.ArgumentParser) -> None:
    """Adds --host-scale (estimate, generate)."""
    p.add_argument("--host-scale", type=float, default=1.0,
                   help="scale host dispatch costs (slower CPU > 1; `gpuest host-probe` measures it)")


def _compare_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest compare`'s own arguments."""
    p.add_argument("--gpus", default=None, help="comma-separated GPU names (default: the whole catalogue)")
    p.add_argument("--clock", type=float, default=None, help="SM clock in MHz, clamped to each GPU's range")
    p.add_argument("--by", default="time", choices=list(OBJECTIVES))
    p.add_argument("--price-per-hour", default=None, help="e.g. H100=2.5,A100=1.2 adds cost per step")
    p.add_argument("--launch", default="eager", choices=LAUNCHES)
    p.add_argument("--json", action="store_true")


def _sweep_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest sweep`'s own arguments."""
    p.add_argument("--gpu", required=True)
    p.add_argument("--clocks", default=None, help="MHz: START:STOP:STEP or a comma list")
    p.add_argument("--power-limits", default=None, help="W: START:STOP:STEP or a comma list")
    p.add_argument("--launch", default="eager", choices=LAUNCHES)
    p.add_argument("--plot", default=None, help="write a PNG of time and energy against the setting")
    p.add_argument("--optimal", default=None, choices=list(OBJECTIVES),
                   help="also name the swept setting with the lowest energy, EDP or time")
    p.add_argument("--max-slowdown", type=float, default=None,
                   help="with --optimal: only settings at most this fraction slower than the fastest (0.1 = 10 %%)")
    p.add_argument("--json", action="store_true")


def _memory_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest memory`'s own arguments."""
    p.add_argument("--gpu", required=True, help="GPU name from `gpuest gpus` (e.g. L4, A100-SXM4-40GB)")
    p.add_argument("--max-batch", action="store_true", help="also find the largest batch that fits (traces several)")
    p.add_argument("--json", action="store_true")


def _generate_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest generate`'s own arguments (its model is a decoder LM, not the common model arguments)."""
    p.add_argument("model", help="a decoder LM: hf:gpt2|llama|llama-3b|qwen2-0.5b or an hf config .json")
    p.add_argument("--batch", type=int, default=1, help="sequences generated together (default 1)")
    p.add_argument("--prompt", type=int, required=True, help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=int, required=True, help="tokens generated per sequence")
    p.add_argument("--precision", default="bf16", help="weights and KV cache: bf16 | fp16 | fp32 (default bf16)")
    p.add_argument("--cache", default="dynamic", choices=CACHES, help="transformers KV cache kind")
    _routing_arg(p)
    p.add_argument("--power-limit", type=float, default=None, help="board power limit in W (default TDP)")
    p.add_argument("--profile", default=None, help="profile JSON, 'prior' or 'roofline' (default: automatic)")
    _host_scale_arg(p)
    p.add_argument("--compare", default=None, help="also rank these comma-separated GPUs (with --gpu)")
    p.add_argument("--by", default="tokens_per_s", choices=list(GENERATION_OBJECTIVES),
                   help="ranking of --compare (default tokens_per_s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _host_probe_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest host-probe`'s own arguments."""
    p.add_argument("--gpu", required=True, help="the GPU whose profile the scale is for (the one you will price)")
    p.add_argument("-o", "--output", default=None, help="also save the measured probe record (JSON)")
    p.add_argument("--from", dest="from_file", default=None, help="price a saved probe record instead of measuring")
    p.add_argument("--repeats", type=int, default=5, help="probes taken one after another, averaged (default 5)")
    p.add_argument("--profile", default=None, help="profile JSON the scale is for (default: the GPU's, as estimate)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _fit_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest fit`'s own arguments."""
    p.add_argument("raw")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--validation", nargs="+", default=None,
                   help="validation JSONL files of the same GPU (host-side calibration)")
    p.add_argument("--stored-nodes", action="store_true",
                   help="use the nodes stored at measurement time instead of re-tracing the benchmarks")
    p.add_argument("--shape-prior", default="auto", metavar="GPU|auto|none",
                   help="shipped profile whose fits a partial calibration corrects in level (default auto: the "
                        "nearest other calibrated GPU when the rows measured less than the whole suite: "
                        "gpuest.calibrate.fit.PARTIAL_SUITE_SHARE)")


def _import_kernels_args(p: argparse.ArgumentParser) -> None:
    """Adds `gpuest import-kernels`'s own arguments."""
    p.add_argument("src", help="one GPU's folder of <op>.csv.gz files")
    p.add_argument("-o", "--out", required=True, help="e.g. data/calibration/external/T4.jsonl.gz (gzipped by its name)")
    p.add_argument("--per-op", type=int, default=None, help="rows kept per op file (default: per-op quotas)")
    p.add_argument("--seed", type=int, default=None, help="seed of the deterministic sub-sample")


def _add_plot(sub: Any) -> None:
    """Adds `gpuest plot`, whose usage lists its plot kind before the model arguments."""
    p = sub.add_parser("plot", help="plots of an estimate")
    p.add_argument("kind", choices=["roofline"])
    _add_model_args(p)
    p.add_argument("--gpu", required=True)
    p.add_argument("--clock", type=float, default=None)
    p.add_argument("--launch", default="eager", choices=LAUNCHES)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_plot)


def build_parser() -> argparse.ArgumentParser:
    """The `gpuest` parser: one subcommand per cmd_* function, in the order `gpuest --help` lists them."""
    parser = argparse.ArgumentParser(prog="gpuest", description="Predict PyTorch time, power and energy on "
                                     "NVIDIA GPUs without running there.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = functools.partial(_add_subcommand, sub)
    p = add("graph", cmd_graph, "trace a model and summarise its annotated ATen graph")
    p.add_argument("-o", "--output", help="write the graph (.graphml, .json, .dot, .csv)")
    _estimate_args(add("estimate", cmd_estimate, "predict time, power and energy of one step on a GPU", gpu=True))
    _compare_args(add("compare", cmd_compare, "rank GPUs by time, energy or EDP for one model"))
    _sweep_args(add("sweep", cmd_sweep, "sweep SM clocks and/or power limits on one GPU", gpu=False))
    _memory_args(add("memory", cmd_memory, "predict peak memory of one step on a GPU, whether it fits, the largest "
                     "batch"))
    _generate_args(add("generate", cmd_generate, "predict a greedy generate() call of a decoder LM: TTFT, time per "
                       "token, tokens/s and energy per token", model=False, gpu=True))
    _host_probe_args(add("host-probe", cmd_host_probe, "measure this host's dispatch speed against a GPU's "
                         "profile: the --host-scale to price this machine's host with", model=False))
    add("gpus", cmd_gpus, "list the GPU catalogue", model=False)
    add("calibrate", cmd_calibrate, "measure this machine's GPU (micro-benchmarks + NVML; options: gpuest "
        "calibrate -h)", model=False, add_help=False)
    _fit_args(add("fit", cmd_fit, "fit a profile from raw calibration rows", model=False))
    _import_kernels_args(add("import-kernels", cmd_import_kernels, "import public per-kernel timings of one GPU "
                             "(NeuSight's <op>.csv.gz folder) as calibration rows", model=False))
    p = add("validate", cmd_validate, "measure real runs on this GPU (see --help of gpuest.calibrate.validate)",
            model=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = add("report", cmd_report, "accuracy report from validation results", model=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = add("export", cmd_export, "export an estimate (.graphml .json .dot .csv .trace.json .html)", gpu=True)
    p.add_argument("-o", "--output", required=True)
    _add_plot(sub)
    return parser


# Subcommands whose words their module's own parser reads (one declaration of each option).
FORWARDED = ("calibrate",)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(argv if argv is not None else sys.argv[1:])
    parser = build_parser()
    args = parser.parse_known_args(words)[0] if words[:1] and words[0] in FORWARDED else parser.parse_args(words)
    args.argv = words[1:]   # the subcommand's own words
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return args.func(args)
    except (GpuestError, ValueError, FileNotFoundError) as exc:
        print(f"gpuest {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
