"""Calibration: measure a benchmark grid on a real NVIDIA GPU (time, power, energy, clocks).

`run_suite` writes JSONL rows (schema "gpuest.calib-row/1") that `gpuest.calibrate.fit` consumes;
`PowerMonitor` is a read-only NVML energy/clock monitor; `time_op` times one op with CUDA events.
"""
from .nvml_monitor import NvmlUnavailableError, PowerMeasurement, PowerMonitor
from .timing import TimingResult, host_dispatch_us, time_op

__all__ = ["CalibrationError", "META_SCHEMA", "NvmlUnavailableError", "PowerMeasurement", "PowerMonitor",
           "ROW_SCHEMA", "TimingResult", "host_dispatch_us", "meta_path", "run_suite", "time_op"]


def __getattr__(name: str):
    # The runner is imported lazily so `python3 -m gpuest.calibrate.runner` does not import it twice.
    if name in ("META_SCHEMA", "ROW_SCHEMA", "CalibrationError", "meta_path", "run_suite"):
        from . import runner
        return getattr(runner, name)
    raise AttributeError(f"module 'gpuest.calibrate' has no attribute {name!r}")
