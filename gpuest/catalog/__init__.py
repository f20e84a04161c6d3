"""GPU catalogue (datasheet specs as JSON files) and its loader. See ``gpu_spec``."""

from gpuest.catalog.gpu_spec import (
    BUILTIN_DIR,
    ENV_VAR,
    MATH_MODES,
    GPUSpec,
    get_gpu,
    list_gpus,
    load_gpu_file,
    search_dirs,
)
from gpuest.errors import (
    CatalogError,
    ClockOutOfRangeError,
    PowerLimitOutOfRangeError,
    UnknownGPUError,
)

__all__ = [
    "BUILTIN_DIR",
    "ENV_VAR",
    "MATH_MODES",
    "GPUSpec",
    "get_gpu",
    "list_gpus",
    "load_gpu_file",
    "search_dirs",
    "CatalogError",
    "ClockOutOfRangeError",
    "PowerLimitOutOfRangeError",
    "UnknownGPUError",
]
