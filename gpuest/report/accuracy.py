"""Accuracy report: gpuest's predictions against measured runs (`gpuest.calibrate.validate` results).

    python3 -m gpuest.report.accuracy results/*.jsonl -o docs/ACCURACY.md [--png docs/accuracy.png]

For each measured row (status ok) the same config is traced on the CPU (meta model, fake tensors) and
priced on the row's GPU with:
  calibrated  profile=None: the GPU's own calibrated profile (else gpuest's automatic choice, which
              the report names: transferred or prior)
  fresh       with --fresh GPU=PROFILE: the profile a fresh default calibration of that GPU gave (rows of
              that GPU only), set against the shipped one
  cross_gpu   the profile of the sibling GPU (H200 rows with the H100 profile and vice versa), when
              that profile exists in gpuest/profiles/
  roofline    profile="roofline": plain roofline with catalogue peaks (baseline)
  prior       profile="prior": uncalibrated prior assumptions (baseline)
and absolute percentage errors are summarised (MAPE, 90th percentile) for device-busy time, wall time,
average power and energy per iteration, split by mode, precision, family, GPU and held-out vs fitted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from ..calibrate.fit import PARTIAL_SUITE_SHARE
from ..evaluate.accuracy import (BUSY_WITH_ANNOTATIONS_NOTE, FRESH_MARGIN_PP, GPU_BOUND_FRACTION, PREDICTORS,
                                    QUANTITIES, RATIO_BOUNDS, SPLITS, WORST_SHOWN, align_per_op,
                                    compute_metrics, cross_profiles, evaluate_aims, fresh_comparison,
                                    load_results, predict_rows, test_split_summary)


# ================================================================== markdown

def _pct(v: Any) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f} %"


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("\\|", "|").replace("|", "\\|").replace("\n", " ") for c in r) + " |"
              for r in rows]
    return "\n".join(lines)


def _stats_rows(stats_by: dict[str, dict[str, Any]], label: str) -> list[list[Any]]:
    rows = []
    for k, st in stats_by.items():
        row = [f"{label}{k}"]
        for q in QUANTITIES:
            s = st[q]
            row.append(f"{_pct(s['mape'])} / {_pct(s['p90'])} (n={s['n']})" if s["n"] else "–")
        rows.append(row)
    return rows


def _si_time(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    return f"{s * 1e3:.3f} ms"


def test_split_markdown(df: pd.DataFrame) -> list[str]:
    t = test_split_summary(df)
    if not t or not t["n_configs"]:
        return []
    L = ["## Test split (headline)", "",
         f"The frozen test split: {t['n_models']} models of families the profiles never saw, drawn by seeded random "
         "samples before any was measured (`gpuest.evaluate.validation_set.TEST_MODELS`, `ARCHITECTURES_TEST_MODELS`, "
         f"`FAMILIES_TEST_MODELS`, `MOE_TEST_KEYS`); never used to fit, tune or choose anything. {t['n_configs']} "
         "configs, calibrated predictor.", ""]
    rows = [[a["aim"], f"≤ {a['target_pct']:g} %", _pct(a["mape_pct"]), a["n"],
             "no data" if a["met"] is None else ("**met**" if a["met"] else "**not met**")] for a in t["aims"]]
    rows.append([f"predicted / measured device time within [{RATIO_BOUNDS[0]:g}, {RATIO_BOUNDS[1]:g}]", "every config",
                 f"{t['outside_bounds']} outside", t["n_configs"], "**met**" if not t["outside_bounds"] else "**not met**"])
    L += [_md_table(["aim", "target", "MAPE", "n", "status"], rows), ""]
    if len(t["by_set"]) > 1:
        L += ["By validation set (`generalisation`: new dense families and recipes; `architectures`: a second draw "
              "of architectures neither had; `families`: a third draw, measured on the H200 only; `moe`: "
              "mixture-of-experts models, priced with the routing each measured step ran):", "",
              _md_table(["set", "models", "configs", "GPU-bound device time MAPE", "GPU-bound configs",
                         f"outside [{RATIO_BOUNDS[0]:g}, {RATIO_BOUNDS[1]:g}]"],
                        [[b["set"], b["n_models"], b["n_configs"], _pct(b["device_mape_pct"]), b["n_gpu_bound"],
                          b["outside_bounds"]] for b in t["by_set"]]), ""]
    for title, frame in ((f"Worst {WORST_SHOWN} test configs by predicted / measured device time", t["worst_test"]),
                         (f"Worst {WORST_SHOWN} configs of all rows by the same ratio "
                          f"({t['all_outside_bounds']} outside [{RATIO_BOUNDS[0]:g}, {RATIO_BOUNDS[1]:g}])",
                          t["worst_all"])):
        L += [f"**{title}**", "", _md_table(
            ["config", "GPU", "split", "measured device", "predicted device", "ratio"],
            [[f"`{r.key}`", r.gpu, r.split or ("held-out" if r.heldout else "fitted"), _si_time(r.meas_device_time),
              _si_time(r.pred_device_time), f"{r.ratio:.2f}"] for r in frame.itertuples(index=False)]), ""]
    return L


def fresh_markdown(df: pd.DataFrame) -> list[str]:
    rows = fresh_comparison(df)
    if not rows:
        return []
    table = [[r["gpu"], r["configs"], r["n"], _pct(r["shipped_mape"]), _pct(r["fresh_mape"]),
              f"{r['fresh_mape'] - r['shipped_mape']:+.1f} pp", "**met**" if r["met"] else "**not met**"]
             for r in rows]
    return ["## A fresh 5-minute calibration against the shipped profile", "",
            "`fresh`: the profile `gpuest fit` made of one default `gpuest calibrate` run (its micro-benchmarks and "
            "host probes), pricing the same configs as the shipped profile. A run that measured less than "
            f"{PARTIAL_SUITE_SHARE:.0%} of the suite corrects the level of the nearest other calibrated GPU's fits (its provenance names it, "
            "`shape_prior`; never the same GPU's shipped profile), inherits the finer fits it measured too few "
            "benchmarks of, and borrows that GPU's residual points where it measured nothing near them. The fit was "
            "developed on the H100 run; the H200 run is its first unseen check (data/calibration/fresh/, "
            "data/README.md). Aim: GPU-bound device-time MAPE "
            f"within {FRESH_MARGIN_PP:g} percentage point of the shipped profile's.", "",
            "The validation set is the 21 models the shipped profile's host costs were fitted on; the "
            "generalisation (issue 25), architectures, families, moe and recipes sets take part in neither "
            "profile's fit.", "",
            _md_table(["GPU", "configs", "GPU-bound configs", "shipped profile MAPE", "fresh profile MAPE",
                       "difference", "status"], table), ""]


def _quantity_header() -> list[str]:
    """Column titles of the per-quantity MAPE / P90 columns."""
    return [f"{QUANTITIES[q][2]} MAPE / P90" for q in QUANTITIES]


def _intro_lines(command: str) -> list[str]:
    """The title, the generation stamp, the command that regenerates the report and how errors are defined."""
    return [
        "# gpuest prediction accuracy",
        "",
        f"Generated {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
        f"`gpuest.report.accuracy`. Regenerate with:",
        "",
        f"    {command}",
        "",
        "Errors are absolute percentage errors |predicted − measured| / measured; MAPE is their mean, "
        "P90 their 90th percentile. Measured device-busy time is the union of GPU kernel intervals "
        "(torch.profiler) per iteration; wall time is the median CUDA-event time of one synchronised "
        "iteration; energy is the NVML energy counter over a ≥ 2 s window divided by iterations. "
        f"GPU-bound: measured device busy ≥ {GPU_BOUND_FRACTION:g} × wall time. Rows noted "
        f"\"{BUSY_WITH_ANNOTATIONS_NOTE}\" were measured before gpuest.calibrate.validate excluded "
        "annotations from the GPU timeline: their busy time also spans the optimizer step's "
        "record_function range, idle gaps included (data/README.md: "
        "validation/H100-SXM-busy-recheck.jsonl sizes it).",
        "",
    ]


def _sources_lines(rows: list[dict[str, Any]], skipped: list[dict[str, Any]], result_files: list[Path]) -> list[str]:
    """The Sources section: one table row per result file (rows, GPUs, dates, torch, driver) and the counts."""
    by_file: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_file[r["_source"]].append(r)
    src_rows = []
    for f in result_files:
        rs = by_file.get(str(f), [])
        gpus = sorted({r["gpu_canonical"] for r in rs})
        prov = (rs[0].get("provenance") or {}) if rs else {}
        dates = sorted(str(r.get("date", ""))[:10] for r in rs if r.get("date"))
        src_rows.append([f"`{f}`", len(rs), ", ".join(gpus) or "–",
                         f"{dates[0]}..{dates[-1]}" if dates else "–", prov.get("torch") or "–",
                         prov.get("driver_version") or "–"])
    n_held = sum(1 for r in rows if r.get("heldout"))
    return ["## Sources", "",
            _md_table(["file", "usable rows", "GPUs", "dates", "torch", "driver"], src_rows), "",
            f"{len(rows)} measured configs used ({n_held} of held-out models), {len(skipped)} skipped. "
            "Held-out models are never used for fitting or tuning.", ""]


def _aims_lines(aims: list[dict[str, Any]]) -> list[str]:
    """The Aims section: each aim's target, MAPE, n and status."""
    aim_rows = []
    for a in aims:
        status = "no data" if a["met"] is None else ("**met**" if a["met"] else "**not met**")
        aim_rows.append([a["aim"], a["scope"], f"≤ {a['target_pct']:g} %", _pct(a["mape_pct"]), a["n"], status])
    return ["## Aims", "",
            "Targets from the validation issue, judged on the MAPE over all configs and over held-out models "
            "only. \"no data\" means no measured row covers the aim (e.g. no calibrated profile or no second "
            "GPU yet); it is not a pass.", "",
            _md_table(["aim", "scope", "target", "MAPE", "n", "status"], aim_rows), ""]


