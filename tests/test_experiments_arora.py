"""Arora, Li & Lyu (App. D) catalogue entries: plans against the paper, verdict logic, tiny runs."""

from __future__ import annotations

import math

import pytest

from bnlab.experiments.arora import entries as A
from bnlab.experiments.arora import verdicts as AV
from bnlab.experiments import get, reproduce
from bnlab.train import TrainConfig

IDS = ["arora-d1", "arora-d2", "arora-d3"]


def _run_id(config: dict) -> str:
    return TrainConfig.coerce(config).run_id()


def test_d1_plan_matches_appendix_d1():
    runs = get("arora-d1").plan("paper").runs
    assert len(runs) == 2 * 5 * len(A.SEEDS) and len(A.SEEDS) >= 3
    for r in runs:
        c = r.config
        assert (c["model"], c["data"], c["epochs"]) == ("vgg_arora", "cifar10", 100)
        # plain SGD
        assert (c["momentum"], c["weight_decay"], c["schedule"]) == (0.0, 0.0, "constant")
        # scale-variant lr fixed
        assert c["lr"] == 0.1 and c["norm"].startswith("bn")
    assert sorted({r.config["lr_scale_invariant"] for r in runs
                   if r.config["optimizer"] == "sgd"}) == \
        [1e-2, 1e-1, 1.0, 1e1, 1e2]
    assert {r.config["optimizer"] for r in runs} == {"sgd", "psgd"}


def test_d2_plan_and_sharing():
    runs = get("arora-d2").plan("paper").runs
    n = len(A.SEEDS)
    assert len(runs) == 3 * 5 * n
    assert all(r.config["lr"] == r.config["lr_scale_invariant"] for r in runs)
    removed = [r for r in runs if r.factors["setting"] == "SGD, BN removed"]
    assert len(removed) == 5 * n \
        and all(r.config["norm"] == "none" and r.config["optimizer"] == "sgd" for r in removed)
    for preset, shared in (("paper", 2 * n), ("smoke", 2 * n)):
        d1 = {_run_id(r.config) for r in get("arora-d1").plan(preset).runs}
        d2 = {_run_id(r.config) for r in get("arora-d2").plan(preset).runs}
        d3 = {_run_id(r.config) for r in get("arora-d3").plan(preset).runs}
        # SGD and PSGD at lr 0.1 are the same runs in both presets (both train 100 epochs)
        assert len(d1 & d2) == shared
        assert d3 == d1 | d2 and len(d3) == 25 * n - shared


def test_smoke_plans_are_small():
    for eid in IDS:
        for r in get(eid).plan("smoke").runs:
            assert r.config["data"] == "digits" and r.config["model"] == "mlp"
            # Arora Eq. 2: BN on the logits too (every kernel scale-invariant) wherever there is BN
            assert r.config["model_options"]["logit_bn"] is True
    # the paper's 100 epochs: at 15, SGD at lr_si 0.01 sat at 0.31, above the "converged" line
    assert all(r.config["epochs"] == 100 for r in get("arora-d1").plan("smoke").runs)


def test_d2_smoke_runs_the_papers_epochs():
    """At 15 epochs SGD with BN at lr 0.01 was still falling (a budget artifact): D.2's smoke runs
    train the paper's 100 epochs, every arm alike, with three seeds."""
    runs = get("arora-d2").plan("smoke").runs
    assert {r.config["epochs"]
            for r in runs} == {100} == {get("arora-d2").plan("paper").runs[0].config["epochs"]}
    assert sorted(r.config["seed"] for r in runs if r.factors["lr"] == 0.01
                  and r.factors["setting"] == "SGD") == \
        [0, 1, 2]


# ---- verdicts on synthetic numbers ---------------------------------------------------------------

