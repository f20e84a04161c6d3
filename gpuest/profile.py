"""Calibration profiles: what a GPU (and the host driving it) really achieves, as fitted numbers.

A profile is JSON with a schema version, never pickle. It holds the per-category residual
regression that corrects the roofline, kernel latency, host dispatch costs, the power model
and the provenance of the measurements. `gpuest/profiles/` ships fitted profiles and a
`prior` profile (documented assumptions, not measurements) used when nothing was measured.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .errors import ProfileError

PROFILE_SCHEMA = "gpuest.profile/1"
PROFILE_DIR = Path(__file__).parent / "profiles"
# Residual fits are keyed by ATen op or category, optionally narrowed to one math mode: "op@mode".
MODE_KEY_SEP = "@"
# Math modes that share one fit: fp16 and bf16 run the same tensor-core kernels at the same peak (the
# suite's fp16 and bf16 attention and GEMM benchmarks of one shape take the same time within a few %),
# so pooling them doubles the rows behind each 16-bit fit (kept by 5-fold cross-validation,
# benchmarks/cross_validate.py; docs/CV_HISTORY.md).
MODE_FIT_FAMILY = {"fp16": "16bit", "bf16": "16bit"}


def mode_key(name: str, mode: str) -> str:
    """The residual-fit key of an op or category narrowed to one math mode (or its MODE_FIT_FAMILY)."""
    return name + MODE_KEY_SEP + MODE_FIT_FAMILY.get(mode, mode)


VARIANT_OPEN = "["


def variant_op(op: str, variant: str) -> str:
    """`op` qualified by its kernel variant (Cost.variant): "aten.convolution.default[transposed]"."""
    return f"{op}{VARIANT_OPEN}{variant}]" if variant else op


def op_variants(op: str) -> tuple[str, ...]:
    """The kernel variants a variant_op-qualified `op` carries ("aten.x.default[3d+weight_grad]" -> ("3d",
    "weight_grad")), () for a plain op."""
    if not (op.endswith("]") and VARIANT_OPEN in op):
        return ()
    return tuple(op[op.index(VARIANT_OPEN) + 1:-1].split("+"))


def op_keys(op: str, mode: str) -> tuple[str, ...]:
    """The per-op keys a node of ATen `op` (variant_op-qualified) priced in math `mode` may be fitted under,
    most specific first: the op in that mode, the op, then the same for the op without its variant, and
    for its out-of-place form ("aten.add_.Tensor" -> "aten.add.Tensor"), whose kernel an in-place op runs
    when the suite has not measured it itself."""
    keys = (mode_key(op, mode), op)
    if op.endswith("]") and VARIANT_OPEN in op:
        return keys + op_keys(op[:op.index(VARIANT_OPEN)], mode)
    if is_in_place(op):
        namespace, _, rest = op.partition(".")
        name, dot, overload = rest.partition(".")
        functional = f"{namespace}.{name[:-1]}{dot}{overload}"
        keys += (mode_key(functional, mode), functional)
    return keys


def is_in_place(op: str) -> bool:
    """Whether an ATen op ("aten.relu_.default") is an in-place variant: its name ends in one underscore."""
    name = op.partition(".")[2].partition(".")[0]
    return name.endswith("_") and not name.endswith("__") and len(name) > 1


@dataclass(frozen=True)
class ResidualFit:
    """Robust regression of log(measured / roofline) on the profile's residual features for one key
    (op, category, or either narrowed to a math mode)."""

    coef: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    sigma: float                      # residual std of log time
    r2: float
    n: int
    holdout_median_ape: float | None = None
    holdout_p90_ape: float | None = None
    x_lo: tuple[float, ...] | None = None     # feature range of the fitted data: predictions clip to it
    x_hi: tuple[float, ...] | None = None     # rather than extrapolate the regression
    log_lo: float | None = None               # range of log(measured / roofline) the fitted data showed: the
    log_hi: float | None = None               # correction (fit + local) never leaves it


@dataclass(frozen=True)
class ResidualPoints:
    """What the regression left unexplained on each calibration benchmark of one pool (an ATen op, or an
    op in one math mode): the benchmark's residual features and its residual of log time. The
    estimator adds to a node the kernel-weighted mean residual of the pool's benchmarks nearest to it in
    feature space (gpuest.price.local_correction): shape effects the linear fit cannot express
    (a cuDNN kernel choice, a tile size) hold for the shapes around a measured one."""

    scale: tuple[float, ...]          # per feature: the distance unit (spread of the pool's features)
    x: tuple[tuple[float, ...], ...]  # one row of features per benchmark
    residual: tuple[float, ...]       # log(measured / fitted) per benchmark


@dataclass(frozen=True)
class PowerFit:
    """Average board power (W) = static_w + s(f) * (tensor_w*u_tc + simt_w*u_simt + vector_w*u_vec)
    + memory_w*u_mem, each u a node's achieved share of its roof (gpuest.price.power)."""

    static_w: float                   # active, clocks up, no work (also: host-bound gaps)
    idle_w: float                     # deep idle, measured before the run
    tensor_w: float                   # GEMM-like nodes on tensor cores (bf16, fp16, tf32, fp8)
    vector_w: float                   # every other node's compute
    memory_w: float
    sigma_w: float
    r2: float
    n: int
    v_min_ratio: float = 0.7          # V(f_min)/V(f_max) of the voltage-frequency curve
    gap_w: float | None = None        # while the GPU waits for the host (clocks up, no kernel); None: static_w
    # GEMM-like nodes in full fp32, on the SIMT FMA pipes: a different share of the chip switches than on
    # tensor cores at the same share of the peak; None (profiles fitted before it was split out): tensor_w.
    simt_w: float | None = None
    # Compute power grows with a unit's utilisation u as u ** utilisation_exponent (concave below 1, as the
    # calibration windows show; gpuest.price.power); 1.0 for profiles fitted before the exponent was.
    utilisation_exponent: float = 1.0


