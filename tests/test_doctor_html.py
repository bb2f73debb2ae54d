"""The doctor's HTML page: one self-contained file (every image an embedded PNG that decodes,
nothing loaded from the network), the findings and the per-layer plots of a real watched run; and,
where /usr/bin/chromium is installed, rendered by a real headless browser into a screenshot that is
not blank."""

from __future__ import annotations

import base64
import io
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bnlab.doctor import Doctor, Finding, Report
from bnlab.doctor.html import PLOTS
from tests.test_doctor_watch import Net, data

PIL = pytest.importorskip("PIL.Image")
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Report, Path]:
    """A watched run with a planted cause (the first BN's momentum 0.001 on inputs of mean 5,
    a learning-rate drop) and the sharpness read every 16 steps."""
    torch.manual_seed(0)
    model = Net(momentum=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g, x_all, y_all = data(0, 5.0)
    doc = Doctor(model, F.cross_entropy, opt, sharpness_every=16, sharpness_budget=100.0)
    for step in range(1, 97):
        if step == 64:
            opt.param_groups[0]["lr"] = 0.01
        i = torch.randint(0, len(x_all), (64,), generator=g)
        x, y = x_all[i], y_all[i]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        doc.after_backward((x, y), step)
        opt.step()
        doc.after_step((x, y), step)
    report = doc.report()
    path = report.to_html(tmp_path_factory.mktemp("doctor") / "report.html")
    return report, path


def images(text: str) -> list[str]:
    return re.findall(r"<img\b[^>]*\bsrc=\"([^\"]*)\"", text)


def test_every_plot_is_an_embedded_png_that_decodes(page):
    report, path = page
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    sources = images(text)
    measured = [title for title, _, key, _ in PLOTS if report.measurements.get(key)]
    assert len(measured) == len(PLOTS)  # the run measured every series the page draws
    assert len(sources) == len(measured)
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        image = PIL.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1], validate=True)))
        assert image.format == "PNG" and image.width > 100 and image.height > 100
        image.verify()
    for title in measured:
        assert f"<h2>{title}</h2>" in text


def test_nothing_loads_from_the_network(page):
    _, path = page
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", text, re.I)
    assert not re.search(r"<(?:script|link|iframe|object|embed)\b", text, re.I)
    assert "@import" not in text and "url(" not in text


def test_the_findings_are_listed_most_severe_first(page):
    report, path = page
    text = path.read_text(encoding="utf-8")
    rows = re.findall(r"<tr><td class=\"(warn|info)\">\w+</td><td><code>([^<]+)</code>", text)
    assert rows == [(f.severity, f.code) for f in report.findings]
    assert ("warn", "stale-running-stats") in rows
    assert report.findings[0].severity == "warn"


def test_text_is_escaped_and_missing_series_are_said_not_drawn(tmp_path):
    finding = Finding("small-batch", "warn", ("a<b>",), 2.0, 1.0, "why <i>", "paper & co",
                      "use <mbn>", "detail")
    path = Report([finding], {}, {"model": "<Net>"}).to_html(tmp_path / "r.html")
    text = path.read_text(encoding="utf-8")
    assert "a&lt;b&gt;" in text and "use &lt;mbn&gt;" in text and "&lt;Net&gt;" in text
    assert "<b>" not in text and "<i>" not in text and "<mbn>" not in text
    assert images(text) == []
    assert text.count("Not measured in this run.") == len(PLOTS)


def test_a_headless_browser_renders_the_page(page, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: the page's structure and images are checked above")
    _, path = page
    shot = tmp_path / "shot.png"
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--hide-scrollbars",
               "--window-size=1200,2000", f"--screenshot={shot}", path.as_uri()]
    subprocess.run(command, capture_output=True, timeout=120, check=False,
                   cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert shot.exists(), "chromium wrote no screenshot"
    image = PIL.open(shot).convert("L")
    histogram = image.histogram()
    pixels = image.width * image.height
    white = sum(histogram[250:])
    dark = sum(histogram[:100])
    # not blank: text and plots cover part of the page, and there is dark ink (text, axes)
    assert white < 0.97 * pixels and dark > 0.002 * pixels, (white / pixels, dark / pixels)
