"""Measure the peak device memory of real steps on a GPU, one JSONL row per config, for `gpuest.price.memory`.

    PYTHONPATH=. python3 -m gpuest.calibrate.memory_validate --out data/memory/H100-SXM.jsonl --budget-s 400
    PYTHONPATH=. python3 -m gpuest.calibrate.memory_validate --list     # the configs, no GPU needed

Protocol (what gpuest.price.memory.peak predicts): free everything the last config left (gc, empty_cache,
ATen's cuBLAS workspaces), build the model with random weights on the GPU (`load_model(device="cuda")`,
cast for bf16), build the step of `gpuest.calibrate.validate.make_step` (the step `trace` prices: inference
under no_grad; training = zero_grad(set_to_none=True), forward and default loss under autocast for
*-mixed, backward, foreach AdamW/SGD step), run WARMUP_STEPS steps, synchronise,
`torch.cuda.reset_peak_memory_stats()`, run one step, synchronise, read `max_memory_allocated()` and
`max_memory_reserved()`. An out-of-memory error anywhere (build, warm-up or the step) is recorded with
the stage it happened in, memory is freed, and the run continues. Nothing here changes any GPU setting.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROW_SCHEMA = "gpuest.memory/1"


@dataclass(frozen=True)
class MemoryConfig:
    """One measured step; intent says why it is in the set (typical, near-limit or oom on an 80 GB card)."""

    model: str
    batch: int
    mode: str
    precision: str
    optimizer: str = "adamw"
    seq: int | None = None
    image_size: int | None = None
    intent: str = "typical"

    @property
    def key(self) -> str:
        shape = f"s{self.seq}" if self.seq else (f"i{self.image_size}" if self.image_size else "-")
        opt = f"|{self.optimizer}" if self.mode == "training" else ""
        return f"{self.model}|b{self.batch}|{shape}|{self.mode}|{self.precision}{opt}"


def _c(model: str, batch: int, mode: str, precision: str, optimizer: str = "adamw", intent: str = "typical"
       ) -> MemoryConfig:
    seq = 128 if model.startswith("hf:") else (64 if model in ("lstm", "gru") else None)
    return MemoryConfig(model, batch, mode, precision, optimizer, seq=seq, intent=intent)


INF, TRAIN = "inference", "training"
# Inference first: a training step leaves autograd's thread a cuBLAS workspace of its own, which later
# inference steps would otherwise hold too (the workspaces are also cleared before each config).
# near-limit and oom batches: chosen from the predicted peaks on the H100 (near-limit: 86-91 % of the
# memory PyTorch may use; oom: 1.2-1.35x of it), so they test the verdict at the boundary.
CONFIGS: tuple[MemoryConfig, ...] = (
    _c("resnet18", 1, INF, "fp32"),
    _c("resnet18", 256, INF, "bf16-mixed"),
    _c("resnet50", 128, INF, "fp32"),
    _c("resnet50", 64, INF, "bf16"),
    _c("vit_b_16", 64, INF, "bf16-mixed"),
    _c("vit_b_16", 32, INF, "fp32"),
    _c("hf:gpt2", 32, INF, "fp32"),
    _c("hf:gpt2", 16, INF, "bf16"),
    _c("hf:bert-base-uncased", 64, INF, "bf16-mixed"),
    _c("mobilenet_v3_large", 256, INF, "fp32"),
    _c("efficientnet_b0", 128, INF, "bf16-mixed"),
    _c("convnext_tiny", 128, INF, "fp32"),
    _c("swin_t", 64, INF, "bf16-mixed"),
    _c("densenet121", 64, INF, "fp32"),
    _c("lstm", 256, INF, "fp32"),
    _c("gru", 64, INF, "bf16-mixed"),
    _c("hf:llama", 8, INF, "bf16"),
    _c("vgg16", 64, INF, "bf16-mixed"),
    _c("resnet50", 4096, INF, "bf16"),
    _c("resnet18", 1, TRAIN, "fp32"),
    _c("resnet18", 32, TRAIN, "fp32"),
    _c("resnet18", 256, TRAIN, "bf16-mixed", "sgd"),
    _c("resnet50", 64, TRAIN, "fp32"),
    _c("resnet50", 128, TRAIN, "bf16-mixed"),
    _c("resnet50", 64, TRAIN, "bf16"),
    _c("vit_b_16", 32, TRAIN, "bf16-mixed"),
    _c("vit_b_16", 64, TRAIN, "fp32"),
    _c("hf:gpt2", 8, TRAIN, "fp32"),
    _c("hf:gpt2", 32, TRAIN, "bf16-mixed"),
    _c("hf:bert-base-uncased", 32, TRAIN, "fp32", "sgd"),
    _c("hf:bert-base-uncased", 64, TRAIN, "bf16"),
    _c("mobilenet_v2", 128, TRAIN, "fp32"),
    _c("efficientnet_b0", 64, TRAIN, "bf16-mixed"),
    _c("convnext_tiny", 64, TRAIN, "bf16-mixed"),
    _c("swin_t", 32, TRAIN, "fp32"),
    _c("lstm", 128, TRAIN, "fp32"),
    _c("gru", 256, TRAIN, "bf16-mixed"),
    _c("hf:llama", 16, TRAIN, "bf16-mixed"),
    _c("densenet121", 32, TRAIN, "bf16-mixed"),
    _c("shufflenet_v2_x1_0", 256, TRAIN, "fp32"),
    _c("regnet_y_800mf", 128, TRAIN, "bf16-mixed"),
    _c("vgg16", 32, TRAIN, "fp32"),
    _c("resnet50", 864, TRAIN, "fp32", intent="near-limit"),
    _c("vit_b_16", 1024, TRAIN, "bf16-mixed", intent="near-limit"),
    _c("hf:gpt2", 400, TRAIN, "fp32", intent="near-limit"),
    _c("resnet50", 1280, TRAIN, "fp32", intent="oom"),
    _c("vit_b_16", 768, TRAIN, "fp32", intent="oom"),
    _c("hf:gpt2", 640, TRAIN, "bf16-mixed", intent="oom"),
    _c("hf:gpt2", 512, TRAIN, "fp32", intent="oom"),
)


# A second set, drawn before it was measured and never used to find a mechanism: HELD_OUT_COUNT configs of
# models outside CONFIGS, each model, mode, precision and batch drawn with HELD_OUT_SEED (held_out_configs).
HELD_OUT_SEED = 21
HELD_OUT_COUNT = 16
HELD_OUT_MODELS = ("resnet34", "resnet101", "resnext50_32x4d", "wide_resnet50_2", "regnet_y_1_6gf", "regnet_x_3_2gf",
                   "efficientnet_b2", "efficientnet_v2_s", "mobilenet_v3_small", "mnasnet1_0", "googlenet",
                   "squeezenet1_1", "shufflenet_v2_x2_0", "densenet169", "convnext_small", "swin_s", "vit_b_32",
                   "vit_l_16", "maxvit_t", "alexnet", "hf:roberta-base", "hf:distilbert-base-uncased",
                   "hf:qwen2-0.5b", "hf:mistral-0.85b")
HELD_OUT_PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
HELD_OUT_BATCHES = (8, 32, 64, 128)


def held_out_configs() -> tuple[MemoryConfig, ...]:
    """The held-out set: a seeded draw over HELD_OUT_MODELS, modes, precisions and batches."""
    rng = random.Random(HELD_OUT_SEED)
    models = rng.sample(HELD_OUT_MODELS, HELD_OUT_COUNT)
    return tuple(_c(m, rng.choice(HELD_OUT_BATCHES), rng.choice((INF, TRAIN)), rng.choice(HELD_OUT_PRECISIONS),
                    intent="held-out") for m in models)


# A third set for the recurrent layers traced as cuDNN's calls (capture.fused_library_calls), drawn (seed
# RECURRENT_SEED) and committed before it was measured: both cells, both modes, every precision.
RECURRENT_SEED = 22
RECURRENT_COUNT = 12
RECURRENT_BATCHES = (8, 32, 64, 128, 256, 512)


def recurrent_configs() -> tuple[MemoryConfig, ...]:
    """The recurrent set: a seeded draw over cells, modes, precisions and batches, each combination once."""
    rng = random.Random(RECURRENT_SEED)
    grid = [(m, mode, p) for m in ("lstm", "gru") for mode in (INF, TRAIN) for p in HELD_OUT_PRECISIONS]
    return tuple(_c(m, rng.choice(RECURRENT_BATCHES), mode, p, intent="recurrent")
                 for m, mode, p in rng.sample(grid, RECURRENT_COUNT))


SETS = {"main": lambda: CONFIGS, "held-out": held_out_configs, "recurrent": recurrent_configs}


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is CUDA running out of memory (torch.OutOfMemoryError, or its message from older paths)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, oom_type) or "out of memory" in str(exc).lower()


def free_all() -> None:
    """Return every cached block and ATen's cuBLAS workspaces to the driver, so each config starts as the
    prediction assumes: from an empty allocator."""
    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def measure(cfg: MemoryConfig, device: torch.device) -> dict[str, Any]:
    """One config's measured peaks (bytes), or the stage an out-of-memory error stopped it at."""
    from gpuest.capture.models import load_model
    from gpuest.capture.trace import PRECISIONS
    from ..measurement_protocol import WARMUP_STEPS
    from .validate import make_step
    from ..evaluate.validation_set import ValidationConfig

    weight_dtype, _ = PRECISIONS[cfg.precision]
    vcfg = ValidationConfig(model=cfg.model, family="", batch=cfg.batch, mode=cfg.mode, precision=cfg.precision,
                            seq=cfg.seq, image_size=cfg.image_size, optimizer=cfg.optimizer)
    row: dict[str, Any] = {"oom": False, "oom_stage": None, "error": None}
    stage = "build"
    loaded = step = opt = None
    try:
        loaded = load_model(cfg.model, batch=cfg.batch, seq=cfg.seq, image_size=cfg.image_size, device=str(device),
                            dtype=weight_dtype)
        step, opt = make_step(loaded, vcfg, device)
        stage = "warmup"
        for _ in range(WARMUP_STEPS):
            step()
        torch.cuda.synchronize(device)
        stage = "step"
        torch.cuda.reset_peak_memory_stats(device)
        row["allocated_before_bytes"] = torch.cuda.memory_allocated(device)
        row["reserved_before_bytes"] = torch.cuda.memory_reserved(device)
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        row["step_s"] = time.perf_counter() - t0
        row["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        row["max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        row["allocated_after_bytes"] = torch.cuda.memory_allocated(device)
        free, total = torch.cuda.mem_get_info(device)
        row["context_bytes"] = total - free - torch.cuda.memory_reserved(device)   # outside PyTorch's allocator
        row["params"] = sum(p.numel() for p in loaded.model.parameters())
    except Exception as exc:  # noqa: BLE001 - every failure is recorded in the row, OOM by its stage
        if is_oom(exc):
            row.update(oom=True, oom_stage=stage, error=str(exc).splitlines()[0][:300])
        else:
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            row["traceback"] = traceback.format_exc()[-2000:]
    finally:
        del loaded, step, opt
        free_all()
    return row


def provenance(argv: list[str]) -> dict[str, Any]:
    """GPU, driver, CUDA, cuDNN, library versions, commit, command and date of the run (run_provenance), and
    whether this torch can clear ATen's cuBLAS workspaces between configs."""
    from .validate import run_provenance
    info = run_provenance("gpuest.calibrate.memory_validate", argv)
    info["cublas_workspaces_cleared"] = hasattr(torch._C, "_cuda_clearCublasWorkspaces")
    return info


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python3 -m gpuest.calibrate.memory_validate", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSONL file to append rows to")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting new configs after this many seconds")
    ap.add_argument("--only", default=None, help="comma-separated substrings: measure only configs whose key has one")
    ap.add_argument("--set", choices=sorted(SETS), default="main",
                    help="main: the configs mechanisms were checked on; held-out: a seeded draw of other models; "
                         "recurrent: a seeded draw of LSTM/GRU configs")
    ap.add_argument("--list", action="store_true", help="print the configs and exit")
    args = ap.parse_args(argv)
    configs = [c for c in SETS[args.set]() if not args.only or any(s in c.key for s in args.only.split(","))]
    if args.list:
        for c in configs:
            print(f"{c.key:60s} {c.intent}")
        print(f"{len(configs)} configs")
        return 0
    if not args.out:
        ap.error("--out is required (or --list)")
    if not torch.cuda.is_available():
        print("gpuest.calibrate.memory_validate needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    prov = provenance(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    free_all()
    with out.open("a", encoding="utf-8") as f:
        for i, cfg in enumerate(configs):
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: {len(configs) - i} configs not run", file=sys.stderr)
                break
            t0 = time.perf_counter()
            row = {"schema": ROW_SCHEMA, "key": cfg.key, **asdict(cfg), **measure(cfg, device),
                   "wall_s": round(time.perf_counter() - t0, 2), "provenance": prov}
            f.write(json.dumps(row) + "\n")
            f.flush()
            peak = row.get("max_allocated_bytes")
            what = "OOM at " + str(row["oom_stage"]) if row["oom"] else (row["error"] or f"{peak / 1e9:.3f} GB")
            print(f"[{i + 1}/{len(configs)}] {cfg.key}: {what} ({row['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