# Quantities a profile can predict: a profile fitted on timings alone (public kernel data) predicts "time".
PREDICTS_ALL = ("time", "power")


@dataclass(frozen=True)
class Profile:
    gpu: str
    kind: str                                   # "measured" | "prior"
    kernel_latency_s: float
    graph_kernel_latency_s: float
    host_op_s: Mapping[str, float]              # per category, plus "default"
    host_backward_factor: float                 # autograd's C++ engine dispatches cheaper than Python
    host_only_op_s: float
    residual_features: tuple[str, ...]
    residuals: Mapping[str, ResidualFit]        # per category, plus "default"
    power: PowerFit | None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    residual_points: Mapping[str, ResidualPoints] = field(default_factory=dict)   # by pool key
    # GPU idle per host synchronisation inside an op (s): the round trip of the value to the host and
    # the host's launch of what follows. None: the prior's.
    host_sync_s: float | None = None
    # Device time per grid-wide barrier inside a kernel (s): one step of a persistent recurrent kernel.
    # None: the prior's.
    grid_sync_s: float | None = None
    # Device time of a persistent recurrent kernel's serial work (s per serial step, Cost.serial_steps:
    # PERSISTENT_STEP_WEIGHTS recurrent weights multiplied), and the extra per serial step beyond the
    # share of its weights the kernel keeps in registers (gpuest.price.device_time.persistent_steps).
    # None: the prior's.
    persistent_step_s: float | None = None
    spilled_step_s: float | None = None
    predicts: tuple[str, ...] = PREDICTS_ALL    # which of PREDICTS_ALL its own measurements cover
    # Per category and per op, the math-mode families (MODE_FIT_FAMILY) its fitted rows ran in; empty: not
    # recorded. A GPU without a profile averages each node's correction over the profiles that saw its op (or
    # category) in its mode.
    fitted_modes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    path: str | None = None

    def saw(self, name: str, mode: str) -> bool:
        """Whether this profile's fits saw rows of op or category `name` in math mode `mode` (or its family)."""
        return MODE_FIT_FAMILY.get(mode, mode) in self.fitted_modes.get(name, ())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        if self.predicts == PREDICTS_ALL:
            data.pop("predicts")  # profiles that predict everything stay as they were written before the field
        if not self.fitted_modes:
            data.pop("fitted_modes")
        else:
            data["fitted_modes"] = {k: list(v) for k, v in self.fitted_modes.items()}
        return {"schema": PROFILE_SCHEMA, **data}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(profile_json(self.to_json()) + "\n")
        return path


