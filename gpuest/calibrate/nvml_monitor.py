"""Read-only NVML power/clock monitor with Zeus-style measurement windows.

`PowerMonitor.begin_window(name)` / `end_window(name)` bracket a region of work and return a
`PowerMeasurement`: energy (from the GPU's total-energy counter where the driver has one, otherwise
from integrating sampled power draw), the SM/memory clocks seen during the window, temperature and
the clock throttle reasons. A background thread samples power, clocks and throttle reasons every
~20 ms for every window, so clocks are recorded even when the energy counter supplies the energy.

This module never calls an NVML ``nvmlDeviceSet*`` function: calibration must measure the GPU as
it is configured, never reconfigure it.
"""
from __future__ import annotations

import importlib
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

# Bits of nvmlDeviceGetCurrentClocksEventReasons / ...ThrottleReasons (stable since NVML 5).
THROTTLE_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that do not mean the clock was held down by power or heat.
BENIGN_REASONS = frozenset({"gpu_idle", "none"})
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
MIN_RELIABLE_WINDOW_S = 0.5  # the energy counter and the ~20 ms power samples are too coarse below this


class NvmlUnavailableError(RuntimeError):
    """NVML (pynvml / nvidia-ml-py) cannot be imported or initialised on this machine."""


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks-event/throttle-reasons bitmask (["none"] for 0)."""
    if mask == 0:
        return ["none"]
    names = [name for bit, name in THROTTLE_REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASON_BITS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def is_throttled(reasons: list[str], sm_clock_mhz: float | None, max_sm_clock_mhz: float | None) -> bool:
    """True if any reason other than idle/none was seen, or the mean SM clock was < 90 % of its maximum."""
    if any(r not in BENIGN_REASONS for r in reasons):
        return True
    if sm_clock_mhz and max_sm_clock_mhz:
        return sm_clock_mhz < 0.9 * max_sm_clock_mhz
    return False


@dataclass
class PowerMeasurement:
    """What one window measured. Energy in J, power in W, clocks in MHz, temperature in deg C."""

    name: str
    duration_s: float
    energy_j: float
    avg_power_w: float
    source: str  # "energy_counter" | "sampled" | "dry_run"
    sm_clock_mhz: float | None
    sm_clock_min_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None
    throttle_reasons: list[str]
    power_limit_w: float | None
    samples: int
    reliable: bool
    max_sm_clock_mhz: float | None = None
    throttled: bool = False

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Sample:
    t: float
    power_w: float | None
    sm_mhz: float | None
    mem_mhz: float | None
    temp_c: float | None
    reasons_mask: int | None


@dataclass
class _Window:
    name: str
    t0: float
    energy0_mj: float | None
    samples: list[_Sample] = field(default_factory=list)


def _load_nvml(module: Any | None) -> Any:
    if module is not None:
        return module
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:  # nvidia-ml-py missing
        raise NvmlUnavailableError(f"pynvml (nvidia-ml-py) is not importable: {exc}") from exc


class PowerMonitor:
    """Measures energy and clocks of one GPU over named windows (read-only NVML access).

    nvml: an object with pynvml's API (tests inject a fake); default imports `pynvml`.
    sample_interval_s: background sampling period for power, clocks and throttle reasons.
    """

    def __init__(self, device_index: int = 0, *, nvml: Any | None = None, sample_interval_s: float = 0.02) -> None:
        self.nvml = _load_nvml(nvml)
        self._error_types = self._nvml_error_types()
        try:
            self.nvml.nvmlInit()
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(device_index)
        except self._error_types as exc:
            raise NvmlUnavailableError(f"NVML could not be initialised for GPU {device_index}: {exc}") from exc
        self.device_index = device_index
        self.sample_interval_s = sample_interval_s
        self.has_energy_counter = self._probe_energy_counter()
        self.max_sm_clock_mhz = self._try(self.nvml.nvmlDeviceGetMaxClockInfo, self.handle, NVML_CLOCK_SM)
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="gpuest-nvml-sampler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ NVML helpers
    def _nvml_error_types(self) -> tuple[type[BaseException], ...]:
        err = getattr(self.nvml, "NVMLError", None)
        return (err,) if isinstance(err, type) and issubclass(err, BaseException) else (RuntimeError,)

    def _try(self, fn: Any, *args: Any) -> Any:
        """Call a *query* NVML function; None if this GPU/driver does not support it."""
        try:
            return fn(*args)
        except self._error_types:
            return None

    def _probe_energy_counter(self) -> bool:
        fn = getattr(self.nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
        if fn is None:
            return False
        try:
            fn(self.handle)
        except self._error_types:  # NVMLError_NotSupported on pre-Volta GPUs and some vGPUs
            return False
        return True

    def _energy_mj(self) -> float | None:
        if not self.has_energy_counter:
            return None
        value = self._try(self.nvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        return float(value) if value is not None else None

    def _reasons_mask(self) -> int | None:
        for fname in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nvml, fname, None)
            if fn is not None:
                value = self._try(fn, self.handle)
                if value is not None:
                    return int(value)
        return None

    def _sample(self) -> _Sample:
        power_mw = self._try(self.nvml.nvmlDeviceGetPowerUsage, self.handle)
        sm = self._try(self.nvml.nvmlDeviceGetClockInfo, self.handle, NVML_CLOCK_SM)
        mem = self._try(self.nvml.nvmlDeviceGetClockInfo, self.handle, NVML_CLOCK_MEM)
        temp = self._try(self.nvml.nvmlDeviceGetTemperature, self.handle, NVML_TEMPERATURE_GPU)
        return _Sample(time.monotonic(), power_mw / 1000.0 if power_mw is not None else None,
                       float(sm) if sm is not None else None, float(mem) if mem is not None else None,
                       float(temp) if temp is not None else None, self._reasons_mask())

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                active = list(self._windows.values())
            if active:
                s = self._sample()
                with self._lock:
                    for w in active:
                        w.samples.append(s)
            self._stop.wait(self.sample_interval_s)

    # ------------------------------------------------------------------ public API
    def power_limit_w(self) -> float | None:
        """Enforced power limit in W."""
        for fname in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"):
            fn = getattr(self.nvml, fname, None)
            if fn is not None:
                value = self._try(fn, self.handle)
                if value is not None:
                    return value / 1000.0
        return None

    def begin_window(self, name: str) -> None:
        """Start measuring window `name` (takes a first sample synchronously)."""
        if name in self._windows:
            raise ValueError(f"window {name!r} is already open")
        first = self._sample()
        window = _Window(name, time.monotonic(), self._energy_mj(), [first])
        with self._lock:
            self._windows[name] = window

    def end_window(self, name: str) -> PowerMeasurement:
        """Close window `name` and return what it measured (call after torch.cuda.synchronize())."""
        energy1 = self._energy_mj()
        t1 = time.monotonic()
        last = self._sample()
        with self._lock:
            window = self._windows.pop(name, None)
        if window is None:
            raise ValueError(f"window {name!r} was never opened")
        samples = window.samples + [last]
        duration = max(t1 - window.t0, 1e-9)
        if window.energy0_mj is not None and energy1 is not None and energy1 >= window.energy0_mj:
            energy = (energy1 - window.energy0_mj) / 1000.0
            source = "energy_counter"
        else:
            energy = _integrate_power(samples, window.t0, t1)
            source = "sampled"
        sm = [s.sm_mhz for s in samples if s.sm_mhz is not None]
        mem = [s.mem_mhz for s in samples if s.mem_mhz is not None]
        temps = [s.temp_c for s in samples if s.temp_c is not None]
        mask = 0
        seen_mask = False
        for s in samples:
            if s.reasons_mask is not None:
                mask |= s.reasons_mask
                seen_mask = True
        reasons = decode_throttle_reasons(mask) if seen_mask else []
        sm_mean = sum(sm) / len(sm) if sm else None
        return PowerMeasurement(
            name=name, duration_s=duration, energy_j=energy, avg_power_w=energy / duration, source=source,
            sm_clock_mhz=sm_mean, sm_clock_min_mhz=min(sm) if sm else None,
            mem_clock_mhz=sum(mem) / len(mem) if mem else None, temperature_c=max(temps) if temps else None,
            throttle_reasons=reasons, power_limit_w=self.power_limit_w(), samples=len(samples),
            reliable=duration >= MIN_RELIABLE_WINDOW_S,
            max_sm_clock_mhz=float(self.max_sm_clock_mhz) if self.max_sm_clock_mhz is not None else None,
            throttled=is_throttled(reasons, sm_mean, self.max_sm_clock_mhz),
        )

    def idle_power(self, seconds: float = 5.0, *, settle_timeout_s: float = 30.0, step_s: float = 0.1) -> float:
        """Idle power draw in W: waits until the reading stops falling (the card stays at high power
        for seconds after load), at most `settle_timeout_s`, then averages `seconds` of samples."""
        def mean_power(duration: float) -> float:
            values: list[float] = []
            end = time.monotonic() + duration
            while time.monotonic() < end:
                s = self._try(self.nvml.nvmlDeviceGetPowerUsage, self.handle)
                if s is not None:
                    values.append(s / 1000.0)
                time.sleep(step_s)
            if not values:
                raise NvmlUnavailableError("nvmlDeviceGetPowerUsage returned nothing; cannot measure idle power")
            return sum(values) / len(values)

        deadline = time.monotonic() + settle_timeout_s
        previous = mean_power(1.0)
        while time.monotonic() < deadline:
            current = mean_power(1.0)
            if current > previous * 0.99:  # stopped falling by more than 1 % per second
                break
            previous = current
        return mean_power(seconds)

    def device_info(self) -> dict[str, Any]:
        """Name, driver and CUDA versions, power limits (W), clocks (MHz) and memory (bytes) of the GPU."""
        nv, h = self.nvml, self.handle
        name = self._try(nv.nvmlDeviceGetName, h)
        driver = self._try(nv.nvmlSystemGetDriverVersion)
        cuda = self._try(nv.nvmlSystemGetCudaDriverVersion) if hasattr(nv, "nvmlSystemGetCudaDriverVersion") else None
        constraints = (self._try(nv.nvmlDeviceGetPowerManagementLimitConstraints, h)
                       if hasattr(nv, "nvmlDeviceGetPowerManagementLimitConstraints") else None)
        mem = self._try(nv.nvmlDeviceGetMemoryInfo, h) if hasattr(nv, "nvmlDeviceGetMemoryInfo") else None

        def text(v: Any) -> Any:
            return v.decode() if isinstance(v, bytes) else v

        def clock(fn_name: str, kind: int) -> float | None:
            fn = getattr(nv, fn_name, None)
            v = self._try(fn, h, kind) if fn is not None else None
            return float(v) if v is not None else None

        return {
            "name": text(name),
            "driver_version": text(driver),
            "cuda_driver_version": (f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else cuda),
            "power_limit_w": self.power_limit_w(),
            "power_limit_min_w": constraints[0] / 1000.0 if constraints else None,
            "power_limit_max_w": constraints[1] / 1000.0 if constraints else None,
            "max_sm_clock_mhz": clock("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM),
            "max_mem_clock_mhz": clock("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM),
            "sm_clock_mhz": clock("nvmlDeviceGetClockInfo", NVML_CLOCK_SM),
            "mem_clock_mhz": clock("nvmlDeviceGetClockInfo", NVML_CLOCK_MEM),
            "memory_total_bytes": int(mem.total) if mem is not None else None,
            "energy_counter": self.has_energy_counter,
        }

    def close(self) -> None:
        """Stop the sampler thread and shut NVML down."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        try:
            self.nvml.nvmlShutdown()
        except self._error_types as exc:
            warnings.warn(f"nvmlShutdown failed: {exc}", RuntimeWarning, stacklevel=2)

    def __enter__(self) -> "PowerMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _integrate_power(samples: list[_Sample], t0: float, t1: float) -> float:
    """Energy in J by the trapezoid rule over power samples, held flat out to the window's edges."""
    pts = [(min(max(s.t, t0), t1), s.power_w) for s in samples if s.power_w is not None]
    if not pts:
        return 0.0
    pts.sort()
    if pts[0][0] > t0:
        pts.insert(0, (t0, pts[0][1]))
    if pts[-1][0] < t1:
        pts.append((t1, pts[-1][1]))
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2.0 for a, b in zip(pts, pts[1:]))


