"""Measure LLM inference on a GPU: decode steps over a KV cache, prefills and whole greedy generate() calls.

    PYTHONPATH=. python3 -m gpuest.calibrate.generation_validate --out gen.jsonl --budget-s 300
    PYTHONPATH=. python3 -m gpuest.calibrate.generation_validate --dry-run     # tiny configs on the CPU

Models are built from the shipped configs with random weights in bf16 (no download): a Llama (hf:llama,
hf:llama-3b), a Qwen2-style GQA model (hf:qwen2-0.5b) and GPT-2 (hf:gpt2). One JSONL row per config:
  decode    one greedy loop iteration (`gpuest.capture.generation.GreedyStep`: forward over a dynamic
            cache holding `context` tokens, argmax, stopping-criteria ops, and the host read of the
            finished flag), batch 1-64, context 128-8192; after each step the cache layers get their
            `context`-token tensors back (references, no GPU work), so every step concatenates onto
            contiguous tensors as generate() does (cropping leaves strided views, whose concatenation
            takes CUDA's slow strided-copy path: 2-4x the KV-cache cat time)
  prefill   the same iteration over the whole prompt with an empty cache
  generate  model.generate(greedy, max_new_tokens = min_new_tokens = new_tokens, no EOS stop), and the
            same steps as a plain Python loop of GreedyStep (`loop_wall_s`): their difference is
            generate()'s own Python work
Each row has wall time per call (CUDA events, synchronised; median), device-busy time (torch.profiler:
union of GPU kernels, memcpys and memsets), energy and average power (NVML energy counter over a >= 2 s
window), host probes taken just before and just after it (`host_probe`, `host_probe_after`:
gpuest.calibrate.host_probe, so the report can price the row on the host that ran it; --no-host-probe leaves
them out) and provenance (GPU, driver, CUDA, cuDNN, torch, transformers, date, command, git commit).
Configs run in tiers (every model's core configs before any model's extended grid) until --budget-s
would be exceeded; the file is appended to and --resume (default) skips configs already in it.
Nothing here changes clocks, power limits or any other GPU setting.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .host_probe import HostProbe
from .validate import RunContext, _append, _Timer, measure_energy, profile_iterations, read_rows
from .validate_measure import time_calls as timed_calls

ROW_SCHEMA = "gpuest.generation/1"
PRECISION = "bf16"
MODELS = ("hf:llama", "hf:qwen2-0.5b", "hf:gpt2", "hf:llama-3b")
FAMILY = {"hf:llama": "llama", "hf:llama-3b": "llama", "hf:qwen2-0.5b": "qwen2-gqa", "hf:gpt2": "gpt2"}
DECODE_BATCHES = (1, 4, 16, 64)
DECODE_CONTEXTS = (128, 512, 2048, 8192)
PREFILLS = ((1, 512), (16, 512), (1, 2048), (4, 128))
GENERATES = ((1, 128, 64), (16, 512, 64), (4, 1024, 32))
CACHE_MEMORY_SHARE = 0.4   # skip configs whose KV cache would take more of the GPU's memory
TIMING_TARGET_S = 0.5
MIN_ITERS, MAX_ITERS = 5, 100
DRY_MODELS = ("hf:llama",)


@dataclass(frozen=True)
class GenConfig:
    """One measured configuration (kind: decode, prefill or generate)."""

    kind: str
    model: str
    batch: int
    context: int = 0          # decode: tokens in the cache before the step
    prompt: int = 0           # prefill, generate
    new_tokens: int = 0       # generate
    tier: int = 0

    @property
    def key(self) -> str:
        return f"{self.kind}|{self.model}|b{self.batch}|c{self.context}|p{self.prompt}|n{self.new_tokens}"


def configs(dry_run: bool = False) -> list[GenConfig]:
    """Tier 0: each model's core configs; tier 1: the rest of the grid. Within a tier, model by model."""
    if dry_run:
        return [GenConfig("decode", "hf:llama", 2, context=16), GenConfig("prefill", "hf:llama", 1, prompt=16),
                GenConfig("generate", "hf:llama", 2, prompt=8, new_tokens=4)]
    out = []
    for model in MODELS:
        for b in DECODE_BATCHES:
            for c in DECODE_CONTEXTS:
                core = (b, c) in ((1, 128), (1, 2048), (16, 512), (64, 128))
                out.append(GenConfig("decode", model, b, context=c, tier=0 if core else 1))
        for i, (b, p) in enumerate(PREFILLS):
            out.append(GenConfig("prefill", model, b, prompt=p, tier=0 if i < 2 else 1))
        for i, (b, p, n) in enumerate(GENERATES):
            out.append(GenConfig("generate", model, b, prompt=p, new_tokens=n, tier=0 if i < 2 else 1))
    # the 3 B model is the slowest to build and run: its configs after every other model's
    return sorted(out, key=lambda c: (c.tier, c.model == "hf:llama-3b"))


