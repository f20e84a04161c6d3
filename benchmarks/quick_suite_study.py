"""How well a profile fitted from a budget-limited calibration prices whole models, simulated offline.

The full calibration data of a GPU measured every benchmark of the suite, so the rows a shorter run
(the named "quick" suite, or any --budget-s) would measure are a subset of it: fitting that subset gives
the profile such a run would give, without a GPU. The script fits it (with the host probes of a real
fresh run, as `gpuest fit` does) and prices the validation configs of that GPU whose measured device
busy time is >= 0.8 x wall time (the accuracy report's GPU-bound configs) with it and with the shipped
profile, then prints the device-time MAPE of each and, per op category, the mean share of measured
device time by which the subset's profile moves the prediction away from the shipped one's.

    python3 benchmarks/quick_suite_study.py                        # quick suite, non-test configs
    python3 benchmarks/quick_suite_study.py --profile data/calibration/fresh/H100-SXM-quick.profile.json
    python3 benchmarks/quick_suite_study.py --split test           # the frozen test split: report only

Configs of the frozen test splits (gpuest.evaluate.validation_set.test_split_models) are priced only with
--split test, so nothing chosen with this script's default output has seen them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuest.calibrate.budget import SUITES, run_plan  # noqa: E402
from gpuest.calibrate.fit import (RawData, fit_profile, load_raw, load_validation, resolve_shape_prior,  # noqa: E402
                                  with_current_nodes)
from gpuest.evaluate.validation_set import test_split_models  # noqa: E402
from gpuest.profile import Profile, load_profile, shipped_profiles  # noqa: E402
from gpuest.evaluate.accuracy import GPU_BOUND_FRACTION, load_results, trace_config, trace_key  # noqa: E402

DEFAULT_DATA = "data/calibration/H100-SXM.jsonl"
DEFAULT_HOST = "data/calibration/fresh/H100-SXM-quick.jsonl.host.jsonl"
DEFAULT_VALIDATION = ("data/validation/H100-SXM-full.jsonl", "data/validation/H100-SXM-busy-recheck.jsonl",
                      "data/validation/H100-SXM-train-b1.jsonl", "data/validation/H100-SXM-generalisation.jsonl")
DEFAULT_CACHE = Path("/tmp/gpuest-quick-study")
TOP_OPS = 6                     # ops listed in the per-op breakdown


def _cached(cache: Path, tag: str, make: Any) -> Any:
    """`make()`, pickled under `cache` by `tag` (retraced rows and traced graphs cost minutes of CPU)."""
    path = cache / (hashlib.sha1(tag.encode()).hexdigest()[:16] + ".pkl")
    if path.exists():
        return pickle.loads(path.read_bytes())
    value = make()
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(value))
    return value


def _source_tag(path: str | Path | None = None) -> str:
    """A cache tag that changes with the file and with the code that derives nodes and graphs (not the fit)."""
    code = sorted((ROOT / "gpuest").rglob("*.py"))
    h = hashlib.sha1(Path(path).read_bytes() if path else b"")
    for p in code:
        h.update(p.read_bytes())
    return h.hexdigest()


def retraced_raw(path: str, cache: Path) -> RawData:
    """The calibration file with every row's nodes re-derived by this estimator (as `gpuest fit` does)."""
    raw = load_raw(path)
    rows = _cached(cache, "rows" + _source_tag(path), lambda: with_current_nodes(raw.rows)[0])
    return RawData(raw.meta, rows)


def subset_profile(raw: RawData, names: set[str], host_paths: list[str], shape_prior: str = "auto") -> Profile:
    """The profile `gpuest fit --shape-prior <shape_prior>` makes of the rows of `raw` named in `names`, host
    costs from `host_paths`."""
    subset = RawData(raw.meta, [r for r in raw.rows if r.get("name") in names])
    validation = load_validation(*host_paths) if host_paths else None
    return fit_profile(subset, validation=validation, retrace=False, command="benchmarks/quick_suite_study.py",
                       shape_prior=resolve_shape_prior(shape_prior, subset))


def gpu_bound_configs(paths: list[str], gpu: str, split: str) -> list[dict[str, Any]]:
    """Usable validation rows of `gpu` whose device was busy >= GPU_BOUND_FRACTION of wall time, of the
    frozen test split (split="test") or of every other model (split="nontest")."""
    rows, _ = load_results([Path(p) for p in paths])
    out = []
    for r in rows:
        busy, wall = r.get("device_busy_s"), r.get("wall_s")
        if r["gpu_canonical"] != gpu or not busy or not wall or busy < GPU_BOUND_FRACTION * wall:
            continue
        if (r["model"] in test_split_models()) == (split == "test"):
            out.append(r)
    return sorted(out, key=lambda r: r["key"])


