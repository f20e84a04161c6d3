"""What every measurement of `gpuest.calibrate.validate` shares: the device, the power monitor, the cached
model and the run's provenance (GPU, driver, libraries, commit)."""
from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ..evaluate.validation_set import ValidationConfig


class RunContext:
    """What every config's measurement shares: device, power monitor, window length, provenance."""

    def __init__(self, *, dry_run: bool = False, device_index: int = 0, window_s: float = 2.0,
                 monitor: Any | None = None) -> None:
        self.dry_run = dry_run
        self.window_s = float(window_s)
        if dry_run:
            self.device = torch.device("cpu")
        else:
            if not torch.cuda.is_available():
                raise RuntimeError("gpuest.calibrate.validate needs a CUDA GPU (torch.cuda.is_available() is False); "
                                   "use --dry-run to smoke-test on the CPU")
            torch.cuda.set_device(device_index)
            self.device = torch.device("cuda", device_index)
        self.device_index = device_index
        self.monitor = monitor if monitor is not None else _make_monitor(dry_run, device_index)
        self.provenance = collect_provenance(self)
        self.gpu = self.provenance.get("gpu_name") or "unknown"
        self.gpu_canonical = _canonical_gpu(self.gpu)
        self._cache_key: tuple | None = None
        self._cache: Any = None

    # one-entry cache of the built model: consecutive configs of the same (model, batch) reuse it
    def model_for(self, cfg: ValidationConfig, dtype: torch.dtype | None) -> Any:
        key = (cfg.model, cfg.batch, cfg.seq, cfg.image_size, dtype, cfg.memory_format)
        if key != self._cache_key:
            self.drop_model()
            from gpuest.capture.models import load_model
            loaded = load_model(cfg.model, batch=cfg.batch, seq=cfg.seq, image_size=cfg.image_size,
                                device=str(self.device), dtype=dtype, memory_format=cfg.memory_format)
            self._cache_key, self._cache = key, loaded
        return self._cache

    def drop_model(self) -> None:
        self._cache_key, self._cache = None, None
        free_memory(self.device)

    def close(self) -> None:
        self.drop_model()
        close = getattr(self.monitor, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _make_monitor(dry_run: bool, device_index: int) -> Any:
    from .nvml_monitor import FakePowerMonitor, NvmlUnavailableError, PowerMonitor
    if dry_run:
        return FakePowerMonitor()
    try:
        return PowerMonitor(device_index)
    except NvmlUnavailableError as exc:
        print(f"warning: NVML unavailable ({exc}); energy and power are not measured", file=sys.stderr)
        return None


def _canonical_gpu(name: str) -> str | None:
    try:
        from gpuest.catalog import get_gpu
        return get_gpu(name).name
    except Exception:  # noqa: BLE001 - an uncatalogued GPU is not an error here
        return None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # noqa: BLE001
        return None
    return getattr(mod, "__version__", None)


def _git_commit() -> str | None:
    """HEAD's hash, with "+dirty" when tracked files differ from it (a device machine runs the
    working tree shipped over the last landed commit, so HEAD alone can name older code)."""
    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=where)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=10, cwd=where)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if status.returncode == 0 and status.stdout.strip() else "")


def collect_provenance(ctx: RunContext) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if ctx.monitor is not None and hasattr(ctx.monitor, "device_info"):
        with contextlib.suppress(Exception):
            info = dict(ctx.monitor.device_info())
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        gpu_name = torch.cuda.get_device_name(ctx.device)
        extra = {"compute_capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
                 "memory_total_bytes": props.total_memory}
    else:
        gpu_name = info.get("name") or "dry-run (no GPU)"
        extra = {}
    return {
        "gpu_name": gpu_name,
        "gpu_index": ctx.device_index,
        "nvml": info,
        **extra,
        "driver_version": info.get("driver_version"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torchvision": _version("torchvision"),
        "timm": _version("timm"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "gpuest_commit": _git_commit(),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "dry_run": ctx.dry_run,
    }


def run_provenance(module: str, argv: list[str]) -> dict[str, Any]:
    """Provenance of a measuring run on this machine's GPU (collect_provenance: GPU, driver, CUDA, cuDNN,
    libraries, commit) with its command, `python3 -m MODULE ARGV...`, and the UTC date."""
    ctx = RunContext()
    info = dict(ctx.provenance)
    ctx.close()
    info.update(command=f"python3 -m {module} " + " ".join(argv),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return info


def free_memory(device: torch.device | None = None) -> None:
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
