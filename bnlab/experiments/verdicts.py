"""The verdict rule of the catalogue: one pre-declared primary comparison per entry, judged against
the paper's effect with a resolution fixed in advance.

Why a rule of its own: judging every comparison an entry prints, with the minimum
detectable effect computed from the observed SD of 3 seeds, made verdicts that depended on chance
(an exact null was called "not held" 8–14 % of the time; the paper's true effect "held" only 20 %),
gave p ≈ 0 to arms that differed by one test image, and dropped diverged runs as missing data. The
rule, stated once (:data:`RULE`):

1. **Primary comparison.** Each entry declares one :class:`Design` before it runs: the quantity b −
   a it compares, the paper's effect on that quantity (signed: the direction the paper claims), the
   number of seeds per arm and a *design SD* of one seed's value, measured in a pilot and written
   into the entry. Every other comparison is reported; where one is judged as well, its p-values are
   Holm-corrected (:func:`rule_stats.holm`, Holm 1979) as a family.
2. **Resolution fixed in advance.** The minimum detectable effect is ``(t_{1−α/2} +
   t_{power})·SE_design`` with ``SE_design = max(design_sd·√(1/n_a + 1/n_b), floor)``, at df = n_a +
   n_b − 2: a property of the design, not of the scatter of this run's seeds.
3. **A floor on the standard error.** The test uses ``SE = max(Welch SE, floor)``. For accuracies
   the floor is the binomial SE of the two arm means on a test set of ``n_test`` images
   (``√(p_a(1−p_a)/(n_test·n_a) + p_b(1−p_b)/(n_test·n_b))``): accuracies measured by counting
   images cannot resolve a difference below it, so arms that differ by one image are not
   "significant" because their seeds happened to agree. Other quantities pass ``se_floor`` (their
   measurement resolution).
4. **Divergence is failure.** A diverged run enters its arm with the entry's failure value (chance
   accuracy, the loss at initialization, ...; :func:`rule_stats.arm_values`), never as missing
   data. Runs that crashed (status "failed"/"interrupted") are missing, and named in the summary.
5. **Decision.** Welch's two-sided t at α = 0.05 on the primary comparison: "held" if significant in
   the paper's direction; "not held" if significant against it, or if the (1−α) confidence interval
   lies entirely short of the paper's effect (the data reject an effect of the paper's size);
   otherwise "inconclusive", stating the design's resolvable effect. Hence P(false "held" | no
   effect) ≤ α/2 and P(false "not held" | the paper's effect) ≤ α/2 + the family's Holm-controlled
   share; ``tests/test_verdict_rule.py`` measures both by simulation and the docs print them.
6. **Settling.** Where the verdict is read at the end of training, it is read again inside the final
   learning-rate phase (:func:`rule_stats.settle_fraction`): halfway through the last constant-lr
   stretch of a step schedule, never before the last drop. A verdict that changed within that phase
   is "inconclusive".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bnlab.formatting import finite_or_none, mean_std

# the rule's constants, defined once in rule_stats (re-exported here: the rule's own module)
from .rule_stats import (
    ALPHA, MIN_SEEDS, POWER, Comparison, binomial_floor, design_mde, fewest_seeds, holm)

RULE = (
    f"one pre-declared primary comparison per entry: Welch's two-sided t (α = {ALPHA:g}, "
    f"≥ {MIN_SEEDS} seeds per arm) with the standard error floored (binomial on the test-set size "
    "for accuracies); held = significant in the paper's direction, not held = significant against "
    f"it or the {100 * (1 - ALPHA):g} % CI excludes the paper's effect, else inconclusive; "
    f"resolvable effect (t_{1 - ALPHA / 2:g} + t_{POWER:g})·design SD·√(1/n_a + 1/n_b), from a "
    "design SD stated in advance; diverged runs count as failures of their arm; other comparisons "
    "Holm-corrected"
)


@dataclass(frozen=True)
class Design:
    """The pre-declared primary comparison of an entry (b − a).

    ``paper_effect``: the paper's b − a in the same units (its sign is the claimed direction).
    ``design_sd``: SD of one seed's value, from the pilot named in ``source``. ``n_test``: test-set
    size when the values are accuracies in [0, 1] (binomial floor); ``se_floor``: an absolute floor
    otherwise.
    """

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
            raise ValueError(
                f"paper_effect must be a nonzero finite number (its sign is the claim), "
                f"got {self.paper_effect!r}"
            )
        if not self.design_sd >= 0 or self.n_seeds < 2:
            raise ValueError(
                f"design_sd must be ≥ 0 and n_seeds ≥ 2, got {self.design_sd!r}, {self.n_seeds!r}"
            )

    def mde(self, p_a: float = 0.5, p_b: float = 0.5) -> float:
        """The effect this design detects with probability ``power`` (two-sided α), from the design
        SD and the floor; ``p_a``/``p_b`` (accuracies) set the binomial floor, 0.5 its largest
        value."""
        n = self.n_seeds
        floor = max(self.se_floor, binomial_floor(p_a, p_b, self.n_test, n, n))
        return design_mde(self.design_sd, n, n, floor, alpha=self.alpha, power=self.power)

    def seeds_to_resolve(self, effect: float | None = None, limit: int = 1000) -> int | None:
        """The fewest seeds per arm whose resolvable effect is ≤ |``effect``| (the paper's by
        default): what "the budget truly cannot do better" costs. None when no number of seeds
        up to ``limit`` does (the floor on the SE is above the effect)."""
        return fewest_seeds(lambda n: replace(self, n_seeds=n).mde(),
                            self.paper_effect if effect is None else effect, limit)

    def resolves_paper(self) -> bool:
        """Whether the paper's effect is at least the design's minimum detectable effect."""
        return abs(self.paper_effect) >= self.mde()

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        paper = (
            f"{scale * self.paper_effect:+.3g}{unit}"
            if self.magnitude_known
            else ("lower" if self.paper_effect < 0 else "higher") + " (direction only)"
        )
        return (
            f"primary: {self.quantity}; paper {paper}; design "
            f"SD {scale * self.design_sd:.2g}{unit} ({self.source}), {self.n_seeds} seeds/arm → "
            f"resolvable ≥ {scale * self.mde():.2g}{unit}"
        )


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
        if self.diff is None or self.se is None:
            return (f"{design.quantity}: n={self.n_a}/{self.n_b}, too few seeds "
                    f"({design.text(scale, unit)})")
        lo, hi = self.ci
        return (
            f"{design.quantity} {scale * self.diff:+.3g}{unit} ± {scale * self.se:.2g} "
            f"(SE{', floored' if self.floored else ''}; {100 * (1 - design.alpha):g} % CI "
            f"[{scale * lo:+.3g}, {scale * hi:+.3g}], p={self.p:.2g}, n={self.n_a}/{self.n_b}) "
            "vs the paper's "
            + (
                f"{scale * design.paper_effect:+.3g}{unit}"
                if design.magnitude_known
                else ("negative" if design.paper_effect < 0 else "positive") + " (direction only)"
            )
            + f"; resolvable ≥ {scale * self.mde:.2g}{unit} "
            f"(design SD {scale * design.design_sd:.2g}, {design.source})"
        )


def judge(a, b, design: Design) -> Judgement:
    """Judge the primary comparison b − a by :data:`RULE` (values per seed; diverged runs already
    replaced by the failure value, see :func:`rule_stats.arm_values`; non-finite values dropped)."""
    from scipy import stats

    xa = [v for v in (finite_or_none(v) for v in a) if v is not None]
    xb = [v for v in (finite_or_none(v) for v in b) if v is not None]
    n_a, n_b = len(xa), len(xb)
    if n_a < MIN_SEEDS or n_b < MIN_SEEDS:
        return Judgement(INCONCLUSIVE, None, None, None, None, design.mde(), n_a, n_b, False)
    (ma, sa), (mb, sb) = mean_std(xa), mean_std(xb)
    diff = mb - ma
    va, vb = sa**2 / n_a, sb**2 / n_b
    welch = math.sqrt(va + vb)
    floor = max(design.se_floor, binomial_floor(ma, mb, design.n_test, n_a, n_b))
    if va + vb > 0:
        df = (va + vb) ** 2 / ((va**2 / (n_a - 1)) + (vb**2 / (n_b - 1)))
    else:
        df = float(n_a + n_b - 2)
    se = max(welch, floor)
    if se == 0:  # deterministic values without a stated resolution: any difference is exact
        p = 0.0 if diff else 1.0
        ci = (diff, diff)
    else:
        p = float(2 * stats.t.sf(abs(diff) / se, df))
        half = float(stats.t.ppf(1 - design.alpha / 2, df)) * se
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
    return Judgement(verdict, diff, se, p, ci, design.mde(ma, mb), n_a, n_b, floor > welch)


# ---- The ladder: the one place that turns evidence into a verdict -------------------------------
# Entry modules never write a verdict string (tests/test_verdict_sites.py scans them): they compute
# their evidence — the primary comparison (:func:`judge`, :func:`decide`, :func:`against_bound`,
# :func:`conjunction`, a bool from a check), the Holm-corrected secondary comparisons that
# contradict the claim, whether the runs can decide anything — and :func:`ladder` turns it into the
# verdict, always in the same order.

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE)


def check(supports: bool | None) -> str:
    """The outcome of a deterministic check (a bound, a tolerance on a fitted or computed number, an
    exact identity): True → held, False → not held, None (nothing to check) → inconclusive."""
    if supports is None:
        return INCONCLUSIVE
    return HELD if supports else NOT_HELD


def ladder(primary: str | bool | None = None, *, unusable: bool = False,
           against: bool = False) -> str:
    """The catalogue's verdict ladder, in its one order (one place, not one per
    site):

    1. ``unusable`` — tiny runs, no data, a missing arm, fewer than :data:`MIN_SEEDS` seeds:
       "inconclusive";
    2. ``against`` — a secondary comparison (Holm-corrected where it is one of a family) or a
       pre-declared failure condition contradicts the claim: "not held";
    3. otherwise the primary comparison's outcome: a verdict from :func:`judge` / :func:`decide` /
       :func:`against_bound` / :func:`conjunction`, or a bool (:func:`check`); None →
       "inconclusive".
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
    """The text an entry appends to its summary for ``verdict`` (so that entries need not branch on
    the verdict strings themselves)."""
    texts = {HELD: held, NOT_HELD: not_held, INCONCLUSIVE: inconclusive}
    if verdict not in texts:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return texts[verdict]


