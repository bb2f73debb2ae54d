"""A config given twice to one sweep is trained once (entries that share runs).

``bnlab reproduce peng-table1 peng-fig4`` plans Table 1's compared runs twice. Before, both copies
went into one sweep: with two workers they could start side by side on the same run (one waited on
the other's lock), and the seconds of the second were a resume's. Now the sweep trains each distinct
config once and repeats its record.
"""

from __future__ import annotations

from types import SimpleNamespace

from bnlab.experiments import runner

A = {"model": "mlp", "norm": "bn", "data": "digits", "steps": 3, "seed": 0}
B = {**A, "seed": 1}


def test_duplicate_configs_train_once_and_every_position_gets_its_record(monkeypatch):
    trained = []

    def fake_run(config, progress=False, **_):
        trained.append(config["seed"])
        return SimpleNamespace(to_dict=lambda: {"id": f"run{config['seed']}", "status": "finished",
                                                "seed": config["seed"]})

    monkeypatch.setattr(runner.train, "run", fake_run)
    # the same config as another dict, keys in another order: still one run
    records = runner.run_sweep([A, B, dict(reversed(list(A.items()))), B, A], workers=1,
                               progress=False)
    assert sorted(trained) == [0, 1]
    assert [r["id"] for r in records] == ["run0", "run1", "run0", "run1", "run0"]
    records[0]["status"] = "edited"  # each position has its own record
    assert records[2]["status"] == "finished"


def test_distinct_keeps_first_seen_order():
    distinct, where = runner._distinct([B, A, B, {**A, "lr": 0.1}, A])
    assert distinct == [B, A, {**A, "lr": 0.1}]
    assert where == [0, 1, 0, 2, 1]
