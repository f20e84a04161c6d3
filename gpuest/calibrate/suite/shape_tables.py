"""The suite's benchmark shapes as data: `shapes/<module>.json` holds the tables of suite/<module>.py, each
{"why": the reason for these shapes, "columns": what each value holds, "rows": [[...], ...]}. A file is read
on its first use (never at import) and checked whole; a row comes back as a tuple, a list inside it (a
tensor's shape) as a tuple too, so the builders see what literal tuples gave them."""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

TABLE_KEYS = ("why", "columns", "rows")
# JSON values a row may hold; floats are refused: a shape is exact (write 2 ** 20 as 1048576).
VALUE_TYPES = "int, str, bool or a list of those"


class ShapeTableError(ValueError):
    """A shape table that is missing or malformed."""


class _Table(NamedTuple):
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]


def shape_table(family: str, table: str, *more: str) -> list[tuple]:
    """The rows of `table` in shapes/<family>.json, each a tuple of its columns' values, followed by those
    of the `more` tables (of the same columns: sub-groups with reasons of their own)."""
    first = _lookup(family, table)
    rows = list(first.rows)
    for name in more:
        found = _lookup(family, name)
        if found.columns != first.columns:
            raise ShapeTableError(f"{_path(family)}: table {name!r} has columns {list(found.columns)}, table "
                                  f"{table!r} {list(first.columns)}; accepted: tables of the same columns")
        rows += found.rows
    return rows


def shape_column(family: str, table: str) -> list[Any]:
    """The values of a one-column table (a list of batch sizes, of element counts)."""
    found = _lookup(family, table)
    if len(found.columns) != 1:
        raise ShapeTableError(f"{_path(family)}: table {table!r} has columns {list(found.columns)}; "
                              "shape_column reads one-column tables only (use shape_table)")
    return [row[0] for row in found.rows]


def families() -> list[str]:
    """The families that have a shapes file."""
    return sorted(p.name.removesuffix(".json") for p in _shapes_dir().iterdir() if p.name.endswith(".json"))


def _lookup(family: str, table: str) -> _Table:
    tables = _family(family)
    if table not in tables:
        raise ShapeTableError(f"{_path(family)} has no table {table!r}; accepted: {', '.join(tables)}")
    return tables[table]


def _shapes_dir() -> Traversable:
    # The data package, not this one: importing a deprecated alias (calibration.suite) re-specs the suite
    # package as a plain module, which importlib.resources then refuses.
    return resources.files(f"{__package__}.shapes")


def _path(family: str) -> str:
    return f"gpuest/calibrate/suite/shapes/{family}.json"


@cache
def _family(family: str) -> dict[str, _Table]:
    """Every table of shapes/<family>.json, checked."""
    resource = _shapes_dir() / f"{family}.json"
    if not resource.is_file():
        raise ShapeTableError(f"no shapes file {_path(family)} for family {family!r}; "
                              f"accepted: {', '.join(families())}")
    try:
        data = json.loads(resource.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ShapeTableError(f"{_path(family)} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not data:
        raise ShapeTableError(f"{_path(family)} must map table names to tables; accepted: a non-empty JSON object")
    return {name: _checked(family, name, spec) for name, spec in data.items()}


def _checked(family: str, name: str, spec: Any) -> _Table:
    """`spec` as a table, or a ShapeTableError naming the file, the table and what is accepted."""
    where = f"{_path(family)}, table {name!r}"
    if not isinstance(spec, dict) or set(spec) != set(TABLE_KEYS):
        got = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        raise ShapeTableError(f"{where}: keys {got}; accepted: exactly {', '.join(TABLE_KEYS)}")
    why, columns, rows = (spec[k] for k in TABLE_KEYS)
    if not isinstance(why, str) or not why.strip():
        raise ShapeTableError(f"{where}: \"why\" must be a non-empty string giving the reason for the shapes")
    if not (isinstance(columns, list) and columns and all(isinstance(c, str) and c for c in columns)
            and len(set(columns)) == len(columns)):
        raise ShapeTableError(f"{where}: \"columns\" must be a non-empty list of distinct names; got {columns!r}")
    if not isinstance(rows, list) or not rows:
        raise ShapeTableError(f"{where}: \"rows\" must be a non-empty list of rows")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise ShapeTableError(f"{where}: row {i} is {row!r}; accepted: a list of {len(columns)} values, "
                                  f"one per column {columns}")
        if not all(_valid(v) for v in row):
            raise ShapeTableError(f"{where}: row {i} {row!r}; accepted values: {VALUE_TYPES}")
    return _Table(tuple(columns), tuple(_frozen(row) for row in rows))


def _valid(value: Any) -> bool:
    if isinstance(value, list):
        return all(_valid(v) for v in value)
    return isinstance(value, (int, str))  # bool is an int


def _frozen(value: Any) -> Any:
    """`value` with every list turned into a tuple."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
