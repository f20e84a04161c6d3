"""GPU catalogue: datasheet specifications of NVIDIA GPUs, loaded from JSON files.

Each GPU is one JSON file in ``gpuest/catalog/gpus/`` (schema_version 1). Users add a
GPU without touching code by dropping a file of the same schema into that directory or into
any directory listed in the environment variable ``GPUEST_GPU_PATH`` (``os.pathsep``
separated). Files in ``GPUEST_GPU_PATH`` override built-in files that have the same
canonical ``name``.

An optional ``chip`` (GA102, GH100, ...) names the GPU chip a board is built on; ``chips.json`` gives each
chip's full-load reference board (``gpuest.catalog.chips``), from which power models move between GPUs.

Units are in the field names: MHz, GB (1e9 bytes), GB/s (1e9 bytes/s), MB (L2, as reported
by the vendor / torch, 2**20 bytes), TFLOPS (1e12 FLOP/s, dense, no sparsity), W.

Nothing is read at import time; the catalogue is loaded lazily and cached
(``functools.lru_cache``) per value of ``GPUEST_GPU_PATH``.

Name resolution (``get_gpu``) is case-insensitive and ignores spaces, dashes and
underscores; it matches the canonical name or any alias. Ambiguous short names are
resolved as follows (documented choice): ``"A100"`` -> ``A100-SXM4-80GB`` (the most common
A100 in current clouds), ``"H100"`` -> ``H100-SXM``, ``"V100"`` -> ``V100-SXM2-32GB``,
``"H200"`` -> ``H200`` (SXM, 141 GB).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from gpuest.errors import (
    CatalogError,
    ClockOutOfRangeError,
    PowerLimitOutOfRangeError,
    UnknownGPUError,
)

__all__ = [
    "GPUSpec",
    "MATH_MODES",
    "ARCHITECTURES",
    "BUILTIN_DIR",
    "ENV_VAR",
    "get_gpu",
    "list_gpus",
    "load_gpu_file",
    "search_dirs",
]

SCHEMA_VERSION = 1
ENV_VAR = "GPUEST_GPU_PATH"
BUILTIN_DIR = Path(__file__).resolve().parent / "gpus"

#: Keys of ``peak_tflops`` (all must be present in a file; value may be null).
MATH_MODES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8")
ARCHITECTURES: tuple[str, ...] = (
    "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
)

#: Resident threads per SM by compute capability: a fact of the architecture, not of one product
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability").
MAX_THREADS_PER_SM: dict[str, int] = {"3.7": 2048, "5.0": 2048, "5.2": 2048, "6.0": 2048, "6.1": 2048,
                                      "7.0": 2048, "7.5": 1024, "8.0": 2048, "8.6": 1536, "8.7": 2048,
                                      "8.9": 1536, "9.0": 2048, "10.0": 2048, "12.0": 1536}
DEFAULT_THREADS_PER_SM = 2048

# Required scalar numeric fields (JSON number, > 0).
_NUMERIC_FIELDS: tuple[str, ...] = (
    "sm_count",
    "base_clock_mhz",
    "max_clock_mhz",
    "min_clock_mhz",
    "memory_gb",
    "memory_bandwidth_gb_s",
    "l2_cache_mb",
    "peak_tflops_clock_mhz",
    "tdp_w",
    "power_limit_min_w",
    "power_limit_max_w",
    "idle_power_w",
)
#: Microarchitecture facts (tensor-core generation, FP32 lanes per SM, DRAM type) every file states.
MICROARCH_FIELDS: tuple[str, ...] = ("tensor_core_generation", "fp32_lanes_per_sm", "memory_type")
#: DRAM technologies a file may name in ``memory_type``.
MEMORY_TYPES: tuple[str, ...] = ("GDDR5", "GDDR5X", "GDDR6", "GDDR6X", "GDDR7", "HBM2", "HBM2e", "HBM3", "HBM3e")
#: Fields that must have an entry in ``sources`` (every number in the file).
SOURCED_FIELDS: tuple[str, ...] = ("compute_capability",) + _NUMERIC_FIELDS + ("peak_tflops",) + MICROARCH_FIELDS


def _norm(name: str) -> str:
    """Normalise a GPU name for matching: lower case, no spaces/dashes/underscores."""
    return re.sub(r"[\s\-_]+", "", name).lower()


_VENDOR_WORDS = re.compile(r"\b(nvidia|tesla|geforce)\b", re.IGNORECASE)


def _norm_no_vendor(name: str) -> str:
    """Like :func:`_norm` but also drops the words 'NVIDIA', 'Tesla', 'GeForce'."""
    return _norm(_VENDOR_WORDS.sub(" ", name))


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet specification of one GPU (see module docstring for units).

    ``peak_tflops`` maps math mode -> dense peak TFLOPS (or TOPS for int8) at
    ``peak_tflops_clock_mhz``, or ``None`` where the chip has no such hardware path.
    ``sources`` maps field name -> citation text.
    """

    name: str
    aliases: tuple[str, ...]
    architecture: str
    compute_capability: str
    sm_count: int
    base_clock_mhz: float
    max_clock_mhz: float
    min_clock_mhz: float
    memory_gb: float
    memory_bandwidth_gb_s: float
    l2_cache_mb: float
    peak_tflops: Mapping[str, float | None]
    tensor_cores: bool
    peak_tflops_clock_mhz: float
    tdp_w: float
    power_limit_min_w: float
    power_limit_max_w: float
    idle_power_w: float
    # Tensor-core generation (1 Volta ... 5 Blackwell; None without tensor cores), FP32 lanes per SM, DRAM type.
    tensor_core_generation: int | None = None
    fp32_lanes_per_sm: int = 64
    memory_type: str = ""
    # Device memory CUDA reports (torch.cuda.get_device_properties().total_memory), where measured.
    memory_total_bytes: int | None = None
    # The GPU chip the board is built on (GA102, GH100, ...): names its full-load reference in chips.json.
    chip: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    path: str | None = field(default=None, compare=False)

    def __hash__(self) -> int:  # mappings are not hashable; the name identifies a spec
        return hash((self.name, self.path))

    # ----------------------------------------------------------------- compute
    @property
    def available_math_modes(self) -> tuple[str, ...]:
        """Math modes with a non-null peak, in ``MATH_MODES`` order."""
        return tuple(m for m in MATH_MODES if self.peak_tflops.get(m) is not None)

    def peak_flops_per_s(self, math_mode: str, clock_mhz: float | None = None) -> float:
        """Dense peak throughput in FLOP/s (int8: OP/s) for ``math_mode``.

        Scaled linearly by ``clock_mhz / peak_tflops_clock_mhz``; ``clock_mhz=None`` means
        the clock the datasheet peak is quoted at. ``clock_mhz`` is range-checked with
        :meth:`check_clock`. Raises ``ValueError`` listing the available modes if the mode is
        unknown or has no hardware path on this GPU (null in the catalogue).
        """
        mode = str(math_mode).lower()
        tflops = self.peak_tflops.get(mode)
        if tflops is None:
            why = "is unknown" if mode not in MATH_MODES else f"has no hardware path on {self.name}"
            raise ValueError(
                f"math mode {math_mode!r} {why}; available modes for {self.name}: "
                f"{', '.join(self.available_math_modes)}"
            )
        scale = 1.0
        if clock_mhz is not None:
            self.check_clock(clock_mhz)
            scale = float(clock_mhz) / self.peak_tflops_clock_mhz
        return tflops * 1e12 * scale

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        """Peak DRAM bandwidth in bytes/s (independent of the SM clock)."""
        return self.memory_bandwidth_gb_s * 1e9

    @property
    def max_threads_per_sm(self) -> int:
        """Threads one SM holds at once (from the compute capability; 2048 where it is not listed)."""
        return MAX_THREADS_PER_SM.get(self.compute_capability, DEFAULT_THREADS_PER_SM)

    @property
    def memory_bytes(self) -> float:
        """DRAM capacity in bytes (memory_gb * 1e9; datasheet GB)."""
        return self.memory_gb * 1e9

    @property
    def cuda_memory_bytes(self) -> float:
        """Device memory CUDA can hand out, in bytes: the measured total where the catalogue has one, else
        the datasheet's GB as 1e9 bytes, which every measured card exceeds (the driver's reserve is smaller
        than the gap between datasheet GB and GiB)."""
        return float(self.memory_total_bytes) if self.memory_total_bytes else self.memory_bytes

    @property
    def l2_cache_bytes(self) -> int:
        """L2 cache size in bytes (l2_cache_mb * 2**20)."""
        return int(round(self.l2_cache_mb * 2**20))

    def ridge_point(self, math_mode: str, clock_mhz: float | None = None) -> float:
        """Roofline ridge point in FLOP/byte: peak FLOP/s divided by DRAM bytes/s."""
        return self.peak_flops_per_s(math_mode, clock_mhz) / self.memory_bandwidth_bytes_per_s

    # ------------------------------------------------------------ range checks
    def check_clock(self, clock_mhz: float) -> float:
        """Return ``clock_mhz`` (MHz) if within [min_clock_mhz, max_clock_mhz], else raise
        :class:`ClockOutOfRangeError` stating the valid range."""
        ok = (
            isinstance(clock_mhz, (int, float))
            and not isinstance(clock_mhz, bool)
            and math.isfinite(clock_mhz)
            and clock_mhz > 0
            and self.min_clock_mhz <= clock_mhz <= self.max_clock_mhz
        )
        if not ok:
            raise ClockOutOfRangeError(
                f"SM clock {clock_mhz!r} MHz is out of range for {self.name}: valid range is "
                f"{self.min_clock_mhz:g}-{self.max_clock_mhz:g} MHz"
            )
        return float(clock_mhz)

    def check_power_limit(self, watts: float) -> float:
        """Return ``watts`` (W) if within [power_limit_min_w, power_limit_max_w], else raise
        :class:`PowerLimitOutOfRangeError` stating the valid range."""
        ok = (
            isinstance(watts, (int, float))
            and not isinstance(watts, bool)
            and math.isfinite(watts)
            and watts > 0
            and self.power_limit_min_w <= watts <= self.power_limit_max_w
        )
        if not ok:
            raise PowerLimitOutOfRangeError(
                f"power limit {watts!r} W is out of range for {self.name}: valid range is "
                f"{self.power_limit_min_w:g}-{self.power_limit_max_w:g} W"
            )
        return float(watts)