# ================================================================== building

class Models:
    """One built model at a time (bf16, random weights, on the run's device)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.spec: str | None = None
        self.model: Any = None

    def get(self, spec: str) -> Any:
        if spec != self.spec:
            self.drop()
            from gpuest.capture.models import load_model
            self.model = load_model(spec, batch=1, seq=1, device=str(self.device), dtype=torch.bfloat16).model.eval()
            self.spec = spec
        return self.model

    def drop(self) -> None:
        self.spec, self.model = None, None
        import gc
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def max_positions(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)


def cache_bytes(model: Any, batch: int, tokens: int) -> int:
    """Bytes of the keys and values of `tokens` tokens for `batch` sequences (bf16)."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * 2 * c.num_hidden_layers * heads * head_dim * batch * tokens


def filled_cache(model: Any, batch: int, context: int, device: torch.device) -> Any:
    """A dynamic cache holding `context` random tokens per sequence, built as the estimator builds it."""
    from gpuest.capture.generation import kv_cache
    meta = kv_cache(model, batch, context, "dynamic", context + 1)
    import transformers
    cache = transformers.DynamicCache(config=model.config)
    for i, layer in enumerate(meta.layers):
        k = torch.randn(layer.keys.shape, dtype=torch.bfloat16, device=device)
        cache.update(k, torch.randn_like(k), i)
    return cache


def step_inputs(batch: int, tokens: int, vocab: int, device: torch.device) -> tuple:
    ids = torch.randint(0, vocab, (batch, tokens), device=device)
    return (ids, torch.ones_like(ids), torch.arange(tokens, device=device).expand(batch, tokens).contiguous(),
            torch.ones(batch, dtype=torch.long, device=device))


# ================================================================== one config