def test_d1_verdict():
    sgd = {lr: [0.02, 0.03, 0.025] for lr in A.LRS}
    psgd = {0.01: [0.02, 0.03, 0.02], 0.1: [0.02, 0.02, 0.03], 1.0: [0.6, 0.7, 0.65],
            10.0: [0.8, 0.9, 1.0], 100.0: [2.1, 2.0, None]}
    assert AV.d1_verdict({"SGD": sgd, "PSGD": psgd})[0] == "held"
    assert AV.d1_verdict({"SGD": sgd, "PSGD": psgd}, tiny=True)[0] == "inconclusive"
    # SGD diverged
    assert AV.d1_verdict({"SGD": {**sgd, 100.0: [0.02, None, 0.02]}, "PSGD": psgd})[0] == "not held"
    # PSGD not stuck
    assert AV.d1_verdict({"SGD": sgd, "PSGD": {**psgd, 100.0: [0.02] * 3}})[0] == "not held"
    assert "PSGD fails at every larger lr: 1" in AV.d1_verdict({"SGD": sgd, "PSGD": psgd})[1]
    # PSGD training at lr_si = 1 and failing from 10 up: held, with the smallest failing lr reported
    # (the paper gives no threshold; a 100-epoch re-run: "the claim holds from lr 10 up")
    verdict, summary = AV.d1_verdict({"SGD": sgd, "PSGD": {**psgd, 1.0: [0.05, 0.04, 0.06]}})
    assert verdict == "held" and "larger lr: 10" in summary
    # PSGD failing at lr_si 0.1 (where the projection should change nothing the paper reports): not
    # held
    assert AV.d1_verdict({"SGD": sgd, "PSGD": {**psgd, 0.1: [0.9, 1.0, 0.95]}})[0] == "not held"
    # slow, not stuck
    assert AV.d1_verdict({"SGD": {**sgd, 0.01: [0.3] * 3}, "PSGD": psgd})[0] == "inconclusive"
    # stuck-level loss but one seed only: the rule cannot tell PSGD from SGD
    assert AV.d1_verdict(
        {"SGD": {lr: [0.02] for lr in A.LRS}, "PSGD": {lr: [v[0]] for lr, v in psgd.items()}}
        )[0] == "inconclusive"
    assert AV.d1_verdict({"SGD": {}, "PSGD": {}})[0] == "inconclusive"


def test_d1_names_a_psgd_arm_between_the_converged_and_the_stuck_line():
    """The store's lr_si 10: PSGD 0.42 against SGD 0.026, neither converged (≤ 0.23) nor stuck
    (≥ 0.46): the smallest failing lr reads 100, and the summary says why."""
    sgd = {lr: [0.02, 0.03, 0.025] for lr in A.LRS}
    psgd = {0.01: [0.03] * 3, 0.1: [0.02] * 3, 1.0: [0.02] * 3, 10.0: [0.36, 0.42, 0.47],
            100.0: [2.1, 2.0, 2.3]}
    verdict, summary = AV.d1_verdict({"SGD": sgd, "PSGD": psgd})
    assert verdict == "held" and "larger lr: 100" in summary
    assert "between the converged ≤ 0.23 and stuck ≥ 0.46 lines, neither: lr_si 10 0.417" in summary
    assert "between" not in AV.d1_verdict({"SGD": sgd, "PSGD": {**psgd, 10.0: [0.9] * 3}})[1]


def test_d2_verdict():
    sgd = {lr: 0.01 for lr in A.LRS}
    psgd = {0.01: 0.05, 0.1: 0.01, 1.0: 0.3, 10.0: 2.3, 100.0: None}
    none = {0.01: 0.4, 0.1: 0.1, 1.0: None, 10.0: None, 100.0: None}
    loss = {"SGD": sgd, "PSGD": psgd, "SGD, BN removed": none}
    settled = loss  # the 5 epochs before the last 5 at the same level: every arm has settled
    assert AV.d2_verdict(loss, settled)[0] == "held"
    bad = {**loss, "SGD": {**sgd, 10.0: 2.15}}
    assert AV.d2_verdict(bad, bad)[0] == "not held"
    assert AV.d2_verdict({**loss, "PSGD": {**psgd, 100.0: 0.01}}, settled)[0] == "not held"
    assert AV.d2_verdict({"SGD": sgd}, {})[0] == "inconclusive"


