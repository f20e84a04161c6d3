"""The package's layering (docs/DESIGN.md): capture -> annotate -> price -> evaluate -> calibrate -> report ->
cli, each importing only from layers below it, no import cycles between modules, and no measuring module
importing pricing (only the CLI joins the two). Imports are read from the source, those under
`if TYPE_CHECKING:` excepted (they never run)."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpuest"
# Lowest first. The base modules hold facts every layer shares (errors, catalogue, formats); a profile
# (gpuest.profile) holds the fitted coefficients of pricing's features, so it sits with pricing.
LAYERS = (("errors", "jsonl", "catalog", "measurement_protocol", "_alias"), ("annotate",), ("capture",),
          ("price", "profile"), ("evaluate",), ("calibrate",), ("report",), ("cli",))
# Result objects render themselves as text (torchinfo's split of result and formatting): the plain-text
# formatter sits beside the results it formats and imports nothing above the base layer.
RESULT_FORMATTERS = {"gpuest.report.text"}
# Modules that run on the GPU to measure; they must not import the predictor they are measured against.
MEASURING = {"gpuest.calibrate." + m for m in ("runner", "validate", "validate_context", "validate_measure",
                                               "validate_profile", "memory_validate", "generation_validate",
                                               "kernel_profile", "timing", "nvml_monitor", "suite", "budget",
                                               "host_probe")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """gpuest modules `path` imports at run time (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            names = [f"{target}.{a.name}" for a in node.names]
            out.update(n if _exists(n) else target for n in names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m and m.split(".")[0] == "gpuest"}


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in sorted(PACKAGE.rglob("*.py")):
        g.add_node(_module(path))
        g.add_edges_from((_module(path), target) for target in _imports(path))
    return g


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None          # the package's own __init__: the public API gathers every layer
    return next(i for i, names in enumerate(LAYERS) if parts[1] in names)


def test_every_subpackage_has_a_layer(graph):
    for module in graph:
        if module != "gpuest":
            assert module.split(".")[1] in {n for names in LAYERS for n in names}, module


def test_no_import_cycles(graph):
    modules = graph.subgraph(m for m in graph if m != "gpuest")
    cycles = list(nx.simple_cycles(modules))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_layers_import_only_downwards(graph):
    upward = []
    for src, dst in graph.edges:
        lo, hi = _layer(src), _layer(dst)
        if lo is None or hi is None or hi <= lo:
            continue
        if dst in RESULT_FORMATTERS and src.split(".")[1] == "price":
            continue
        upward.append(f"{src} -> {dst}")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_result_formatters_depend_only_on_the_base(graph):
    for formatter in RESULT_FORMATTERS:
        assert all(_layer(dst) == 0 for dst in graph.successors(formatter)), list(graph.successors(formatter))


def test_measuring_never_imports_pricing(graph):
    for module in MEASURING:
        assert module in graph, module
        priced = [dst for dst in graph.successors(module) if dst.startswith("gpuest.price")]
        assert not priced, f"{module} imports {priced}: measuring and pricing meet only in gpuest.cli"


def test_old_names_still_import_the_same_modules():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import estimator
        from calibration.suite import all_benchmarks
        from estimator.memory.peak import memory_estimate
    import gpuest
    import gpuest.calibrate.suite
    import gpuest.price.memory.peak
    assert estimator.estimate is gpuest.estimate and all_benchmarks is gpuest.calibrate.suite.all_benchmarks
    assert memory_estimate is gpuest.price.memory.peak.memory_estimate
    # the shared module keeps its own spec: still the package it is (importlib.resources reads its data)
    assert gpuest.calibrate.suite.__spec__.name == "gpuest.calibrate.suite"
    assert gpuest.calibrate.suite.__spec__.submodule_search_locations
