"""The catalogue's analysis closes the run store it opens (``analysis_context`` once opened a
``Store`` and never closed it, one SQLite connection left per analysed entry)."""

from __future__ import annotations

import pytest

from bnlab.experiments import runner
from bnlab.store import Store

from .store_helpers import track_stores


@pytest.fixture
def opened(tmp_path, monkeypatch):
    """Every Store the runner opens, with whether it was closed; an entry with one stored run."""
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {"model": "mlp"})
        store.log_rows("r1", [(1, "train_loss", 0.5)])
        store.set_status("r1", "finished", steps=1, summary={"metrics": {"test_accuracy": 0.9}})
        store.save_entry("peng-fig2", "smoke", [{"label": "bn", "id": "r1"}], {},
                         tiny=True, seconds=1.0)
    return track_stores(monkeypatch, runner)


def test_analysis_context_is_open_inside_its_block_and_closed_after(tmp_path, opened):
    with runner.analysis_context("peng-fig2", "smoke", runs_dir=tmp_path) as ctx:
        assert ctx.run("bn").series("train_loss") == ([1], [0.5])  # the views read the open store
        assert not opened[-1].closed  # (the entry's results were read through one closed already)
    assert opened and all(store.closed for store in opened)


def test_analyze_and_iter_outcomes_close_every_store(tmp_path, opened):
    try:
        runner.analyze("peng-fig2", "smoke", runs_dir=tmp_path)
    except Exception:  # a one-run entry may not analyse; the store must close anyway
        pass
    for _, _, ctx, _ in runner.iter_outcomes(tmp_path, tmp_path / "report"):
        # open while the consumer reads it
        assert ctx.run("bn").series("train_loss") == ([1], [0.5])
        assert not opened[-1].closed
    assert len(opened) >= 2 and all(store.closed for store in opened)
