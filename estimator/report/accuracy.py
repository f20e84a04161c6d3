"""Accuracy report: gpuest's predictions against measured runs (`calibration.validate` results).

    python3 -m estimator.report.accuracy results/*.jsonl -o docs/ACCURACY.md [--png docs/accuracy.png]

For each measured row (status ok) the same config is traced on the CPU (meta model, fake tensors) and
priced on the row's GPU with:
  calibrated  profile=None: the GPU's own calibrated profile (else gpuest's automatic choice, which
              the report names: transferred or prior)
  fresh       with --fresh GPU=PROFILE: the profile a fresh default calibration of that GPU gave (rows of
              that GPU only), set against the shipped one
  cross_gpu   the profile of the sibling GPU (H200 rows with the H100 profile and vice versa), when
              that profile exists in estimator/profiles/
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
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..jsonl import read_jsonl

PREDICTORS = ("calibrated", "fresh", "cross_gpu", "roofline", "prior")
# A fresh default calibration (gpuest calibrate, then gpuest fit of that file alone) must price the
# GPU-bound configs of its GPU within this many percentage points of the shipped profile's MAPE.
FRESH_MARGIN_PP = 1.0
# quantity -> (measured field, Estimate attribute, label)
QUANTITIES = {
    "device_time": ("device_busy_s", "device_time_s", "device-busy time / iteration"),
    "wall": ("wall_s", "time_s", "wall time / iteration"),
    "power": ("avg_power_w", "avg_power_w", "average power"),
    "energy": ("energy_j", "energy_j", "energy / iteration"),
}
GPU_BOUND_FRACTION = 0.8  # measured device busy >= 0.8 x wall
# calibration.validate's device-busy source before it excluded GPU-timeline annotations: a training
# row's busy time then also spans the optimizer step's annotation, idle gaps included.
BUSY_WITH_ANNOTATIONS = "profiler_gpu_events"
BUSY_WITH_ANNOTATIONS_NOTE = "busy incl. optimizer-step annotation"


def busy_spans_annotations(row: dict[str, Any]) -> bool:
    """Whether a validation row's device busy time also spans the optimizer step's annotation."""
    return row.get("mode") == "training" and row.get("device_busy_source") == BUSY_WITH_ANNOTATIONS

# Sibling GPUs for the cross-GPU check: rows on the key GPU are priced with a profile of a value GPU.
CROSS_GPU = {"H200": ("H100-SXM", "H100-PCIe"), "H100-SXM": ("H200",)}
# (name, predictor, quantity, subset, target MAPE %)
AIMS = (
    ("device time, GPU-bound configs", "calibrated", "device_time", "gpu_bound", 8.0),
    ("energy per iteration", "calibrated", "energy", "all", 10.0),
    ("wall time per iteration", "calibrated", "wall", "all", 15.0),
    ("cross-GPU device time, GPU-bound configs", "cross_gpu", "device_time", "gpu_bound", 12.0),
)
SPLITS = ("mode", "precision", "family", "gpu", "heldout_label")
# The frozen test split (calibration.validation_set.TEST_MODELS): aims on its configs, the headline.
TEST_AIMS = (("device time, GPU-bound configs", "device_time", True, 5.0),
             ("energy per iteration, GPU-bound configs", "energy", True, 8.0))
RATIO_BOUNDS = (0.5, 2.0)       # predicted / measured device time no config may leave
WORST_SHOWN = 10


# ================================================================== loading

def latest_per_config(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (config, GPU): the last of each, so a re-measurement replaces the row it repeats.
    Each row gets its config `key` filled in."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        row["key"] = row.get("key") or _key(row)
        last[(row["key"], str(row.get("gpu")))] = row
    return list(last.values())


def load_results(result_files: Iterable[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(usable rows, skipped rows with a reason). The last row of a (config, GPU) wins."""
    def tagged(path: Path) -> Iterable[dict[str, Any]]:
        for row in read_jsonl(path):
            row["_source"] = str(path)
            yield row
    latest = latest_per_config(row for path in result_files for row in tagged(Path(path)))
    rows, skipped = [], []
    for row in latest:
        reason = None
        if row.get("status") != "ok":
            reason = f"measurement failed: {row.get('error') or row.get('status')}"
        elif row.get("dry_run"):
            reason = "dry run (CPU): not a GPU measurement"
        elif row.get("wall_s") is None:
            reason = "no wall time"
        else:
            canonical = row.get("gpu_canonical") or _canonical(str(row.get("gpu")))
            if canonical is None:
                reason = f"GPU {row.get('gpu')!r} is not in the catalogue"
            row["gpu_canonical"] = canonical
        if reason:
            skipped.append({"key": row["key"], "gpu": row.get("gpu"), "reason": str(reason)[:200]})
        else:
            rows.append(row)
    return rows, skipped


