"""The quick-start notebook runs top to bottom (so it cannot rot) and is committed without outputs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code
    for cell in code:
        assert cell.get("outputs") == [] and cell.get("execution_count") is None, "strip outputs before committing"


def test_quickstart_notebook_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[dev]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (pip install -e '.[dev]')")
    pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install -e '.[dev]')")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Run in a temp dir: the notebook writes its exports to the working directory.
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    for name in ("resnet18.graphml", "resnet18.csv", "resnet18.trace.json", "resnet18.html", "roofline.png",
                 "sweep.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 2  # sweep and roofline displayed inline
