"""Pictures of estimates (matplotlib, Agg backend: no display needed).

`roofline_plot`: the GPU's roofs with every priced op at (arithmetic intensity, achieved FLOP/s).
`sweep_plot`: predicted time and energy against SM clock and/or board power limit, from `sweep()`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: never try to open a window (CI, notebooks over SSH)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

if TYPE_CHECKING:
    from ..catalog import GPUSpec
    from ..price.estimate import Estimate

# Fixed colours per category, so the same category looks the same in every plot and report.
CATEGORY_COLOURS = {
    "matmul": "#1f77b4", "conv": "#d62728", "attention": "#9467bd", "rnn": "#8c564b",
    "elementwise": "#2ca02c", "norm": "#ff7f0e", "reduction": "#17becf", "pool": "#bcbd22",
    "embedding": "#e377c2", "optimizer": "#393b79", "copy": "#7f7f7f", "other": "#c7c7c7",
}
ROOF_STYLES = ("-", "--", "-.", ":")
SETTING_AXES = {"clock": ("clock_mhz", "SM clock (MHz)"), "power_limit": ("power_limit_w", "board power limit (W)")}


def _colour(category: str) -> str:
    if category in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[category]
    # Unknown categories still get a stable colour from the tab20 palette.
    return plt.get_cmap("tab20")(sum(map(ord, category)) % 20)


def _ops(n: int) -> str:
    return f"{n} op" if n == 1 else f"{n} ops"


def _fmt_flops(v: float) -> str:
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if v >= scale:
            return f"{v / scale:.3g} {p}FLOP/s"
    return f"{v:.3g} FLOP/s"


def _plotted_ops(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The ops a roofline can place (FLOPs, bytes and time), with `ai` (FLOP/byte) and `achieved` (FLOP/s)
    columns, and how many timed ops it leaves out."""
    ops = df[(~df["free"]) & (df["flops"] > 0) & (df["bytes"] > 0) & (df["time_s"] > 0)].copy()
    ops["ai"] = ops["flops"] / ops["bytes"]
    ops["achieved"] = ops["flops"] / ops["time_s"]
    skipped = int(((~df["free"]) & (df["time_s"] > 0)).sum() - len(ops))
    return ops, skipped


def _roof_peaks(gpu: "GPUSpec", ops: pd.DataFrame, clock_mhz: float) -> tuple[list[str], dict[str, float]]:
    """The math modes the ops use (fp32 if none), highest peak first, and each mode's peak in FLOP/s."""
    modes = [m for m in dict.fromkeys(ops["math_mode"]) if m in gpu.available_math_modes] or ["fp32"]
    peaks = {m: gpu.peak_flops_per_s(m, clock_mhz) for m in modes}
    modes.sort(key=lambda m: -peaks[m])
    return modes, peaks


def _axis_limits(ops: pd.DataFrame, peaks: dict[str, float], bw: float) -> tuple[float, float, float, float]:
    """x_lo, x_hi (FLOP/byte), y_lo, y_hi (FLOP/s): the ops and every ridge point with a margin, in whole decades."""
    ridges = [p / bw for p in peaks.values()]
    xs = [*ops["ai"], *ridges] or [1.0]
    x_lo = 10 ** math.floor(math.log10(max(min(xs), 1e-3)) - 0.3)
    x_hi = 10 ** math.ceil(math.log10(max(xs)) + 0.3)
    ys = [*ops["shown"], *peaks.values(), bw * x_lo]
    y_lo = 10 ** math.floor(math.log10(max(min(ys), 1.0)) - 0.2)
    y_hi = 10 ** math.ceil(math.log10(max(ys)) + 0.3)
    return x_lo, x_hi, y_lo, y_hi


def _draw_roofs(ax: "plt.Axes", gpu: "GPUSpec", modes: list[str], peaks: dict[str, float], x_lo: float,
                x_hi: float) -> None:
    """Draws the memory roof and one compute roof per math mode, each peak annotated at its ridge point."""
    bw = gpu.memory_bandwidth_bytes_per_s
    x = np.logspace(math.log10(x_lo), math.log10(x_hi), 400)
    ax.plot(x, np.minimum(bw * x, max(peaks.values())), color="black", lw=1.8, zorder=2,
            label=f"memory roof {gpu.memory_bandwidth_gb_s:.0f} GB/s")
    for i, m in enumerate(modes):
        ridge = peaks[m] / bw
        xr = x[x >= ridge]
        ax.plot(np.concatenate([[ridge], xr]), np.full(len(xr) + 1, peaks[m]), color="black", lw=1.2,
                ls=ROOF_STYLES[i % len(ROOF_STYLES)], zorder=2, label=f"{m} roof {_fmt_flops(peaks[m])}")
        ax.annotate(f"{m} peak", (ridge, peaks[m]), xytext=(-4, 3), textcoords="offset points", ha="right",
                    va="bottom", fontsize=9)


