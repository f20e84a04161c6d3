"""Accuracy of LLM inference estimates against `gpuest.calibrate.generation_validate` measurements.

    python3 -m gpuest.report.generation_accuracy data/generation/*.jsonl -o docs/GENERATION.md

Each measured row (status ok, not a dry run) is priced on its GPU with the GPU's calibrated profile:
a decode or prefill row as the same greedy loop iteration (`capture.generation.trace_step`, priced by
`estimate_graph`), a generate row by `estimate_generation`. Absolute percentage errors of device-busy time,
wall time and energy per call are summarised per kind, model family and GPU, against the aims of issue 29
(decode-step device time <= 10 % MAPE, generate() wall time <= 15 %). Wall time and energy are priced twice:
with the profile's host costs as calibrated, and on the host that measured the row, at the host_scale of the
host probe taken just before it (`host_probe`, gpuest.calibrate.fit_host_scale), as a user prices their host
after `gpuest host-probe`; rows measured without a probe have no such prediction.
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


def latest_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Usable rows, the last of each (config, GPU)."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for row in read_jsonl(path):
            if row.get("status") == "ok" and not row.get("dry_run"):
                last[(row["key"], str(row.get("gpu")))] = row
    return list(last.values())


def predict(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One record per row: measured and predicted device time, wall time and energy (s, J)."""
    from ..capture.generation import decoder_facts, trace_step
    from ..capture.models import load_model
    from ..calibrate.fit_host_scale import probe_host_scale
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
        scale = probe_host_scale(row["host_probe"], gpu).host_scale if row.get("host_probe") else float("nan")
        on_host = price(scale) if scale == scale else None
        pred = {"device": est.device_time_s, "wall": est.time_s, "energy": est.energy_j,
                "wall_host": on_host.time_s if on_host else float("nan"),
                "energy_host": on_host.energy_j if on_host else float("nan")}
        rec = {"kind": row["kind"], "model": spec, "family": row.get("family", spec), "gpu": gpu,
               "batch": row["batch"], "context": row.get("context", 0), "prompt": row.get("prompt", 0),
               "new_tokens": row.get("new_tokens", 0), "python_per_step_s": row.get("generate_python_per_step_s"),
               "host_scale": scale}
        for q, (field, _) in QUANTITIES.items():
            meas = row.get(field)
            rec[f"meas_{q}"] = float(meas) if isinstance(meas, (int, float)) else np.nan
            rec[f"pred_{q}"] = float(pred[q])
            rec[f"ape_{q}"] = abs(rec[f"pred_{q}"] / rec[f"meas_{q}"] - 1) * 100 if rec[f"meas_{q}"] > 0 else np.nan
        out.append(rec)
    return pd.DataFrame(out)


def _md(header: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _pct(v: float) -> str:
    return "-" if v != v else f"{v:.1f} %"


def _scale(v: float) -> str:
    return "-" if v != v else f"{v:.2f}"


def _ms(v: float) -> str:
    return "-" if v != v else f"{v * 1e3:.3f}"


def render(df: pd.DataFrame, sources: list[str], command: str) -> str:
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
    lines += [_md(["aim", "configs", "MAPE", "target", ""], aim_rows), ""]
    lines += ["## MAPE by kind, family and GPU", ""]
    rows = []
    for (kind, family, gpu), sub in df.groupby(["kind", "family", "gpu"]):
        rows.append([kind, family, gpu, len(sub)] + [_pct(float(sub[f"ape_{q}"].mean())) for q in QUANTITIES])
    lines += [_md(["kind", "family", "GPU", "configs"] + [f"{label} MAPE" for _, label in QUANTITIES.values()],
                  rows), ""]
    gen = df[df["kind"] == "generate"]
    if not gen.empty:
        lines += ["## generate() calls", "",
                  "Times in ms. `host scale`: of the host probe taken just before the row (`-`: none was). "
                  "`python/step`: measured generate() minus the same steps as a plain loop, per token "
                  "(the estimate's `generate_step` host cost stands for it).", ""]
        lines += [_md(["model", "GPU", "batch", "prompt", "new", "wall", "pred wall", "host scale",
                       "pred wall on host", "busy", "pred busy", "python/step"],
                      [[r.model, r.gpu, r.batch, r.prompt, r.new_tokens, _ms(r.meas_wall), _ms(r.pred_wall),
                        _scale(r.host_scale), _ms(r.pred_wall_host), _ms(r.meas_device), _ms(r.pred_device),
                        _ms(r.python_per_step_s or np.nan)] for r in gen.itertuples()]), ""]
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
    args.out.write_text(render(df, [str(s) for s in args.results], command))
    print(f"wrote {args.out} ({len(df)} configs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
