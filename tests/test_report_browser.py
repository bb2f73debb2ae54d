"""The report's figures read at page width, checked in a real browser (headless chromium): every
figure links to its full-size image, and a multi-panel figure wider than the page's column is shown
at ``MIN_SCALE`` of its size at least (its legends, 7 pt at 110 dpi, stay ≥ 8 px high), where the
old column shrank a 2,464 px figure to 1,100 px (legends ≈ 5 px). The report is built from a tiny
store made here; the page is measured at two window widths and a screenshot is kept
(``BNLAB_REPORT_SCREENSHOT=PATH`` copies it out)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bnlab.experiments import runner
from bnlab.experiments.base import CATALOGUE, Experiment, Outcome, Plan, register
from bnlab.report import COLUMN_PX, MIN_SCALE, png_size, write_report

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser",
                                                 "google-chrome") if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium found (Debian: apt-get install -y chromium; .ci/run "
                             "tries it): the report's figures are not measured in a browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--hide-scrollbars", "--virtual-time-budget=10000"]
MEASURE = """<script>
window.addEventListener("load", () => {
  const out = [...document.querySelectorAll("figure img")].map(img => ({
    src: img.getAttribute("src"), natural: img.naturalWidth,
    shown: img.getBoundingClientRect().width,
    link: img.closest("a") && img.closest("a").getAttribute("href")}));
  const pre = document.createElement("pre");
  pre.id = "measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script></body>"""


def _analyze(ctx) -> Outcome:
    from bnlab.plots import panels

    xs = list(range(20))
    curves = {f"arm {k}": (xs, [(k + 1) * x ** 0.5 for x in xs]) for k in range(3)}
    spec = {"series": curves, "xlabel": "step", "ylabel": "loss", "title": "a panel"}
    figures = [panels(ctx.figure_path("four"), [spec] * 4, ncols=4),  # 4 × 616 px
               panels(ctx.figure_path("three"), [spec] * 3),
               panels(ctx.figure_path("one"), [spec])]
    return Outcome(figures, [], "held", "three figures")


@pytest.fixture
def report(tmp_path) -> Path:
    exp = register(Experiment(
        id="test-wide-figures", paper="santurkar", target="Fig. 0", title="wide figures",
        claim="figures read at page width", smoke_changes="none", cost={"smoke": "seconds"},
        plan=lambda preset: Plan(compute={"nothing": lambda: {}}), analyze=_analyze))
    try:
        runner.reproduce(exp.id, "smoke", runs_dir=tmp_path, progress=False)
        yield write_report(tmp_path)
    finally:
        CATALOGUE.remove(exp.id)


def _chromium(*args: str) -> str:
    proc = subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _measure(page: Path, width: int) -> list[dict]:
    probe = page.with_name(f"measure-{width}.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE))
    dom = _chromium(f"--window-size={width},900", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, flags=re.S)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("window", [1440, 1024])
def test_every_figure_is_legible_and_links_to_its_full_size(report, window):
    figures = _measure(report, window)
    sizes = sorted(f["natural"] for f in figures)
    assert sizes == [616, 1848, 2464]  # all three loaded: 1, 3 and 4 panels of 5.6 in at 110 dpi
    for figure in figures:
        assert figure["link"] == figure["src"], figure  # a click opens the full-size image
        scale = figure["shown"] / figure["natural"]
        assert scale >= MIN_SCALE - 0.01, figure
        assert 7 * 110 / 72 * scale >= 7.9, figure  # the legend's text, in CSS pixels
        if figure["natural"] <= COLUMN_PX:
            assert scale == pytest.approx(1.0, abs=0.01)  # small figures at their own size


def test_screenshot_of_the_report(report):
    shot = report.with_name("report.png")
    _chromium("--window-size=1440,2600", f"--screenshot={shot}", report.as_uri())
    assert png_size(shot) == (1440, 2600)
    target = os.environ.get("BNLAB_REPORT_SCREENSHOT")
    if target:
        shutil.copy(shot, target)


def test_png_size_reads_the_header(tmp_path):
    figure = tmp_path / "x.png"
    from bnlab.plots import panels

    panels(figure, [{"series": {"a": ([0, 1], [0, 1])}}])
    assert png_size(figure) == (616, 363)
    (tmp_path / "not.png").write_bytes(b"GIF89a" + bytes(40))
    assert png_size(tmp_path / "not.png") is None and png_size(tmp_path / "missing.png") is None