# --------------------------------------------------------------------- loading
def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bad(p: Path, field_name: str, why: str) -> CatalogError:
    """The error naming the file `p` and its missing or bad field."""
    return CatalogError(f"GPU catalogue file {p}: field {field_name!r} {why}")


def _req(p: Path, data: dict[str, Any], key: str) -> Any:
    """The value of a required field of `data` (read from `p`)."""
    if key not in data:
        raise _bad(p, key, "is missing")
    return data[key]


def _read_gpu_json(p: Path) -> dict[str, Any]:
    """The JSON object in `p`."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise CatalogError(f"GPU catalogue file {p}: cannot be read ({e})") from e
    except json.JSONDecodeError as e:
        raise CatalogError(f"GPU catalogue file {p}: invalid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CatalogError(f"GPU catalogue file {p}: top level must be a JSON object")
    return data


def _identity_fields(p: Path, data: dict[str, Any]) -> tuple[str, list[str], str, str]:
    """The checked name, aliases, architecture and compute capability (after the schema version)."""
    if _req(p, data, "schema_version") != SCHEMA_VERSION:
        raise _bad(p, "schema_version", f"is {data['schema_version']!r}, expected {SCHEMA_VERSION}")
    name = _req(p, data, "name")
    if not isinstance(name, str) or not name.strip():
        raise _bad(p, "name", "must be a non-empty string")
    aliases = _req(p, data, "aliases")
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise _bad(p, "aliases", "must be a list of non-empty strings")
    arch = _req(p, data, "architecture")
    if not isinstance(arch, str) or arch.lower() not in ARCHITECTURES:
        raise _bad(p, "architecture", f"must be one of {', '.join(ARCHITECTURES)}; got {arch!r}")
    cc = _req(p, data, "compute_capability")
    if not isinstance(cc, str) or not re.fullmatch(r"\d+\.\d+", cc):
        raise _bad(p, "compute_capability", f"must be a string like '9.0'; got {cc!r}")
    return name, aliases, arch, cc


def _numeric_fields(p: Path, data: dict[str, Any]) -> dict[str, float]:
    """The checked positive numbers of _NUMERIC_FIELDS, clocks and power limits in order."""
    nums: dict[str, float] = {}
    for key in _NUMERIC_FIELDS:
        v = _req(p, data, key)
        if not _is_number(v) or v <= 0:
            raise _bad(p, key, f"must be a positive number; got {v!r}")
        nums[key] = v
    if not isinstance(nums["sm_count"], int):
        raise _bad(p, "sm_count", f"must be an integer; got {nums['sm_count']!r}")
    if not nums["min_clock_mhz"] <= nums["base_clock_mhz"] <= nums["max_clock_mhz"]:
        raise _bad(p, "min_clock_mhz", "must satisfy min_clock_mhz <= base_clock_mhz <= max_clock_mhz")
    if not nums["power_limit_min_w"] <= nums["power_limit_max_w"]:
        raise _bad(p, "power_limit_min_w", "must be <= power_limit_max_w")
    return nums


def _peak_tflops(p: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The checked peak_tflops object: every math mode, each a positive TFLOPS or null (fp32 never null)."""
    peaks = _req(p, data, "peak_tflops")
    if not isinstance(peaks, dict):
        raise _bad(p, "peak_tflops", "must be an object mapping math mode -> TFLOPS or null")
    for mode in MATH_MODES:
        if mode not in peaks:
            raise _bad(p, f"peak_tflops.{mode}", "is missing (use null where there is no hardware path)")
    for mode, v in peaks.items():
        if mode not in MATH_MODES:
            raise _bad(p, f"peak_tflops.{mode}", f"is not a known math mode ({', '.join(MATH_MODES)})")
        if v is not None and (not _is_number(v) or v <= 0):
            raise _bad(p, f"peak_tflops.{mode}", f"must be a positive number or null; got {v!r}")
    if peaks["fp32"] is None:
        raise _bad(p, "peak_tflops.fp32", "must not be null")
    return peaks


