"""One analysis pass opens (and checks) the run store once.

``Store`` runs ``PRAGMA quick_check`` over the whole file at every open: seconds for a store of a
few hundred MB. The report opened the store twice per catalogue entry plus once to list them (73
opens, ≈20 s of a 60 s report on a 36-entry store); it now opens it once per pass and passes it
down. Every open still checks: a store damaged between two passes is refused by the next.
"""

from __future__ import annotations

import pytest

import bnlab.store.database as database
from bnlab.experiments import runner
from bnlab.report import write_report
from bnlab.store import Store, StoreCorruptError

from .store_helpers import garble_an_index, track_stores

ENTRIES = [("peng-fig2", "smoke"), ("peng-fig2", "paper"), ("peng-table1", "smoke")]


@pytest.fixture
def store_dir(tmp_path):
    """A store with three catalogue entries, each naming one finished run."""
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {"model": "mlp"})
        store.log_rows("r1", [(s, "train_loss", 1.0 / s) for s in range(1, 4)])
        store.set_status("r1", "finished", steps=3, summary={"metrics": {"test_accuracy": 0.9}})
        for experiment_id, preset in ENTRIES:
            store.save_entry(experiment_id, preset, [{"label": "bn", "id": "r1"}], {},
                             tiny=True, seconds=1.0)
    return tmp_path


@pytest.fixture
def checks(monkeypatch):
    """The files ``quick_check`` ran on, in order."""
    seen: list[str] = []
    real = database.quick_check

    def counted(conn, path):
        seen.append(str(path))
        return real(conn, path)

    monkeypatch.setattr(database, "quick_check", counted)
    return seen


@pytest.fixture
def opened(monkeypatch):
    """Every Store the runner opens, with whether it was closed."""
    return track_stores(monkeypatch, runner)


def test_one_pass_over_every_entry_checks_the_store_once(store_dir, checks, opened):
    seen = []
    for experiment_id, preset, ctx, _ in runner.iter_outcomes(store_dir, store_dir / "report"):
        seen.append((experiment_id, preset))
        assert ctx.run("bn").series("train_loss")[0] == [1, 2, 3]  # the views read the store
        assert len(opened) == 1 and not opened[0].closed  # open while the consumer reads
    assert sorted(seen) == sorted(ENTRIES)
    assert checks == [str(store_dir / "bnlab.db")]  # was 1 + 2 per entry (7)
    assert opened[0].closed


def test_the_report_checks_the_store_once(store_dir, checks):
    write_report(store_dir)
    assert len(checks) == 1
    assert (store_dir / "report" / "index.md").read_text().count("\n## ") == len(ENTRIES)


def test_one_analysed_entry_opens_the_store_once(store_dir, checks, opened):
    with runner.analysis_context("peng-fig2", "smoke", runs_dir=store_dir) as ctx:
        assert ctx.run("bn").status == "finished"
    assert len(checks) == 1 and len(opened) == 1 and opened[0].closed  # was 2


def test_a_context_on_the_callers_store_leaves_it_open(store_dir, checks):
    with Store(store_dir / "bnlab.db") as store:
        for experiment_id, preset in ENTRIES:
            with runner.analysis_context(experiment_id, preset, runs_dir=store_dir,
                                         store=store) as ctx:
                assert ctx.run("bn").series("train_loss")[1] == [1.0, 0.5, 1.0 / 3]
        assert store.entries()  # still open after the contexts closed
        with pytest.raises(ValueError, match="no stored results"):
            runner.analysis_context("peng-fig4", "smoke", runs_dir=store_dir, store=store)
        assert store.get_run("r1")["status"] == "finished"  # a refused context leaves it open
    assert len(checks) == 1


def test_an_abandoned_pass_closes_the_store(store_dir, opened):
    outcomes = runner.iter_outcomes(store_dir, store_dir / "report")
    next(iter(outcomes))
    assert len(opened) == 1 and not opened[0].closed
    outcomes.close()  # the consumer stopped early (a break, an error)
    assert opened[0].closed


def test_every_pass_checks_again_and_a_store_damaged_between_passes_is_refused(store_dir, checks):
    db = store_dir / "bnlab.db"
    list(runner.iter_outcomes(store_dir, store_dir / "report"))
    with Store(db) as store:  # a change between passes
        store.create_run("r2", {"model": "mlp"})
        store.log_rows("r2", [(s, "train_loss", float(s)) for s in range(3000)])  # several pages
    list(runner.iter_outcomes(store_dir, store_dir / "report"))
    assert len(checks) == 3  # pass, writer, pass: nothing is remembered between opens
    garble_an_index(db)
    with pytest.raises(StoreCorruptError, match=f"run store {db} is damaged"):
        write_report(store_dir)
    with pytest.raises(StoreCorruptError, match=f"run store {db} is damaged"):
        list(runner.iter_outcomes(store_dir, store_dir / "report"))
