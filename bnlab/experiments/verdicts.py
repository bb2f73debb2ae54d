"""The verdict rule of the catalogue, in one module: its constants (:data:`ALPHA`, :data:`POWER`,
:data:`MIN_SEEDS`), its two texts (:data:`RULE` for a pre-declared primary comparison,
:data:`COMPARE_RULE` for the comparisons an entry reports) and every function that decides. The
maths it is made of (Welch's SE and df, t quantiles, the binomial floor, Holm's step-down) is
:mod:`~bnlab.experiments.significance`, level-free; how its numbers are written is
:mod:`~bnlab.experiments.verdict_text`. No plotting is imported here.

Why a rule of its own: judging every comparison an entry prints at the resolution of 3 seeds'
observed SD called an exact null "not held" 8–14 % of the time and the paper's true effect "held"
only 20 %, gave p ≈ 0 to arms one test image apart and dropped diverged runs. The rule's items:
(1) one pre-declared primary comparison (:class:`Design`), other judged comparisons Holm-corrected
as a family (Holm 1979, "A simple sequentially rejective multiple test procedure"); (2) its
resolution fixed in advance (:func:`design_mde`); (3) a floor on the SE (binomial for accuracies);
(4) divergence is failure (:func:`arm_values`); (5) the decision, Welch's two-sided t at α (Welch
1947; :func:`judge`): P(false "held" | no effect) ≤ α/2, P(false "not held" | the paper's effect)
≤ α/2 + the family's Holm share (``tests/test_verdict_rule.py`` simulates both); (6) settling
(:func:`settle_fraction`, :func:`settle`). ``docs/readme/experiments.md`` states them in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bnlab.formatting import mean_std

from . import verdict_text
from .significance import (
    binomial_floor, design_se, fewest_seeds, finite_values, holm, resolvable, short_p, t_quantile,
    two_sided_p, welch)

MIN_SEEDS = 3   # per arm, below which no test is made
ALPHA = 0.05    # two-sided significance level of every test of the rule
POWER = 0.8     # the power at which a design's resolvable effect is stated

RULE = (
    f"one pre-declared primary comparison per entry: Welch's two-sided t (α = {ALPHA:g}, "
    f"≥ {MIN_SEEDS} seeds per arm) with the standard error floored (binomial on the test-set size "
    "for accuracies); held = significant in the paper's direction, not held = significant against "
    f"it or the {100 * (1 - ALPHA):g} % CI excludes the paper's effect, else inconclusive; "
    f"resolvable effect (t_{1 - ALPHA / 2:g} + t_{POWER:g})·design SD·√(1/n_a + 1/n_b), from a "
    "design SD stated in advance; diverged runs count as failures of their arm; other comparisons "
    "Holm-corrected"
)
# What :func:`compare_arms` does, quoted by the entries that report its comparisons.
COMPARE_RULE = (
    f"Welch's two-sided t-test on the per-seed values, α = {ALPHA:g}, at least {MIN_SEEDS} "
    "seeds per arm, the standard error floored at the measurement's resolution (binomial on "
    "the test-set size for accuracies); a non-significant difference is reported with the "
    f"effect it resolves at power {POWER:g}, (t_(1−α/2) + t_({POWER:g}))·SE, the SE from the "
    "design SD stated in advance where the entry gives one (\"at the design SD\"), else from "
    "the observed SDs")
HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE)


def design_mde(design_sd: float, n_a: int, n_b: int, floor: float = 0.0, *, alpha: float = ALPHA,
               power: float = POWER) -> float:
    """Item 2: the effect ``n_a``/``n_b`` seeds detect with probability ``power`` (two-sided
    ``alpha``) when one seed's value has SD ``design_sd``: ``(t_{1−α/2} + t_power)·max(design_sd·
    √(1/n_a + 1/n_b), floor)`` at df = n_a + n_b − 2 (pooled-variance approximation of Welch's)."""
    return resolvable(design_se(design_sd, n_a, n_b, floor), n_a + n_b - 2, alpha=alpha,
                      power=power)


# ---- comparing two arms over seeds (the comparisons an entry reports: COMPARE_RULE) ------------

@dataclass(frozen=True)
class Comparison:
    """Outcome of :func:`compare_arms` (b − a). ``decision``: "higher" (b > a), "lower" (b < a),
    "no detectable difference" (with ``mde`` the smallest |b − a| the seeds could have resolved) or
    "too few seeds". ``mde_basis``: the observed SD of these seeds, or a design SD stated in advance
    (:class:`DesignSD`; the observed one scatters 1.7–4.8× run to run)."""

    diff: float | None
    se: float | None
    df: float | None
    p: float | None
    mde: float | None
    n_a: int
    n_b: int
    decision: str
    mde_basis: str = "observed SD"

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        """``+3.1 ± 0.8 (SE; Welch p=0.01, n=3/3, resolvable ≥ 2.9)`` (:mod:`verdict_text`)."""
        return verdict_text.comparison(self, scale, unit)


@dataclass(frozen=True)
class DesignSD:
    """The design SD of the comparisons of a conjunctive or family claim: SD of one seed's value,
    one number for all comparisons or one per comparison key, from the pilot named in ``source``.
    Given to :func:`compare_arms`, it fixes each comparison's resolvable effect in advance, as
    :class:`Design` does for one primary comparison; the decision is unchanged."""

    sd: float | dict
    source: str

    def __post_init__(self):
        values = self.sd.values() if isinstance(self.sd, dict) else (self.sd,)
        if not values or not all(isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)
                                 for v in values):
            raise ValueError(f"design SDs must be finite numbers ≥ 0, got {self.sd!r}")

    def of(self, key=None) -> float:
        """The design SD of comparison ``key`` (the one number when not given per key)."""
        if not isinstance(self.sd, dict):
            return float(self.sd)
        if key not in self.sd:
            raise KeyError(f"no design SD for comparison {key!r}; declared for: "
                           f"{', '.join(map(str, self.sd))}")
        return float(self.sd[key])

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        return verdict_text.design_sd(self, scale, unit)