def _core_fields(p: Path, data: dict[str, Any]) -> tuple[bool, int | None, int]:
    """The checked tensor_cores flag, tensor-core generation and FP32 lanes per SM."""
    tensor_cores = _req(p, data, "tensor_cores")
    if not isinstance(tensor_cores, bool):
        raise _bad(p, "tensor_cores", f"must be true or false; got {tensor_cores!r}")
    gen = _req(p, data, "tensor_core_generation")
    if gen is not None and (not isinstance(gen, int) or isinstance(gen, bool) or gen < 1):
        raise _bad(p, "tensor_core_generation", f"must be a positive integer or null; got {gen!r}")
    if (gen is None) == tensor_cores:
        raise _bad(p, "tensor_core_generation", "must be null exactly when tensor_cores is false")
    lanes = _req(p, data, "fp32_lanes_per_sm")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes <= 0:
        raise _bad(p, "fp32_lanes_per_sm", f"must be a positive integer; got {lanes!r}")
    return tensor_cores, gen, lanes


def _memory_fields(p: Path, data: dict[str, Any]) -> tuple[str, int | None]:
    """The checked memory type and the optional measured memory_total_bytes."""
    memory_type = _req(p, data, "memory_type")
    if memory_type not in MEMORY_TYPES:
        raise _bad(p, "memory_type", f"must be one of {', '.join(MEMORY_TYPES)}; got {memory_type!r}")
    total = data.get("memory_total_bytes")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total <= 0):
        raise _bad(p, "memory_total_bytes", f"must be a positive integer (bytes) when given; got {total!r}")
    return memory_type, total


