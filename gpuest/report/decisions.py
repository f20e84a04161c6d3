"""The decision log: every module-level constant of the model (pricing, features, memory, fit and budget),
its value, the reason its comment gives and the command that prints its evidence, read from the source
so the log cannot drift from the code.

    python3 -m gpuest.report.decisions -o docs/DECISIONS.md
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# Modules whose constants are modelling decisions (others hold schemas, names and formats); a folder ending
# in "/" stands for its modules, so a new formula family joins the log without an edit here.
MODULES = ("price/features.py", "price/device_time.py", "price/power.py", "price/host_timeline.py",
           "price/reduce_launch.py", "price/local_correction.py", "price/memory/peak.py",
           "price/memory/allocator.py", "price/memory/workspace.py", "annotate/registry.py",
           "annotate/formulas/", "capture/routing.py", "capture/fused_library_calls.py",
           "calibrate/fit.py", "calibrate/fit_power.py", "calibrate/fit_host.py", "calibrate/budget.py", "profile.py",
           "measurement_protocol.py")
COMMAND = re.compile(r"(benchmarks/[\w./]+\.py|python3 -m [\w.]+|data/[\w./-]+\.jsonl)")
MAX_VALUE_CHARS = 60


def constants(path: Path) -> list[dict[str, str]]:
    """UPPER_CASE module-level assignments of `path` with the comment block above or beside each."""
    source = path.read_text()
    lines = source.splitlines()
    out = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
            continue
        comment = []
        i = node.lineno - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            comment.insert(0, lines[i].lstrip("# ").rstrip())
            i -= 1
        inline = lines[node.lineno - 1].split("#", 1)
        if len(inline) == 2 and "=" in inline[0]:
            comment.append(inline[1].strip())
        if not comment and out and out[-1]["end"] == node.lineno - 1:
            comment = [f"(with `{out[-1]['name']}` above)"]   # one comment block explains a group
        value = ast.get_source_segment(source, node.value) or ""
        value = " ".join(value.split())
        text = " ".join(comment)
        out.append({"name": name, "value": value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + " …",
                    "why": text, "evidence": ", ".join(dict.fromkeys(COMMAND.findall(text))),
                    "end": node.end_lineno})
    return out


def _expand(modules: tuple[str, ...]) -> list[str]:
    """`modules` with each folder entry ("annotate/formulas/") replaced by its modules in name order."""
    out: list[str] = []
    for module in modules:
        if module.endswith("/"):
            out += [p.relative_to(PACKAGE).as_posix() for p in sorted((PACKAGE / module).glob("*.py"))]
        else:
            out.append(module)
    return out


def render(modules: tuple[str, ...] = MODULES) -> str:
    lines = ["# Decision log", "",
             "Every constant of the model, keyed by name: its value, why (the comment beside it in the code) and the "
             "command that prints its evidence. Generated from the source by `python3 -m gpuest.report.decisions "
             "-o docs/DECISIONS.md`; edit the comment in the code, not this file.", ""]
    for module in _expand(modules):
        rows = constants(PACKAGE / module)
        if not rows:
            continue
        lines += [f"## `gpuest/{module}`", "", "| constant | value | why | evidence |", "|---|---|---|---|"]
        for r in rows:
            cells = [f"`{r['name']}`", f"`{r['value']}`", r["why"] or "(no comment)",
                     ", ".join(f"`{c}`" for c in r["evidence"].split(", ")) if r["evidence"] else ""]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
