"""Santurkar et al. 2018's ℓp entries judged under every reading that can move them: Figs 11–13
with the DLN trained at both readings of App. A.1's rate (1e-3 and the literal 1e-2), Fig. 14 with
the caption's "normal networks" read as the standard and as the BN network.

Each reading is judged by the same rule and combined by :func:`readings.combine_readings`: the
entry holds or fails only where the readings agree, else it is inconclusive (reading-dependent)
and its summary gives both readings' numbers. The verdicts are pure functions of per-seed numbers,
tested here on synthetic values whose answer is known by construction; the printed numbers are
checked against scipy's Welch test.
"""

from __future__ import annotations

import math
import re

import pytest
from scipy import stats

import bnlab.experiments as E
from bnlab.experiments.runner import AnalysisContext
from bnlab.experiments.santurkar import dln as DL
from bnlab.experiments.santurkar import lp as LP
from bnlab.experiments.santurkar import lp_verdicts as LV
from bnlab.experiments.santurkar import vgg as V
from bnlab.experiments.santurkar.common import (BN, DLN_LR, L1, L2, LINF, LITERAL_LR, STANDARD,
                                                dln_config)

SPREAD = (0.97, 1.0, 1.03)
NETS = ("VGG", "DLN", LV.LITERAL_NET)


def seeds(value: float) -> list[float]:
    return [value * j for j in SPREAD]


def _lp_values(rough: dict[str, float] | None = None) -> tuple[dict, dict]:
    """Per-seed losses and landscape summaries of every fig11 arm: every normalized arm 10× below
    the standard network in loss and in each landscape median; ``rough`` maps a net to the factor
    its normalized arms' landscape medians stand at instead (above 1: rougher than standard)."""
    losses, landscapes = {}, {}
    for net in NETS:
        for label in LV.LP_LABELS:
            key = f"{net}: {label}"
            losses[key] = seeds(1.0 if label == STANDARD else 0.1)
            f = 1.0 if label == STANDARD else (rough or {}).get(net, 0.1)
            landscapes[key] = [{k: 50.0 * f * j for k in DL.LANDSCAPE} for j in SPREAD]
    return losses, landscapes


def _welch_p(a: list[float], b: list[float]) -> float:
    return float(stats.ttest_ind(b, a, equal_var=False).pvalue)


def test_fig11_readings_agree_and_disagree():
    losses, landscapes = _lp_values()
    verdict, summary = LV.fig11_readings(losses, landscapes)
    assert verdict == "held" and "the readings agree" in summary
    # the DLN's landscape 3× rougher than standard's at 1e-3 and 10× smoother at 1e-2: the primary
    # reading alone says "not held"; the readings together cannot decide
    losses, landscapes = _lp_values({"DLN": 3.0})
    primary = LV.fig11_verdict(losses, landscapes)
    assert primary[0] == "not held"
    verdict, summary = LV.fig11_readings(losses, landscapes)
    assert verdict == "inconclusive"
    assert (f"reading-dependent: the readings disagree (DLN trained at lr {DLN_LR:g} not held, "
            f"DLN trained at lr {LITERAL_LR:g} held)") in summary
    # both readings' numbers: each is fig11_verdict's own summary, in the readings' order
    first, second = summary.index(f"DLN trained at lr {DLN_LR:g}: not held: "), \
        summary.index(f"DLN trained at lr {LITERAL_LR:g}: held: ")
    assert first < second and primary[1] in summary
    assert "16 of 16 checks held" in summary[second:] and "4 against" in summary[first:second]
    # the DLN's BN − standard numbers of each reading: ln 3 rougher at 1e-3, ln 0.1 at 1e-2
    shown = re.findall(r"median loss range along the gradient \(ln\): ([+-]?[0-9.]+) ±", summary)
    assert [float(v) for v in shown] == pytest.approx([math.log(3.0), math.log(0.1)], rel=0.01)
    # rough at both rates: the readings agree on "not held"
    losses, landscapes = _lp_values({"DLN": 3.0, LV.LITERAL_NET: 3.0})
    assert LV.fig11_readings(losses, landscapes)[0] == "not held"
    assert LV.fig11_readings(losses, landscapes, "tiny")[0] == "inconclusive"


