"""Beyond Peng's tables: every entry whose primary is one two-arm comparison states
its resolvable effect from a design SD declared before the runs (a pilot named in the entry), not
from the scatter of this run's seeds, and judges it by :func:`verdicts.judge`."""

import re

import pytest

from bnlab.experiments.luo import cnn as LCNN
from bnlab.experiments.mbn import entries as MBN
from bnlab.experiments.santurkar import dln as SDLN
from bnlab.experiments.santurkar import predictiveness as SPRED
from bnlab.experiments.santurkar.common import BN, STANDARD
from bnlab.experiments.verdicts import Design, judge


def _fig4(spread: float) -> dict:
    base = {"vanilla SGD": 0.15, "BN": 0.05, "WN": 0.13, "WN + mean-only BN": 0.10,
            "WN + variance-only BN": 0.08}
    offsets = [spread * (i - 4.5) / 4.5 for i in range(10)]
    return {k: [v + o for o in offsets] for k, v in base.items()}


def _mbn(spread: float) -> dict:
    acc = {}
    for norm, drop in (("BN", 0.40), ("MBN", 0.05)):
        acc[norm] = {32: {s: 0.98 for s in range(3)},
                     2: {s: 0.98 - drop + spread * (s - 1) for s in range(3)}}
    return acc


CASES = {
    "luo-fig4": (LCNN.FIG4_DESIGN, lambda sd: LCNN.fig4_verdict(_fig4(sd))),
    "mbn-batch-size": (MBN.BATCH_SIZE_DESIGN,
                       lambda sd: MBN.batch_size_verdict(_mbn(sd), tiny=False)),
    "santurkar-fig8": (SDLN.FIG8_DESIGN,
                       lambda sd: SDLN.fig8_verdict({STANDARD: [2.0 + sd, 2.0, 2.0 - sd],
                                                     BN: [1.0 + sd, 1.0, 1.0 - sd]})),
}


@pytest.mark.parametrize("entry", sorted(CASES))
def test_resolvable_effect_comes_from_the_design_not_the_seeds(entry):
    design, verdict_of = CASES[entry]
    assert isinstance(design, Design) and design.design_sd > 0 and "pilot" in design.source
    texts = [verdict_of(sd)[1] for sd in (0.001, 0.01)]
    stated = [re.findall(r"resolvable ≥ ([0-9.e+-]+)", t) for t in texts]
    # the old rule printed (t + t)·observed SE: ten times the spread, ten times the number
    assert stated[0] and stated[0] == stated[1], stated
    assert float(stated[0][0]) == pytest.approx(design.mde(), rel=0.05)
    assert all(design.source in t for t in texts)


def test_fig10_primary_is_judged_with_its_design():
    w = {label: {"ours": [{"grad_change_max": v} for v in values]}
         for label, values in ((STANDARD, [10.0, 12.0, 11.0]), (BN, [1.0, 1.2, 1.1]))}
    # both rate readings trained and agreeing (the second reading's windows are its own replay's)
    verdict, text = SPRED.fig10_verdict(w, literal=w)
    assert verdict == "held"
    design = SPRED.FIG10_DESIGN
    assert f"resolvable ≥ {design.mde():.2g}" in text and design.source in text
    # BN's gradient change larger: significant against the claimed direction
    w[BN], w[STANDARD] = w[STANDARD], w[BN]
    assert SPRED.fig10_verdict(w, literal=w)[0] == "not held"
    # the second reading missing: the readings cannot be shown to agree
    assert SPRED.fig10_verdict(w)[0] == "inconclusive"


def test_direction_only_designs_need_a_significant_contrary_effect_for_not_held():
    # magnitude unknown: a CI short of the stand-in unit effect must not read as "not held"
    design = LCNN.FIG4_DESIGN
    assert not design.magnitude_known
    a, b = [0.10, 0.11, 0.12, 0.10, 0.11], [0.105, 0.115, 0.125, 0.105, 0.115]
    assert judge(a, b, design).verdict == "inconclusive"


# ---- the same for the comparisons of conjunctive / family claims (common.DesignSD) ---------------

