"""Measure real runs of the validation set on a GPU, one JSONL row per config.

    python3 -m gpuest.calibrate.validate --set quick --out results/h100-quick.jsonl [--resume]
    python3 -m gpuest.calibrate.validate --models resnet50,hf:gpt2 --batch 1,64 --modes inference,training \
        --precision fp32,bf16-mixed --out results.jsonl
    python3 -m gpuest.calibrate.validate --dry-run          # 2 tiny configs on the CPU (no CUDA, no NVML)
    python3 -m gpuest.calibrate.validate --set quick --list # print the configs and the estimated duration

Each config runs the step `gpuest.capture.trace.trace` defines, eagerly:
  inference: model.eval(), torch.no_grad(), forward
  training:  model.train(), forward (+ default loss) under torch.autocast for *-mixed, loss.backward(),
             AdamW(foreach=True).step(), grads set to None
and measures (a) wall time per iteration (CUDA events around each iteration, synchronised after each:
one iteration from an idle GPU until host and device are done; median), (b) device-busy time per
iteration (torch.profiler: union of GPU kernel/memcpy/memset intervals / iterations), (c) energy per
iteration and average power over a >= window_s window of synchronised iterations (NVML energy
counter via `gpuest.calibrate.nvml_monitor.PowerMonitor`), with SM clock, temperature and throttle
reasons, and (d) provenance. Optionally (per_op) the top-level ATen ops of one profiled iteration
with their device time, for per-op comparison in the accuracy report.

Failures (OOM, unsupported dtype, ...) are recorded in the row's `error` and the run continues.
A CUDA error that poisons the context (illegal address, device-side assert) stops the run with exit
code 3: rerun the same command (resume is on by default) to continue with the next config. A config
that killed the process is recorded as an error on the next resume and not retried.

Nothing here changes clocks, power limits or any other GPU setting.

This module holds the loop over configs, the rows and resume logic, and the command line; the measuring
is in validate_measure (one config: step, timing, energy, routing), validate_profile (device-busy and
per-op times from torch.profiler) and validate_context (device, power monitor, provenance).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..evaluate.validation_set import (MODES, PRECISIONS, SETS, ValidationConfig, estimated_duration_s,
                                       explicit_configs, get_set, with_per_op)
# The measuring code lives in three modules; its names stay importable from here, where other modules,
# tests and older scripts import them.
from .timing import is_device_work, is_gpu_event, union_length  # noqa: F401
from .validate_context import (RunContext, _canonical_gpu, _git_commit, _make_monitor, _version,  # noqa: F401
                               collect_provenance, free_memory, run_provenance)
from .validate_measure import (ENERGY_MIN_ITERS, MAX_ROUTED_EXPERTS, PROFILE_ITERS_FAST,  # noqa: F401
                               PROFILE_ITERS_SLOW, PROFILE_SLOW_S, TIMING_MAX_ITERS, TIMING_MIN_ITERS,
                               TIMING_TARGET_S, WARMUP_MIN_ITERS, WARMUP_MIN_S, _percentile, _precision,
                               _RoutingCounts, _Timer, make_step, measure_config, measure_energy,
                               routing_counts)
from .validate_profile import (DEVICE_BUSY_SOURCE, _evt_device_us, _is_aten, _iteration_work,  # noqa: F401
                               _top_level_aten, profile_iterations)

ROW_SCHEMA = "gpuest.validation/1"
FATAL_CUDA_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                      "misaligned address", "illegal instruction", "uncorrectable ecc", "cuda error: an illegal")
DRY_RUN_OUT = Path("/tmp/gpuest-validate-dryrun.jsonl")

MeasureFn = Callable[[ValidationConfig, "RunContext"], dict]


class FatalCudaError(RuntimeError):
    """The CUDA context is unusable; the process must restart (resume continues after this config)."""


# ================================================================== rows, resume, the loop

def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a results file; a torn last line (killed mid-write) is ignored."""
    rows = []
    if not path.exists():
        return rows
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _append(path: Path, row: dict[str, Any]) -> None:
    lead = ""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:  # a torn last line (killed mid-write) must not swallow this row
            f.seek(-1, os.SEEK_END)
            lead = "" if f.read(1) == b"\n" else "\n"
    with path.open("a") as f:
        f.write(lead + json.dumps(row, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _inflight_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".inflight")


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc).lower()
    return not _is_oom(exc) and any(m in text for m in FATAL_CUDA_MARKERS)


