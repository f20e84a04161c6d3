"""Where a generated report goes: a file its command names, else standard output."""
from __future__ import annotations

from pathlib import Path


def write_or_print(text: str, out: str | Path | None) -> None:
    """Write `text` (UTF-8) to `out` and say so, or print it when no file is named."""
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        print(text, end="")