def _profiles_used_lines(metrics: dict[str, Any], cross: dict[str, tuple[str, str]]) -> list[str]:
    """Which profiles the calibrated predictor used, and the cross-GPU pairs (or why there are none)."""
    L: list[str] = []
    cal = metrics.get("calibrated", {})
    if cal:
        sources = cal.get("profile_sources", {})
        L.append("Profiles the calibrated predictor actually used: "
                 + ", ".join(f"{k} × {v}" for k, v in sources.items())
                 + (". Rows priced with a `prior` or `transferred` profile are not calibrated on their own GPU."
                    if set(sources) - {"measured"} else "."))
        L.append("")
    if cross:
        L.append("Cross-GPU pairs: " + ", ".join(f"{g} rows priced with the {p} profile (`{_shown_path(path)}`)"
                                                 for g, (p, path) in cross.items()) + ".")
    else:
        L.append("Cross-GPU: no sibling profile (H100 / H200) is present in gpuest/profiles/, so the cross-GPU "
                 "check was skipped.")
    L.append("")
    return L


def _summary_lines(metrics: dict[str, Any]) -> list[str]:
    """The Summary by predictor section: MAPE / P90 of each predictor over four subsets of the rows."""
    summ = []
    for predictor in PREDICTORS:
        e = metrics.get(predictor)
        if not e:
            continue
        for scope in ("overall", "gpu_bound", "fitted", "heldout"):
            row = [predictor, scope.replace("_", "-")]
            for q in QUANTITIES:
                s = e[scope][q]
                row.append(f"{_pct(s['mape'])} / {_pct(s['p90'])} (n={s['n']})" if s["n"] else "–")
            summ.append(row)
    return ["## Summary by predictor", "",
            _md_table(["predictor", "subset", *_quantity_header()], summ), "",
            "Baselines: `roofline` is a plain roofline with catalogue peaks (no calibration, no launch or host "
            "cost); `prior` is gpuest's uncalibrated prior.", ""]