def _base_row(cfg: ValidationConfig, ctx: RunContext | None, gpu: str, set_name: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"schema": ROW_SCHEMA, **cfg.as_dict(), "set": set_name, "gpu": gpu}
    if ctx is not None:
        row.update(gpu_canonical=ctx.gpu_canonical, dry_run=ctx.dry_run, provenance=ctx.provenance)
    row["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return row


def run_validation(configs: list[ValidationConfig], out_path: str | Path, *, resume: bool = True,
                   window_s: float = 2.0, per_op: bool | Iterable[str] = False, dry_run: bool = False,
                   device_index: int = 0, measure: MeasureFn | None = None, context: RunContext | None = None,
                   retry_errors: bool = False, set_name: str | None = None,
                   log: Callable[[str], None] | None = print) -> Path:
    """Measure `configs`, appending one JSONL row per config to `out_path` as each completes.

    resume: skip configs that already have a row for this GPU in `out_path` (errored ones too, unless
        retry_errors). Without resume every config is measured again and new rows are appended (the
        report uses the last row of a config).
    per_op: True (all configs), False (each config's own `per_op` flag) or a collection of model
        specs / config keys whose per-op device times are recorded.
    measure / context: injectable for tests (default: `measure_config` on a real `RunContext`).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    configs = with_per_op(configs, per_op)
    ctx = context if context is not None else RunContext(dry_run=dry_run, device_index=device_index,
                                                         window_s=window_s)
    measure = measure or measure_config
    gpu = ctx.gpu
    say = log or (lambda _msg: None)
    try:
        done = _done_rows(out_path, gpu)
        inflight = _inflight_path(out_path)
        _record_crashed_config(out_path, inflight, configs, ctx, set_name, done)
        todo = [cfg for cfg in configs if not _skipped(done.get(cfg.key), resume, retry_errors)]
        say(f"gpuest validate: {len(todo)} of {len(configs)} configs to measure on {gpu} "
            f"(~{estimated_duration_s(todo, ctx.window_s) / 60:.1f} min) -> {out_path}")
        todo = _grouped_by_model(todo)
        for i, cfg in enumerate(todo, 1):
            inflight.write_text(json.dumps({"key": cfg.key, "gpu": gpu}))
            row, fatal = _measure_row(cfg, ctx, set_name, measure)
            _append(out_path, row)
            inflight.unlink(missing_ok=True)
            say(_progress_line(i, len(todo), cfg, row)[:300])
            if fatal is not None:
                raise fatal
            next_cfg = todo[i] if i < len(todo) else None
            if next_cfg is None or (next_cfg.model, next_cfg.batch) != (cfg.model, cfg.batch):
                ctx.drop_model()
    finally:
        if context is None:
            ctx.close()
    return out_path


def _done_rows(out_path: Path, gpu: str) -> dict[str, dict[str, Any]]:
    """Config key -> the last row `out_path` holds for it on this GPU."""
    done: dict[str, dict[str, Any]] = {}
    for r in read_rows(out_path):
        if r.get("gpu") == gpu and "key" in r:
            done[r["key"]] = r
    return done


def _record_crashed_config(out_path: Path, inflight: Path, configs: list[ValidationConfig], ctx: RunContext,
                           set_name: str | None, done: dict[str, dict[str, Any]]) -> None:
    """Records, as an error row (also added to `done`), the config a previous run died in, and clears the mark."""
    if not inflight.exists():
        return
    # The previous run died inside a config: record it, never retry it blindly.
    with contextlib.suppress(Exception):
        crashed = json.loads(inflight.read_text())
        if crashed.get("gpu") == ctx.gpu and crashed.get("key") not in done:
            cfg = next((c for c in configs if c.key == crashed["key"]), None)
            if cfg is not None:
                row = _base_row(cfg, ctx, ctx.gpu, set_name)
                row.update(status="error", error_type="ProcessDied",
                           error="the process died while measuring this config (previous run)")
                _append(out_path, row)
                done[cfg.key] = row
    inflight.unlink(missing_ok=True)


def _skipped(prev: dict[str, Any] | None, resume: bool, retry_errors: bool) -> bool:
    """Whether resume skips a config whose last row is `prev` (an ok row always; an error unless retried)."""
    return resume and prev is not None and (prev.get("status") == "ok" or not retry_errors)


def _grouped_by_model(todo: list[ValidationConfig]) -> list[ValidationConfig]:
    """`todo` with the configs of one (model, batch, seq, image size) together, so the built model is reused."""
    order: dict[tuple, list[ValidationConfig]] = {}
    for cfg in todo:
        order.setdefault((cfg.model, cfg.batch, cfg.seq, cfg.image_size), []).append(cfg)
    return [c for group in order.values() for c in group]


def _measure_row(cfg: ValidationConfig, ctx: RunContext, set_name: str | None,
                 measure: MeasureFn) -> tuple[dict[str, Any], FatalCudaError | None]:
    """The config's row, measured or with its error, and the FatalCudaError to raise once it is written."""
    row = _base_row(cfg, ctx, ctx.gpu, set_name)
    t0 = time.perf_counter()
    fatal: FatalCudaError | None = None
    err: tuple[str, str, str] | None = None
    try:
        measured = measure(cfg, ctx)
        row.update(measured)
        row["status"] = "ok"
        row["error"] = None
    except Exception as exc:  # noqa: BLE001 - record and continue
        err = (type(exc).__name__, f"{type(exc).__name__}: {exc}"[:2000],
               "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
        if _is_fatal_cuda(exc):
            fatal = FatalCudaError(str(exc))
        del exc
    if err is not None:
        row.update(status="error", error_type="OutOfMemory" if "out of memory" in err[1].lower()
                   else err[0], error=err[1], traceback=err[2])
        ctx.drop_model()  # frees memory (OOM) and never reuses a model in an unknown state
    row["elapsed_s"] = time.perf_counter() - t0
    return row, fatal


def _progress_line(i: int, n: int, cfg: ValidationConfig, row: dict[str, Any]) -> str:
    """One line on a written row: its wall and busy time in ms and power in W, or its status and error."""
    return (f"[{i}/{n}] {cfg.key}: " +
            (f"wall {row['wall_s'] * 1e3:.3f} ms, busy {row.get('device_busy_s', float('nan')) * 1e3:.3f} ms"
             + (f", {row['avg_power_w']:.0f} W" if row.get("avg_power_w") is not None else "")
             if row["status"] == "ok" and row.get("wall_s") is not None
             else f"{row['status']}" + (f" ({row.get('error')})" if row.get("error") else "")))


# ================================================================== CLI

def _split(text: str | None, sep: str = ",") -> list[str]:
    return [t.strip() for t in (text or "").split(sep) if t.strip()]


def build_configs(args: argparse.Namespace) -> tuple[list[ValidationConfig], str]:
    if args.models:
        batches = [int(b) for b in _split(args.batch)] or None
        modes = _split(args.modes) or list(MODES)
        precisions = _split(args.precision) or list(PRECISIONS)
        for m in modes:
            if m not in MODES:
                raise SystemExit(f"unknown mode {m!r}; accepted: {', '.join(MODES)}")
        configs = explicit_configs(_split(args.models), batches, modes, precisions, seq=args.seq,
                                   image_size=args.image_size)
        return configs, "explicit"
    name = "dry" if args.dry_run and not args.set else (args.set or "quick")
    configs = get_set(name)
    # --modes/--precision/--batch narrow a predefined set, e.g. to re-measure only its host-bound
    # (batch-1) training configs.
    for field, wanted in (("mode", _split(args.modes)), ("precision", _split(args.precision)),
                          ("batch", _split(args.batch))):
        if wanted:
            known = sorted({str(getattr(c, field)) for c in configs},
                           key=lambda v: (int(v), v) if v.isdigit() else (0, v))
            unknown = [w for w in wanted if w not in known]
            if unknown:
                raise SystemExit(f"set {name!r} has no {field} {', '.join(map(repr, unknown))}; "
                                 f"it has: {', '.join(known)}")
            configs = [c for c in configs if str(getattr(c, field)) in wanted]
    keys = _split(args.keys, ";")
    if keys:
        known_keys = {c.key for c in configs}
        unknown_keys = [k for k in keys if k not in known_keys]
        if unknown_keys:
            raise SystemExit(f"set {name!r} has no config {', '.join(map(repr, unknown_keys))}; "
                             f"`--set {name} --list` prints its keys")
        configs = [c for c in configs if c.key in keys]
    return configs, name


def _parser() -> argparse.ArgumentParser:
    """The command line of `python3 -m gpuest.calibrate.validate`."""
    p = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.validate",
                                description="Measure the validation set on this GPU (one JSONL row per config).")
    p.add_argument("--set", choices=sorted(SETS), help="predefined set (default quick; dry with --dry-run)")
    p.add_argument("--models", help="comma-separated model specs (instead of --set)")
    p.add_argument("--batch", help="comma-separated batch sizes (default: each model's small and large batch)")
    p.add_argument("--modes", help="comma-separated: inference,training (default both)")
    p.add_argument("--precision", help="comma-separated: fp32,bf16-mixed,... (default fp32,bf16-mixed)")
    p.add_argument("--seq", type=int, help="sequence length for language models")
    p.add_argument("--image-size", type=int, help="image size for vision models")
    p.add_argument("--keys", help="semicolon-separated config keys (as --list prints them) to measure from the set, "
                                   "e.g. to profile a few configs per op")
    p.add_argument("--out", "-o", type=Path, help="results JSONL (appended to)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", dest="resume", action="store_true", default=True,
                        help="skip configs already in --out for this GPU (default)")
    resume.add_argument("--no-resume", dest="resume", action="store_false",
                        help="measure every config again (rows are appended; the report uses the last)")
    p.add_argument("--retry-errors", action="store_true", help="with resume: measure errored configs again")
    p.add_argument("--window-s", type=float, default=2.0, help="energy window length in s (default 2)")
    p.add_argument("--per-op", default=None,
                   help="'all', 'none', or comma-separated model specs/config keys to record per-op times for "
                        "(default: the set's own choice)")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--dry-run", action="store_true",
                   help="run tiny configs on the CPU through the same code path (no CUDA, no NVML)")
    p.add_argument("--list", action="store_true", help="print the configs and the estimated duration, then exit")
    return p


