"""Which calibration profile prices a GPU: its own, one transferred from the nearest calibrated GPU,
or the documented prior when nothing has been measured."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..catalog import GPUSpec, get_gpu
from ..errors import ProfileError
from ..profile import Profile, ResidualFit, load_profile, prior_profile, shipped_profiles

ARCH_ORDER = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")


@dataclass(frozen=True)
class ProfileChoice:
    profile: Profile
    source: str          # "measured" | "transferred" | "prior" | "roofline" | "user"
    note: str
    power_note: str = ""  # where the power model comes from when the profile itself predicts time only
    # Other GPUs' shipped profiles that record what they measured, nearest GPU first: they correct the nodes
    # whose op or category `profile` never saw in its math mode (price.device_time.correction_sources).
    donors: tuple[Profile, ...] = ()


def roofline_profile() -> Profile:
    """Plain roofline with catalogue peaks: no residual, no latency, no host cost (the PALEO baseline)."""
    prior = prior_profile()
    zero = ResidualFit(tuple(0.0 for _ in prior.residual_features),
                       tuple(tuple(0.0 for _ in prior.residual_features) for _ in prior.residual_features),
                       0.0, 0.0, 0)
    return replace(prior, kind="roofline", kernel_latency_s=0.0, graph_kernel_latency_s=0.0, host_sync_s=0.0,
                   grid_sync_s=0.0, persistent_step_s=0.0, spilled_step_s=0.0, host_op_s={"default": 0.0},
                   host_only_op_s=0.0, residuals={"default": zero})


def _arch_distance(a: GPUSpec, b: GPUSpec) -> tuple[int, float]:
    ia = ARCH_ORDER.index(a.architecture) if a.architecture in ARCH_ORDER else 0
    ib = ARCH_ORDER.index(b.architecture) if b.architecture in ARCH_ORDER else 0
    return abs(ia - ib), abs(a.memory_bandwidth_gb_s - b.memory_bandwidth_gb_s)


def shipped_profile_named(name: str) -> Profile | None:
    """The shipped profile of the GPU a catalogue name or alias names ("H100" -> H100-SXM); None where `name`
    is no catalogued GPU or that GPU has no shipped profile."""
    from ..errors import UnknownGPUError
    try:
        return shipped_profiles().get(get_gpu(name).name)
    except UnknownGPUError:
        return None


def with_power(choice: ProfileChoice) -> ProfileChoice:
    """`choice` with a power model where its profile predicts time only (fitted on public timings): the
    measured power model of the calibrated GPU nearest the profile's, scaled to the profile's GPU
    (price.power.transfer_power), and a note saying so."""
    prof = choice.profile
    if "power" in prof.predicts or prof.power is not None:
        return choice
    from .power import transfer_power
    own = get_gpu(prof.gpu)
    nearest = nearest_full_profile(own)
    if nearest is None:
        return replace(choice, power_note=f"the {prof.gpu} profile predicts time only and no calibrated GPU has a "
                                          "power model: energy is not predicted")
    donor = nearest.gpu
    power = transfer_power(nearest.power, get_gpu(donor), own)
    return replace(choice, profile=replace(prof, power=power),
                   power_note=f"the {prof.gpu} profile predicts time only: power and energy come from {donor}'s "
                              f"measured power model scaled to {own.name} by full-load power and DRAM bandwidth")


def choose_profile(gpu: GPUSpec, profile: Profile | str | Path | None = None) -> ProfileChoice:
    """The profile that prices `gpu` (see _choose_profile for `profile`), with a borrowed power model where
    that profile predicts time only (with_power)."""
    return with_power(_choose_profile(gpu, profile))


def nearest_full_profile(gpu: GPUSpec, exclude: str | None = None) -> Profile | None:
    """The shipped profile calibrated with power (every quantity) of the GPU nearest `gpu` in architecture,
    then memory bandwidth, leaving out the GPU named `exclude`; None if there is none."""
    full = {n: p for n, p in shipped_profiles().items()
            if "power" in p.predicts and p.power is not None and n != exclude}
    return full[min(full, key=lambda name: _arch_distance(gpu, get_gpu(name)))] if full else None


def _donors(gpu: GPUSpec, profile: Profile, measured: dict[str, Profile]) -> tuple[Profile, ...]:
    """The shipped profiles of other GPUs that can correct `profile`'s nodes (they record what they measured
    and read the same residual features), nearest `gpu` first."""
    by_distance = sorted(measured, key=lambda name: (_arch_distance(gpu, get_gpu(name)), name))
    return tuple(measured[n] for n in by_distance if n != gpu.name and measured[n].fitted_modes
                 and measured[n].residual_features == profile.residual_features)


def _choose_profile(gpu: GPUSpec, profile: Profile | str | Path | None = None) -> ProfileChoice:
    """profile: None (automatic), a Profile, a path to a profile JSON, "prior", "roofline", or a catalogue
    GPU name or alias with a shipped profile ("H100": price with the H100's calibration). An existing file
    of that name stays a path."""
    if isinstance(profile, Profile):
        return ProfileChoice(profile, "user", f"user profile for {profile.gpu}")
    if profile == "roofline":
        return ProfileChoice(roofline_profile(), "roofline", "plain roofline with catalogue peaks (no calibration)")
    if profile == "prior":
        return ProfileChoice(prior_profile(), "prior", "prior assumptions (no calibration)")
    if isinstance(profile, str) and not Path(profile).exists():
        named = shipped_profile_named(profile)
        if named is None:
            raise ProfileError(f"profile {profile!r} is neither a profile file nor a GPU with a shipped profile; "
                               f"accepted: a profile JSON path, 'prior', 'roofline', or one of "
                               f"{', '.join(sorted(shipped_profiles()))} (or their aliases)")
        note = "" if named.gpu == gpu.name else f" (transferred to {gpu.name})"
        return ProfileChoice(named, "measured" if named.gpu == gpu.name else "transferred",
                             f"calibrated profile of {named.gpu}{note}")
    if profile is not None:
        loaded = load_profile(profile)
        return ProfileChoice(loaded, "user", f"profile {profile}")
    measured = shipped_profiles()
    if gpu.name in measured:
        # Its own fits correct every op they saw in its math mode; the rest (a public FP32 profile has no
        # tensor-core rows) borrow from the GPUs that measured them (device_time.correction_sources).
        own = measured[gpu.name]
        donors = _donors(gpu, own, measured)
        return ProfileChoice(own, "measured", f"calibrated profile of {gpu.name}"
                             + ("; ops it never measured in their math mode take the corrections of "
                                f"{', '.join(p.gpu for p in donors)}" if donors else ""), donors=donors)
    # The nearest GPU measured with power and every math mode supplies the latencies, host costs and power;
    # each node's correction comes from the profiles whose data saw its op or category in its math mode,
    # those of the GPU's own compute capability first, public FP32 timings included
    # (device_time.correction_sources).
    nearest = nearest_full_profile(gpu)
    if nearest is None:
        return ProfileChoice(prior_profile(), "prior", "no calibrated GPU available: prior assumptions")
    donors = _donors(gpu, nearest, measured)
    lenders = ", ".join(p.gpu for p in donors)
    return ProfileChoice(nearest, "transferred",
                         f"no calibration for {gpu.name}: latencies and host costs from {nearest.gpu}; "
                         + (f"each op's efficiency from the profiles that measured it in its math mode, those of "
                            f"compute capability {gpu.compute_capability} first, else averaged ({lenders})"
                            if donors else f"efficiencies from {nearest.gpu}")
                         + " (features normalised to each GPU's ridge point and SM count)",
                         donors=donors)
