"""Data-parallel runs inside a sweep (``bnlab reproduce``), and crashed runs named in verdicts.

Every sweep's ``nproc > 1`` run failed before it started: the sweep gave it a progress callback that
closes over the parent's progress bar, and a data-parallel run sends its callbacks to its ranks'
processes ("Can't pickle local object 'run_parallel.<locals>.<lambda>'"). ``mbn-batch-size``'s
three data-parallel arms showed "—" in its summary, their failure nowhere. Now the sweep runs them,
the launcher names an unpicklable callback, and every entry's summary names its crashed runs.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from bnlab.experiments import parallel, runner
from bnlab.experiments.base import Experiment, Outcome, Plan, crashed_note
from bnlab.store import Store
from bnlab.train import launcher
from bnlab.train.callbacks import Callback

BASE = {"model": "mlp", "norm": "bn", "data": "digits", "steps": 3, "batch_size": 64, "lr": 0.1,
        "seed": 0}


def test_a_sweep_passes_data_parallel_runs_only_picklable_callbacks():
    """The in-process loop's callbacks for an nproc > 1 run must survive pickling (the launcher
    pickles them to every rank); one-process runs keep their progress reporter."""
    seen = {}

    def train_one(config, callbacks=()):
        seen[config["nproc"]] = list(callbacks)
        pickle.dumps(list(callbacks)) if config["nproc"] > 1 else None
        return {"status": "finished"}

    records = parallel.run_parallel([{**BASE, "nproc": 2}, {**BASE, "nproc": 1}], train_one,
                                    workers=1, progress=False)
    assert [r["status"] for r in records] == ["finished", "finished"]
    assert seen[2] == [] and isinstance(seen[1][0], parallel.StepReporter)


def test_a_sweep_trains_a_data_parallel_run(tmp_path, monkeypatch):
    """End to end through ``run_sweep`` (2 gloo processes on the CPU): it used to fail."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    config = {**BASE, "nproc": 2, "runs_dir": str(tmp_path)}
    record, = runner.run_sweep([config], progress=False, workers=1)
    assert record["status"] == "finished", record.get("error")
    with Store(tmp_path / "bnlab.db") as store:
        assert store.get_run(record["id"])["status"] == "finished"


class _Local(Callback):
    def __init__(self):
        self.send = lambda m: m  # a closure: cannot go to another process


def test_launcher_names_a_callback_that_cannot_reach_the_ranks():
    with pytest.raises(TypeError, match=r"callback .*_Local.* cannot be sent to the processes "
                                        r"of a data-parallel run .*nproc 1"):
        launcher.check_picklable([Callback(), _Local()])
    launcher.check_picklable([Callback()])  # a plain callback pickles


def _view(label, status, error=None):
    return SimpleNamespace(label=label, status=status, record={"error": error} if error else {})


def test_crashed_note_names_the_crashed_runs_and_the_first_error():
    runs = [_view("a", "finished"), _view("b", "diverged", "loss exploded"),
            _view("c", "failed", "AttributeError: no\nTraceback ..."), _view("d", "interrupted"),
            _view("e", "damaged", "seal mismatch"), _view("f", "failed")]
    note = crashed_note(runs)
    assert note == "; 4 of 6 runs crashed, not analysed: c, d, e, … (AttributeError: no)"
    assert crashed_note(runs[:2]) == ""  # a diverged run has its results: the rules judge it


def test_every_outcome_names_its_crashed_runs():
    exp = Experiment("x", "peng", "Fig. 1", "t", "c", "s", {}, lambda preset: Plan(runs=[]),
                     lambda ctx: Outcome([], [], "held", "as claimed"))
    ctx = SimpleNamespace(runs=[_view("seed 0", "finished"), _view("seed 1", "failed", "boom")])
    outcome = exp.outcome(ctx)
    assert outcome.summary == "as claimed; 1 of 2 runs crashed, not analysed: seed 1 (boom)"
    assert outcome.verdict == "held"
    ctx.runs = ctx.runs[:1]
    assert exp.outcome(ctx).summary == "as claimed"
