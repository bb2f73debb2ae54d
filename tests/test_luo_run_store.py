"""Luo's entries whose runs need Python objects (Fig. 3's population-statistics evaluation, Fig. 6's
fine-tuning from folded weights) train through the run store like every run: their runs are in the
reproduce's store under ids of their own, and a second reproduce trains nothing (every stored run
unchanged) and says the same."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from bnlab.experiments import runner
from bnlab.experiments.luo.fig3 import population_run
from bnlab.models import create
from bnlab.store import Store
from bnlab.train import TrainConfig
from bnlab.train.prepare import build_model


def _runs(path):
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT id, status, steps, updated, finished FROM runs"))
    finally:
        conn.close()


@pytest.mark.parametrize("entry, label", [("luo-fig6", "fine-tune of"),
                                          ("luo-fig3", "population-statistics evaluation")])
def test_a_second_reproduce_trains_nothing(tmp_path, entry, label):
    first = runner.reproduce(entry, runs_dir=tmp_path, tiny=True, workers=1)
    stored = _runs(tmp_path / "bnlab.db")
    conn = sqlite3.connect(tmp_path / "bnlab.db")
    labels = [row[0] for row in conn.execute("SELECT config FROM runs")]
    conn.close()
    assert any(label in config for config in labels), labels  # trained in this store
    again = runner.reproduce(entry, runs_dir=tmp_path, tiny=True, workers=1)
    assert _runs(tmp_path / "bnlab.db") == stored  # nothing trained, nothing resumed
    assert (again.summary, again.verdict) == (first.summary, first.verdict)


def test_the_population_run_starts_from_the_plain_runs_weights():
    config = {"model": "perceptron", "activation": "identity", "model_options": {"bias": False},
              "norm": "bn", "data": "teacher_student", "seed": 3, "steps": 5}
    labelled, factory = population_run(config)
    assert labelled["model"] == "perceptron[population-statistics evaluation]"
    plain = build_model(TrainConfig.coerce(config), (16,), 1)
    ours = build_model(TrainConfig.coerce(labelled), (16,), 1, factory)
    reference = create("perceptron", norm="bn", activation="identity", input_shape=(16,),
                       num_classes=1, bias=False)
    assert type(ours) is type(plain) is type(reference)
    for (name, a), (_, b) in zip(plain.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_population_runs_follow_the_plain_bn_runs(tmp_path):
    """Fig. 3's population-statistics runs are the plan's BN runs again, step for step: the same
    training losses as the plain runs of their seeds (the evaluation works on a copy)."""
    runner.reproduce("luo-fig3", runs_dir=tmp_path, tiny=True, workers=1)
    with Store(tmp_path / "bnlab.db") as store:
        runs = store.list_runs()
        plain = {r["config"]["seed"]: r["id"] for r in runs
                 if r["config"]["model"] == "perceptron" and r["config"]["norm"] == "bn"}
        population = {r["config"]["seed"]: r["id"] for r in runs
                      if r["config"]["model"].endswith("[population-statistics evaluation]")}
        assert set(plain) == set(population) == {0, 1, 2}
        for seed, run_id in population.items():
            ours, theirs = store.metrics(run_id), store.metrics(plain[seed])
            assert ours["train_loss"] == theirs["train_loss"], seed
            assert "test_loss_population" in ours and "test_loss_population" not in theirs