def _chip(p: Path, data: dict[str, Any]) -> str | None:
    """The checked optional chip name (a non-empty string or absent)."""
    chip = data.get("chip")
    if chip is not None and (not isinstance(chip, str) or not chip.strip()):
        raise _bad(p, "chip", f"must be a non-empty string (the GPU chip, e.g. GA102) when given; got {chip!r}")
    return None if chip is None else chip.strip()


def _sources(p: Path, data: dict[str, Any]) -> dict[str, str]:
    """The checked sources object: a citation for every sourced field (memory_total_bytes and chip when given)."""
    sources = _req(p, data, "sources")
    if not isinstance(sources, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in sources.items()
    ):
        raise _bad(p, "sources", "must be an object mapping field name -> non-empty citation string")
    optional = tuple(k for k in ("memory_total_bytes", "chip") if data.get(k) is not None)
    for key in SOURCED_FIELDS + optional:
        if key not in sources:
            raise _bad(p, f"sources.{key}", "is missing: every number and the chip need a named source")
    return sources


def load_gpu_file(path: str | os.PathLike[str]) -> GPUSpec:
    """Load and validate one GPU JSON file. Raises :class:`CatalogError` naming the file and
    the missing or bad field."""
    p = Path(path)
    data = _read_gpu_json(p)
    # One fixed order of checks: a file with several faults always names the same first one.
    name, aliases, arch, cc = _identity_fields(p, data)
    nums = _numeric_fields(p, data)
    peaks = _peak_tflops(p, data)
    tensor_cores, gen, lanes = _core_fields(p, data)
    memory_type, total = _memory_fields(p, data)
    chip = _chip(p, data)
    sources = _sources(p, data)
    return GPUSpec(
        name=name.strip(),
        aliases=tuple(a.strip() for a in aliases),
        architecture=arch.lower(),
        compute_capability=cc,
        sm_count=int(nums["sm_count"]),
        base_clock_mhz=float(nums["base_clock_mhz"]),
        max_clock_mhz=float(nums["max_clock_mhz"]),
        min_clock_mhz=float(nums["min_clock_mhz"]),
        memory_gb=float(nums["memory_gb"]),
        memory_bandwidth_gb_s=float(nums["memory_bandwidth_gb_s"]),
        l2_cache_mb=float(nums["l2_cache_mb"]),
        peak_tflops=MappingProxyType(
            {m: (None if peaks[m] is None else float(peaks[m])) for m in MATH_MODES}
        ),
        tensor_cores=tensor_cores,
        peak_tflops_clock_mhz=float(nums["peak_tflops_clock_mhz"]),
        tdp_w=float(nums["tdp_w"]),
        power_limit_min_w=float(nums["power_limit_min_w"]),
        power_limit_max_w=float(nums["power_limit_max_w"]),
        idle_power_w=float(nums["idle_power_w"]),
        tensor_core_generation=gen,
        fp32_lanes_per_sm=lanes,
        memory_type=memory_type,
        memory_total_bytes=total,
        chip=chip,
        sources=MappingProxyType(dict(sources)),
        path=str(p),
    )


