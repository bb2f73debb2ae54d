"""A diverged run is a failure of its arm, never missing data, in every analysis
that groups runs into arms (``common.grouped_finals`` and the loss readers of Peng Table 5 / Fig. 6
and Luo Fig. 7). The issue's case: peng-table5's CBN + SELU diverged in 2 of 3 seeds and was scored
"too few seeds"."""

import math

import pytest

from bnlab.experiments.common import grouped_finals
from bnlab.experiments.luo.dropout import fig7_values
from bnlab.experiments.peng import imagenet as P
from bnlab.experiments.peng.blocks import BLOCK_READINGS
from bnlab.experiments.peng.common import ACTIVATIONS
from .test_experiments_luo import fake_context


def _table5_runs(diverged_cbn_selu: int):
    runs = []
    for arm, acc in (("BN", 0.50), ("CBN", 0.70)):
        for act in ACTIVATIONS:
            for seed in range(3):
                diverged = arm == "CBN" and act == "selu" and seed < diverged_cbn_selu
                status = "diverged" if diverged else "finished"
                final = {"test_accuracy": float("nan") if diverged else acc + 0.01 * seed}
                loss = [2.3, float("nan")] if diverged else [2.3, 1.0 - 0.2 * (arm == "CBN")]
                runs.append((f"{arm} {act} {seed}", {"arch": "resnet18", "arm": arm,
                                                     "activation": act, "seed": seed},
                             status, final, {"train_loss": loss}))
    return runs


def test_grouped_finals_counts_diverged_runs_at_the_failure_value(tmp_path):
    ctx = fake_context("peng-table5", _table5_runs(2), tmp_path=tmp_path)
    cells = grouped_finals(ctx, ("arch", "arm", "activation"), "test_accuracy",
                           failure_value=0.1)
    assert cells[("resnet18", "CBN", "selu")] == pytest.approx([0.1, 0.1, 0.72])
    assert cells[("resnet18", "BN", "selu")] == pytest.approx([0.50, 0.51, 0.52])


def test_crashed_runs_stay_missing(tmp_path):
    runs = _table5_runs(0)
    label, factors, _, final, series = runs[-1]
    runs[-1] = (label, factors, "failed", final, series)
    ctx = fake_context("peng-table5", runs, tmp_path=tmp_path)
    cells = grouped_finals(ctx, ("arch", "arm", "activation"), "test_accuracy",
                           failure_value=0.1)
    assert len(cells[(factors["arch"], factors["arm"], factors["activation"])]) == 2


def test_table5_diverged_cbn_seeds_fail_the_claim_not_the_seed_count(tmp_path):
    # the case: 2 of 3 CBN + SELU seeds diverged. Old code: n = 1, "too few seeds"
    two = get_table5(tmp_path, diverged=2)
    assert "too few seeds" not in two.summary and "SELU -20.3" in two.summary
    assert "n=3/3" in two.summary.split("SELU")[1].split("[paper")[0]
    # every CBN + SELU seed diverged: CBN at chance there is significantly worse, "not held" (old
    # code: an empty arm, "inconclusive")
    three = get_table5(tmp_path, diverged=3)
    assert three.verdict == "not held" and "ResNet-18/SELU" in three.summary.split("Against")[1]


def get_table5(tmp_path, diverged):
    from bnlab.experiments import get
    # the same runs under both block readings, so that neither reading is missing (inconclusive)
    runs = [(f"{label} {reading}", {**factors, "reading": reading}, status, final, series)
            for reading in BLOCK_READINGS
            for label, factors, status, final, series in _table5_runs(diverged)]
    ctx = fake_context("peng-table5", runs, tmp_path=tmp_path)
    return get("peng-table5").analyze(ctx)


def test_fig6_loss_cells_count_a_diverged_run_as_chance_loss(tmp_path):
    ctx = fake_context("peng-fig6", _table5_runs(2), tmp_path=tmp_path)
    cells = P._loss_cells(ctx)
    assert cells[("resnet18", "CBN", "selu")][:2] == pytest.approx([math.log(10)] * 2)
    assert len(cells[("resnet18", "CBN", "selu")]) == 3


def test_luo_fig7_diverged_run_counts_as_chance_level(tmp_path):
    runs = [(f"{arm} {s}", {"arm": arm, "seed": s}, "diverged" if (arm == "WN" and s == 0)
             else "finished", {}, {"test_loss": [0.5, 0.4, 0.3], "test_accuracy": [0.8, 0.9, 0.9]})
            for arm in ("BN", "WN") for s in range(3)]
    ctx = fake_context("luo-fig7", runs, tmp_path=tmp_path)
    losses = fig7_values(ctx.runs)
    accs = fig7_values(ctx.runs, "test_accuracy")
    assert losses["WN"][0] == pytest.approx(math.log(10)) and len(losses["WN"]) == 3
    assert accs["WN"][0] == pytest.approx(0.1) and len(accs["WN"]) == 3
