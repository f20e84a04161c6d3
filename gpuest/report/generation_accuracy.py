"""Accuracy of LLM inference estimates against `gpuest.calibrate.generation_validate` measurements.

    python3 -m gpuest.report.generation_accuracy data/generation/*.jsonl -o docs/GENERATION.md

Each measured row (status ok, not a dry run) is priced on its GPU with the GPU's calibrated profile:
a decode or prefill row as the same greedy loop iteration (`capture.generation.trace_step`, priced by
`estimate_graph`), a generate row by `estimate_generation`. Absolute percentage errors of device-busy time,
wall time and energy per call are summarised per kind, model family and GPU, against the aims of issue 29
(decode-step device time <= 10 % MAPE, generate() wall time <= 15 %). Wall time and energy are priced twice:
with the profile's host costs as calibrated, and on the host that measured the row, at the host_scale of the
host probes taken just before and just after it (`host_probe`, `host_probe_after`: the geometric mean of their
scales, gpuest.calibrate.fit_host_scale), as a user prices their host after `gpuest host-probe`; rows measured
without a probe have no such prediction.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..jsonl import read_jsonl

AIMS = (("decode-step device time", "decode", "device", 10.0), ("generate() wall time", "generate", "wall", 15.0),
        ("generate() wall time on the measuring host (host probe)", "generate", "wall_host", 15.0))
QUANTITIES = {"device": ("device_busy_s", "device-busy time"), "wall": ("wall_s", "wall time"),
              "energy": ("energy_j", "energy"), "wall_host": ("wall_s", "wall time (host probe)"),
              "energy_host": ("energy_j", "energy (host probe)")}


# The on-host pairing of probes (before and after a row) was chosen on the rows measured before this UTC date;
# rows measured from it on score the choice out of sample.
HOST_PAIRING_CHOSEN_ON = "2026-11-28"
AFTER_PROBE_GAP_S = 30.0   # longest pause between a row's end and the next row's probe (a model's rebuild)


def _with_after_probes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one file in measured order, each probed row given the host probe taken right after it
    (`host_probe_after`): its own if it recorded one, else the next row's when that row started within
    AFTER_PROBE_GAP_S of this one's end (the same run; its probe ran before anything else)."""
    out = []
    for row, nxt in zip(rows, rows[1:] + [None]):
        if (row.get("host_probe") and not row.get("host_probe_after") and nxt and nxt.get("host_probe")
                and row.get("date") and nxt.get("date")):
            gap = (_dt.datetime.fromisoformat(nxt["date"]) - _dt.datetime.fromisoformat(row["date"])).total_seconds()
            # dates are whole seconds
            if -1.0 <= gap - float(row.get("elapsed_s") or 0.0) <= AFTER_PROBE_GAP_S:
                row = dict(row, host_probe_after=nxt["host_probe"])
        out.append(row)
    return out


def latest_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Usable rows, the last of each (config, GPU), with their probes after (_with_after_probes)."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for row in _with_after_probes(list(read_jsonl(path))):
            if row.get("status") == "ok" and not row.get("dry_run"):
                last[(row["key"], str(row.get("gpu")))] = row
    return list(last.values())


def host_scale_of(row: dict[str, Any], gpu: str) -> float:
    """The host_scale of the host that measured `row` (gpuest.calibrate.fit_host_scale): the geometric mean
    of the probes before and after it, or the one before where none followed; NaN without a probe."""
    from ..calibrate.fit_host_scale import probe_host_scale
    probes = [row[k] for k in ("host_probe", "host_probe_after") if row.get(k)]
    if not probes:
        return float("nan")
    return float(np.exp(np.mean([np.log(probe_host_scale(p, gpu).host_scale) for p in probes])))