def test_fig11_literal_reading_reads_the_literal_runs_and_prints_welchs_numbers():
    losses, landscapes = _lp_values()
    # at 1e-2 the ℓ1 DLN trains 2× worse than BN: Fig. 13's check fails there only
    literal_l1 = [0.2, 0.25, 0.18]
    losses[f"{LV.LITERAL_NET}: {L1}"] = literal_l1
    verdict, summary = LV.fig11_readings(losses, landscapes)
    assert verdict == "inconclusive" and "reading-dependent" in summary
    tail = summary[summary.index(f"DLN trained at lr {LITERAL_LR:g}: not held"):]
    bn = [math.log(v) + math.log(LV.COMPARABLE_FACTOR) for v in losses[f"{LV.LITERAL_NET}: {BN}"]]
    ours = [math.log(v) for v in literal_l1]
    p = _welch_p(bn, ours)
    shown = re.search(rf"DLN: {re.escape(L1)} − 1.25× BN, mean training loss \(ln\): "
                      r"([+-]?[0-9.]+) ± [0-9.]+ \(SE; Welch p=([0-9.e-]+)", tail)
    assert shown is not None
    assert float(shown[1]) == pytest.approx(sum(ours) / 3 - sum(bn) / 3, rel=0.01)
    assert float(shown[2]) == pytest.approx(p, rel=0.02)
    # the literal DLN's landscape is stated at fig9's lr 1e-2 design SDs, not the 1e-3 ones
    assert LV.FIG11_LITERAL_DESIGN_SD.of("DLN loss_range") == \
        DL.FIG9_DESIGN_SD.of("lr 1e-2 loss_range")
    assert LV.FIG11_LITERAL_DESIGN_SD.text() in tail


def test_fig11_record_is_the_primary_readings_deciding_check():
    losses, landscapes = _lp_values({"DLN": 3.0})
    verdict, _ = LV.fig11_readings(losses, landscapes)
    record = LV.fig11_record(verdict, losses, landscapes)
    assert record.verdict == "inconclusive"
    # the first check against the claim at 1e-3: BN's DLN landscape, its loss range
    assert record.primary == (f"DLN: {BN} − standard, ln median loss range along the gradient "
                              f"(DLN at lr {DLN_LR:g})")
    assert record.effect == pytest.approx(math.log(3.0), rel=1e-6) and record.unit == " (ln)"
    assert record.p == pytest.approx(_welch_p([math.log(50.0 * j) for j in SPREAD],
                                              [math.log(150.0 * j) for j in SPREAD]), rel=0.02)


def test_fig11_plans_the_literal_dln_as_the_runs_other_entries_train():
    """The literal DLN arms are fig9's (standard, BN) and fig6's configs: the store trains each
    config once, so fig11 adds only its ℓp arms at 1e-2."""
    for preset in ("smoke", "paper"):
        def literal(entry):
            return {(r.config["norm"], r.config["seed"]): r.config
                    for r in E.get(entry).plan(preset).runs
                    if r.factors["net"] == "dln" and r.config["lr"] == LITERAL_LR}
        fig11, fig9, fig6 = literal("santurkar-fig11"), literal("santurkar-fig9"), \
            literal("santurkar-fig6")
        assert len(fig11) == 15 and {norm for norm, _ in fig11} == {
            "none", "bn", "lp_bn(p=1)", "lp_bn(p=2)", "lp_bn(p=inf)"}
        assert fig9 and all(fig11[key] == config for key, config in fig9.items())
        assert fig6 and all(fig11[key] == config for key, config in fig6.items())
        assert fig11[("lp_bn(p=2)", 1)] == dln_config(preset, "lp_bn(p=2)", 1, LITERAL_LR)
        arms = {r.factors["arm"] for r in E.get("santurkar-fig11").plan(preset).runs}
        assert f"{LV.LITERAL_NET}: {L2}" in arms and f"{LV.LITERAL_NET}: {STANDARD}" in arms
    assert LV.LITERAL_NET + ": " == V.LITERAL_DLN  # one name for the DLN at 1e-2 across entries