def compare_arms(a, b, *, alpha: float = ALPHA, power: float = POWER, min_seeds: int = MIN_SEEDS,
                 se_floor: float = 0.0, n_test: int | None = None,
                 design_sd: float | None = None) -> Comparison:
    """Compare arm ``b`` with arm ``a`` (per-seed values, non-finite ones dropped) by
    :data:`COMPARE_RULE`: Welch's t-test (Welch 1947), SE = √(s_a²/n_a + s_b²/n_b) floored at
    ``se_floor`` and at the binomial SE of the arm means on ``n_test`` test images, two-sided p;
    "higher"/"lower" when p < ``alpha``, else "no detectable difference" with ``mde = (t_{1−α/2,df}
    + t_{power,df})·SE``, or :func:`design_mde` of ``design_sd`` where the entry states one in
    advance. Fewer than ``min_seeds`` values in an arm: "too few seeds" (diff still given). Without
    a floor, identical values (SE = 0) count any nonzero difference as detected (p = 0)."""
    xa, xb = finite_values(a), finite_values(b)
    n_a, n_b = len(xa), len(xb)
    if not xa or not xb:
        return Comparison(None, None, None, None, None, n_a, n_b, "too few seeds")
    if n_a < max(min_seeds, 2) or n_b < max(min_seeds, 2):
        return Comparison(mean_std(xb)[0] - mean_std(xa)[0], None, None, None, None, n_a, n_b,
                          "too few seeds")
    diff, welch_se, df, (ma, mb) = welch(xa, xb)
    floor = max(se_floor, binomial_floor(ma, mb, n_test, n_a, n_b))
    se = max(welch_se, floor)
    p = two_sided_p(diff, se, df)
    basis = "observed SD" if design_sd is None else "design SD"
    if design_sd is not None:
        mde = design_mde(design_sd, n_a, n_b, floor, alpha=alpha, power=power)
    else:
        mde = resolvable(se, df, alpha=alpha, power=power) if se else 0.0
    decision = ("higher" if diff > 0 else "lower") if p < alpha and diff else \
        "no detectable difference"
    return Comparison(diff, se, None if se == 0 else df, p, mde, n_a, n_b, decision, basis)


# ---- the primary comparison (RULE) --------------------------------------------------------------