def price(graphs: dict[tuple, Any], rows: list[dict[str, Any]], gpu: str, profile: Any) -> list[dict[Any, float]]:
    """Predicted device time per row (s, key "device_s"), per op category (key ("category", name)) and per
    ATen op (key ("op", name))."""
    from gpuest.price.estimate import estimate
    out = []
    for r in rows:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = estimate(graphs[trace_key(r)], gpu=gpu, profile=profile)
        per = est.per_node[~est.per_node["free"]]
        out.append({"device_s": est.device_time_s,
                    **{(level, k): v for level in ("category", "op") for k, v in per.groupby(level)["time_s"].sum().items()}})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="full calibration JSONL of the GPU")
    p.add_argument("--suite", default="quick", choices=SUITES, help="named suite to simulate")
    p.add_argument("--budget-s", type=float, default=None, help="simulate a run of this budget instead")
    p.add_argument("--names-from", default=None,
                   help="simulate the benchmarks this calibration JSONL measured (a real run) instead of a plan")
    p.add_argument("--host", nargs="*", default=[DEFAULT_HOST], help="host probe JSONL a fresh run measured")
    p.add_argument("--validation", nargs="+", default=list(DEFAULT_VALIDATION), help="validation JSONL files")
    p.add_argument("--split", choices=("nontest", "test"), default="nontest")
    p.add_argument("--profile", nargs="*", default=[], help="also price with these profile files")
    p.add_argument("--shape-prior", default="auto", metavar="GPU|auto|none",
                   help="as gpuest fit's (none: fit the simulated run alone)")
    p.add_argument("--save", type=Path, default=None, help="write the simulated profile here")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="pickles of retraced rows and graphs")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    raw = retraced_raw(args.data, args.cache)
    gpu = str(raw.meta.get("catalog_gpu") or raw.meta.get("gpu_name"))
    from gpuest.catalog import get_gpu
    gpu = get_gpu(gpu).name
    if args.names_from:
        names = {r.get("name") for r in load_raw(args.names_from).rows} - {None}
        planned = f"as measured in {args.names_from}"
    else:
        plan = run_plan(args.suite, args.budget_s)
        names = {b.name for b in plan.benchmarks}
        planned = f"planned {plan.est_s:.0f} s"
    have = {r.get("name") for r in raw.rows}
    print(f"simulated run: {len(names)} benchmarks ({len(names & have)} in {args.data}), {planned}")
    sim = subset_profile(raw, names & have, args.host, args.shape_prior)
    if args.save:
        sim.save(args.save)
    rows = gpu_bound_configs(args.validation, gpu, args.split)
    code = _source_tag()
    graphs = {k: _cached(args.cache, "graph" + code + repr(k), lambda k=k: trace_config(*k))
              for k in sorted({trace_key(r) for r in rows}, key=repr)}
    predictors = {"shipped": shipped_profiles()[gpu], "simulated": sim}
    predictors.update({Path(f).name: load_profile(f) for f in args.profile})
    priced = {name: price(graphs, rows, gpu, prof) for name, prof in predictors.items()}
    measured = np.array([r["device_busy_s"] for r in rows])
    print(f"{len(rows)} GPU-bound {gpu} configs ({args.split} split): device-time MAPE")
    for name, preds in priced.items():
        ape = np.abs(np.array([q["device_s"] for q in preds]) / measured - 1) * 100
        print(f"  {name:40s} {ape.mean():5.1f} %   (P90 {np.percentile(ape, 90):5.1f} %)")
    keys = sorted({k for preds in priced.values() for q in preds for k in q if k != "device_s"})
    for level, shown in (("category", None), ("op", TOP_OPS)):
        print(f"per {level}: mean |prediction - shipped's| / mean signed, % of measured device time")
        for name, preds in priced.items():
            if name == "shipped":
                continue
            moved = []
            for k in (k for k in keys if k[0] == level):
                d = np.array([q.get(k, 0.0) - s.get(k, 0.0) for q, s in zip(preds, priced["shipped"])]) / measured * 100
                moved.append((-np.abs(d).mean(), k[1], d.mean()))
            parts = [f"{k} {-a:.1f}/{m:+.1f}" for a, k, m in sorted(moved)[:shown] if -a >= 0.05]
            print(f"  {name}: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