def test_d2_verdict_waits_for_the_loss_to_settle():
    """The old smoke verdict: SGD at lr 0.01 at 0.56 after 15 epochs, still falling ≈ 4 % an epoch,
    read as a failure to converge ("not held"). Still falling is inconclusive; settled at that level
    is not held."""
    sgd = {lr: [0.02, 0.03, 0.025] for lr in A.LRS}
    loss = {"SGD": {**sgd, 0.01: [0.55, 0.56, 0.58]}, "PSGD": {lr: [2.3] * 3 for lr in A.LRS},
            "SGD, BN removed": {**{lr: [0.1] * 3 for lr in A.LRS}, 100.0: [None] * 3}}
    falling = {**loss, "SGD": {**loss["SGD"], 0.01: [0.68, 0.70, 0.72]}}
    verdict, summary = AV.d2_verdict(loss, falling)
    assert verdict == "inconclusive" and "still falling" in summary and "SGD at lr 0.01" in summary
    # settled at 0.56 > 0.2·ln 10: SGD fails at lr 0.01
    assert AV.d2_verdict(loss, loss)[0] == "not held"
    # a stuck-level PSGD arm at the largest lr that is still falling has not been shown stuck
    converged = {**loss, "SGD": sgd}
    verdict, summary = AV.d2_verdict(
        converged, {**converged, "PSGD": {**converged["PSGD"], 100.0: [3.0] * 3}})
    assert verdict == "inconclusive" and "PSGD at lr 100" in summary
    assert AV.d2_verdict(converged, converged)[0] == "held"


def test_still_falling():
    assert AV.still_falling([0.536] * 3, [0.685] * 3)          # the 15-epoch lr-0.01 arm: 22 % down
    # 5 % down: settled (SETTLE_DROP = 10 %)
    assert not AV.still_falling([0.136] * 3, [0.143] * 3)
    assert not AV.still_falling([0.5, 0.5, 0.5], [0.5, 0.52, 0.54])
    assert not AV.still_falling([None, 0.2, 0.2], [1.0] * 3)   # diverged: not falling
    # no earlier window: cannot be shown settled
    assert AV.still_falling([0.5] * 3, None)
    assert AV.SETTLE_DROP == 0.1


def test_d3_verdict():
    def acc(sgd, psgd):
        return {("SGD", m): dict(zip(A.LRS, sgd)) for m in ("unified", "separate")} | \
               {("PSGD", m): dict(zip(A.LRS, psgd)) for m in ("unified", "separate")}

    good = acc([0.80, 0.85, 0.84, 0.82, 0.80], [0.80, 0.85, 0.60, 0.30, 0.10])
    assert AV.d3_verdict(good)[0] == "held"
    assert AV.d3_verdict(
        acc([0.80, 0.85, 0.84, 0.82, None], [0.8, 0.85, 0.6, 0.3, 0.1]))[0] == "not held"
    assert AV.d3_verdict(
        acc([0.80, 0.85, 0.84, 0.82, 0.8], [0.8, 0.85, 0.86, 0.85, 0.84]))[0] == "not held"
    assert AV.d3_verdict({})[0] == "inconclusive"


class _FakeRun:
    def __init__(self, status, values):
        self.status, self._values = status, values

    def series(self, name):
        return list(range(len(self._values))), list(self._values)


def test_tail_value():
    # last 5 epochs
    assert A.tail_value(_FakeRun("finished", [9, 9, 1, 2, 3, 4, 5]), "m") == pytest.approx(3.0)
    run = _FakeRun("finished", [99, 6, 5, 4, 3, 2, 1, 1, 1, 1, 1])
    # the 5 epochs before the last 5: 6 5 4 3 2
    assert A.tail_value(run, "m", skip=5) == pytest.approx(4.0)
    # what is there
    assert A.tail_value(_FakeRun("finished", [4, 2, 1]), "m", skip=2) == pytest.approx(4.0)
    assert A.tail_value(_FakeRun("finished", [2.0, float("nan"), 4.0]), "m") == pytest.approx(3.0)
    assert A.tail_value(_FakeRun("diverged", [1.0, 2.0]), "m") is None
    assert A.tail_value(_FakeRun("finished", []), "m") is None
    assert AV.CONVERGED == pytest.approx(0.1 * math.log(10)) and AV.STUCK > AV.CONVERGED


# ---- end to end, tiny ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("arora_runs")


@pytest.mark.parametrize("experiment_id", IDS)
def test_tiny_reproduce(experiment_id, runs_dir):
    outcome = reproduce(experiment_id, "smoke", runs_dir=runs_dir, tiny=True,
                        report=False, progress=False)
    assert outcome.figures \
        and all(f.suffix == ".png" and f.stat().st_size > 2000 for f in outcome.figures)
    assert outcome.table and all({"quantity", "ours", "paper"} <= set(row) for row in outcome.table)
    assert outcome.verdict == "inconclusive" and "tiny" in outcome.summary
    expected_rows = {"arora-d1": 10, "arora-d2": 15, "arora-d3": 25}[experiment_id]
    assert len(outcome.table) == expected_rows