@dataclass(frozen=True)
class Design:
    """The pre-declared primary comparison of an entry (b − a): ``paper_effect`` the paper's b − a
    (its sign the claimed direction), ``design_sd`` one seed's SD from the pilot named in
    ``source``, ``n_test`` the test-set size of accuracies (binomial floor), else ``se_floor``."""

    quantity: str
    paper_effect: float
    design_sd: float
    n_seeds: int
    source: str
    n_test: int | None = None
    se_floor: float = 0.0
    alpha: float = ALPHA
    power: float = POWER
    # False where the paper gives only a direction (curves without numbers): ``paper_effect`` is
    # then a unit-size stand-in for its sign, and "not held" needs a significant effect against it.
    magnitude_known: bool = True

    def __post_init__(self):
        if self.paper_effect == 0 or not math.isfinite(self.paper_effect):
            raise ValueError("paper_effect must be a nonzero finite number (its sign is the "
                             f"claim), got {self.paper_effect!r}")
        if not self.design_sd >= 0 or self.n_seeds < 2:
            raise ValueError(f"design_sd must be ≥ 0 and n_seeds ≥ 2, got {self.design_sd!r}, "
                             f"{self.n_seeds!r}")

    def mde(self, p_a: float = 0.5, p_b: float = 0.5) -> float:
        """:func:`design_mde` of this design; ``p_a``/``p_b`` (accuracies) set the binomial floor,
        0.5 its largest value."""
        n = self.n_seeds
        floor = max(self.se_floor, binomial_floor(p_a, p_b, self.n_test, n, n))
        return design_mde(self.design_sd, n, n, floor, alpha=self.alpha, power=self.power)

    def seeds_to_resolve(self, effect: float | None = None, limit: int = 1000) -> int | None:
        """The fewest seeds per arm resolving |``effect``| (the paper's by default); None when none
        up to ``limit`` does (the floor on the SE is above the effect)."""
        return fewest_seeds(lambda n: replace(self, n_seeds=n).mde(),
                            self.paper_effect if effect is None else effect, limit)

    def resolves_paper(self) -> bool:
        """Whether the paper's effect is at least the design's minimum detectable effect."""
        return abs(self.paper_effect) >= self.mde()

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        return verdict_text.design(self, scale, unit)


@dataclass(frozen=True)
class Judgement:
    """The primary comparison's outcome: the verdict and the numbers that decided it."""

    verdict: str
    diff: float | None
    se: float | None
    p: float | None
    ci: tuple[float, float] | None
    mde: float
    n_a: int
    n_b: int
    floored: bool

    def text(self, design: Design, scale: float = 1.0, unit: str = "") -> str:
        return verdict_text.judgement(self, design, scale, unit)


def judge(a, b, design: Design) -> Judgement:
    """Judge the primary comparison b − a by :data:`RULE` (values per seed; diverged runs already
    replaced by the failure value, :func:`arm_values`; non-finite values dropped): items 3 and 5."""
    xa, xb = finite_values(a), finite_values(b)
    n_a, n_b = len(xa), len(xb)
    if n_a < MIN_SEEDS or n_b < MIN_SEEDS:
        return Judgement(INCONCLUSIVE, None, None, None, None, design.mde(), n_a, n_b, False)
    diff, welch_se, df, (ma, mb) = welch(xa, xb)
    floor = max(design.se_floor, binomial_floor(ma, mb, design.n_test, n_a, n_b))
    se = max(welch_se, floor)
    p = two_sided_p(diff, se, df)
    half = t_quantile(1 - design.alpha / 2, df) * se if se else 0.0
    ci = (diff - half, diff + half)
    sign = 1.0 if design.paper_effect > 0 else -1.0
    if p < design.alpha and diff * sign > 0:
        verdict = HELD
    elif (p < design.alpha and diff * sign < 0) or (
        design.magnitude_known and sign * ci[1 if sign > 0 else 0] < abs(design.paper_effect)
    ):
        verdict = NOT_HELD
    else:
        verdict = INCONCLUSIVE
    return Judgement(verdict, diff, se, p, ci, design.mde(ma, mb), n_a, n_b, floor > welch_se)