def repeat_spreads(paths: Iterable[Path], kind: str = "generate") -> pd.DataFrame:
    """Configs of `kind` measured more than once on one GPU (every usable row, not only the last): per config
    the number of runs and the spread max/min - 1 of wall time and of device-busy time, the floor below which
    no prediction of one run can be checked. Only generate() rows by default: decode rows were re-measured
    after their protocol changed (the cache restored to contiguous tensors), so their runs differ in what
    they timed."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for row in read_jsonl(path):
            if row.get("status") == "ok" and not row.get("dry_run") and row.get("kind") == kind:
                runs.setdefault((row["key"], str(row.get("gpu_canonical") or row.get("gpu"))), []).append(row)
    out = []
    for (key, gpu), rows in runs.items():
        if len(rows) < 2:
            continue
        r0 = rows[0]
        rec = {"key": key, "kind": r0["kind"], "model": r0["model"], "batch": r0["batch"], "prompt": r0["prompt"],
               "new_tokens": r0["new_tokens"], "gpu": gpu, "runs": len(rows)}
        for q in ("wall", "device"):
            v = np.array([float(r[QUANTITIES[q][0]]) for r in rows])
            rec[f"{q}_min_s"], rec[f"{q}_max_s"] = float(v.min()), float(v.max())
            rec[f"{q}_spread"] = float(v.max() / v.min() - 1) * 100
        out.append(rec)
    return pd.DataFrame(out)


def predict(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One record per row: measured and predicted device time, wall time and energy (s, J)."""
    from ..capture.generation import decoder_facts, trace_step
    from ..capture.models import load_model
    from ..price.estimate import estimate_graph
    from ..price.generation import price_generation, trace_generation
    built: dict[str, Any] = {}
    out = []
    for row in sorted(rows, key=lambda r: r["model"]):
        spec, gpu = row["model"], row.get("gpu_canonical") or row["gpu"]
        if spec not in built:
            model = load_model(spec, batch=1, seq=1).model
            built = {spec: (model, decoder_facts(model, spec))}
        model, facts = built[spec]
        if row["kind"] == "generate":
            graphs = trace_generation(model, batch=row["batch"], prompt_tokens=row["prompt"],
                                      new_tokens=row["new_tokens"], precision=row["precision"], cache=row["cache"])

            def price(scale: float) -> Any:
                return price_generation(graphs, gpu, host_scale=scale, warn=False)
        else:
            decode = row["kind"] == "decode"
            context, query = (row["context"], 1) if decode else (0, row["prompt"])
            g = trace_step(model, facts, batch=row["batch"], context=context, query_tokens=query, cache=row["cache"],
                           max_len=context + query, precision=row["precision"], name=spec)

            def price(scale: float) -> Any:
                return estimate_graph(g, gpu, warn=False, host_scale=scale)
        est = price(1.0)
        scale = host_scale_of(row, gpu)
        on_host = price(scale) if scale == scale else None
        pred = {"device": est.device_time_s, "wall": est.time_s, "energy": est.energy_j,
                "wall_host": on_host.time_s if on_host else float("nan"),
                "energy_host": on_host.energy_j if on_host else float("nan")}
        rec = {"kind": row["kind"], "model": spec, "family": row.get("family", spec), "gpu": gpu,
               "batch": row["batch"], "context": row.get("context", 0), "prompt": row.get("prompt", 0),
               "new_tokens": row.get("new_tokens", 0), "python_per_step_s": row.get("generate_python_per_step_s"),
               "host_scale": scale, "date": str(row.get("date", ""))}
        for q, (field, _) in QUANTITIES.items():
            meas = row.get(field)
            rec[f"meas_{q}"] = float(meas) if isinstance(meas, (int, float)) else np.nan
            rec[f"pred_{q}"] = float(pred[q])
            rec[f"ape_{q}"] = abs(rec[f"pred_{q}"] / rec[f"meas_{q}"] - 1) * 100 if rec[f"meas_{q}"] > 0 else np.nan
        out.append(rec)
    return pd.DataFrame(out)


def _after_choice(df: pd.DataFrame) -> str:
    """The on-host wall-time MAPE of the generate() rows measured after the probe pairing was chosen."""
    later = df[(df["kind"] == "generate") & (df["date"] >= HOST_PAIRING_CHOSEN_ON)]["ape_wall_host"].dropna()
    if not len(later):
        return "No row was measured after it."
    return (f"The {len(later)} measured after it ({HOST_PAIRING_CHOSEN_ON} on): {_pct(float(later.mean()))} on their "
            f"own hosts, {_pct(float(df.loc[later.index, 'ape_wall'].mean()))} on the profile's.")