def _key(row: dict[str, Any]) -> str:
    shape = f"s{row['seq']}" if row.get("seq") else (f"i{row['image_size']}" if row.get("image_size") else "-")
    return f"{row['model']}|b{row['batch']}|{shape}|{row['mode']}|{row['precision']}"


def _canonical(name: str) -> str | None:
    from ..catalog import get_gpu
    try:
        return get_gpu(name).name
    except Exception:  # noqa: BLE001
        return None


def cross_profiles() -> dict[str, tuple[str, str]]:
    """Row GPU -> (profile GPU, profile path) for the cross-GPU check, from the shipped profiles."""
    from ..profile import shipped_profiles
    shipped = shipped_profiles()
    out = {}
    for gpu, siblings in CROSS_GPU.items():
        for s in siblings:
            prof = shipped.get(s)
            if prof is not None and getattr(prof, "path", None):
                out[gpu] = (s, str(prof.path))
                break
    return out


# ================================================================== predicting

def trace_key(row: dict[str, Any]) -> tuple:
    """The arguments of trace_config that a validation row was measured with."""
    return (row["model"], int(row["batch"]), row.get("seq"), row.get("image_size"), row["mode"], row["precision"],
            row.get("optimizer") or "adamw", row.get("memory_format") or "contiguous")


def trace_config(model: str, batch: int, seq: int | None, image_size: int | None, mode: str, precision: str,
                 optimizer: str = "adamw", memory_format: str = "contiguous") -> Any:
    from ..capture.models import load_model
    from ..capture.trace import trace
    loaded = load_model(model, batch=batch, seq=seq, image_size=image_size, device="meta",
                        memory_format=memory_format)
    return trace(loaded.model, loaded.example_inputs, mode=mode, precision=precision, optimizer=optimizer,
                 name=loaded.name, batch=loaded.batch)


def _predict_group(tkey: tuple, items: list[tuple[int, str, str, Any, bool]]) -> dict[str, Any]:
    """Trace once, price for every (row index, gpu, predictor, profile, want per-node) item."""
    import warnings
    from ..price.estimate import estimate
    out: dict[str, Any] = {"preds": [], "nodes": {}, "error": None}
    try:
        graph = trace_config(*tkey)
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"trace failed: {type(exc).__name__}: {exc}"[:300]
        return out
    for idx, gpu, predictor, profile, want_nodes in items:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = estimate(graph, gpu=gpu, profile=profile)
        except Exception as exc:  # noqa: BLE001
            out["preds"].append((idx, predictor, {"error": f"{type(exc).__name__}: {exc}"[:300]}))
            continue
        out["preds"].append((idx, predictor, {
            "device_time_s": est.device_time_s, "time_s": est.time_s, "avg_power_w": est.avg_power_w,
            "energy_j": est.energy_j, "profile_source": est.profile_source, "profile_note": est.profile_note,
            "bound": est.bound}))
        if want_nodes:
            out["nodes"][idx] = ops_as_profiled(est.per_node)
    return out


def ops_as_profiled(per_node: pd.DataFrame) -> list[tuple[str, float]]:
    """(op, device s) per node as the profiler attributes time: a copy an op makes of its own input
    (a staged node, recorded just before it) counts inside that op."""
    ops: list[tuple[str, float]] = []
    carried = 0.0
    for op, t, staged in zip(per_node["op"].astype(str), per_node["time_s"].astype(float), per_node["staged"]):
        if staged:
            carried += t
            continue
        ops.append((op, t + carried))
        carried = 0.0
    return ops