# ---- the ladder: the one place that turns evidence into a verdict ------------------------------
# Entry modules never write a verdict string (tests/test_verdict_sites.py scans them): they compute
# their evidence and :func:`ladder` turns it into the verdict, always in the same order.

def check(supports: bool | None) -> str:
    """The outcome of a deterministic check (a bound, a tolerance on a fitted or computed number, an
    exact identity): True → held, False → not held, None (nothing to check) → inconclusive."""
    if supports is None:
        return INCONCLUSIVE
    return HELD if supports else NOT_HELD


def ladder(primary: str | bool | None = None, *, unusable: bool = False,
           against: bool = False) -> str:
    """The verdict ladder, in its one order: (1) ``unusable`` (tiny runs, no data, a missing arm,
    fewer than :data:`MIN_SEEDS` seeds) → "inconclusive"; (2) ``against`` (a Holm-corrected
    secondary comparison or a pre-declared failure condition contradicts the claim) → "not held";
    (3) else the primary's outcome: a verdict of :func:`judge` / :func:`decide` /
    :func:`against_bound` / :func:`conjunction`, or a bool (:func:`check`); None → "inconclusive".
    """
    if unusable:
        return INCONCLUSIVE
    if against:
        return NOT_HELD
    if primary is None or isinstance(primary, bool):
        return check(primary)
    if primary not in VERDICTS:
        raise ValueError(
            f"primary outcome must be one of {VERDICTS}, a bool or None, got {primary!r}")
    return primary


def explain(verdict: str, *, held: str = "", not_held: str = "", inconclusive: str = "") -> str:
    """The text an entry appends to its summary for ``verdict`` (entries need not branch on the
    verdict strings themselves)."""
    texts = {HELD: held, NOT_HELD: not_held, INCONCLUSIVE: inconclusive}
    if verdict not in texts:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return texts[verdict]


def is_held(verdict: str) -> bool:
    """Whether ``verdict`` is "held" (for entries that combine or report their parts' verdicts)."""
    return verdict == HELD


def decide(comparison: Comparison, wanted: str, p: float | None = None,
           alpha: float = ALPHA) -> str:
    """The outcome of one :func:`compare_arms` comparison (b − a): "held" when it detects the
    difference the paper claims (``wanted`` "lower"/"higher"), "not held" the opposite, else
    "inconclusive". ``p``: a Holm-adjusted p-value to judge it by instead, as one of a family."""
    if wanted not in ("lower", "higher"):
        raise ValueError(f"wanted must be 'lower' or 'higher', got {wanted!r}")
    decision = comparison.decision
    if p is not None and decision in ("lower", "higher") and not p < alpha:
        decision = "no detectable difference"
    if decision == wanted:
        return HELD
    if decision in ("lower", "higher"):
        return NOT_HELD
    return INCONCLUSIVE


def family(comparisons: dict, wanted, alpha: float = ALPHA) -> dict:
    """Each comparison of a family (key → :class:`Comparison`) judged by :func:`decide` on its
    Holm-adjusted p: an entry's secondary comparisons, whose "not held" may overrule a primary.
    ``wanted``: "lower"/"higher" for all, or a dict key → direction."""
    adjusted = holm({k: c.p for k, c in comparisons.items()})
    want = wanted if isinstance(wanted, dict) else {k: wanted for k in comparisons}
    return {k: decide(c, want[k], adjusted[k], alpha) for k, c in comparisons.items()}


def short_of_effect(comparisons: dict, effects: dict, alpha: float = ALPHA) -> dict:
    """Item 5's "the CI lies entirely short of the paper's effect", for a family: per key, whether
    the data reject a difference as large as ``effects[key]`` (signed as claimed), Holm-corrected.
    Per comparison 2·p₁ of the one-sided test H0: the true difference reaches the effect
    (:func:`significance.short_p`; 2·p₁ < α alone is "the (1 − α) CI excludes it", as
    :func:`judge` reads one primary); Holm over the family keeps the chance of calling some
    comparison short of an effect it truly has ≤ α/2 (``tests/test_verdict_rule.py``). Comparisons
    without an SE (too few seeds) are never short."""
    adjusted = holm({k: None if c.diff is None or c.se is None or c.df is None
                     else short_p(c.diff, effects[k], c.se, c.df)
                     for k, c in comparisons.items()})
    return {k: adjusted[k] is not None and adjusted[k] < alpha for k in comparisons}