def _md(header: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _pct(v: float) -> str:
    return "-" if v != v else f"{v:.1f} %"


def _scale(v: float) -> str:
    return "-" if v != v else f"{v:.2f}"


def _ms(v: float) -> str:
    return "-" if v != v else f"{v * 1e3:.3f}"


def render(df: pd.DataFrame, sources: list[str], command: str, repeats: pd.DataFrame | None = None) -> str:
    lines = ["# LLM inference accuracy", "",
             f"Regenerated by `{command}` on {_dt.date.today().isoformat()} from "
             + ", ".join(f"`{s}`" for s in sources) + f" ({len(df)} measured configs).", ""]
    if df.empty:
        return "\n".join(lines + ["No usable rows."]) + "\n"
    lines += ["## Aims", ""]
    aim_rows = []
    for label, kind, q, target in AIMS:
        sub = df[df["kind"] == kind][f"ape_{q}"].dropna()
        mape = float(sub.mean()) if len(sub) else float("nan")
        aim_rows.append([label, len(sub), _pct(mape), f"<= {target:g} %",
                         "-" if mape != mape else ("met" if mape <= target else "not met")])
    lines += [_md(["aim", "configs", "MAPE", "target", ""], aim_rows), "",
              "On the measuring host: each probed row priced at the geometric mean of the host scales of the probes "
              "taken just before and just after it (docs/DESIGN.md, \"The host a generate() call runs on\"); that "
              "pairing was chosen on the rows measured before " + HOST_PAIRING_CHOSEN_ON + ", so on those the "
              "figure is in-sample. " + _after_choice(df), ""]
    lines += ["## MAPE by kind, family and GPU", ""]
    rows = []
    for (kind, family, gpu), sub in df.groupby(["kind", "family", "gpu"]):
        rows.append([kind, family, gpu, len(sub)] + [_pct(float(sub[f"ape_{q}"].mean())) for q in QUANTITIES])
    lines += [_md(["kind", "family", "GPU", "configs"] + [f"{label} MAPE" for _, label in QUANTITIES.values()],
                  rows), ""]
    gen = df[df["kind"] == "generate"]
    if not gen.empty:
        lines += ["## generate() calls", "",
                  "Times in ms. `host scale`: of the host probes taken just before and after the row "
                  "(`-`: none was). "
                  "`python/step`: measured generate() minus the same steps as a plain loop, per token "
                  "(the estimate's `generate_step` host cost stands for it).", ""]
        lines += [_md(["model", "GPU", "batch", "prompt", "new", "wall", "pred wall", "host scale",
                       "pred wall on host", "busy", "pred busy", "python/step"],
                      [[r.model, r.gpu, r.batch, r.prompt, r.new_tokens, _ms(r.meas_wall), _ms(r.pred_wall),
                        _scale(r.host_scale), _ms(r.pred_wall_host), _ms(r.meas_device), _ms(r.pred_device),
                        _ms(r.python_per_step_s or np.nan)] for r in gen.itertuples()]), ""]
    if repeats is not None and not repeats.empty:
        lines += ["## Run-to-run spread of generate() calls", "",
                  "Configs measured in more than one run (same code and protocol; runs minutes to days apart, each "
                  "on the host its machine came with): spread = largest / smallest - 1 of the runs' medians, times in "
                  "ms. The accuracy above uses each config's last run.", ""]
        summary = [[kind, gpu, len(sub), _pct(float(sub["device_spread"].median())),
                    _pct(float(sub["device_spread"].max())), _pct(float(sub["wall_spread"].median())),
                    _pct(float(sub["wall_spread"].max()))] for (kind, gpu), sub in repeats.groupby(["kind", "gpu"])]
        lines += [_md(["kind", "GPU", "configs", "busy spread median", "busy spread max", "wall spread median",
                       "wall spread max"], summary), ""]
        lines += [_md(["model", "GPU", "batch", "prompt", "new", "runs", "wall min", "wall max", "busy min",
                       "busy max"],
                      [[r.model, r.gpu, r.batch, r.prompt, r.new_tokens, r.runs, _ms(r.wall_min_s), _ms(r.wall_max_s),
                        _ms(r.device_min_s), _ms(r.device_max_s)] for r in repeats.itertuples()]), ""]
    dec = df[df["kind"] != "generate"]
    if not dec.empty:
        lines += ["## Decode steps and prefills", "", "Times in ms.", ""]
        lines += [_md(["kind", "model", "GPU", "batch", "context", "prompt", "busy", "pred busy", "wall", "pred wall",
                       "host scale", "pred wall on host"],
                      [[r.kind, r.model, r.gpu, r.batch, r.context, r.prompt, _ms(r.meas_device),
                        _ms(r.pred_device), _ms(r.meas_wall), _ms(r.pred_wall), _scale(r.host_scale),
                        _ms(r.pred_wall_host)] for r in dec.itertuples()]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpuest.report.generation_accuracy", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="JSONL files from gpuest.calibrate.generation_validate")
    p.add_argument("-o", "--out", type=Path, required=True, help="markdown report to write")
    args = p.parse_args(argv)
    command = "python3 -m gpuest.report.generation_accuracy " + " ".join(map(str, args.results)) + f" -o {args.out}"
    df = predict(latest_rows(args.results))
    args.out.write_text(render(df, [str(s) for s in args.results], command, repeat_spreads(args.results)))
    print(f"wrote {args.out} ({len(df)} configs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
