"""experiments.common.compare_arms: the stated rule (Welch t, ≥3 seeds, minimum detectable
effect)."""

import math

import numpy as np
import pytest
from scipy import stats

from bnlab.experiments.common import MIN_SEEDS, RULE, compare_arms


def test_compare_arms_matches_scipy_welch():
    a, b = [0.10, 0.14, 0.12, 0.11], [0.20, 0.25, 0.19]
    c = compare_arms(a, b)
    ref = stats.ttest_ind(b, a, equal_var=False)
    assert c.diff == pytest.approx(np.mean(b) - np.mean(a))
    assert c.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert c.se == pytest.approx(math.sqrt(np.var(a, ddof=1) / 4 + np.var(b, ddof=1) / 3))
    assert c.decision == "higher" and compare_arms(b, a).decision == "lower"
    assert "Welch" in c.text(100) and "Welch" in RULE


def test_compare_arms_needs_three_seeds_and_drops_non_finite():
    c = compare_arms([0.1, 0.2], [0.5, 0.6, 0.7])
    assert c.decision == "too few seeds" and c.diff == pytest.approx(0.45) and MIN_SEEDS == 3
    c = compare_arms([0.1, float("nan"), 0.2, None], [0.5, 0.6, 0.7])
    assert c.n_a == 2 and c.decision == "too few seeds"
    assert compare_arms([], [1.0, 2.0, 3.0]).diff is None


def test_no_detectable_difference_reports_a_minimum_detectable_effect_with_the_stated_power():
    gen = np.random.default_rng(1)
    a, b = gen.normal(0, 1, 8), gen.normal(0, 1, 8)
    c = compare_arms(a, b)
    assert c.decision == "no detectable difference" and c.mde > abs(c.diff)
    # simulation: a true effect equal to the MDE computed from the true SE (σ=1, n=8 per arm) is
    # detected about 80 % of the time (the t quantiles at the Welch df make it approximate)
    n, sims = 8, 4000
    se = math.sqrt(2 / n)
    mde = (stats.t.ppf(0.975, 2 * n - 2) + stats.t.ppf(0.8, 2 * n - 2)) * se
    x = gen.normal(0, 1, (sims, n))
    y = gen.normal(mde, 1, (sims, n))
    detected = stats.ttest_ind(y, x, axis=1, equal_var=False).pvalue < 0.05
    assert 0.74 < detected.mean() < 0.86


def test_identical_values_count_any_difference_as_detected():
    assert compare_arms([1.0] * 3, [1.0] * 3).decision == "no detectable difference"
    assert compare_arms([1.0] * 3, [2.0] * 3).decision == "higher"


def test_the_quoted_rule_describes_what_compare_arms_does_with_a_design_sd_and_a_floor():
    """Entries quote ``RULE`` beside comparisons made with a design SD and an SE floor; the text
    once described only the observed-SD resolution."""
    a, b = [0.50, 0.52, 0.51], [0.53, 0.50, 0.52]
    planned = compare_arms(a, b, design_sd=0.1, se_floor=0.05)
    observed = compare_arms(a, b)
    # the resolution is the design's, not these seeds' scatter; the floor bounds the test's SE
    assert planned.mde_basis == "design SD" and planned.mde > 5 * observed.mde
    assert planned.se == pytest.approx(0.05)
    assert "design SD" in RULE and "floored" in RULE and "observed" in RULE
    assert "at the design SD" in planned.text() and "at the design SD" not in observed.text()
