"""The calibration suite's shape tables (gpuest/calibrate/suite/shapes/*.json) and their loader
(gpuest.calibrate.suite.shape_tables)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuest.calibrate.suite import all_benchmarks, shape_tables
from gpuest.calibrate.suite.shape_tables import TABLE_KEYS, ShapeTableError, shape_column, shape_table

SHAPES = Path(shape_tables.__file__).resolve().parent / "shapes"
PAIRS = {"why": "a reason", "columns": ["m", "n"], "rows": [[1, 2], [3, 4]]}


def _shipped() -> dict[tuple[str, str], dict]:
    return {(path.stem, name): spec for path in sorted(SHAPES.glob("*.json"))
            for name, spec in json.loads(path.read_text()).items()}


def test_every_shipped_table_is_read_by_the_suite(monkeypatch):
    served: set[tuple[str, str]] = set()
    lookup = shape_tables._lookup

    def recording(family: str, table: str) -> shape_tables._Table:
        served.add((family, table))
        return lookup(family, table)
    monkeypatch.setattr(shape_tables, "_lookup", recording)
    all_benchmarks()
    assert sorted(set(_shipped()) - served) == [], "tables no benchmark reads"


def test_every_shipped_row_has_one_value_per_column():
    for (family, name), spec in _shipped().items():
        assert list(spec) == list(TABLE_KEYS), (family, name)
        assert all(len(row) == len(spec["columns"]) for row in spec["rows"]), (family, name)
        assert len(shape_table(family, name)) == len(spec["rows"])


@pytest.fixture
def shapes_dir(tmp_path, monkeypatch):
    """A shapes folder of the test's own files in place of the shipped one."""
    monkeypatch.setattr(shape_tables, "_shapes_dir", lambda: tmp_path)
    shape_tables._family.cache_clear()
    yield tmp_path
    shape_tables._family.cache_clear()


def _write(folder: Path, family: str, tables: dict) -> None:
    (folder / f"{family}.json").write_text(json.dumps(tables))


def test_rows_come_back_as_tuples_nested_lists_too(shapes_dir):
    _write(shapes_dir, "toy", {"pairs": PAIRS, "sizes": {"why": "w", "columns": ["n"], "rows": [[5], [6]]},
                               "nested": {"why": "w", "columns": ["shape", "cell", "flag"],
                                          "rows": [[[1, [2, 3]], "lstm", True]]}})
    assert shape_table("toy", "pairs") == [(1, 2), (3, 4)]
    assert shape_column("toy", "sizes") == [5, 6]
    assert shape_table("toy", "nested") == [((1, (2, 3)), "lstm", True)]


def test_sub_group_tables_join_in_order_when_their_columns_agree(shapes_dir):
    _write(shapes_dir, "toy", {"pairs": PAIRS, "more": {**PAIRS, "rows": [[5, 6]]},
                               "sizes": {"why": "w", "columns": ["n"], "rows": [[7]]}})
    assert shape_table("toy", "pairs", "more") == [(1, 2), (3, 4), (5, 6)]
    with pytest.raises(ShapeTableError, match=r"table 'sizes' has columns \['n'\], table 'pairs' \['m', 'n'\]"):
        shape_table("toy", "pairs", "sizes")


@pytest.mark.parametrize("table, message", [
    ({**PAIRS, "rows": [[1, 2], [3]]}, "row 1 is [3]; accepted: a list of 2 values, one per column ['m', 'n']"),
    ({"why": "w", "columns": ["m"]}, "keys ['columns', 'why']; accepted: exactly why, columns, rows"),
    ({**PAIRS, "extra": 1}, "keys ['columns', 'extra', 'rows', 'why']; accepted: exactly why, columns, rows"),
    ({**PAIRS, "rows": [[1, 2.5]]}, "row 0 [1, 2.5]; accepted values: int, str, bool or a list of those"),
    ({**PAIRS, "why": " "}, '"why" must be a non-empty string'),
    ({**PAIRS, "columns": ["m", "m"]}, '"columns" must be a non-empty list of distinct names'),
    ({**PAIRS, "rows": []}, '"rows" must be a non-empty list of rows'),
])
def test_a_malformed_table_is_refused_naming_file_table_and_what_is_accepted(shapes_dir, table, message):
    _write(shapes_dir, "toy", {"bad": table})
    with pytest.raises(ShapeTableError) as raised:
        shape_table("toy", "bad")
    assert str(raised.value).startswith(f"gpuest/calibrate/suite/shapes/toy.json, table 'bad': {message}")


def test_an_unknown_family_or_table_is_refused_with_the_accepted_names(shapes_dir):
    _write(shapes_dir, "toy", {"pairs": PAIRS, "more": PAIRS})
    with pytest.raises(ShapeTableError, match=r"no shapes file .*shapes/nope\.json for family 'nope'; accepted: toy"):
        shape_table("nope", "pairs")
    with pytest.raises(ShapeTableError, match=r"shapes/toy\.json has no table 'other'; accepted: pairs, more"):
        shape_table("toy", "other")
    with pytest.raises(ShapeTableError, match="table 'pairs' has columns \\['m', 'n'\\]; shape_column reads"):
        shape_column("toy", "pairs")


def test_importing_gpuest_reads_no_table():
    code = ("import gpuest, gpuest.calibrate.suite; from gpuest.calibrate.suite import shape_tables; "
            "print(shape_tables._family.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "0"


def test_tables_read_after_the_deprecated_package_name_was_imported():
    code = ("import warnings; warnings.simplefilter('ignore'); from calibration.suite import all_benchmarks; "
            "print(len(all_benchmarks()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out.split()[-1]) == len(all_benchmarks())
