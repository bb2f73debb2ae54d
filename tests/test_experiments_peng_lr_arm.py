"""The lr side arm of Peng's ResNet tables (peng.tables._lr_rows): CBN − BN with Sigmoid at half the
paper's lr beside the same difference at the paper's lr; a diverged run counts as chance
accuracy for its arm (failure, not missing data)."""

from types import SimpleNamespace

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
    rows = T._lr_rows(SimpleNamespace(runs=_runs()), 359)
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
    assert T._lr_rows(SimpleNamespace(runs=runs), 359) == []


def test_the_floor_is_the_tables_design():
    """The side arm's SE floor is the binomial SE on the table's own test-set size (its design):
    on CIFAR-100's stand-in (901 test images) the same difference is resolved more sharply than
    on 359."""
    from bnlab.experiments.peng.verdict import table_design

    assert (table_design(1).n_test, table_design(3).n_test) == (359, 901)
    p = [float(T._lr_rows(SimpleNamespace(runs=_runs()), n)[0]["ours"]
               .split("p = ")[1].split(";")[0]) for n in (359, 901)]
    assert p[1] < p[0]