def search_dirs() -> list[Path]:
    """Directories searched for GPU files, lowest precedence first: the built-in directory,
    then each directory of ``GPUEST_GPU_PATH`` in order (later ones override earlier)."""
    extra = [d for d in os.environ.get(ENV_VAR, "").split(os.pathsep) if d.strip()]
    return [BUILTIN_DIR] + [Path(d).expanduser() for d in extra]


@dataclass(frozen=True)
class _Catalog:
    specs: tuple[GPUSpec, ...]
    index: Mapping[str, GPUSpec]           # normalised name/alias -> spec
    index_no_vendor: Mapping[str, GPUSpec]  # same keys with vendor words stripped


@lru_cache(maxsize=8)
def _load_catalog(dirs: tuple[str, ...]) -> _Catalog:
    by_name: dict[str, GPUSpec] = {}
    for d in dirs:
        dp = Path(d)
        if not dp.is_dir():
            continue
        for f in sorted(dp.glob("*.json")):
            spec = load_gpu_file(f)
            by_name[_norm(spec.name)] = spec  # later directories override earlier ones
    index: dict[str, GPUSpec] = {}
    index_nv: dict[str, GPUSpec] = {}
    for spec in by_name.values():
        for label in (spec.name, *spec.aliases):
            for idx, key in ((index, _norm(label)), (index_nv, _norm_no_vendor(label))):
                other = idx.get(key)
                if other is not None and other.name != spec.name:
                    raise CatalogError(
                        f"GPU catalogue file {spec.path}: field 'aliases': {label!r} is also a "
                        f"name/alias of {other.name} ({other.path})"
                    )
                idx[key] = spec
    specs = tuple(sorted(by_name.values(), key=lambda s: s.name))
    return _Catalog(specs, MappingProxyType(index), MappingProxyType(index_nv))


def _catalog() -> _Catalog:
    return _load_catalog(tuple(str(d) for d in search_dirs()))


def list_gpus() -> list[GPUSpec]:
    """All GPUs in the catalogue (built-in plus ``GPUEST_GPU_PATH``), sorted by name."""
    return list(_catalog().specs)


def get_gpu(name: str) -> GPUSpec:
    """Look up a GPU by canonical name or alias (case-insensitive; spaces, dashes and
    underscores ignored; the words NVIDIA/Tesla/GeForce optional). Raises
    :class:`UnknownGPUError` listing the closest names and how to add a GPU."""
    if isinstance(name, GPUSpec):
        return name
    cat = _catalog()
    key = _norm(str(name))
    spec = cat.index.get(key) or cat.index_no_vendor.get(_norm_no_vendor(str(name)))
    if spec is not None:
        return spec
    labels = {}
    for s in cat.specs:
        for label in (s.name, *s.aliases):
            labels.setdefault(_norm(label), s.name)
    close = difflib.get_close_matches(key, list(labels), n=10, cutoff=0.4)
    suggestions: list[str] = []
    for c in close:
        if labels[c] not in suggestions:
            suggestions.append(labels[c])
    hint = f"closest matches: {', '.join(suggestions[:5])}" if suggestions else "no close matches"
    raise UnknownGPUError(
        f"unknown GPU {name!r} ({hint}). Known GPUs: {', '.join(s.name for s in cat.specs)}. "
        f"To add a GPU, drop a JSON file (same schema as the built-in ones) into {BUILTIN_DIR} "
        f"or into a directory listed in the environment variable {ENV_VAR}."
    )