def predict_rows(rows: list[dict[str, Any]], *, jobs: int = 1, cross: dict[str, tuple[str, str]] | None = None,
                 fresh: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict[int, list]]:
    """One record per (row, predictor) with measured and predicted values; per-node predictions
    (calibrated profile) for rows that carry per-op measurements. fresh: GPU -> profile path of the
    "fresh" predictor."""
    cross = cross_profiles() if cross is None else cross
    fresh = fresh or {}
    groups: dict[tuple, list] = defaultdict(list)
    for i, row in enumerate(rows):
        gpu = row["gpu_canonical"]
        want = bool(row.get("per_op"))
        tk = trace_key(row)
        groups[tk].append((i, gpu, "calibrated", None, want))
        groups[tk].append((i, gpu, "roofline", "roofline", False))
        groups[tk].append((i, gpu, "prior", "prior", False))
        if gpu in cross:
            groups[tk].append((i, gpu, "cross_gpu", cross[gpu][1], False))
        if gpu in fresh:
            groups[tk].append((i, gpu, "fresh", fresh[gpu], False))
    results = []
    if jobs > 1 and len(groups) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futs = [pool.submit(_predict_group, tk, items) for tk, items in groups.items()]
            results = [(tk, f.result()) for tk, f in zip(groups, futs)]
    else:
        results = [(tk, _predict_group(tk, items)) for tk, items in groups.items()]
    records, nodes = [], {}
    for tk, res in results:
        if res["error"]:
            for idx, _, predictor, _, _ in groups[tk]:
                records.append(_record(rows[idx], predictor, {"error": res["error"]}, cross))
            continue
        for idx, predictor, pred in res["preds"]:
            records.append(_record(rows[idx], predictor, pred, cross))
        nodes.update(res["nodes"])
    df = pd.DataFrame.from_records(records)
    return df, nodes


def _record(row: dict[str, Any], predictor: str, pred: dict[str, Any], cross: dict) -> dict[str, Any]:
    rec = {
        "key": row["key"], "gpu": row["gpu_canonical"], "model": row["model"], "family": row.get("family"),
        "batch": row["batch"], "mode": row["mode"], "precision": row["precision"],
        "heldout": bool(row.get("heldout")), "predictor": predictor, "split": row.get("split") or "",
        "set": row.get("set") or "",
        "heldout_label": "held-out" if row.get("heldout") else "fitted",
        "error": pred.get("error"), "profile_source": pred.get("profile_source"),
        "note": BUSY_WITH_ANNOTATIONS_NOTE if busy_spans_annotations(row) else "",
        "profile_gpu": cross.get(row["gpu_canonical"], (None,))[0] if predictor == "cross_gpu" else row["gpu_canonical"],
    }
    meas_wall = _num(row.get("wall_s"))
    meas_dev = _num(row.get("device_busy_s"))
    rec["gpu_bound"] = bool(meas_wall and meas_dev and meas_dev >= GPU_BOUND_FRACTION * meas_wall)
    for q, (mfield, pfield, _) in QUANTITIES.items():
        m = _num(row.get(mfield))
        p = _num(pred.get(pfield))
        rec[f"meas_{q}"] = m
        rec[f"pred_{q}"] = p
        rec[f"ape_{q}"] = abs(p - m) / m * 100.0 if (m and p is not None and m > 0) else np.nan
    return rec


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# ================================================================== metrics

def _stat(values: pd.Series) -> dict[str, Any]:
    v = values.dropna()
    if v.empty:
        return {"n": 0, "mape": None, "p90": None}
    return {"n": int(len(v)), "mape": float(v.mean()), "p90": float(np.percentile(v, 90))}


