"""Plain-text tables: what `str(Estimate)` and the CLI print."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..price.estimate import Estimate
    from ..price.generation import GenerationEstimate

PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def si(value: float, unit: str = "") -> str:
    """1.23e12 -> '1.23 T'."""
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def seconds(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} us"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def memory_text(est: "Estimate | GenerationEstimate") -> str:
    """'3.16 GB' (peak allocated), or 'n/a' when the graph had no storage events."""
    return "n/a" if est.peak_memory_bytes is None else f"{est.peak_memory_bytes / 1e9:.3g} GB"


def fits_text(est: "Estimate | GenerationEstimate") -> str:
    """Whether the step (every step of a generate() call) fits the GPU, with the memory PyTorch may use there."""
    if est.memory is None:
        return ""
    return ("fits" if est.fits else "DOES NOT FIT") + f" in {est.memory.capacity_bytes / 1e9:.3g} GB usable"


def estimate_summary(est: "Estimate", hot: int = 10) -> str:
    """The readable summary of an estimate: totals, bound, energy, per-category and hot-op tables."""
    clock = f"{est.clock_mhz:.0f} MHz"
    if abs(est.effective_clock_mhz - est.clock_mhz) > 1:
        clock += f" (power-capped to {est.effective_clock_mhz:.0f} MHz avg at {est.power_limit_w:.0f} W)"
    lines = [
        f"gpuest estimate: {est.model} [{est.mode}, {est.precision}, batch {est.batch}] on {est.gpu} @ {clock}, "
        f"launch={est.launch}",
        f"profile: {est.profile_source} ({est.profile_note})",
        "",
        table([
            ["wall time / iteration", seconds(est.time_s),
             f"90% interval {seconds(est.time_low_s)} .. {seconds(est.time_high_s)}"],
            ["device busy", seconds(est.device_time_s), ""],
            ["host dispatch", seconds(est.host_time_s), ""],
            ["bound", est.bound, ""],
            ["energy / iteration", f"{est.energy_j:.4g} J", ""],
            ["average power", f"{est.avg_power_w:.4g} W", ""],
            ["energy-delay product", f"{est.edp_js:.4g} J*s", ""],
            ["peak memory (allocated)", memory_text(est), fits_text(est)],
        ], ["", "value", ""]),
        "",
    ]
    cats = est.by_category()
    lines.append(table([[c, int(r.nodes), seconds(r.time_s), f"{100 * r.share:.1f}%", si(r.flops, "FLOP"),
                         si(r.bytes, "B"), f"{r.energy_j:.3g} J"] for c, r in cats.iterrows()],
                       ["category", "nodes", "time", "share", "flops", "bytes", "energy"]))
    lines.append("")
    hot_df = est.hot_ops(hot)
    lines.append(table([[r.op.replace("aten.", ""), (r.module or "-")[-40:], r.phase, seconds(r.time_s),
                         f"{100 * r.share:.1f}%", r.bound] for r in hot_df.itertuples()],
                       [f"top {hot} ops", "module", "phase", "time", "share", "bound"]))
    for note in est.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def generation_summary(gen: "GenerationEstimate") -> str:
    """The readable summary of a generate() estimate: totals, rates, and one row per priced step."""
    tokens = gen.batch * gen.new_tokens
    lines = [
        f"gpuest generate: {gen.model} [{gen.precision}, batch {gen.batch}, prompt {gen.prompt_tokens}, "
        f"{gen.new_tokens} new tokens, {gen.cache} cache] on {gen.gpu} @ {gen.clock_mhz:.0f} MHz, launch={gen.launch}",
        f"profile: {gen.profile_source}",
        "",
        table([
            ["time to first token", seconds(gen.ttft_s), "generate() setup + prefill"],
            ["time per output token", seconds(gen.tpot_s), "mean decode step"],
            ["whole generate() call", seconds(gen.time_s), f"{tokens} tokens"],
            ["tokens / s", f"{gen.tokens_per_s:.4g}", f"{gen.tokens_per_s / gen.batch:.4g} per sequence"],
            ["device busy", seconds(gen.device_time_s), f"{100 * gen.device_time_s / gen.time_s:.0f}% of the call"],
            ["energy", f"{gen.energy_j:.4g} J", f"{gen.avg_power_w:.4g} W average"],
            ["energy / token", f"{gen.energy_per_token_j:.4g} J", ""],
            *([["peak memory", memory_text(gen), fits_text(gen)]] if gen.memory is not None else []),
        ], ["", "value", ""]),
        "",
        table([[r.phase, str(r.context), str(r.query_tokens), f"{r.steps:.4g}", seconds(r.time_s),
                seconds(r.device_time_s), seconds(r.host_time_s), r.bound, seconds(r.total_time_s),
                f"{r.total_energy_j:.3g} J"] for r in gen.phases.itertuples()],
              ["phase", "context", "tokens in", "steps", "time/step", "device/step", "host/step", "bound",
               "total time", "energy"]),
    ]
    lines += [f"note: {note}" for note in gen.notes]
    return "\n".join(lines)