def checks(comparisons: dict, wanted, alpha: float = ALPHA) -> dict:
    """Each comparison of a conjunctive claim (every one must go the paper's way): "held" when
    significant at ``alpha`` in the claimed direction (an intersection–union test is level α without
    a correction), "not held" when significant against it after Holm's correction over the family (a
    union of m tests needs one), else "inconclusive". ``wanted`` as in :func:`family`."""
    want = wanted if isinstance(wanted, dict) else {k: wanted for k in comparisons}
    against = family(comparisons, want, alpha)
    return {k: against[k] if against[k] == NOT_HELD else
            (HELD if decide(c, want[k], alpha=alpha) == HELD else INCONCLUSIVE)
            for k, c in comparisons.items()}


def conjunction(comparisons: dict, wanted, alpha: float = ALPHA) -> str:
    """The verdict on a claim that every comparison of a family goes the paper's way:
    :func:`combine` of :func:`checks` (held when each is significant as claimed; not held when one
    is Holm-significant against it; otherwise — and for an empty family — inconclusive)."""
    return combine(list(checks(comparisons, wanted, alpha).values()))


def tally(verdicts) -> str:
    """"k of n checks held, j against, i undecided" for the per-check verdicts of a summary."""
    verdicts = list(verdicts)
    return (f"{verdicts.count(HELD)} of {len(verdicts)} checks held, "
            f"{verdicts.count(NOT_HELD)} against, {verdicts.count(INCONCLUSIVE)} undecided")


def against_bound(values, bound: float, wanted: str, *, se_floor: float = 0.0,
                  alpha: float = ALPHA) -> tuple[str, Comparison]:
    """Per-seed values against a fixed number (a threshold the paper states, a theorem's bound): is
    their mean significantly ``wanted`` ("lower"/"higher") than ``bound``? A one-sample t-test
    (two-sided at ``alpha``, the SE floored at ``se_floor``): significant on the claimed side →
    "held", on the other side → "not held", else "inconclusive". Returns the verdict and the
    comparison (mean − bound, as :func:`compare_arms` reports b − a)."""
    if wanted not in ("lower", "higher"):
        raise ValueError(f"wanted must be 'lower' or 'higher', got {wanted!r}")
    xs = finite_values(values)
    n = len(xs)
    if n < MIN_SEEDS:
        diff = (sum(xs) / n - bound) if xs else None
        return INCONCLUSIVE, Comparison(diff, None, None, None, None, 1, n, "too few seeds")
    mean, sd = mean_std(xs)
    diff, se, df = mean - bound, max(sd / math.sqrt(n), se_floor), n - 1
    p = two_sided_p(diff, se, df)
    mde = resolvable(se, df, alpha=alpha, power=POWER) if se else 0.0
    significant = p < alpha and diff
    decision = ("higher" if diff > 0 else "lower") if significant else "no detectable difference"
    comparison = Comparison(diff, se, float(df), p, mde, 1, n, decision)
    return decide(comparison, wanted), comparison


def combine(verdicts: list[str]) -> str:
    """The ladder over the parts of one claim that are all primary (the claim is their conjunction):
    all parts held → held; any part not held → not held; else inconclusive (also without parts)."""
    if verdicts and all(v == HELD for v in verdicts):
        return HELD
    return NOT_HELD if NOT_HELD in verdicts else INCONCLUSIVE


def settle(end: tuple[str, str], mid: tuple[str, str],
           where: str = "2/3 of training") -> tuple[str, str]:
    """Item 6: ``end`` / ``mid`` are (verdict, summary) of one verdict function on the values at
    the end and at ``where`` (:func:`settle_fraction`). A verdict that changed in between is
    "inconclusive": the quantity has not settled, and a longer run could change it again."""
    verdict, summary = end
    if mid[0] == verdict:
        return verdict, f"{summary}; settled: the verdict at {where} is also '{mid[0]}'"
    return INCONCLUSIVE, (f"{summary}; NOT settled: the verdict would be '{verdict}' at the end "
                          f"but was '{mid[0]}' at {where} ({mid[1]})")
