"""A figure is not drawn again when its PNG already holds it.

Each PNG written by :mod:`bnlab.plots` records a key of what drew it (the function, every argument,
the module's code, matplotlib's version). Drawing and laying out were ≈ 43 s of a 63 s report over
a 36-entry store; a report re-written over an unchanged store now draws nothing. The cache may
miss, never be stale: any changed value, order or code redraws, and arguments without an exact
text are always drawn.
"""

from __future__ import annotations

import numpy as np
import pytest

from bnlab import plots
from bnlab.report import write_report
from bnlab.store import Store


def spec(values=(1.0, 2.0, float("nan")), order=("a", "b")):
    series = {name: ([1, 2, 3], np.array(values) * (i + 1)) for i, name in enumerate(order)}
    return [{"series": series, "xlabel": "step", "ylabel": "train_loss", "title": "t"}]


@pytest.fixture
def drawn(monkeypatch):
    """The paths :func:`plots._save` wrote, in order."""
    paths = []
    real = plots._save

    def counted(fig, path, *args, **kwargs):
        paths.append(path)
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "_save", counted)
    return paths


def test_same_figure_is_not_drawn_again(tmp_path, drawn):
    path = tmp_path / "fig" / "a.png"
    assert plots.panels(path, spec(), title="x") == path
    before = path.read_bytes()
    assert plots.panels(path, spec(), title="x") == path
    assert len(drawn) == 1 and path.read_bytes() == before
    assert not list(path.parent.glob(".*partial"))  # written beside and renamed


@pytest.mark.parametrize("change", [
    lambda: (spec(values=(1.0, 2.0000001, float("nan"))), "x"),  # one data value
    lambda: (spec(order=("b", "a")), "x"),  # the series' order: their colours
    lambda: (spec(), "y"),  # the title
])
def test_any_change_redraws(tmp_path, drawn, change):
    path = tmp_path / "a.png"
    plots.panels(path, spec(), title="x")
    specs, title = change()
    plots.panels(path, specs, title=title)
    assert len(drawn) == 2
    assert plots.is_current(path, plots.figure_key("panels", specs, title, None))


def test_new_plotting_code_redraws(tmp_path, drawn, monkeypatch):
    path = tmp_path / "a.png"
    plots.panels(path, spec())
    monkeypatch.setattr(plots, "_CODE", "another version")
    plots.panels(path, spec())
    assert len(drawn) == 2


def test_arguments_without_exact_text_are_always_drawn(tmp_path, drawn):
    from matplotlib.markers import MarkerStyle

    path = tmp_path / "a.png"
    odd = spec()
    odd[0]["style"] = {"a": {"marker": MarkerStyle("o")}}  # drawable, but no exact text
    assert plots.figure_key("panels", odd, None, None) is None
    plots.panels(path, odd)
    plots.panels(path, odd)
    assert len(drawn) == 2 and not plots.is_current(path, None)


def test_damaged_or_foreign_files_are_redrawn(tmp_path, drawn):
    path = tmp_path / "a.png"
    plots.panels(path, spec())
    key = plots.figure_key("panels", spec(), None, None)
    whole = path.read_bytes()
    path.write_bytes(whole[:300])  # the key's chunk kept, the image cut: a killed writer
    assert not plots.is_current(path, key)
    plots.panels(path, spec())
    assert path.read_bytes() == whole and len(drawn) == 2
    path.write_bytes(b"not a png")
    assert not plots.is_current(path, key)


def test_bars_and_histograms_are_keyed_too(tmp_path, drawn):
    bars = tmp_path / "bars.png"
    hist = tmp_path / "hist.png"
    for _ in range(2):
        plots.bars(bars, {"tanh": {"BN": 0.9, "CBN": 0.95}}, ylabel="test_accuracy")
        plots.histograms(hist, {"layer 1": {"step 0": [0.1, 0.2, 0.4]}})
    assert drawn == [bars, hist]
    plots.bars(bars, {"tanh": {"BN": 0.9, "CBN": 0.96}}, ylabel="test_accuracy")
    assert drawn[-1] == bars and len(drawn) == 3


def test_report_over_an_unchanged_store_draws_nothing(tmp_path, drawn):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {"model": "mlp"})
        store.log_rows("r1", [(s, "train_loss", 1.0 / s) for s in range(1, 4)])
        store.set_status("r1", "finished", steps=3, summary={"metrics": {"test_accuracy": 0.9}})
        store.save_entry("peng-fig2", "smoke", [{"label": "bn", "id": "r1"}], {}, tiny=True,
                         seconds=1.0)
    write_report(tmp_path)
    first = len(drawn)
    figures = sorted((tmp_path / "report").rglob("*.png"))
    assert first >= 1 and figures
    write_report(tmp_path)
    assert len(drawn) == first
    assert sorted((tmp_path / "report").rglob("*.png")) == figures


def test_other_formats_are_written_in_their_format_and_always_drawn(tmp_path, drawn):
    svg = tmp_path / "a.svg"
    for _ in range(2):
        plots.panels(svg, spec())
    assert svg.read_text().lstrip().startswith("<?xml") and len(drawn) == 2
