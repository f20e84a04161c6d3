"""Evaluation: measured validation rows, selected (one per config and GPU) and priced by gpuest's
predictors; metrics, aims and the frozen test split's summary. Rendering is gpuest.report.accuracy's."""
from __future__ import annotations

import math
from collections import defaultdict
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..annotate.cuda_kernels import BATCH_NORM_CUDA, BATCH_NORM_EVAL, packet_name
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
# gpuest.calibrate.validate's device-busy source before it excluded GPU-timeline annotations: a training
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
# The frozen test split (gpuest.evaluate.validation_set.TEST_MODELS): aims on its configs, the headline.
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

def measured_routing(row: dict[str, Any]) -> tuple[float, ...] | None:
    """The expert shares a mixture-of-experts row's steps routed (its `routing_counts`, one list of slots
    per expert and routing decision): each decision's shares sorted hottest first, averaged over the
    decisions, since experts are alike in cost and only how unevenly they are loaded matters. None for
    rows that recorded no routing (dense models, MoE rows measured before it was recorded)."""
    counts = [np.sort(np.asarray(c, dtype=float))[::-1] for c in row.get("routing_counts") or [] if sum(c) > 0]
    if not counts or len({len(c) for c in counts}) != 1:
        return None
    shares = np.mean([c / c.sum() for c in counts], axis=0)
    return tuple(float(v) for v in shares / shares.sum())


def trace_key(row: dict[str, Any]) -> tuple:
    """The arguments of trace_config that a validation row was measured with."""
    return (row["model"], int(row["batch"]), row.get("seq"), row.get("image_size"), row["mode"], row["precision"],
            row.get("optimizer") or "adamw", row.get("memory_format") or "contiguous", measured_routing(row))


def trace_config(model: str, batch: int, seq: int | None, image_size: int | None, mode: str, precision: str,
                 optimizer: str = "adamw", memory_format: str = "contiguous",
                 routing: tuple[float, ...] | None = None) -> Any:
    """Trace a validation config on the meta device; routing: expert shares (None: balanced)."""
    from ..capture.models import load_model
    from ..capture.trace import trace
    loaded = load_model(model, batch=batch, seq=seq, image_size=image_size, device="meta",
                        memory_format=memory_format)
    return trace(loaded.model, loaded.example_inputs, mode=mode, precision=precision, optimizer=optimizer,
                 name=loaded.name, batch=loaded.batch, routing=list(routing) if routing else "balanced")


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


CONVOLUTION_OPS = frozenset({"aten.convolution.default", "aten._convolution.default"})
BIAS_ADD_OP = "aten.add_.Tensor"


def ops_as_profiled(per_node: pd.DataFrame) -> list[tuple[str, float]]:
    """(op, device s) per node as the profiler attributes time: a copy an op makes of its own input
    (a staged node, recorded just before it) counts inside that op, and so does a convolution's bias add
    (capture.recorder.CudaFunctionPaths records it as the add_ CUDA runs after cuDNN, in the
    convolution's module; the profiler nests it under aten::convolution)."""
    ops: list[tuple[str, float]] = []
    carried = 0.0
    n = len(per_node)
    modules = per_node["module"].astype(str).tolist() if "module" in per_node else [""] * n
    free = per_node["free"].astype(bool).tolist() if "free" in per_node else [False] * n
    conv: tuple[int, str] | None = None   # (entry, module) of the convolution just emitted, until a costed node
    for op, t, staged, module, is_free in zip(per_node["op"].astype(str), per_node["time_s"].astype(float),
                                              per_node["staged"], modules, free):
        if staged:
            carried += t
            continue
        if op == BIAS_ADD_OP and conv is not None and module == conv[1]:
            name, seconds = ops[conv[0]]
            ops[conv[0]] = (name, seconds + t + carried)
            carried, conv = 0.0, None
            continue
        ops.append((op, t + carried))
        carried = 0.0
        if not is_free:
            conv = (len(ops) - 1, module) if op in CONVOLUTION_OPS else None
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

# The profiler records a training or eval batch norm's forward as the composite aten::batch_norm (its kernel
# below it); the graph names the kernel (gpuest.annotate.cuda_kernels).
BATCH_NORM_FORWARD = frozenset(packet_name(op) for op in (
    BATCH_NORM_EVAL, *(op for (_, direction), op in BATCH_NORM_CUDA.items() if direction == "forward")))


def _norm_pred(op: str) -> str:
    parts = op.split(".")
    name = parts[1] if parts[0] == "aten" and len(parts) >= 2 else op
    return "batch_norm" if name in BATCH_NORM_FORWARD else name


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
    by_set = []
    sets = test["set"] if "set" in test else pd.Series("", index=test.index)
    for name, sub in test.groupby(sets.fillna("").replace("", "validation")):
        bound = sub.loc[sub["gpu_bound"], "ape_device_time"].dropna()
        by_set.append({"set": name, "n_configs": int(len(sub)), "n_models": int(sub["model"].nunique()),
                       "device_mape_pct": float(bound.mean()) if len(bound) else None, "n_gpu_bound": int(len(bound)),
                       "outside_bounds": int(((sub["ratio"] < RATIO_BOUNDS[0]) | (sub["ratio"] > RATIO_BOUNDS[1])).sum())})
    return {"n_configs": int(len(test)), "n_models": int(test["model"].nunique()), "aims": aims, "by_set": by_set,
            "outside_bounds": int(len(outside)), "worst_test": worst(test), "worst_all": worst(cal),
            "all_outside_bounds": int(((cal["ratio"] < RATIO_BOUNDS[0]) | (cal["ratio"] > RATIO_BOUNDS[1])).sum())}


# Validation sets of models outside the 21 the shipped profiles' host costs were fitted on (the quick, full
# and host sets, and rows without a set name, measure those 21).
SEPARATE_SETS = ("generalisation", "moe", "recipes", "architectures", "families")


def fresh_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per GPU with a fresh profile: GPU-bound device-time MAPE of the shipped (calibrated) and the fresh
    profile over the same configs, and whether the fresh one is within FRESH_MARGIN_PP."""
    if not len(df) or "fresh" not in set(df["predictor"]):
        return []
    out = []
    ok = df[df["error"].isna() & df["gpu_bound"]].copy()
    ok["configs"] = [f"{s} set" if s in SEPARATE_SETS else "validation set" for s in ok["set"].fillna("")]
    for gpu in sorted(set(ok.loc[ok["predictor"] == "fresh", "gpu"])):
        for configs in sorted(set(ok["configs"]), key=lambda c: (c != "validation set", c)) + ["all"]:
            sub = ok[(ok["gpu"] == gpu) & ((ok["configs"] == configs) | (configs == "all"))]
            both = sub.pivot_table(index="key", columns="predictor", values="ape_device_time")
            if not {"calibrated", "fresh"} <= set(both.columns):
                continue
            both = both[["calibrated", "fresh"]].dropna()
            shipped, fresh = float(both["calibrated"].mean()), float(both["fresh"].mean())
            out.append({"gpu": gpu, "configs": configs, "n": len(both), "shipped_mape": shipped, "fresh_mape": fresh,
                        "met": fresh <= shipped + FRESH_MARGIN_PP})
    return out
