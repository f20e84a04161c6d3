#!/usr/bin/env bash
# Provenance of a device run, printed before it: GPU, driver, SM clock, power limit and temperature as
# found; torch, CUDA, cuDNN, Python, transformers and timm; the host CPU; the UTC date.
nvidia-smi --query-gpu=name,driver_version,clocks.current.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
python3 - <<'PY'
import importlib, platform, torch
extra = []
for name in ("transformers", "timm"):
    try:
        extra.append(f"{name} {importlib.import_module(name).__version__}")
    except ImportError:
        extra.append(f"{name} absent")
print(f"torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} "
      f"python {platform.python_version()} " + " ".join(extra))
PY
lscpu | grep "Model name"
date -u +%FT%TZ
