"""Exceptions raised by gpuest. Every message says what was wrong and what is accepted."""


class GpuestError(Exception):
    """Base class of every gpuest error."""


class TraceError(GpuestError, RuntimeError):
    """A model could not be captured (data-dependent control flow, unsupported construct, ...)."""


class ModelSpecError(GpuestError, ValueError):
    """A model name given to the CLI or to `load_model` could not be resolved."""


class GraphNotAnnotatedError(GpuestError, ValueError):
    """A graph handed to the estimator was not produced by `gpuest.trace`."""


class ProfileError(GpuestError, ValueError):
    """A calibration profile is corrupt, of another schema version, or for another GPU."""


class UnknownGPUError(GpuestError, ValueError):
    """A GPU name matched no catalogue entry (name or alias)."""


class ClockOutOfRangeError(GpuestError, ValueError):
    """An SM clock outside the GPU's supported range [min_clock_mhz, max_clock_mhz] was requested."""


class PowerLimitOutOfRangeError(GpuestError, ValueError):
    """A power limit outside the GPU's [power_limit_min_w, power_limit_max_w] range was requested."""


class CatalogError(GpuestError, ValueError):
    """A GPU catalogue JSON file is unreadable, or has a missing or badly typed field."""


class MeasuredDataError(ProfileError):
    """A measurement file (calibration or validation JSONL) is unreadable or has a corrupt line; a
    ProfileError too, as fitting a profile is what such files feed."""


class GenerationError(GpuestError, ValueError):
    """A generation estimate was asked of a model that cannot generate with a KV cache (not a decoder LM,
    no cache), or for more tokens than its position embeddings cover."""


class RoutingError(GpuestError, ValueError):
    """A mixture-of-experts routing assumption is malformed (shares that do not sum to 1, a share count
    that differs from the model's experts, a hot share outside (0, 1)) or cannot hold for the model."""


class OpArgumentError(GpuestError, ValueError):
    """A cost formula asked an ATen op for an argument its schema does not declare (a renamed argument, or
    a formula registered for an op it does not fit)."""


class HostProbeError(GpuestError, ValueError):
    """A host probe record is unreadable (another schema, no steps, a step without a time), or a probe
    step is not paced by the host on the GPU it is priced on, so it says nothing of the host's speed."""