def is_held(verdict: str) -> bool:
    """Whether ``verdict`` is "held" (for entries that combine or report their parts' verdicts)."""
    return verdict == HELD


def decide(comparison: Comparison, wanted: str, p: float | None = None,
           alpha: float = ALPHA) -> str:
    """The outcome of one comparison of :func:`bnlab.experiments.common.compare_arms` (b − a):
    "held" when the rule detects the difference the paper claims (``wanted`` "lower"/"higher"),
    "not held" when it detects the opposite, else "inconclusive" (no detectable difference, too few
    seeds).
    ``p``: a Holm-adjusted p-value (:func:`rule_stats.holm`) to judge it by instead of its own, as
    one of a family."""
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
    Holm-adjusted p-value (:func:`rule_stats.holm`): the secondary comparisons of an entry, whose
    "not held" may overrule a primary. ``wanted``: "lower"/"higher" for all, or a dict key →
    direction."""
    adjusted = holm({k: c.p for k, c in comparisons.items()})
    want = wanted if isinstance(wanted, dict) else {k: wanted for k in comparisons}
    return {k: decide(c, want[k], adjusted[k], alpha) for k, c in comparisons.items()}


def short_of_effect(comparisons: dict, effects: dict, alpha: float = ALPHA) -> dict:
    """Rule 5's "the confidence interval lies entirely short of the paper's effect", for a family:
    per key, whether the data reject a difference as large as ``effects[key]`` (the paper's, signed
    in the claimed direction), Holm-corrected over the family (:func:`rule_stats.holm`).

    Per comparison the test is one-sided, H0: the true difference reaches the effect, with p₁ =
    P(T_df ≤ sign·(diff − effect)/SE) on the comparison's floored SE and Welch df (sign: the
    effect's). 2·p₁ < α alone is exactly "the two-sided (1 − α) CI excludes the effect", as
    :func:`judge` reads it for one primary comparison. Over m comparisons the 2·p₁ are
    Holm-adjusted, so the chance of calling some comparison short of an effect it truly has stays
    ≤ α/2 (without the correction it grows with m; measured in ``tests/test_verdict_rule.py``).
    Comparisons without an SE (too few seeds) are never short."""
    from scipy import stats

    two_sided = {}
    for key, c in comparisons.items():
        if c.diff is None or c.se is None or c.df is None:
            two_sided[key] = None
            continue
        sign = 1.0 if effects[key] > 0 else -1.0
        if c.se == 0:  # deterministic: short exactly when the difference falls short
            two_sided[key] = 0.0 if sign * (c.diff - effects[key]) < 0 else 1.0
            continue
        t = sign * (c.diff - effects[key]) / c.se
        two_sided[key] = min(1.0, 2 * float(stats.t.cdf(t, c.df)))
    adjusted = holm(two_sided)
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
    from scipy import stats

    if wanted not in ("lower", "higher"):
        raise ValueError(f"wanted must be 'lower' or 'higher', got {wanted!r}")
    xs = [v for v in (finite_or_none(v) for v in values) if v is not None]
    n = len(xs)
    if n < MIN_SEEDS:
        diff = (sum(xs) / n - bound) if xs else None
        return INCONCLUSIVE, Comparison(diff, None, None, None, None, 1, n, "too few seeds")
    mean, sd = mean_std(xs)
    diff, se, df = mean - bound, max(sd / math.sqrt(n), se_floor), n - 1
    if se == 0:
        p, mde = (0.0 if diff else 1.0), 0.0
    else:
        p = float(2 * stats.t.sf(abs(diff) / se, df))
        mde = float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(POWER, df)) * se)
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
    """The settling rule (item 6 of :data:`RULE`): ``end`` / ``mid`` are (verdict, summary) of the
    same verdict function on the values at the end and at ``where``
    (:func:`rule_stats.settle_fraction`: halfway through the final learning-rate phase for step
    schedules). A verdict that changed in between is "inconclusive": the compared quantity has not
    settled, and a longer run could change it again."""
    verdict, summary = end
    if mid[0] == verdict:
        return verdict, f"{summary}; settled: the verdict at {where} is also '{mid[0]}'"
    return INCONCLUSIVE, (f"{summary}; NOT settled: the verdict would be '{verdict}' at the end "
                          f"but was '{mid[0]}' at {where} ({mid[1]})")