def _splits_lines(metrics: dict[str, Any]) -> list[str]:
    """One Splits section per calibrated and cross-GPU predictor: its errors by mode, precision, family, ..."""
    L: list[str] = []
    for predictor in ("calibrated", "cross_gpu"):
        e = metrics.get(predictor)
        if not e:
            continue
        split_rows = []
        for split in SPLITS:
            split_rows += _stats_rows(e[f"by_{split}"], f"{split.replace('_label', '')}: ")
        L += [f"## Splits: {predictor}", "", _md_table(["group", *_quantity_header()], split_rows), ""]
    return L


def _heldout_lines(metrics: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The Held-out models section: their names and the calibrated predictor's errors on them."""
    L = ["## Held-out models", ""]
    cal = metrics.get("calibrated", {})
    held_models = sorted({r["model"] for r in rows if r.get("heldout")})
    if held_models:
        L.append("Models: " + ", ".join(f"`{m}`" for m in held_models))
        L.append("")
        if cal:
            L.append(_md_table(["held-out subset", *_quantity_header()],
                               _stats_rows({"all": cal["heldout"], "GPU-bound": cal["gpu_bound_heldout"]}, "")))
    else:
        L.append("No held-out model was measured.")
    L.append("")
    return L


def _per_config_lines(df: pd.DataFrame) -> list[str]:
    """The Per-config results section: measured and predicted busy time, wall time and energy of every row."""
    L = ["## Per-config results (calibrated predictor)", ""]
    if len(df):
        c = df[df["predictor"] == "calibrated"].sort_values(["gpu", "family", "model", "batch", "mode", "precision"])
        crow = []
        for r in c.itertuples(index=False):
            crow.append([f"`{r.key}`" + (" (held-out)" if r.heldout else ""), r.gpu,
                         _si_time(r.meas_device_time), _si_time(r.pred_device_time), _pct(r.ape_device_time),
                         _si_time(r.meas_wall), _si_time(r.pred_wall), _pct(r.ape_wall),
                         "–" if r.meas_energy is None or pd.isna(r.meas_energy) else f"{r.meas_energy:.4g} J",
                         "–" if r.pred_energy is None or pd.isna(r.pred_energy) else f"{r.pred_energy:.4g} J",
                         _pct(r.ape_energy), "yes" if r.gpu_bound else "no", r.error or r.note])
        L.append(_md_table(["config", "GPU", "busy meas", "busy pred", "err", "wall meas", "wall pred", "err",
                            "energy meas", "energy pred", "err", "GPU-bound", "note"], crow))
    L.append("")
    return L


def _per_op_lines(per_op: list[dict[str, Any]]) -> list[str]:
    """The Per-op device time section (empty without per-op rows): coverage per config, then its top ops."""
    if not per_op:
        return []
    L = ["## Per-op device time (calibrated predictor)", "",
         "The profiler's top-level ATen ops of one iteration are aligned with the graph's nodes by sequence "
         "matching on normalised names (composite ops such as `aten::linear` are expanded into the ATen "
         "ops the graph records below autograd); only matched ops are compared. Coverage = measured time "
         "of the matched ops / whole-network device-busy time of that iteration (the thesis-style check "
         "that per-op times add up to the network). Op errors count ops ≥ 5 µs.", ""]
    prow = []
    for p in per_op:
        prow.append([f"`{p['key']}`", p["gpu"], f"{p['n_matched']}/{p['n_measured_ops']}",
                     f"{p['matched_measured_us'] / 1e3:.3f} ms", f"{p['matched_predicted_us'] / 1e3:.3f} ms",
                     f"{p['whole_network_measured_us'] / 1e3:.3f} ms", _pct(p["coverage_pct"]),
                     _pct(p["matched_sum_error_pct"]), _pct(p["weighted_ape_pct"]), _pct(p["op_mape_pct"])])
    L.append(_md_table(["config", "GPU", "matched ops", "matched meas", "matched pred", "network meas",
                        "coverage", "sum error", "time-weighted op APE", "op MAPE"], prow))
    L.append("")
    for p in per_op:
        L += [f"Top ops of `{p['key']}` on {p['gpu']}:", "",
              _md_table(["op", "count", "measured", "predicted", "pred/meas"],
                        [[f"`{name}`", n, f"{m / 1e3:.3f} ms", f"{pr / 1e3:.3f} ms",
                          f"{pr / m:.2f}" if m else "–"] for name, n, m, pr in p["by_op"][:10]]), ""]
    return L


def _skipped_lines(skipped: list[dict[str, Any]]) -> list[str]:
    """The Skipped rows section (empty when none was skipped): each row's config, GPU and reason."""
    if not skipped:
        return []
    return ["## Skipped rows", "",
            _md_table(["config", "GPU", "reason"], [[f"`{s['key']}`", s["gpu"], s["reason"]] for s in skipped]), ""]


def _scatter_lines(png: Path | None, out_md: Path) -> list[str]:
    """The Predicted vs measured section (empty without a PNG): the scatter plot, linked relative to the report."""
    if png is None:
        return []
    try:
        rel = Path(png).resolve().relative_to(Path(out_md).resolve().parent)
    except ValueError:
        rel = Path(png)
    return ["## Predicted vs measured", "", f"![predicted vs measured]({rel.as_posix()})", ""]


def render_markdown(*, metrics: dict[str, Any], aims: list[dict[str, Any]], df: pd.DataFrame,
                    rows: list[dict[str, Any]], skipped: list[dict[str, Any]], per_op: list[dict[str, Any]],
                    result_files: list[Path], out_md: Path, png: Path | None, command: str,
                    cross: dict[str, tuple[str, str]]) -> str:
    """The accuracy report's markdown, one section after another (each section's lines from its helper)."""
    return "\n".join([
        *_intro_lines(command),
        *_sources_lines(rows, skipped, result_files),
        *_aims_lines(aims),
        *test_split_markdown(df),
        *_profiles_used_lines(metrics, cross),
        *_summary_lines(metrics),
        *fresh_markdown(df),
        *_splits_lines(metrics),
        *_heldout_lines(metrics, rows),
        *_per_config_lines(df),
        *_per_op_lines(per_op),
        *_skipped_lines(skipped),
        *_scatter_lines(png, out_md),
    ])


def scatter_png(df: pd.DataFrame, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = df[(df["predictor"] == "calibrated") & df["error"].isna()] if len(df) else df
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    gpus = sorted(c["gpu"].unique()) if len(c) else []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (q, unit, scale) in zip(axes, (("device_time", "ms", 1e3), ("wall", "ms", 1e3), ("energy", "J", 1.0))):
        allv = []
        for gi, gpu in enumerate(gpus):
            for held, marker in ((False, "o"), (True, "x")):
                s = c[(c["gpu"] == gpu) & (c["heldout"] == held)]
                s = s[s[f"meas_{q}"].notna() & s[f"pred_{q}"].notna()]
                s = s[(s[f"meas_{q}"] > 0) & (s[f"pred_{q}"] > 0)]
                if s.empty:
                    continue
                m, p = s[f"meas_{q}"].astype(float) * scale, s[f"pred_{q}"].astype(float) * scale
                allv += list(m) + list(p)
                ax.scatter(m, p, marker=marker, color=colors[gi % len(colors)], alpha=0.8,
                           label=f"{gpu} {'held-out' if held else 'fitted'}")
        if allv:
            lo, hi = min(allv) / 1.5, max(allv) * 1.5
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.fill_between([lo, hi], [lo / 1.1, hi / 1.1], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        ax.set_title(QUANTITIES[q][2])
    fig.suptitle("gpuest predicted vs measured (calibrated predictor; band: ±10 %)")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _shown_path(path: str | Path) -> str:
    """A path relative to the working directory when it lies below it (reports must not embed a
    machine's absolute paths)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def op_holdout_markdown() -> str:
    """Per-op device-time accuracy on the calibration suite's held-out shapes, from the shipped profiles
    (written there by `gpuest fit`: the fitted model priced on benchmarks it never saw)."""
    from ..annotate.registry import CATEGORIES
    from ..profile import shipped_profiles
    profiles = shipped_profiles()
    if not profiles:
        return ""
    L = ["## Per-op accuracy on held-out calibration shapes", "",
         "Device time of single ops from the calibration suite whose shapes were held out of the fit "
         "(about 20 % of each category), priced with the full model (roofline, residual, latency); "
         "\"fitted benchmarks\" counts the category's training rows. Source: "
         "the `holdout_median_ape` / `holdout_p90_ape` fields `gpuest fit` writes into each shipped profile. "
         "Some categories hold out only a handful of shapes; docs/CROSS_VALIDATION.md scores every benchmark "
         "by a fit that did not see it (`python3 benchmarks/cross_validate.py --markdown docs/CROSS_VALIDATION.md`).",
         "",
         "| GPU | category | fitted benchmarks | held-out median APE | held-out P90 APE |", "|---|---|---|---|---|"]
    for gpu, prof in sorted(profiles.items()):
        for cat, fit in sorted(prof.residuals.items()):
            # per category; the finer op / op@mode fits carry their own figures in the profile JSON
            if fit.holdout_median_ape is None or cat not in CATEGORIES:
                continue
            L.append(f"| {gpu} | {cat} | {fit.n} | {fit.holdout_median_ape:.1f} % | {fit.holdout_p90_ape:.1f} % |")
    L.append("")
    return "\n".join(L)


# ================================================================== entry points

def build_report(result_files: list[Path], out_md: Path, *, png: Path | None = None, jobs: int = 1,
                 command: str | None = None, cross: dict[str, tuple[str, str]] | None = None,
                 fresh: dict[str, str] | None = None) -> dict[str, Any]:
    """Predict every measured row, write the markdown report (and the scatter PNG); return the metrics.
    fresh: GPU -> path of a profile from a fresh default calibration, set against the shipped one."""
    result_files = [Path(f) for f in result_files]
    out_md = Path(out_md)
    rows, skipped = load_results(result_files)
    cross = cross_profiles() if cross is None else cross
    df, nodes = predict_rows(rows, jobs=jobs, cross=cross, fresh=fresh) if rows else (pd.DataFrame(), {})
    if len(df):
        for rec in df[df["error"].notna() & (df["predictor"] == "calibrated")].itertuples(index=False):
            skipped.append({"key": rec.key, "gpu": rec.gpu, "reason": f"prediction failed: {rec.error}"})
    metrics = compute_metrics(df) if len(df) else {}
    aims = evaluate_aims(metrics)
    per_op = []
    for idx, predicted in sorted(nodes.items()):
        row = rows[idx]
        res = align_per_op(row["per_op"], predicted)
        per_op.append({"key": row["key"], "gpu": row["gpu_canonical"], **res})
    if command is None:
        command = ("python3 -m gpuest.report.accuracy " + " ".join(str(f) for f in result_files)
                   + f" -o {out_md}" + (f" --png {png}" if png else ""))
    out_md.parent.mkdir(parents=True, exist_ok=True)
    if png is not None:
        scatter_png(df, Path(png))
    md = render_markdown(metrics=metrics, aims=aims, df=df, rows=rows, skipped=skipped, per_op=per_op,
                         result_files=result_files, out_md=out_md, png=png, command=command, cross=cross)
    out_md.write_text(md + "\n\n" + op_holdout_markdown() + "\n")
    return {
        "source_files": [str(f) for f in result_files], "n_rows": len(rows), "skipped": skipped,
        "predictors": metrics, "aims": aims, "per_op": per_op,
        "gpu_bound_fraction": GPU_BOUND_FRACTION, "cross_gpu": {k: list(v) for k, v in cross.items()},
        "records": df.to_dict(orient="records") if len(df) else [], "fresh": fresh_comparison(df),
        "test_split": {k: v for k, v in test_split_summary(df).items() if not k.startswith("worst")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.report.accuracy",
                                description="Compare gpuest predictions with measured runs (gpuest.calibrate.validate).")
    p.add_argument("results", nargs="+", type=Path, help="results JSONL files")
    p.add_argument("-o", "--out", type=Path, default=Path("docs/ACCURACY.md"), help="markdown report to write")
    p.add_argument("--png", type=Path, default=None,
                   help="scatter plot (default: next to the report, <report stem>.png; 'none' to skip)")
    p.add_argument("--json", type=Path, default=None, help="also write the metrics as JSON")
    p.add_argument("--jobs", "-j", type=int, default=1, help="parallel trace/predict processes")
    p.add_argument("--fresh", action="append", default=[], metavar="GPU=PROFILE",
                   help="also price that GPU's rows with the profile of a fresh default calibration")
    args = p.parse_args(argv)
    fresh = {}
    for item in args.fresh:
        gpu, sep, path = item.partition("=")
        if not sep or not Path(path).exists():
            p.error(f"--fresh takes GPU=PROFILE with an existing profile file, got {item!r}")
        from ..catalog import get_gpu
        fresh[get_gpu(gpu).name] = path
    png = args.png if args.png is not None else args.out.with_suffix(".png")
    if str(png).lower() == "none":
        png = None
    command = ("python3 -m gpuest.report.accuracy " + " ".join(str(f) for f in args.results)
               + f" -o {args.out}" + (f" --png {png}" if args.png is not None and png is not None else "")
               + "".join(f" --fresh {item}" for item in args.fresh))
    metrics = build_report(args.results, args.out, png=png, jobs=args.jobs, command=command, fresh=fresh)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({k: v for k, v in metrics.items() if k != "records"}, indent=2,
                                        default=str))
    print(f"wrote {args.out}" + (f" and {png}" if png else "") + f" ({metrics['n_rows']} rows)")
    for a in metrics["test_split"].get("aims", []):
        print(f"  test split {a['aim']}: {_pct(a['mape_pct'])} (target <= {a['target_pct']:g} %, n={a['n']})")
    if metrics["test_split"]:
        print(f"  test split configs outside {RATIO_BOUNDS}: {metrics['test_split']['outside_bounds']}")
    for r in metrics["fresh"]:
        print(f"  fresh {r['gpu']} profile, {r['configs']}: GPU-bound device time {_pct(r['fresh_mape'])} against "
              f"the shipped {_pct(r['shipped_mape'])} (n={r['n']}): {'met' if r['met'] else 'NOT met'}")
    for a in metrics["aims"]:
        status = "no data" if a["met"] is None else ("met" if a["met"] else "NOT met")
        print(f"  {a['aim']} [{a['scope']}]: {_pct(a['mape_pct'])} (target <= {a['target_pct']:g} %, "
              f"n={a['n']}): {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
