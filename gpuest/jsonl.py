"""Reading the JSONL files that measurements are written to (calibration runs, validation runs).

One rule for every reader: blank lines are skipped; a last line that is not JSON is the torn write of
an interrupted run (the runners resume by re-measuring it) and is skipped with a warning; any other line
that is not a JSON object is corruption and raises an error naming the file and line.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Any

from .errors import MeasuredDataError


def read_text(path: str | Path) -> str:
    """The text of `path`, gunzipped when its name ends in .gz (closed data files are stored compressed)."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    return path.read_text()


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path`, gzipped when its name ends in .gz (no name or time in the header, so the
    same rows give the same bytes)."""
    path = Path(path)
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fh:
            fh.write(text.encode("utf-8"))
    else:
        path.write_text(text)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of `path` (gzipped if it ends in .gz), one per line, in order (see the module
    docstring for bad lines)."""
    path = Path(path)
    try:
        lines = read_text(path).splitlines()
    except (OSError, EOFError) as exc:
        raise MeasuredDataError(f"cannot read {path}: {exc}") from exc
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == last:
                warnings.warn(f"{path}:{n}: skipped a torn last line (an interrupted run; resume it to "
                              "measure that row again)", RuntimeWarning, stacklevel=2)
                continue
            raise MeasuredDataError(f"{path}:{n} is not a JSON row ({exc}); the file is corrupt (measured "
                                    "data is never edited by hand: restore it from version control)") from exc
        if not isinstance(row, dict):
            raise MeasuredDataError(f"{path}:{n} is {type(row).__name__}, not a JSON object (one row per line)")
        rows.append(row)
    return rows
