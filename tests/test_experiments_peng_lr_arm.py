"""The lr side arm of Peng's ResNet tables (peng.tables._lr_rows): CBN − BN with Sigmoid at half the
paper's lr beside the same difference at the paper's lr; a diverged run counts as chance
accuracy for its arm (failure, not missing data)."""

from types import SimpleNamespace

import pytest

from bnlab.experiments.peng import tables as T
from bnlab.experiments.runner import RunView


def Run(row, reading, seed, acc, status="finished"):
    """A stored run as the analysis sees it: the real ``RunView``, without a store behind it."""
    factors = {"row": row, "activation": "sigmoid", "residual": "peng", "seed": seed,
               "lr_reading": reading, "lr": 0.05 if reading == "half" else 0.1}
    record = {"config": {"data_options": {"size": 16, "noise": 1.5}},
              "metrics": {"test_accuracy": acc}}
    return RunView(f"{row} · seed {seed}", factors, None, status, record, None)


def _runs():
    jitter = (-0.004, 0.0, 0.004, -0.002, 0.002)
    runs = []
    for seed, j in enumerate(jitter):
        runs += [Run("①", "half", seed, 0.85 + j), Run("②", "half", seed, 0.86 - j),
                 Run("①", "paper", seed, 0.87 + j),
                 Run("②", "paper", seed, float("nan"), status="diverged")]
    return runs


def test_lr_rows_compare_cbn_and_bn_at_both_learning_rates():
    rows = T._lr_rows(SimpleNamespace(runs=_runs()))
    assert [r["quantity"] for r in rows] == [
        "lr reading · Sigmoid at lr 0.05 · ② CBN − ① BN (points)",
        "lr reading · Sigmoid at lr 0.1 · ② CBN − ① BN (points)"]
    half, paper = rows
    assert half["ours"].startswith("+1.0 ")
    # CBN diverged in every seed at the paper's lr: chance (0.1) against BN's 0.87
    assert paper["ours"].startswith("-77.0 ")
    assert "p = " in paper["ours"] and "n=5" in paper["ours"]


def test_no_side_arm_no_rows():
    runs = [r for r in _runs() if r.factors["lr_reading"] == "paper"]
    assert T._lr_rows(SimpleNamespace(runs=runs)) == []


def test_n_test_follows_the_split():
    assert T._n_test([Run("①", "half", 0, 0.8)]) == 359
    run = Run("①", "half", 0, 0.8)
    run.record["config"]["data_options"]["test_fraction"] = 0.5
    assert T._n_test([run]) == pytest.approx(898, abs=1)
    assert T._n_test([]) is None