def make_call(cfg: GenConfig, model: Any, device: torch.device) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A zero-argument function running one measured call, and facts about it for the row."""
    import transformers
    from gpuest.capture.generation import GreedyStep
    step = GreedyStep(model, True).eval()
    vocab = int(model.config.vocab_size)
    if cfg.kind == "decode":
        cache = filled_cache(model, cfg.batch, cfg.context, device)
        args = step_inputs(cfg.batch, cfg.context + 1, vocab, device)

        filled = [(layer.keys, layer.values) for layer in cache.layers]

        def decode() -> None:
            with torch.no_grad():
                bool(step(*args, cache, 1))   # the loop reads the finished flag: the step's end
            for layer, (keys, values) in zip(cache.layers, filled):
                layer.keys, layer.values = keys, values   # back to the `context` tokens, contiguous
        return decode, {"cache_bytes": cache_bytes(model, cfg.batch, cfg.context)}
    if cfg.kind == "prefill":
        args = step_inputs(cfg.batch, cfg.prompt, vocab, device)

        def prefill() -> None:
            with torch.no_grad():
                bool(step(*args, transformers.DynamicCache(config=model.config), cfg.prompt))
        return prefill, {}
    if cfg.kind == "generate":
        ids = torch.randint(0, vocab, (cfg.batch, cfg.prompt), device=device)
        mask = torch.ones_like(ids)
        n = cfg.new_tokens
        gen_kwargs = dict(attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0, use_cache=True)

        def generate() -> Any:
            with torch.no_grad():
                return model.generate(ids, **gen_kwargs)
        out = generate()
        if out.shape[1] != cfg.prompt + n:
            raise RuntimeError(f"generate() returned {out.shape[1] - cfg.prompt} new tokens, not {n}")
        return generate, {"generation_kwargs": {k: v for k, v in gen_kwargs.items() if k != "attention_mask"},
                          "loop": _loop(step, ids, n, model.config, device)}
    raise ValueError(f"unknown kind {cfg.kind!r}")


def _loop(step: Any, ids: torch.Tensor, n: int, config: Any, device: torch.device) -> Callable[[], None]:
    """The same n greedy iterations as a plain Python loop (no generate() bookkeeping)."""
    import transformers
    batch, prompt = ids.shape

    def loop() -> None:
        cache = transformers.DynamicCache(config=config)
        seq, unfinished = ids, torch.ones(batch, dtype=torch.long, device=device)
        pos = torch.arange(prompt, device=device).expand(batch, prompt)
        with torch.no_grad():
            for i in range(n):
                bool(step(seq, torch.ones_like(seq), pos, unfinished, cache, prompt if i == 0 else 1))
                seq = torch.cat([seq, seq[:, -1:]], dim=-1)
                pos = torch.cat([pos, pos[:, -1:] + 1], dim=-1)
    return loop


def time_calls(fn: Callable[[], Any], timer: _Timer) -> dict[str, float]:
    """Warm up, then median wall time per call (CUDA events, synchronised after each)."""
    return timed_calls(fn, timer, target_s=TIMING_TARGET_S, min_iters=MIN_ITERS, max_iters=MAX_ITERS, warm_s=0.3)


def measure(cfg: GenConfig, ctx: RunContext, models: Models, per_op: bool = False) -> dict[str, Any]:
    model = models.get(cfg.model)
    limit = max_positions(model)
    length = cfg.context + 1 if cfg.kind == "decode" else cfg.prompt + cfg.new_tokens
    if length > limit:
        return {"status": "skipped", "error": f"{length} tokens exceed max_position_embeddings {limit}"}
    if ctx.device.type == "cuda":
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        need = cache_bytes(model, cfg.batch, max(cfg.context, cfg.prompt + cfg.new_tokens))
        if need > CACHE_MEMORY_SHARE * total:
            return {"status": "skipped", "error": f"KV cache of {need / 2**30:.1f} GiB exceeds "
                    f"{CACHE_MEMORY_SHARE:.0%} of the GPU's memory"}
        torch.cuda.reset_peak_memory_stats(ctx.device)
    fn, facts = make_call(cfg, model, ctx.device)
    loop = facts.pop("loop", None)
    timer = _Timer(ctx.device)
    res: dict[str, Any] = {"name": cfg.model, "family": FAMILY.get(cfg.model, cfg.model), **facts}
    res.update(time_calls(fn, timer))
    res.update(profile_iterations(fn, 2 if res["wall_s"] > 0.1 else 3, ctx.device, per_op=per_op))
    res.update(measure_energy(fn, timer, ctx, res["wall_s"]))
    if loop is not None:
        looped = time_calls(loop, timer)
        res.update(loop_wall_s=looped["wall_s"], loop_wall_iters=looped["wall_iters"])
        res["generate_python_per_step_s"] = (res["wall_s"] - looped["wall_s"]) / cfg.new_tokens
    if ctx.device.type == "cuda":
        res["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
    res["status"] = "ok"
    return res


# ================================================================== the loop

def run(out: Path, budget_s: float, *, dry_run: bool = False, resume: bool = True, window_s: float = 2.0,
        models_filter: list[str] | None = None, keys: list[str] | None = None, per_op: bool = False,
        kinds: list[str] | None = None, command: str = "", host_probe: bool = True) -> int:
    start = time.perf_counter()
    grid = configs(dry_run)
    for what, asked, field in (("models", models_filter, "model"), ("kinds", kinds, "kind"), ("config keys", keys, "key")):
        accepted = sorted({getattr(c, field) for c in grid})
        unknown = sorted(set(asked or ()) - set(accepted))
        if unknown:
            raise SystemExit(f"unknown {what} {unknown}; accepted: "
                             + ("the keys --list prints" if field == "key" else ", ".join(accepted)))
    todo = [c for c in grid if (not models_filter or c.model in models_filter)
            and (not keys or c.key in keys) and (not kinds or c.kind in kinds)]
    ctx = RunContext(dry_run=dry_run, window_s=window_s)
    done = {r.get("key") for r in read_rows(out) if r.get("gpu") == ctx.gpu} if resume else set()
    todo = [c for c in todo if c.key not in done]
    models = Models(ctx.device)
    probe: HostProbe | None = None   # built before the first config it times
    print(f"generation_validate: {len(todo)} configs to measure on {ctx.gpu} within {budget_s:.0f} s -> {out}")
    measured = 0
    longest = 0.0
    try:
        for i, cfg in enumerate(todo, 1):
            elapsed = time.perf_counter() - start
            # stop before a config that would likely overrun the budget (the slowest one so far, plus a build)
            if elapsed + max(longest, 5.0) > budget_s:
                print(f"budget: stopping after {elapsed:.0f} s with {len(todo) - i + 1} configs left "
                      "(rerun the same command to continue)")
                break
            t0 = time.perf_counter()
            row: dict[str, Any] = {"schema": ROW_SCHEMA, "key": cfg.key, **asdict(cfg), "precision": PRECISION,
                                   "cache": "dynamic", "gpu": ctx.gpu, "gpu_canonical": ctx.gpu_canonical,
                                   "dry_run": dry_run, "provenance": {**ctx.provenance, "command": command},
                                   "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
            try:
                if host_probe:
                    probe = probe or HostProbe(ctx.device)
                    row["host_probe"] = probe.measure()
                row.update(measure(cfg, ctx, models, per_op=per_op))
                if probe is not None and row["status"] == "ok":
                    row["host_probe_after"] = probe.measure()
            except Exception as exc:  # noqa: BLE001 - record and go on
                row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:2000],
                           traceback="".join(traceback.format_exception(exc))[-3000:])
                models.drop()
            row["elapsed_s"] = time.perf_counter() - t0
            longest = max(longest, row["elapsed_s"])
            _append(out, row)
            measured += 1
            summary = (f"wall {row['wall_s'] * 1e3:.3f} ms, busy {row['device_busy_s'] * 1e3:.3f} ms"
                       if row["status"] == "ok" else f"{row['status']}: {row.get('error')}")
            print(f"[{i}/{len(todo)}] {cfg.key}: {summary}"[:300], flush=True)
            next_cfg = todo[i] if i < len(todo) else None
            if next_cfg is None or next_cfg.model != cfg.model:
                models.drop()
    finally:
        ctx.close()
    print(f"done: {measured} rows in {time.perf_counter() - start:.0f} s -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.generation_validate", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="results JSONL (appended to)")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting configs after this many seconds")
    p.add_argument("--models", default=None, help=f"comma-separated subset of {', '.join(MODELS)}")
    p.add_argument("--kinds", default=None, help="comma-separated subset of decode, prefill, generate")
    p.add_argument("--keys", default=None, help="comma-separated config keys (as in the rows' `key`) to measure")
    p.add_argument("--per-op", action="store_true", help="record the profiler's top-level ATen ops with device times")
    p.add_argument("--list", action="store_true", help="print the config keys and exit")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="measure configs already in --out again")
    p.add_argument("--window-s", type=float, default=2.0, help="energy window in s (default 2)")
    p.add_argument("--dry-run", action="store_true", help="three tiny configs on the CPU (no CUDA, no NVML)")
    p.add_argument("--no-host-probe", dest="host_probe", action="store_false",
                   help="do not time the host probes before and after each config")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(c.key for c in configs(args.dry_run)))
        return 0
    out = args.out or (Path("/tmp/gpuest-generation-dryrun.jsonl") if args.dry_run else None)
    if out is None:
        p.error("--out is required (except with --dry-run)")
    out.parent.mkdir(parents=True, exist_ok=True)
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    command = "python3 -m gpuest.calibrate.generation_validate " + " ".join(argv if argv is not None else sys.argv[1:])
    return run(out, args.budget_s, dry_run=args.dry_run, resume=args.resume,
               window_s=min(args.window_s, 0.3) if args.dry_run else args.window_s, models_filter=models,
               keys=[k.strip() for k in args.keys.split(",")] if args.keys else None, per_op=args.per_op,
               kinds=[k.strip() for k in args.kinds.split(",")] if args.kinds else None,
               command=command, host_probe=args.host_probe)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