def _stats(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {q: _stat(df[f"ape_{q}"]) if f"ape_{q}" in df else _stat(pd.Series(dtype=float)) for q in QUANTITIES}


def compute_metrics(df: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for predictor in PREDICTORS:
        sub = df[df["predictor"] == predictor] if len(df) else df
        if sub.empty:
            continue
        ok = sub[sub["error"].isna()]
        entry: dict[str, Any] = {
            "n_rows": int(len(sub)), "n_failed": int(sub["error"].notna().sum()),
            "profile_sources": {str(k): int(v) for k, v in ok["profile_source"].value_counts().items()},
            "overall": _stats(ok),
            "gpu_bound": _stats(ok[ok["gpu_bound"]]),
            "heldout": _stats(ok[ok["heldout"]]),
            "fitted": _stats(ok[~ok["heldout"]]),
            "gpu_bound_heldout": _stats(ok[ok["gpu_bound"] & ok["heldout"]]),
        }
        for split in SPLITS:
            entry[f"by_{split}"] = {str(k): _stats(g) for k, g in ok.groupby(split, sort=True)}
        out[predictor] = entry
    return out


def evaluate_aims(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    aims = []
    for name, predictor, quantity, subset, target in AIMS:
        entry = metrics.get(predictor, {})
        all_key = "gpu_bound" if subset == "gpu_bound" else "overall"
        held_key = "gpu_bound_heldout" if subset == "gpu_bound" else "heldout"
        for scope, key in (("all", all_key), ("held-out", held_key)):
            stat = entry.get(key, {}).get(quantity, {"n": 0, "mape": None})
            mape = stat.get("mape")
            aims.append({"aim": name, "scope": scope, "predictor": predictor, "quantity": quantity, "subset": subset,
                         "target_pct": target, "mape_pct": mape, "n": stat.get("n", 0),
                         "met": None if mape is None else bool(mape <= target)})
    return aims


# ================================================================== per-op alignment

def _norm_pred(op: str) -> str:
    parts = op.split(".")
    return parts[1] if parts[0] == "aten" and len(parts) >= 2 else op


def _norm_meas(name: str) -> str:
    return name.split("::", 1)[-1]


def align_per_op(measured: dict[str, Any], predicted: list[tuple[str, float]]) -> dict[str, Any]:
    """Align the profiler's top-level ATen ops with the graph's nodes by sequence matching on normalised
    names (composite ops the graph records below autograd are expanded into their ATen children) and
    compare device times of the matched ops only."""
    pred_names = [_norm_pred(op) for op, _ in predicted]
    vocab = set(pred_names)
    meas: list[tuple[str, float]] = []
    for entry in measured.get("ops", []):
        name, us = str(entry[0]), float(entry[1])
        children = entry[2] if len(entry) > 2 else []
        n = _norm_meas(name)
        if n not in vocab and children and any(_norm_meas(c[0]) in vocab for c in children):
            meas.extend((_norm_meas(c[0]), float(c[1])) for c in children)
        else:
            meas.append((n, us))
    sm = SequenceMatcher(None, [m[0] for m in meas], pred_names, autojunk=False)
    pairs = []
    for a, b, size in sm.get_matching_blocks():
        for k in range(size):
            pairs.append((meas[a + k][0], meas[a + k][1], predicted[b + k][1] * 1e6))
    matched_meas = sum(p[1] for p in pairs)
    matched_pred = sum(p[2] for p in pairs)
    total_meas = _num(measured.get("iteration_device_busy_us")) or _num(measured.get("sum_top_level_us")) or 0.0
    by_op: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, m, p in pairs:
        agg = by_op[name]
        agg[0] += 1
        agg[1] += m
        agg[2] += p
    significant = [(m, p) for _, m, p in pairs if m >= 5.0]  # ops >= 5 us: below that, timer/launch noise
    return {
        "n_measured_ops": len(meas), "n_predicted_ops": len(predicted), "n_matched": len(pairs),
        "matched_measured_us": matched_meas, "matched_predicted_us": matched_pred,
        "whole_network_measured_us": total_meas,
        "coverage_pct": matched_meas / total_meas * 100.0 if total_meas else None,
        "matched_sum_error_pct": (matched_pred - matched_meas) / matched_meas * 100.0 if matched_meas else None,
        "weighted_ape_pct": (sum(abs(p - m) for m, p in significant) / sum(m for m, _ in significant) * 100.0
                             if significant else None),
        "op_mape_pct": (float(np.mean([abs(p - m) / m * 100.0 for m, p in significant])) if significant else None),
        "n_significant": len(significant),
        "by_op": sorted(([k, v[0], v[1], v[2]] for k, v in by_op.items()), key=lambda r: -r[2]),
    }


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


def test_split_summary(df: pd.DataFrame) -> dict[str, Any]:
    """The calibrated predictor on the frozen test split: the TEST_AIMS, predicted / measured device time
    of every test config, how many leave RATIO_BOUNDS, and the WORST_SHOWN configs by ratio (test split
    and all rows)."""
    if not len(df):
        return {}
    cal = df[(df["predictor"] == "calibrated") & df["error"].isna()].copy()
    cal["ratio"] = cal["pred_device_time"] / cal["meas_device_time"]
    test = cal[cal["split"] == "test"]
    worst = lambda d: d.reindex(np.abs(np.log(d["ratio"])).sort_values(ascending=False).index).head(WORST_SHOWN)  # noqa: E731
    aims = []
    for name, q, bound_only, target in TEST_AIMS:
        sub = test[test["gpu_bound"]] if bound_only else test
        ape = sub[f"ape_{q}"].dropna()
        mape = float(ape.mean()) if len(ape) else None
        aims.append({"aim": name, "target_pct": target, "mape_pct": mape, "n": int(len(ape)),
                     "met": None if mape is None else mape <= target})
    outside = test[(test["ratio"] < RATIO_BOUNDS[0]) | (test["ratio"] > RATIO_BOUNDS[1])]
    return {"n_configs": int(len(test)), "n_models": int(test["model"].nunique()), "aims": aims,
            "outside_bounds": int(len(outside)), "worst_test": worst(test), "worst_all": worst(cal),
            "all_outside_bounds": int(((cal["ratio"] < RATIO_BOUNDS[0]) | (cal["ratio"] > RATIO_BOUNDS[1])).sum())}


def test_split_markdown(df: pd.DataFrame) -> list[str]:
    t = test_split_summary(df)
    if not t or not t["n_configs"]:
        return []
    L = ["## Test split (headline)", "",
         f"The frozen test split: {t['n_models']} models of families the profiles never saw, drawn by a seeded random "
         "sample before any was measured (`calibration.validation_set.TEST_MODELS`); never used to fit, tune or "
         f"choose anything. {t['n_configs']} configs, calibrated predictor.", ""]
    rows = [[a["aim"], f"≤ {a['target_pct']:g} %", _pct(a["mape_pct"]), a["n"],
             "no data" if a["met"] is None else ("**met**" if a["met"] else "**not met**")] for a in t["aims"]]
    rows.append([f"predicted / measured device time within [{RATIO_BOUNDS[0]:g}, {RATIO_BOUNDS[1]:g}]", "every config",
                 f"{t['outside_bounds']} outside", t["n_configs"], "**met**" if not t["outside_bounds"] else "**not met**"])
    L += [_md_table(["aim", "target", "MAPE", "n", "status"], rows), ""]
    for title, frame in ((f"Worst {WORST_SHOWN} test configs by predicted / measured device time", t["worst_test"]),
                         (f"Worst {WORST_SHOWN} configs of all rows by the same ratio "
                          f"({t['all_outside_bounds']} outside [{RATIO_BOUNDS[0]:g}, {RATIO_BOUNDS[1]:g}])",
                          t["worst_all"])):
        L += [f"**{title}**", "", _md_table(
            ["config", "GPU", "split", "measured device", "predicted device", "ratio"],
            [[f"`{r.key}`", r.gpu, r.split or ("held-out" if r.heldout else "fitted"), _si_time(r.meas_device_time),
              _si_time(r.pred_device_time), f"{r.ratio:.2f}"] for r in frame.itertuples(index=False)]), ""]
    return L


def fresh_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per GPU with a fresh profile: GPU-bound device-time MAPE of the shipped (calibrated) and the fresh
    profile over the same configs, and whether the fresh one is within FRESH_MARGIN_PP."""
    if not len(df) or "fresh" not in set(df["predictor"]):
        return []
    out = []
    ok = df[df["error"].isna() & df["gpu_bound"]].copy()
    ok["configs"] = np.where(ok["set"] == "generalisation", "generalisation set", "validation set")
    for gpu in sorted(set(ok.loc[ok["predictor"] == "fresh", "gpu"])):
        for configs in ("validation set", "generalisation set", "all"):
            sub = ok[(ok["gpu"] == gpu) & ((ok["configs"] == configs) | (configs == "all"))]
            both = sub.pivot_table(index="key", columns="predictor", values="ape_device_time")
            if not {"calibrated", "fresh"} <= set(both.columns):
                continue
            both = both[["calibrated", "fresh"]].dropna()
            shipped, fresh = float(both["calibrated"].mean()), float(both["fresh"].mean())
            out.append({"gpu": gpu, "configs": configs, "n": len(both), "shipped_mape": shipped, "fresh_mape": fresh,
                        "met": fresh <= shipped + FRESH_MARGIN_PP})
    return out


def fresh_markdown(df: pd.DataFrame) -> list[str]:
    rows = fresh_comparison(df)
    if not rows:
        return []
    table = [[r["gpu"], r["configs"], r["n"], _pct(r["shipped_mape"]), _pct(r["fresh_mape"]),
              f"{r['fresh_mape'] - r['shipped_mape']:+.1f} pp", "**met**" if r["met"] else "**not met**"]
             for r in rows]
    return ["## A fresh 5-minute calibration against the shipped profile", "",
            "`fresh`: the profile `gpuest fit` made of one default `gpuest calibrate` run (its micro-benchmarks and "
            "host probes alone), pricing the same configs as the shipped profile. Aim: GPU-bound device-time MAPE "
            f"within {FRESH_MARGIN_PP:g} percentage point of the shipped profile's.", "",
            "The validation set is the 21 models the shipped profile's host costs were fitted on; the "
            "generalisation set (issue 25) takes part in neither profile's fit.", "",
            _md_table(["GPU", "configs", "GPU-bound configs", "shipped profile MAPE", "fresh profile MAPE",
                       "difference", "status"], table), ""]


def render_markdown(*, metrics: dict[str, Any], aims: list[dict[str, Any]], df: pd.DataFrame,
                    rows: list[dict[str, Any]], skipped: list[dict[str, Any]], per_op: list[dict[str, Any]],
                    result_files: list[Path], out_md: Path, png: Path | None, command: str,
                    cross: dict[str, tuple[str, str]]) -> str:
    q_header = [f"{QUANTITIES[q][2]} MAPE / P90" for q in QUANTITIES]
    L: list[str] = []
    L.append("# gpuest prediction accuracy")
    L.append("")
    L.append(f"Generated {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} by "
             f"`estimator.report.accuracy`. Regenerate with:")
    L.append("")
    L.append(f"    {command}")
    L.append("")
    L.append("Errors are absolute percentage errors |predicted − measured| / measured; MAPE is their mean, "
             "P90 their 90th percentile. Measured device-busy time is the union of GPU kernel intervals "
             "(torch.profiler) per iteration; wall time is the median CUDA-event time of one synchronised "
             "iteration; energy is the NVML energy counter over a ≥ 2 s window divided by iterations. "
             f"GPU-bound: measured device busy ≥ {GPU_BOUND_FRACTION:g} × wall time. Rows noted "
             f"\"{BUSY_WITH_ANNOTATIONS_NOTE}\" were measured before calibration.validate excluded "
             "annotations from the GPU timeline: their busy time also spans the optimizer step's "
             "record_function range, idle gaps included (data/README.md: "
             "validation/H100-SXM-busy-recheck.jsonl sizes it).")
    L.append("")
    L.append("## Sources")
    L.append("")
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
    L.append(_md_table(["file", "usable rows", "GPUs", "dates", "torch", "driver"], src_rows))
    L.append("")
    n_held = sum(1 for r in rows if r.get("heldout"))
    L.append(f"{len(rows)} measured configs used ({n_held} of held-out models), {len(skipped)} skipped. "
             "Held-out models are never used for fitting or tuning.")
    L.append("")

    L.append("## Aims")
    L.append("")
    L.append("Targets from the validation issue, judged on the MAPE over all configs and over held-out models "
             "only. \"no data\" means no measured row covers the aim (e.g. no calibrated profile or no second "
             "GPU yet); it is not a pass.")
    L.append("")
    aim_rows = []
    for a in aims:
        status = "no data" if a["met"] is None else ("**met**" if a["met"] else "**not met**")
        aim_rows.append([a["aim"], a["scope"], f"≤ {a['target_pct']:g} %", _pct(a["mape_pct"]), a["n"], status])
    L.append(_md_table(["aim", "scope", "target", "MAPE", "n", "status"], aim_rows))
    L.append("")
    L.extend(test_split_markdown(df))
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
        L.append("Cross-GPU: no sibling profile (H100 / H200) is present in estimator/profiles/, so the cross-GPU "
                 "check was skipped.")
    L.append("")

    L.append("## Summary by predictor")
    L.append("")
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
    L.append(_md_table(["predictor", "subset", *q_header], summ))
    L.append("")
    L.append("Baselines: `roofline` is a plain roofline with catalogue peaks (no calibration, no launch or host "
             "cost); `prior` is gpuest's uncalibrated prior.")
    L.append("")
    L.extend(fresh_markdown(df))

    for predictor in ("calibrated", "cross_gpu"):
        e = metrics.get(predictor)
        if not e:
            continue
        L.append(f"## Splits: {predictor}")
        L.append("")
        split_rows = []
        for split in SPLITS:
            split_rows += _stats_rows(e[f"by_{split}"], f"{split.replace('_label', '')}: ")
        L.append(_md_table(["group", *q_header], split_rows))
        L.append("")

    L.append("## Held-out models")
    L.append("")
    held_models = sorted({r["model"] for r in rows if r.get("heldout")})
    if held_models:
        L.append("Models: " + ", ".join(f"`{m}`" for m in held_models))
        L.append("")
        if cal:
            L.append(_md_table(["held-out subset", *q_header],
                               _stats_rows({"all": cal["heldout"], "GPU-bound": cal["gpu_bound_heldout"]}, "")))
    else:
        L.append("No held-out model was measured.")
    L.append("")

    L.append("## Per-config results (calibrated predictor)")
    L.append("")
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

    if per_op:
        L.append("## Per-op device time (calibrated predictor)")
        L.append("")
        L.append("The profiler's top-level ATen ops of one iteration are aligned with the graph's nodes by sequence "
                 "matching on normalised names (composite ops such as `aten::linear` are expanded into the ATen "
                 "ops the graph records below autograd); only matched ops are compared. Coverage = measured time "
                 "of the matched ops / whole-network device-busy time of that iteration (the thesis-style check "
                 "that per-op times add up to the network). Op errors count ops ≥ 5 µs.")
        L.append("")
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
            L.append(f"Top ops of `{p['key']}` on {p['gpu']}:")
            L.append("")
            L.append(_md_table(["op", "count", "measured", "predicted", "pred/meas"],
                               [[f"`{name}`", n, f"{m / 1e3:.3f} ms", f"{pr / 1e3:.3f} ms",
                                 f"{pr / m:.2f}" if m else "–"] for name, n, m, pr in p["by_op"][:10]]))
            L.append("")

    if skipped:
        L.append("## Skipped rows")
        L.append("")
        L.append(_md_table(["config", "GPU", "reason"],
                           [[f"`{s['key']}`", s["gpu"], s["reason"]]
                            for s in skipped]))
        L.append("")
    if png is not None:
        L.append("## Predicted vs measured")
        L.append("")
        try:
            rel = Path(png).resolve().relative_to(Path(out_md).resolve().parent)
        except ValueError:
            rel = Path(png)
        L.append(f"![predicted vs measured]({rel.as_posix()})")
        L.append("")
    return "\n".join(L)


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
        command = ("python3 -m estimator.report.accuracy " + " ".join(str(f) for f in result_files)
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
    p = argparse.ArgumentParser(prog="python3 -m estimator.report.accuracy",
                                description="Compare gpuest predictions with measured runs (calibration.validate).")
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
    command = ("python3 -m estimator.report.accuracy " + " ".join(str(f) for f in args.results)
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