def profile_json(data: Mapping[str, Any]) -> str:
    """A profile as JSON: objects indented one space a level, keys sorted, and every list of plain values on
    one line (a profile holds thousands of feature rows; one number per line made it megabytes larger)."""
    flat: dict[str, str] = {}

    def folded(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: folded(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
                token = f"@list{len(flat)}@"
                flat[token] = json.dumps(list(value))
                return token
            return [folded(v) for v in value]
        return value
    text = json.dumps(folded(data), indent=1, sort_keys=True)
    return re.sub(r'"(@list\d+@)"', lambda m: flat[m.group(1)], text)


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ProfileError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ProfileError(f"{where}: field {key!r} should be {getattr(kind, '__name__', kind)}, "
                           f"got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProfileError(f"{where}: field {key!r} is not a finite number")
    return value


def _exponent(value: Any, where: str) -> float:
    """A power fit's utilisation exponent: a number in (0, 1]; power never falls as utilisation rises."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ProfileError(f"{where}: field 'utilisation_exponent' should be a number in (0, 1], got {value!r}")
    return float(value)


def profile_from_json(data: Any, where: str = "profile") -> Profile:
    """Validate a decoded profile document and build a `Profile`; `ProfileError` says what is wrong."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != PROFILE_SCHEMA:
        raise ProfileError(f"{where}: schema {schema!r} is not supported; this gpuest reads {PROFILE_SCHEMA!r} "
                           "(re-run `gpuest fit` on the raw calibration data)")
    num = (int, float)
    from .price.features import RESIDUAL_FEATURES  # the registry; imported here, as it imports pricing
    features = tuple(_need(data, "residual_features", list, where))
    unknown = [f for f in features if f not in RESIDUAL_FEATURES]
    if unknown or not features or features[0] != "const":
        raise ProfileError(f"{where}: residual_features {list(features)} must start with 'const' and use only "
                           f"{list(RESIDUAL_FEATURES)} (unknown: {unknown}); re-fit the profile with this gpuest")
    residuals = {}
    for cat, fit in _need(data, "residuals", dict, where).items():
        w = f"{where}: residuals[{cat!r}]"
        coef = tuple(float(c) for c in _need(fit, "coef", list, w))
        cov = tuple(tuple(float(c) for c in row) for row in _need(fit, "cov", list, w))
        if len(coef) != len(features) or len(cov) != len(features) or any(len(r) != len(features) for r in cov):
            raise ProfileError(f"{w}: coef/cov must have {len(features)} entries (one per feature)")
        bounds = []
        for key in ("x_lo", "x_hi"):
            value = fit.get(key)
            if value is not None and (not isinstance(value, list) or len(value) != len(features)):
                raise ProfileError(f"{w}: {key} must list {len(features)} numbers (one per feature)")
            bounds.append(tuple(float(v) for v in value) if value is not None else None)
        log_range = [float(_need(fit, key, num, w)) if fit.get(key) is not None else None
                     for key in ("log_lo", "log_hi")]
        if None not in log_range and log_range[0] > log_range[1]:
            raise ProfileError(f"{w}: log_lo {log_range[0]} exceeds log_hi {log_range[1]}")
        if data.get("kind") == "measured" and None in (*bounds, *log_range):
            raise ProfileError(f"{w}: a measured fit must store the feature range (x_lo, x_hi) and the log-time "
                               "range (log_lo, log_hi) of its data; re-fit the profile with this gpuest")
        residuals[cat] = ResidualFit(coef, cov, float(_need(fit, "sigma", num, w)), float(_need(fit, "r2", num, w)),
                                     int(_need(fit, "n", int, w)), fit.get("holdout_median_ape"),
                                     fit.get("holdout_p90_ape"), *bounds, *log_range)
    if "default" not in residuals:
        raise ProfileError(f"{where}: residuals needs a 'default' entry for categories without data")
    power = data.get("power")
    if power is not None:
        w = f"{where}: power"
        power = PowerFit(**{k: float(_need(power, k, num, w)) for k in
                            ("static_w", "idle_w", "tensor_w", "vector_w", "memory_w", "sigma_w", "r2")},
                         n=int(_need(power, "n", int, w)), v_min_ratio=float(power.get("v_min_ratio", 0.7)),
                         gap_w=float(power["gap_w"]) if power.get("gap_w") is not None else None,
                         simt_w=float(power["simt_w"]) if power.get("simt_w") is not None else None,
                         utilisation_exponent=_exponent(power.get("utilisation_exponent", 1.0), w))
    points = {key: _residual_points(value, len(features), f"{where}: residual_points[{key!r}]")
              for key, value in data.get("residual_points", {}).items()}
    _check_provenance(data, where)
    predicts = tuple(data.get("predicts", PREDICTS_ALL))
    if not predicts or not set(predicts) <= set(PREDICTS_ALL) or "time" not in predicts:
        raise ProfileError(f"{where}: predicts {list(predicts)} must include 'time' and use only {list(PREDICTS_ALL)}")
    if "power" in predicts and data.get("kind") == "measured" and power is None:
        raise ProfileError(f"{where}: a measured profile that predicts power needs a power model; a time-only "
                           "profile says predicts: ['time']")
    modes = data.get("fitted_modes", {})
    if not isinstance(modes, dict) or not all(isinstance(v, list) and all(isinstance(m, str) for m in v)
                                              for v in modes.values()):
        raise ProfileError(f"{where}: fitted_modes must map each category or op to a list of math-mode names")
    host = _need(data, "host_op_s", dict, where)
    if "default" not in host:
        raise ProfileError(f"{where}: host_op_s needs a 'default' entry")
    return Profile(
        gpu=_need(data, "gpu", str, where), kind=_need(data, "kind", str, where),
        kernel_latency_s=float(_need(data, "kernel_latency_s", num, where)),
        graph_kernel_latency_s=float(_need(data, "graph_kernel_latency_s", num, where)),
        host_op_s={k: float(v) for k, v in host.items()},
        host_backward_factor=float(_need(data, "host_backward_factor", num, where)),
        host_only_op_s=float(_need(data, "host_only_op_s", num, where)),
        residual_features=features, residuals=residuals, power=power,
        provenance=data.get("provenance", {}), residual_points=points,
        **{key: _optional_seconds(data, key, where) for key in OPTIONAL_SECONDS}, predicts=predicts,
        fitted_modes={k: tuple(v) for k, v in modes.items()},
    )


# What a measured profile must say of how it was made: the GPU and software it was measured on, when, by
# which commands, on which suite and how much of it (gpuest.calibrate.fit.calibration_provenance writes them).
REQUIRED_PROVENANCE = ("gpu_name", "driver_version", "cuda_version", "cudnn_version", "torch_version",
                       "measured_dates", "calibration_commands", "fitted_by", "suite_version", "suite_share")


def _check_provenance(data: dict[str, Any], where: str) -> None:
    missing = [k for k in REQUIRED_PROVENANCE if data.get("provenance", {}).get(k) in (None, "", [])]
    if data.get("kind") == "measured" and missing:
        raise ProfileError(f"{where}: a measured profile must record its provenance, and this one lacks "
                           f"{', '.join(missing)}; re-fit it from its calibration data with `gpuest fit`")


# Fitted device costs (s) a profile may lack: None means the prior's.
OPTIONAL_SECONDS = ("host_sync_s", "grid_sync_s", "persistent_step_s", "spilled_step_s")


def _optional_seconds(data: dict[str, Any], key: str, where: str) -> float | None:
    if data.get(key) is None:
        return None
    value = float(_need(data, key, (int, float), where))
    if value < 0:
        raise ProfileError(f"{where}: {key} must be a non-negative number of seconds, got {value!r}")
    return value


def _residual_points(data: Any, n_features: int, where: str) -> ResidualPoints:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected an object with scale, x and residual")
    scale = tuple(float(v) for v in _need(data, "scale", list, where))
    x = tuple(tuple(float(v) for v in row) for row in _need(data, "x", list, where))
    residual = tuple(float(v) for v in _need(data, "residual", list, where))
    if len(scale) != n_features or any(len(row) != n_features for row in x):
        raise ProfileError(f"{where}: scale and every row of x must have {n_features} entries (one per feature)")
    if len(residual) != len(x) or not x:
        raise ProfileError(f"{where}: x and residual must list the same benchmarks ({len(x)} rows, "
                           f"{len(residual)} residuals), at least one")
    if min(scale) <= 0 or not all(math.isfinite(v) for v in (*scale, *residual, *(c for row in x for c in row))):
        raise ProfileError(f"{where}: scales must be positive and all numbers finite")
    return ResidualPoints(scale, x, residual)


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile file {path} is not valid JSON ({exc}); it may be truncated or corrupt") from exc
    profile = profile_from_json(data, where=str(path))
    return Profile(**{**profile.__dict__, "path": str(path)})


@lru_cache(maxsize=None)
def shipped_profiles() -> dict[str, Profile]:
    """Measured profiles shipped with gpuest, by canonical GPU name."""
    out = {}
    for p in sorted(PROFILE_DIR.glob("*.json")):
        prof = load_profile(p)
        if prof.kind == "measured":
            out[prof.gpu] = prof
    return out


@lru_cache(maxsize=None)
def prior_profile() -> Profile:
    """Documented assumptions used when no GPU has been calibrated."""
    return load_profile(PROFILE_DIR / "prior.json")


def seconds_or_prior(profile: Profile, key: str) -> float:
    """Fitted device cost `key` (one of OPTIONAL_SECONDS, s) of `profile`, else the prior's, else 0."""
    value = getattr(profile, key)
    if value is None:
        value = getattr(prior_profile(), key)
    return value or 0.0