def _draw_ops(ax: "plt.Axes", ops: pd.DataFrame, device_time_s: float, label_top: int) -> list[str]:
    """Draws the ops by category, numbers the `label_top` slowest; returns the key's line for each of them."""
    key_lines: list[str] = []
    if not len(ops):
        return key_lines
    t_max = float(ops["time_s"].max())
    sizes = 12 + 400 * ops["time_s"] / t_max  # area proportional to predicted time, smallest still visible
    for cat, group in sorted(ops.groupby("category"), key=lambda kv: -kv[1]["time_s"].sum()):
        share = 100 * group["time_s"].sum() / max(device_time_s, 1e-30)
        ax.scatter(group["ai"], group["shown"], s=sizes[group.index], c=[_colour(cat)], alpha=0.65,
                   edgecolors="black", linewidths=0.4, zorder=3, label=f"{cat} ({share:.0f}% of time)")
    # Hot ops get numbers at the points and a key beside the plot: repeated layers sit on the same
    # spot, so free-floating text labels would pile up unreadably.
    top = ops.nlargest(label_top, "time_s")
    spots: dict[tuple[float, float], list[int]] = {}
    for k, r in enumerate(top.itertuples(), start=1):
        lx, ly = math.log10(r.ai), math.log10(r.shown)
        # Ops within ~0.1 decade share one label: separate labels there would print over each other.
        near = next((s for s in spots if abs(s[0] - lx) < 0.12 and abs(s[1] - ly) < 0.12), (lx, ly))
        spots.setdefault(near, []).append(k)
        name = r.op.removeprefix("aten.").split(".")[0]
        key_lines.append(f"{k:>2}  {name[:22]}\n    {(r.module or '(top level)')[-28:]}  "
                         f"{r.time_s * 1e6:.1f} us, {r.phase}")
    for (lx, ly), ks in spots.items():
        ax.annotate(",".join(map(str, ks)), (10 ** lx, 10 ** ly), xytext=(6, 6), textcoords="offset points",
                    fontsize=8, fontweight="bold", zorder=4,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="#888888", lw=0.5, alpha=0.85))
    return key_lines


def _style_axes(ax: "plt.Axes", x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> None:
    """Sets the log scales, limits, axis labels and grids of the roofline axes."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s (predicted)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.08)


def _plot_note(skipped: int, below: int, floor: float) -> str:
    """The note in the plot's corner: what marker area means and which ops are not drawn to scale."""
    note = "marker area ∝ predicted time"
    if skipped:
        note += f"; {_ops(skipped)} without FLOPs not shown"
    if below:
        note += f"; {_ops(below)} below {_fmt_flops(floor)} drawn at the bottom"
    return note


def _draw_legend(ax: "plt.Axes", key_ax: "plt.Axes") -> None:
    """Draws the roofline's legend in the key axes, with equal-size markers."""
    # The legend lives beside the plot: inside it would hide the ops that sit on the memory roof.
    handles, labels = ax.get_legend_handles_labels()
    legend = key_ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.0, 0.0), fontsize=8,
                           frameon=False, borderaxespad=0.0)
    for handle in legend.legend_handles:  # equal-size markers in the legend whatever the op times
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40])


