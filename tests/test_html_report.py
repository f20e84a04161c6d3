"""HTML report and plots: self-contained file, sections present, renders without JS errors in headless Chromium."""
from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import gpuest
from gpuest.profile import prior_profile
from gpuest.report.export import export
from gpuest.report.html import HOT_OPS, html_report
from gpuest.report.plots import roofline_plot, sweep_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


class Small(torch.nn.Module):
    """Two conv blocks and a head: nested modules for the depth-2 tree, >20 ops for the hot-op table."""

    def __init__(self) -> None:
        super().__init__()
        block = lambda cin, cout: torch.nn.Sequential(  # noqa: E731
            torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU())
        self.stem = block(3, 16)
        self.body = block(16, 32)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def graph():
    return gpuest.trace(Small(), (torch.empty(16, 3, 64, 64, device="meta"),), mode="training", name="small",
                           batch=16)


@pytest.fixture(scope="module")
def est(graph):
    return gpuest.estimate(graph, "A100")


@pytest.fixture(scope="module")
def report(tmp_path_factory, est) -> Path:
    return export(est, tmp_path_factory.mktemp("report") / "report.html")


def chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def run_chromium(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        pytest.skip("Chromium not installed (apt-get install -y chromium): the browser rendering check "
                    "of the HTML report did not run")
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------ file content

def test_report_is_self_contained(report, est):
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # Nothing fetched when opened: no remote or local file references, plots inline as data URIs.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", page, re.I)
    assert not re.search(r"<link\b", page, re.I)
    assert not re.search(r"@import|url\(", page, re.I)
    assert page.count('src="data:image/png;base64,') == 2  # roofline + sweep
    for anchor in ("id='bounds'", "id='hot'", "id='tree'", "id='roofline'", "id='energy'", "id='sweep'"):
        assert anchor in page
    # The summary carries the same numbers as str(est).
    text = str(est)
    numbers = (re.findall(r"wall time / iteration\s+(\S+ \S+)", text)
               + re.findall(r"energy / iteration\s+(\S+ J)", text))
    assert len(numbers) == 2
    for number in numbers:
        assert number in page
    assert est.bound in page
    # Module tree: depth-1 modules, each openable onto its depth-2 children.
    assert page.count("<details><summary><b>") >= 2 and "stem.0" in page and "body.1" in page


def test_report_without_power_has_no_energy_sections(tmp_path, graph):
    e = gpuest.estimate(graph, "A100", profile=dataclasses.replace(prior_profile(), power=None))
    assert math.isnan(e.energy_j)
    page = html_report(e, tmp_path / "r.html").read_text()
    assert "id='energy'" not in page and "id='sweep'" not in page
    assert "no power model" in page
    assert page.count("data:image/png;base64,") == 1


def test_report_uses_a_given_sweep(tmp_path, graph, est):
    spec = gpuest.get_gpu("A100")
    df = gpuest.sweep(graph, "A100", clocks=np.linspace(spec.min_clock_mhz, spec.max_clock_mhz, 4))
    page = html_report(est, tmp_path / "r.html", sweep_df=df).read_text()
    assert "id='sweep'" in page and page.count("data:image/png;base64,") == 2


# ------------------------------------------------------------------------------------------ plots

def test_roofline_plot_writes_a_png(tmp_path, est):
    path = roofline_plot(est, tmp_path / "roof.png", label_top=5)
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 20_000


def test_sweep_plot_both_settings(tmp_path, graph):
    spec = gpuest.get_gpu("A100")
    df = gpuest.sweep(graph, "A100", clocks=np.linspace(spec.min_clock_mhz, spec.max_clock_mhz, 5),
                         power_limits=np.linspace(spec.power_limit_min_w, spec.power_limit_max_w, 5))
    path = sweep_plot(df, tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError):
        sweep_plot(df.iloc[:0], tmp_path / "empty.png")


# ------------------------------------------------------------------------------------------ browser

def _attr(dom: str, name: str) -> str | None:
    m = re.search(rf'<body[^>]*\b{name}="([^"]*)"', dom)
    return m.group(1) if m else None


def test_report_renders_in_chromium(tmp_path, report):
    proc = run_chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        "--dump-dom", report.as_uri())
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<table" in dom and 'class="sortable hot"' in dom
    hot = dom.split('class="sortable hot"', 1)[1].split("</table>", 1)[0]
    assert hot.count("<tr>") == HOT_OPS + 1  # header + rows
    assert 'id="roofline-img"' in dom and 'id="sweep-img"' in dom
    # Set by the page's own script only when no error handler fired and every plot decoded.
    assert _attr(dom, "data-js-ok") == "1", proc.stderr[-2000:]
    assert _attr(dom, "data-images-ok") == "2/2"
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln and ("Uncaught" in ln or "rror" in ln)]
    assert not console, console


def test_chromium_hook_catches_script_errors(tmp_path, report):
    """Negative control: the same page with a failing script must not report itself healthy."""
    broken = tmp_path / "broken.html"
    broken.write_text(report.read_text().replace("</body>", "<script>undefinedFunction();</script></body>"))
    proc = run_chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        "--dump-dom", broken.as_uri())
    assert proc.returncode == 0
    assert _attr(proc.stdout, "data-images-ok") == "2/2"  # the page's scripts ran...
    assert _attr(proc.stdout, "data-js-ok") is None       # ...and saw the error
    assert any("CONSOLE" in ln and "Uncaught" in ln for ln in proc.stderr.splitlines())  # as did the log check


def test_report_screenshot(tmp_path, report):
    shot = tmp_path / "report.png"
    proc = run_chromium(tmp_path, "--window-size=1280,2400", "--virtual-time-budget=5000",
                        f"--screenshot={shot}", report.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 50_000
