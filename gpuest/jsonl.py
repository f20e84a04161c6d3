"""Reading the JSONL files that measurements are written to (calibration runs, validation runs).

One rule for every reader: blank lines are skipped; a last line that is not JSON is the torn write of
an interrupted run (the runners resume by re-measuring it) and is skipped with a warning; any other line
that is not a JSON object is corruption and raises an error naming the file and line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .errors import MeasuredDataError


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of `path`, one per line, in order (see the module docstring for bad lines)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
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