def roofline_plot(est: "Estimate", path: str | Path, label_top: int = 8) -> Path:
    """Roofline of `est` on its GPU at `est.clock_mhz`, written to `path` (PNG/SVG/PDF by extension).

    x: arithmetic intensity (FLOP/byte), y: achieved FLOP/s = flops / predicted time; marker area is
    proportional to predicted time, colour is the op category; the `label_top` slowest ops are labelled.
    Metadata-only nodes and ops with no FLOPs or no bytes are left out (they have no place on a roofline).
    """
    from ..catalog import get_gpu

    path = Path(path)
    gpu = get_gpu(est.gpu)
    ops, skipped = _plotted_ops(est.per_node)
    modes, peaks = _roof_peaks(gpu, ops, est.clock_mhz)
    # A few tiny ops (a 16-element add) reach ~1e5 FLOP/s; showing them to scale would squash the
    # interesting decades, so they sit at a floor five decades under the top roof and are counted in the note.
    floor = max(peaks.values()) * 1e-5
    below = int((ops["achieved"] < floor).sum())
    ops["shown"] = ops["achieved"].clip(lower=floor)
    x_lo, x_hi, y_lo, y_hi = _axis_limits(ops, peaks, gpu.memory_bandwidth_bytes_per_s)

    fig, (ax, key_ax) = plt.subplots(1, 2, figsize=(12.5, 6.5), dpi=110, gridspec_kw={"width_ratios": [3.2, 1]})
    _draw_roofs(ax, gpu, modes, peaks, x_lo, x_hi)
    key_lines = _draw_ops(ax, ops, est.device_time_s, label_top)
    key_ax.axis("off")
    if key_lines:
        key_ax.text(0.0, 1.0, f"slowest {len(key_lines)} ops (predicted time)\n\n" + "\n".join(key_lines),
                    transform=key_ax.transAxes, va="top", ha="left", fontsize=8, family="monospace")
    _style_axes(ax, x_lo, x_hi, y_lo, y_hi)
    title = (f"{est.model} [{est.mode}, {est.precision}, batch {est.batch}] on {est.gpu} @ {est.clock_mhz:.0f} MHz")
    fig.suptitle(title, fontsize=11)
    ax.text(0.01, 0.99, _plot_note(skipped, below, floor), transform=ax.transAxes, fontsize=8, va="top",
            color="#444444")
    _draw_legend(ax, key_ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def sweep_plot(df: pd.DataFrame, path: str | Path) -> Path:
    """Predicted time per step (left axis, ms) and energy per step (right axis, J) against the swept
    setting, one panel per setting in `df["setting"]` ("clock", "power_limit"); minimum energy marked."""
    path = Path(path)
    if df is None or not len(df):
        raise ValueError("sweep_plot needs a non-empty DataFrame from gpuest.sweep()")
    settings = [s for s in SETTING_AXES if (df["setting"] == s).any()]
    if not settings:
        raise ValueError(f"sweep_plot: column 'setting' has none of {', '.join(SETTING_AXES)}")
    fig, axes = plt.subplots(1, len(settings), figsize=(6.2 * len(settings), 4.4), dpi=110, squeeze=False)
    for ax, setting in zip(axes[0], settings):
        col, xlabel = SETTING_AXES[setting]
        part = df[df["setting"] == setting].sort_values(col)
        x = part[col].to_numpy(float)
        ax.plot(x, part["time_s"] * 1e3, "o-", color="#1f77b4", ms=4, label="time / step")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("time per step (ms)", color="#1f77b4")
        ax.tick_params(axis="y", colors="#1f77b4")
        ax.grid(True, alpha=0.3)
        lines = ax.get_lines()
        top_ax = ax  # the legend goes on the topmost axes, else the twin's lines are drawn over it
        t = part["time_s"] * 1e3
        flat_t = float(t.max() - t.min()) < 1e-3 * max(float(t.max()), 1e-30)
        if flat_t:
            # A flat curve would autoscale to rounding noise; pin it in the upper part of the panel.
            ax.set_ylim(float(t.min()) * 0.85, float(t.max()) * 1.05)
        if part["energy_j"].notna().any():
            e = part["energy_j"]
            ax2 = top_ax = ax.twinx()
            # Dashed and hollow: time and energy often have the same shape and would hide each other.
            ax2.plot(x, e, "s--", color="#d62728", ms=5, mfc="white", label="energy / step")
            ax2.set_ylabel("energy per step (J)", color="#d62728")
            ax2.tick_params(axis="y", colors="#d62728")
            if float(e.max() - e.min()) < 1e-3 * max(abs(float(e.max())), 1e-30):
                ax2.set_ylim(float(e.min()) * 0.9, float(e.max()) * 1.4)  # lower part: not on top of time
            else:
                best = part.loc[e.idxmin()]
                unit = "MHz" if setting == "clock" else "W"
                tied = part.loc[e <= float(e.min()) * (1 + 1e-6), col]
                where = (f"{best[col]:.0f} {unit}" if len(tied) == 1
                         else f"{tied.min():.0f}-{tied.max():.0f} {unit} ({len(tied)} settings)")
                ax2.plot([best[col]], [best["energy_j"]], marker="*", color="#d62728", ms=14, ls="none",
                         markeredgecolor="black", label=f"min energy at {where}")
            lines += ax2.get_lines()
        flat_e = float(part["energy_j"].max() - part["energy_j"].min()) < 1e-3 * abs(float(part["energy_j"].max()))
        if flat_t and flat_e and setting == "power_limit" and "avg_power_w" in part:
            ax.text(0.5, 0.5, f"no limit binds: predicted average power {part['avg_power_w'].max():.0f} W\n"
                    f"is under the lowest limit swept ({x.min():.0f} W)", transform=ax.transAxes,
                    ha="center", va="center", fontsize=9, color="#444444",
                    bbox=dict(boxstyle="round", fc="white", ec="#bbbbbb"))
        # Below the panel: inside it, any corner can hide a curve.
        top_ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper center",
                      bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        gpu = part["gpu"].iloc[0] if "gpu" in part else ""
        ax.set_title(f"{gpu}: {'SM clock' if setting == 'clock' else 'power limit'} sweep", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