def _with_per_op_choice(configs: list[ValidationConfig], choice: str | None) -> list[ValidationConfig]:
    """`configs` with per-op recording as --per-op chose: 'all', 'none', model specs / config keys, or (None)
    each config's own choice."""
    if choice is None:
        per_op: bool | list[str] = False
    elif choice.lower() == "all":
        per_op = True
    elif choice.lower() == "none":
        configs = [replace(c, per_op=False) for c in configs]
        per_op = False
    else:
        per_op = _split(choice)
    return with_per_op(configs, per_op)


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status (3 after a fatal CUDA error)."""
    p = _parser()
    args = p.parse_args(argv)

    configs, set_name = build_configs(args)
    configs = _with_per_op_choice(configs, args.per_op)
    if args.list:
        for c in configs:
            print(c.key, "heldout" if c.heldout else "", "per-op" if c.per_op else "")
        print(f"{len(configs)} configs, {len({c.model for c in configs})} models; "
              f"estimated {estimated_duration_s(configs, args.window_s) / 60:.1f} min on an H100")
        return 0
    out = args.out
    window_s = args.window_s
    resume_flag = args.resume
    if args.dry_run:
        if out is None:
            out = DRY_RUN_OUT
            out.unlink(missing_ok=True)
        window_s = min(window_s, 0.3)
    elif out is None:
        p.error("--out is required (except with --dry-run or --list)")
    try:
        run_validation(configs, out, resume=resume_flag, window_s=window_s, dry_run=args.dry_run,
                       device_index=args.device_index, retry_errors=args.retry_errors, set_name=set_name)
    except FatalCudaError as exc:
        print(f"fatal CUDA error, the CUDA context is unusable: {exc}\n"
              f"rerun the same command to continue with the next config (resume is on)", file=sys.stderr)
        return 3
    rows = [r for r in read_rows(Path(out)) if r.get("key") in {c.key for c in configs}]
    ok = sum(r.get("status") == "ok" for r in rows)
    print(f"done: {ok} ok / {len(rows) - ok} errors in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
