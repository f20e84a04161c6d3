"""Time this host's dispatch of eager PyTorch: the host probe, small host-bound steps on this machine's GPU.

The wall time of a host-bound step follows the CPU that dispatches its ops (up to 70 % apart between hosts of
one cloud GPU type), and a profile's host costs are those of the hosts it was calibrated on. A probe record
(PROBE_SCHEMA) holds the median wall time of each of PROBE_CONFIGS, small-batch steps of the validation set's
host probes; `gpuest.calibrate.fit_host_scale` turns it into the `host_scale` that prices this host.
`gpuest.calibrate.generation_validate` takes a probe before and after every config it measures.
"""
from __future__ import annotations

import datetime as _dt
import platform
from typing import Any, Callable

PROBE_SCHEMA = "gpuest.host_probe/1"
# (model, mode, precision) of gpuest.evaluate.validation_set.host_set: batch 1, so the host paces them
PROBE_CONFIGS = (("hf:bert-base-uncased", "inference", "fp32"), ("resnet18", "inference", "fp32"))
PROBE_TARGET_S = 0.4               # timed per probe step, after the warm-up
PROBE_MIN_ITERS, PROBE_MAX_ITERS = 5, 200
CONFIG_FIELDS = ("model", "batch", "seq", "image_size", "mode", "precision", "memory_format")


def probe_configs() -> list[Any]:
    """The ValidationConfigs of PROBE_CONFIGS (small batch, from the host set)."""
    from ..evaluate.validation_set import host_set
    wanted = {c: i for i, c in enumerate(PROBE_CONFIGS)}
    found = sorted((c for c in host_set() if (c.model, c.mode, c.precision) in wanted),
                   key=lambda c: wanted[(c.model, c.mode, c.precision)])
    if len(found) != len(PROBE_CONFIGS):
        raise RuntimeError("the host set lacks a probe config of PROBE_CONFIGS")
    return found



class HostProbe:
    """The probe's steps, built once on `device`; each `measure()` times them again (about 1 s on a GPU)."""

    def __init__(self, device: Any, configs: list[Any] | None = None) -> None:
        import torch
        from ..capture.models import load_model
        from .validate_measure import _Timer, make_step
        self.device = torch.device(device)
        self.configs = probe_configs() if configs is None else configs
        self._timer = _Timer(self.device)
        self._steps: list[Callable[[], None]] = []
        for cfg in self.configs:
            loaded = load_model(cfg.model, batch=cfg.batch, seq=cfg.seq, image_size=cfg.image_size,
                                device=str(self.device), memory_format=cfg.memory_format)
            self._steps.append(make_step(loaded, cfg, self.device)[0])

    def measure(self) -> dict[str, Any]:
        from .validate_measure import time_calls
        """A probe record (PROBE_SCHEMA): per step its config and median wall time per call (s)."""
        steps = []
        for cfg, step in zip(self.configs, self._steps):
            timed = time_calls(step, self._timer, target_s=PROBE_TARGET_S, min_iters=PROBE_MIN_ITERS,
                               max_iters=PROBE_MAX_ITERS, warm_s=0.1)
            steps.append({"config": {f: getattr(cfg, f) for f in CONFIG_FIELDS}, "wall_s": timed["wall_s"],
                          "iters": timed["wall_iters"]})
        return {"schema": PROBE_SCHEMA, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "device": str(self.device), "cpu": platform.processor() or platform.machine(), "steps": steps}
