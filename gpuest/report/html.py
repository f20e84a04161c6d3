"""`html_report`: one self-contained HTML file for an Estimate (inline CSS and JS, plots as data URIs).

Nothing is fetched from the network when the page is opened: it can be mailed, archived or attached to CI.
"""
from __future__ import annotations

import base64
import html
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pandas as pd

from .text import fits_text, memory_text, seconds, si

if TYPE_CHECKING:
    from ..price.estimate import Estimate

HOT_OPS = 20
SWEEP_POINTS = 10

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;
  padding:1.2em 2em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd;
  padding-bottom:.2em} .sub{color:#666;margin-top:0}
table{border-collapse:collapse;font-size:.88em;margin:.5em 0}
th,td{padding:.25em .7em;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f5f5f5;cursor:pointer;user-select:none} th.nosort{cursor:default}
td.l,th.l{text-align:left} td.mod{max-width:28em;overflow:hidden;text-overflow:ellipsis}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:9em;background:#fafafa}
.card .k{font-size:.78em;color:#666} .card .v{font-size:1.25em;font-weight:600}
.bar{display:inline-block;height:.8em;background:#4c78a8;vertical-align:middle;border-radius:2px}
.b-compute{background:#e45756} .b-memory{background:#4c78a8} .b-latency{background:#9d9d9d}
.b-host{background:#f58518}
details{margin:.15em 0} details>summary{cursor:pointer} details table{margin-left:1.5em}
img.plot{max-width:100%;border:1px solid #eee}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.8em}
.note{color:#7a5c00;background:#fff8e1;padding:.3em .6em;border-radius:4px;margin:.3em 0}
"""

# Registered first so it sees errors from every later script; the page reports itself healthy only if
# no error fired and every plot decoded (the headless-browser test reads these attributes).
HEAD_JS = """window.__gpuestErrors=0;
window.addEventListener('error',function(){window.__gpuestErrors++;},true);"""

TAIL_JS = """
(function(){
  function key(td){var v=td.getAttribute('data-v');return v===null?td.textContent:parseFloat(v);}
  document.querySelectorAll('table.sortable').forEach(function(t){
    t.querySelectorAll('th').forEach(function(th,i){
      th.addEventListener('click',function(){
        var body=t.tBodies[0], rows=Array.prototype.slice.call(body.rows);
        var asc=th.getAttribute('data-dir')!=='asc'; th.setAttribute('data-dir',asc?'asc':'desc');
        rows.sort(function(a,b){var x=key(a.cells[i]),y=key(b.cells[i]);
          return (x<y?-1:x>y?1:0)*(asc?1:-1);});
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
  window.addEventListener('load',function(){
    var imgs=document.querySelectorAll('img.plot'), ok=0;
    imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0)ok++;});
    document.body.setAttribute('data-images-ok',ok+'/'+imgs.length);
    if(window.__gpuestErrors===0){document.body.setAttribute('data-js-ok','1');}
  });
})();
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _table(header: list[str], rows: Iterable[list[tuple[str, float | None] | str]], *, cls: str = "",
           left: int = 1) -> str:
    """An HTML table; a cell is text or (text, sort value); the first `left` columns are left-aligned."""
    th = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(header))
    body = []
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            text, value = (c if isinstance(c, tuple) else (c, None))
            attr = f' data-v="{value:.6g}"' if value is not None and math.isfinite(value) else ""
            cells.append(f'<td class="{"l" if i < left else ""}"{attr}>{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _joules(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.4g} J"


def _bar(share: float, cls: str = "") -> str:
    return f'<span class="bar {cls}" style="width:{max(100 * share, 0.0) * 1.5:.1f}px"></span> {100 * share:.1f}%'


def _summary(est: "Estimate") -> str:
    clock = f"{est.clock_mhz:.0f} MHz"
    if abs(est.effective_clock_mhz - est.clock_mhz) > 1:
        clock += f" (power-capped to {est.effective_clock_mhz:.0f} MHz avg at {est.power_limit_w:.0f} W)"
    cards = [("wall time / iteration", seconds(est.time_s)),
             ("90% interval", f"{seconds(est.time_low_s)} .. {seconds(est.time_high_s)}"),
             ("device busy", seconds(est.device_time_s)), ("host dispatch", seconds(est.host_time_s)),
             ("bound", est.bound), ("energy / iteration", _joules(est.energy_j)),
             ("average power", "n/a" if not math.isfinite(est.avg_power_w) else f"{est.avg_power_w:.4g} W"),
             ("energy-delay product", "n/a" if not math.isfinite(est.edp_js) else f"{est.edp_js:.4g} J*s"),
             ("peak memory", f"{memory_text(est)} {fits_text(est)}".strip())]
    html_cards = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div></div>'
                         for k, v in cards)
    notes = "".join(f'<div class="note">note: {_e(n)}</div>' for n in est.notes)
    return (f'<p class="sub">on <b>{_e(est.gpu)}</b> @ {_e(clock)}, launch={_e(est.launch)}; '
            f'profile: {_e(est.profile_source)} ({_e(est.profile_note)})</p>'
            f'<div class="cards" id="summary">{html_cards}</div>{notes}'
            f'<details><summary>text summary (as <code>print(est)</code>)</summary><pre>{_e(str(est))}</pre></details>')


def _memory(est: "Estimate") -> str:
    """Allocated bytes at the predicted peak by kind, and whether the step fits the GPU."""
    mem = est.memory
    if mem is None:
        return '<p class="note">The graph carries no storage events: memory is not predicted.</p>'
    peak = max(mem.peak_bytes, 1)
    rows = [[_e(k.replace("_", " ")), (si(v, "B"), v), (_bar(v / peak), v)] for k, v in mem.breakdown_bytes.items()]
    rows.append(["<b>peak allocated</b>", (si(mem.peak_bytes, "B"), mem.peak_bytes), ""])
    verdict = "fits" if mem.fits else "<b>does not fit</b> (out of memory)"
    return (f"<p>Predicted <code>torch.cuda.max_memory_allocated()</code> of one step after warm-up, by what the "
            f"allocated blocks hold at that moment. Peak reserved {_e(si(mem.peak_reserved_bytes, 'B'))}; "
            f"PyTorch may use {_e(si(mem.capacity_bytes, 'B'))} of {_e(est.gpu)}: the step {verdict}.</p>"
            + _table(["at the peak", "bytes", "share"], rows, cls="sortable memory"))


def _bounds(est: "Estimate") -> str:
    df = est.per_node[~est.per_node["free"]]
    total = max(est.device_time_s, 1e-30)
    timed = df[df["time_s"] > 0]  # host-only ops (no kernel) have bound "none" and no device time
    by_bound = timed.groupby("bound")["time_s"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    rows = [[_e(b), (str(int(r["size"])), r["size"]), (seconds(r["sum"]), r["sum"]),
             (_bar(r["sum"] / total, f"b-{b}"), r["sum"])] for b, r in by_bound.iterrows()]
    parts = [
        "<p>Device time of each op, grouped by what limits it (host: the GPU waited for the CPU to issue it).</p>",
        _table(["bound", "ops", "time", "share of device time"], rows, cls="sortable"),
    ]
    cats = est.by_category()
    rows = [[_e(c), (str(int(r.nodes)), r.nodes), (seconds(r.time_s), r.time_s), (_bar(r.share), r.share),
             (si(r.flops, "FLOP"), r.flops), (si(r.bytes, "B"), r.bytes), (_joules(r.energy_j), r.energy_j)]
            for c, r in cats.iterrows()]
    parts.append(_table(["category", "ops", "time", "share", "FLOPs", "bytes", "energy"], rows, cls="sortable"))
    return "".join(parts)


def _hot_ops(est: "Estimate", n: int = HOT_OPS) -> str:
    hot = est.hot_ops(n)
    rows = [[(str(k), k), _e(r.op.removeprefix("aten.")), f'<span title="{_e(r.module)}">{_e(r.module or "-")}</span>',
             _e(r.phase), _e(r.category), _e(r.math_mode), (si(r.flops, "FLOP"), r.flops), (si(r.bytes, "B"), r.bytes),
             (seconds(r.time_s), r.time_s), (f"{100 * r.share:.1f}%", r.share), _e(r.bound),
             (_joules(r.energy_j), r.energy_j)]
            for k, r in enumerate(hot.itertuples(), start=1)]
    return _table(["#", "op", "module", "phase", "category", "math", "FLOPs", "bytes", "time", "share", "bound",
                   "energy"], rows, cls="sortable hot", left=6)


def _modules(est: "Estimate") -> str:
    """Depth-1 modules as <details>, each opening onto its depth-2 children."""
    top = est.by_module(1)
    second = est.by_module(2)
    out = []
    for name, r in top.iterrows():
        kids = second[[k == name or k.startswith(name + ".") for k in second.index]]
        head = (f"<b>{_e(name)}</b> &mdash; {seconds(r.time_s)} ({100 * r.share:.1f}%), {int(r.nodes)} ops, "
                f"{si(r.flops, 'FLOP')}, {_joules(r.energy_j)}")
        if len(kids) <= 1 and (not len(kids) or kids.index[0] == name):
            out.append(f'<div class="leaf">&#8226; {head}</div>')
            continue
        rows = [[_e(k), (seconds(c.time_s), c.time_s), (f"{100 * c.share:.1f}%", c.share), (str(int(c.nodes)), c.nodes),
                 (si(c.flops, "FLOP"), c.flops), (si(c.bytes, "B"), c.bytes), (_joules(c.energy_j), c.energy_j)]
                for k, c in kids.iterrows()]
        out.append(f"<details><summary>{head}</summary>"
                   + _table(["module", "time", "share", "ops", "FLOPs", "bytes", "energy"], rows, cls="sortable")
                   + "</details>")
    return f'<div id="modules">{"".join(out)}</div>'


def _phases(est: "Estimate") -> str:
    df = est.per_node[~est.per_node["free"]]
    g = df.groupby("phase", sort=False).agg(ops=("op", "size"), time_s=("time_s", "sum"),
                                            energy_j=("energy_j", "sum"))
    total = max(float(g["energy_j"].sum()), 1e-30)
    rows = []
    for phase, r in g.iterrows():
        power = r.energy_j / r.time_s if r.time_s > 0 else float("nan")
        clock = est.phase_clocks_mhz.get(phase, float("nan"))
        rows.append([_e(phase), (str(int(r.ops)), r.ops), (seconds(r.time_s), r.time_s),
                     (_joules(r.energy_j), r.energy_j), (_bar(r.energy_j / total), r.energy_j),
                     (f"{power:.0f} W" if math.isfinite(power) else "n/a", power),
                     (f"{clock:.0f} MHz" if math.isfinite(clock) else "n/a", clock)])
    return ("<p>Energy per training/inference phase (kernel energy plus static power while the GPU waits).</p>"
            + _table(["phase", "ops", "device time", "energy", "share of energy", "avg power", "SM clock"], rows,
                     cls="sortable"))


def _auto_sweep(est: "Estimate") -> tuple[pd.DataFrame | None, str]:
    """A power-limit sweep over the GPU's whole limit range (at max clock), priced like `est`."""
    from ..catalog import get_gpu
    from ..price.sweep import sweep
    graph = est._graph
    if graph is None:
        return None, "no sweep: this Estimate was built without its graph"
    if est.profile_source == "user":
        return None, "no sweep: the estimate used a user profile; pass sweep_df=gpuest.sweep(..., profile=...)"
    spec = get_gpu(est.gpu)
    profile = "roofline" if est.profile_source == "roofline" else None
    limits = np.linspace(spec.power_limit_min_w, spec.power_limit_max_w, SWEEP_POINTS)
    df = sweep(graph, spec.name, power_limits=limits, launch=est.launch, profile=profile)
    return df, f"power limit swept from {limits[0]:.0f} to {limits[-1]:.0f} W at the max boost clock"


def html_report(est: "Estimate", path: str | Path, *, sweep_df: pd.DataFrame | None = None) -> Path:
    """Write a self-contained HTML report of `est` to `path` and return the path.

    Sections: summary, peak memory by kind, bound and category breakdown, top-20 ops, module tree (depths 1-2), roofline plot,
    and, when the estimate has energy: energy per phase and a sweep chart (`sweep_df`, else a power-limit
    sweep over the GPU's range computed here)."""
    from .plots import roofline_plot, sweep_plot

    path = Path(path)
    has_energy = math.isfinite(est.energy_j)
    with tempfile.TemporaryDirectory(prefix="gpuest-report-") as tmp:
        roof = _png_data_uri(roofline_plot(est, Path(tmp) / "roofline.png"))
        sweep_uri, sweep_caption = None, ""
        if has_energy:
            if sweep_df is None:
                sweep_df, sweep_caption = _auto_sweep(est)
            if sweep_df is not None and len(sweep_df):
                sweep_uri = _png_data_uri(sweep_plot(sweep_df, Path(tmp) / "sweep.png"))

    title = f"gpuest: {est.model} [{est.mode}, {est.precision}, batch {est.batch}] on {est.gpu}"
    sections = [
        f"<h1>{_e(title)}</h1>", _summary(est),
        "<h2 id='memory'>Peak memory</h2>", _memory(est),
        "<h2 id='bounds'>Where the time goes</h2>", _bounds(est),
        f"<h2 id='hot'>Top {HOT_OPS} ops by predicted time</h2>",
        "<p>Click a column header to sort.</p>", _hot_ops(est),
        "<h2 id='tree'>Modules</h2><p>Top-level modules; open one for its children.</p>", _modules(est),
        "<h2 id='roofline'>Roofline</h2>",
        f'<img class="plot" id="roofline-img" alt="roofline plot of {_e(est.model)} on {_e(est.gpu)}" src="{roof}">',
    ]
    if has_energy:
        sections += ["<h2 id='energy'>Energy by phase</h2>", _phases(est)]
        if sweep_uri:
            sections += ["<h2 id='sweep'>Power-limit / clock sweep</h2>",
                         f"<p>{_e(sweep_caption)}</p>" if sweep_caption else "",
                         f'<img class="plot" id="sweep-img" alt="time and energy sweep" src="{sweep_uri}">']
        elif sweep_caption:
            sections.append(f'<p class="note">{_e(sweep_caption)}</p>')
    else:
        sections.append('<p class="note">The profile has no power model: energy and power are not predicted.</p>')
    page = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{CSS}</style><script>{HEAD_JS}</script></head>"
        f"<body>{''.join(sections)}"
        f"<p class='sub'>generated by gpuest from a trace on fake tensors; nothing ran on a GPU.</p>"
        f"<script>{TAIL_JS}</script></body></html>\n"
    )
    path.write_text(page, encoding="utf-8")
    return path