def test_compare_arms_with_a_design_sd_states_the_design_resolution():
    from bnlab.experiments.common import DesignSD, compare_arms, design_mde
    from scipy import stats

    design = DesignSD({"loss": 0.2, "drift": 0.05}, "pilot: synthetic")
    a, b = [1.0, 1.1, 0.9], [0.5, 0.6, 0.4]
    observed, planned = compare_arms(a, b), compare_arms(a, b, design_sd=design.of("loss"))
    # the test itself is unchanged; only the stated resolution moves to the design
    assert (planned.diff, planned.se, planned.p, planned.decision) == (
        observed.diff, observed.se, observed.p, observed.decision)
    expected = (stats.t.ppf(0.975, 4) + stats.t.ppf(0.8, 4)) * 0.2 * (2 / 3) ** 0.5
    assert planned.mde == pytest.approx(expected) == design_mde(0.2, 3, 3)
    assert planned.mde_basis == "design SD" and "at the design SD" in planned.text()
    wide = compare_arms([1.0, 2.1, -0.1], [0.5, 1.6, -0.6], design_sd=design.of("loss"))
    assert wide.mde == pytest.approx(planned.mde) and wide.decision != planned.decision
    # the binomial floor still applies to the design resolution
    floored = compare_arms([0.5] * 3, [0.6] * 3, n_test=100, design_sd=0.0)
    assert floored.mde == pytest.approx(design_mde(0.0, 3, 3, floored.se))
    assert "design SD loss 0.2, drift 0.05 (pilot: synthetic)" == design.text()
    with pytest.raises(KeyError, match="declared for: loss, drift"):
        design.of("ics")
    with pytest.raises(ValueError, match="finite numbers ≥ 0"):
        DesignSD(-1.0, "pilot")


def test_mbn_batch_size_floors_the_se_at_the_binomial_se_of_the_drops():
    """A drop counted on 359 test images cannot resolve a 2-point difference because three seeds
    happened to agree (SE 0): the floor, the binomial SE of the two arms' mean drops, makes it
    inconclusive; without test images (no floor) the old rule called it held at p = 0."""
    import math

    import numpy as np

    acc = {"BN": {32: {s: 0.98 for s in range(3)}, 2: {s: 0.96 for s in range(3)}},
           "MBN": {32: {s: 0.98 for s in range(3)}, 2: {s: 0.98 for s in range(3)}}}
    acc["BRN"] = acc["BN"]  # the claim: MBN loses less than BN and than BRN
    assert MBN.batch_size_verdict(acc, tiny=False)[0] == "held"
    verdict, summary = MBN.batch_size_verdict(acc, tiny=False, n_test=359)
    assert verdict == "inconclusive" and "floored" in summary
    # the floor against simulation: seeds' drops counted on n images, arm means over 3 seeds each
    mean = {"BN": {2: 0.556, 32: 0.98}, "MBN": {2: 0.939, 32: 0.981}}
    floor = MBN.drop_floor(mean, {"BN": 3, "MBN": 3}, 359, (2, 32))
    rng = np.random.default_rng(0)

    def arm_mean_drop(p2, p32, draws):
        counts = rng.binomial(359, p32, (draws, 3)) - rng.binomial(359, p2, (draws, 3))
        return counts.mean(1) / 359

    diffs = (arm_mean_drop(0.939, 0.981, 20_000) - arm_mean_drop(0.556, 0.98, 20_000))
    assert diffs.std() == pytest.approx(floor, rel=0.03)
    assert MBN.drop_floor(mean, {"BN": 3, "MBN": 3}, None, (2, 32)) == 0.0
    assert floor == pytest.approx(math.sqrt(sum(
        (p * (1 - p) + q * (1 - q)) / 359 / 3 for p, q in ((0.556, 0.98), (0.939, 0.981)))))


@pytest.mark.parametrize("fraction", [0.2, 0.43, 0.5, 0.501])
def test_test_images_is_the_size_of_the_digits_split(fraction):
    from bnlab import data
    from bnlab.experiments.run_facts import DIGITS_CLASS_SIZES, n_test_images

    split = data.load("digits", test_fraction=fraction)
    assert n_test_images("digits", fraction) == split.y_test.numel()
    assert sum(DIGITS_CLASS_SIZES) == split.y_test.numel() + split.y_train.numel() == 1797
    assert n_test_images("cifar100") == 10_000
    with pytest.raises(ValueError, match="known: digits, cifar10, cifar100"):
        n_test_images("imagenet")