class _Run:
    def __init__(self, arm, seed, loss, landscape):
        self.label, self.status, self.id = f"{arm} · seed {seed}", "finished", "fake"
        self.factors, self.record = {"arm": arm, "seed": seed}, {"metrics": {}}
        steps = range(10, 210, 10)
        self._m = {"train_loss": [(s, loss) for s in steps]}
        self._m.update({f"probe/landscape/{k}": [(s, v) for s in steps]
                        for k, v in landscape.items()})

    def series(self, name):
        rows = self._m.get(name, [])
        return [s for s, _ in rows], [v for _, v in rows]

    def metric_names(self, prefix=""):
        return [n for n in self._m if n.startswith(prefix)]

    def final(self, name):
        return None


def _fig11_runs(rough, nets=NETS):
    losses, landscapes = _lp_values(rough)
    return [_Run(key, i, losses[key][i], landscapes[key][i])
            for key in losses if key.split(":")[0] in nets for i in range(3)]


def test_fig11_analysis_combines_the_readings(tmp_path):
    def analyze(runs):
        return LP._fig11_analyze(AnalysisContext(E.get("santurkar-fig11"), "smoke", runs, {},
                                                 tmp_path, False))

    out = analyze(_fig11_runs({"DLN": 3.0}))
    assert out.verdict == "inconclusive" and "reading-dependent" in out.summary
    assert len(out.figures) == 3 and any(LV.LITERAL_NET in row["quantity"] for row in out.table)
    assert out.record.verdict == "inconclusive" and out.record.effect > 0
    assert analyze(_fig11_runs({"DLN": 3.0, LV.LITERAL_NET: 3.0})).verdict == "not held"
    # a store from before the literal runs: that reading is unmeasured, so nothing is decided
    out = analyze(_fig11_runs(None, nets=("VGG", "DLN")))
    assert out.verdict == "inconclusive" and len(out.figures) == 2
    assert f"DLN trained at lr {LITERAL_LR:g}: inconclusive" in out.summary


# ---- Fig. 14 ------------------------------------------------------------------------------------

def _fig14_values(lp_drift: float, bn_drift: float, bn_loss: float) -> tuple[dict, dict]:
    drift = {STANDARD: seeds(0.2), BN: seeds(bn_drift),
             **{label: seeds(lp_drift) for label in LV.LP}}
    losses = {STANDARD: seeds(1.0), BN: seeds(bn_loss), **{label: seeds(0.1) for label in LV.LP}}
    return drift, losses


def test_fig14_readings_of_normal_networks():
    # ℓp drifts more than both and trains better than standard, comparably to BN: held
    verdict, summary = LV.fig14_readings(*_fig14_values(0.6, 0.1, 0.1))
    assert verdict == "held" and "the readings agree" in summary
    # ℓp drifts less than the standard network but more than BN: the readings disagree
    drift, losses = _fig14_values(0.15, 0.05, 0.1)
    primary = LV.fig14_verdict(drift, losses)
    assert primary[0] == "not held"
    verdict, summary = LV.fig14_readings(drift, losses)
    assert verdict == "inconclusive" and (
        "reading-dependent: the readings disagree (“normal networks” = the standard network not "
        "held, “normal networks” = the BN network held)") in summary
    assert primary[1] in summary and f"{LINF}: drift − BN: " in summary
    assert f"{LINF}: drift − standard: " in summary
    # against BN the loss check is Fig. 13's "comparably": ℓp at 2× BN's loss fails it
    drift, losses = _fig14_values(0.6, 0.1, 0.05)
    bn_reading = LV.fig14_verdict(drift, losses, reference=BN,
                                  design_sd=LV.FIG14_BN_DESIGN_SD)
    assert bn_reading[0] == "not held" and "mean training loss − 1.25× BN (ln)" in bn_reading[1]
    assert LV.fig14_readings(drift, losses)[0] == "inconclusive"
    with pytest.raises(ValueError, match="reference must be"):
        LV.fig14_comparisons(drift, losses, reference=L1)


def test_fig14_record_is_the_primary_readings_deciding_check():
    drift, losses = _fig14_values(0.15, 0.05, 0.1)
    record = LV.fig14_record("inconclusive", drift, losses)
    assert record.verdict == "inconclusive" and record.primary == f"{L1} − standard, median drift"
    assert record.effect == pytest.approx(-0.05, rel=1e-6) and record.p == pytest.approx(
        _welch_p(drift[STANDARD], drift[L1]), rel=0.02)
    # the VGG runs only: the DLN's rate is no reading of Fig. 14
    assert all(r.factors["net"] == "vgg" for r in E.get("santurkar-fig14").plan("smoke").runs)
