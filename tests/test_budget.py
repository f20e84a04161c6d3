"""Which benchmarks a calibration run of a given budget measures (gpuest.calibrate.budget)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuest.calibrate import budget
from gpuest.calibrate.budget import SUITE_BUDGET_S, fit_wall_model, plan, run_plan, stratum
from gpuest.calibrate.runner import HOST_PROBE_RESERVE_S
from gpuest.calibrate.suite import all_benchmarks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def grid():
    return all_benchmarks()


def test_every_budget_covers_every_category_and_dtype(grid):
    strata = {stratum(b) for b in grid if b.kind == "device"}
    probes = {b.name for b in grid if b.kind != "device"}
    for budget_s in (90, 300, 1200):
        chosen = plan(grid, budget_s).benchmarks
        assert {stratum(b) for b in chosen if b.kind == "device"} == strata, budget_s
        assert probes <= {b.name for b in chosen}


def test_a_longer_budget_only_adds_shapes(grid):
    shorter, longer = plan(grid, 200), plan(grid, 600)
    names = [b.name for b in longer.benchmarks]
    assert names[:len(shorter.benchmarks)] == [b.name for b in shorter.benchmarks]
    assert len(longer.benchmarks) > len(shorter.benchmarks) and longer.est_s <= 600 < plan(grid, 10**5).est_s


def test_the_default_suite_is_planned_inside_its_budget_with_the_host_probes():
    quick = run_plan("quick")
    assert quick.est_s + HOST_PROBE_RESERVE_S <= SUITE_BUDGET_S["quick"]
    assert len(run_plan("full").benchmarks) == len(all_benchmarks()) > len(quick.benchmarks)
    with pytest.raises(ValueError, match="accepted: quick, full"):
        run_plan("everything")


def test_strata_with_a_wider_residual_spread_get_more_shapes(grid):
    """Neyman allocation: doubling one category's residual sigma gives it more of a fixed budget."""
    sigmas = {b.category: 0.2 for b in grid}
    base = plan(grid, 240, sigmas=sigmas).benchmarks
    wide = plan(grid, 240, sigmas={**sigmas, "matmul": 0.4}).benchmarks
    count = lambda chosen: sum(b.category == "matmul" for b in chosen)  # noqa: E731
    assert count(wide) > count(base)


def test_wall_time_constants_are_what_the_committed_rows_give():
    fitted = fit_wall_model([ROOT / "data/calibration/fresh/H100-SXM-budget420.jsonl.gz"])
    for cat, seconds in budget.CATEGORY_OVERHEAD_S.items():
        assert seconds == pytest.approx(fitted[f"overhead_s[{cat}]"], abs=5e-4), cat
    assert budget.TRACE_SCALE == pytest.approx(fitted["trace_scale"], abs=5e-4)
    assert budget.POWER_WINDOW_EXTRA_S == pytest.approx(fitted["power_window_extra_s"], abs=5e-4)
    assert budget.POWER_OP_CALLS == pytest.approx(fitted["power_op_calls"], abs=0.05)