class FakePowerMonitor:
    """Stands in for `PowerMonitor` in dry runs (CPU, CI): plausible numbers, never calibration data."""

    has_energy_counter = False
    max_sm_clock_mhz = 1000.0

    def __init__(self, power_w: float = 100.0) -> None:
        self.power_w = power_w
        self._t0: dict[str, float] = {}

    def power_limit_w(self) -> float:
        return 300.0

    def begin_window(self, name: str) -> None:
        self._t0[name] = time.monotonic()

    def end_window(self, name: str) -> PowerMeasurement:
        duration = max(time.monotonic() - self._t0.pop(name), 1e-9)
        return PowerMeasurement(name, duration, self.power_w * duration, self.power_w, "dry_run", 1000.0, 1000.0,
                                1000.0, 40.0, ["none"], 300.0, 2, duration >= MIN_RELIABLE_WINDOW_S, 1000.0, False)

    def idle_power(self, seconds: float = 5.0, **_: Any) -> float:
        return 50.0

    def device_info(self) -> dict[str, Any]:
        return {"name": "dry-run (no GPU)", "driver_version": None, "cuda_driver_version": None,
                "power_limit_w": 300.0, "power_limit_min_w": None, "power_limit_max_w": None,
                "max_sm_clock_mhz": 1000.0, "max_mem_clock_mhz": None, "sm_clock_mhz": None, "mem_clock_mhz": None,
                "memory_total_bytes": None, "energy_counter": False}

    def close(self) -> None:
        pass
