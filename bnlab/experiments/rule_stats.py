"""The statistics of the verdict rule (:mod:`bnlab.experiments.verdicts`), apart from the ladder
that turns them into a verdict, and the rule's constants, defined here once (:data:`ALPHA`,
:data:`POWER`, :data:`MIN_SEEDS`; ``verdicts`` states the rule's text from them): Welch's comparison
of two arms (:func:`compare_arms`, stated in :data:`COMPARE_RULE`) and the resolvable effect of a
design (:func:`design_mde`, item 2 of :data:`~bnlab.experiments.verdicts.RULE`), an arm's per-seed
values with divergence as failure (item 4), the binomial floor on the standard error (item 3),
Holm's step-down for a family of comparisons (item 1) and where the settling rule reads a verdict
a second time (item 6). No plotting here: the report and the README builder import the rule without
matplotlib."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bnlab.formatting import finite_or_none, mean_std
from bnlab.train.schedules import parse_schedule

MIN_SEEDS = 3   # per arm, below which no test is made
ALPHA = 0.05    # two-sided significance level of every test of the rule
POWER = 0.8     # the power at which a design's resolvable effect is stated


# scikit-learn's digits: 1,797 images, per class (0–9); the stratified split rounds each class's
# share on its own
DIGITS_CLASS_SIZES = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)
CIFAR_TEST_IMAGES = 10_000  # CIFAR-10's and CIFAR-100's test sets


def n_test_images(data: str, test_fraction: float = 0.2) -> int:
    """The number of test images an entry's accuracies are counted on (the ``n_test`` of the
    binomial floor): digits' stratified split holds round(``test_fraction``·size) of each class
    (359 at the default 0.2, 898 at 0.5, 901 at 0.501; checked against the split by a test),
    CIFAR's test sets 10,000."""
    if data == "digits":
        return sum(round(test_fraction * size) for size in DIGITS_CLASS_SIZES)
    if data in ("cifar10", "cifar100"):
        return CIFAR_TEST_IMAGES
    raise ValueError(f"no test-set size for data {data!r}; known: digits, cifar10, cifar100")


def digits_train_images(test_fraction: float = 0.2) -> int:
    """The training images of digits' stratified split: the 1,797 less :func:`n_test_images`."""
    return sum(DIGITS_CLASS_SIZES) - n_test_images("digits", test_fraction)


def config_test_images(config: dict) -> int:
    """:func:`n_test_images` of a run config (its ``data`` and ``data_options.test_fraction``)."""
    options = config.get("data_options") or {}
    return n_test_images(config["data"], options.get("test_fraction", 0.2))


def binomial_floor(p_a: float, p_b: float, n_test: int | None, n_a: int, n_b: int) -> float:
    """Binomial SE of the difference of two arm-mean accuracies on ``n_test`` test images (0 without
    n_test)."""
    if not n_test:
        return 0.0
    p_a, p_b = (min(max(p, 0.0), 1.0) for p in (p_a, p_b))
    return math.sqrt(p_a * (1 - p_a) / (n_test * n_a) + p_b * (1 - p_b) / (n_test * n_b))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): the k-th smallest of m gets max over j ≤ k of min(1, (m − j + 1)·p_(j)). None stays
    None."""
    known = sorted(((p, key) for key, p in pvalues.items() if p is not None), key=lambda t: t[0])
    m, running, out = len(known), 0.0, {key: None for key in pvalues}
    for rank, (p, key) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[key] = running
    return out


def arm_values(runs, read, failure_value: float) -> tuple[list[float], list[str]]:
    """Per-seed values of one arm: ``read(run)`` for finished runs, ``failure_value`` for a diverged
    run or a finished one whose value is non-finite (a failure of the arm, not missing data). Runs
    that crashed or were interrupted are left out and their labels returned, so the summary can name
    them."""
    values, missing = [], []
    for r in runs:
        if r.status == "diverged":
            values.append(failure_value)
        elif r.status == "finished":
            value = finite_or_none(read(r))
            values.append(failure_value if value is None else value)
        else:
            missing.append(r.label)
    return values, missing


def settle_fraction(config: dict) -> float:
    """Where (fraction of training) the settling rule reads the verdict a second time: halfway
    through the final learning-rate phase. For ``step:E1,...,Ek`` over E epochs that is (Ek + (E −
    Ek)/2)/E — after the last drop, so the two readings compare like with like; otherwise (constant,
    exponential) 2/3."""
    schedule = parse_schedule(str(config.get("schedule") or "constant"))  # the one parser
    epochs = config.get("epochs")
    if schedule.kind == "step" and epochs:
        last = max(schedule.milestones)
        if last < epochs:
            return (last + (epochs - last) / 2) / epochs
    return 2 / 3


# ---- comparing two arms over seeds ------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """Outcome of :func:`compare_arms` (b − a). ``decision``: "higher" (b > a), "lower" (b < a),
    "no detectable difference" (with ``mde`` the smallest |b − a| the seeds could have resolved) or
    "too few seeds"."""

    diff: float | None
    se: float | None
    df: float | None
    p: float | None
    mde: float | None
    n_a: int
    n_b: int
    decision: str
    # where ``mde`` comes from: the observed spread of these seeds, or a design SD stated in
    # advance (:class:`DesignSD`; the observed one scatters 1.7–4.8× run to run)
    mde_basis: str = "observed SD"

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        """``+3.1 ± 0.8 (SE; Welch p=0.01, n=3/3, resolvable ≥ 2.9)``; numbers times ``scale`` (100:
        points)."""
        if self.diff is None:
            return "no data"
        out = f"{scale * self.diff:+.3g}{unit}"
        if self.se is None:
            return out + f" (n={self.n_a}/{self.n_b}: too few seeds for a test)"
        out += f" ± {scale * self.se:.2g}{unit} (SE; Welch p={self.p:.2g}, n={self.n_a}/{self.n_b}"
        if self.mde is None:
            return out + ")"
        basis = "" if self.mde_basis == "observed SD" else f" at the {self.mde_basis}"
        return out + f", resolvable ≥ {scale * self.mde:.2g}{unit}{basis})"


@dataclass(frozen=True)
class DesignSD:
    """The design SD of the comparisons of a conjunctive or family claim: SD of one seed's value
    (in the compared quantity's units), one number for all comparisons or one per comparison key,
    from the pilot named in ``source``. Given to :func:`compare_arms`, it fixes each comparison's
    resolvable effect in advance, as :class:`verdicts.Design` does for a single primary comparison;
    the decision itself is unchanged (Welch's t on the observed seeds)."""

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
        if isinstance(self.sd, dict):
            sds = ", ".join(f"{k} {scale * v:.2g}{unit}" for k, v in self.sd.items())
        else:
            sds = f"{scale * self.sd:.2g}{unit}"
        return f"design SD {sds} ({self.source})"


def design_mde(design_sd: float, n_a: int, n_b: int, floor: float = 0.0, *, alpha: float = ALPHA,
               power: float = POWER) -> float:
    """The effect ``n_a``/``n_b`` seeds detect with probability ``power`` (two-sided ``alpha``)
    when one seed's value has SD ``design_sd``: ``(t_{1−α/2} + t_power)·max(design_sd·√(1/n_a +
    1/n_b), floor)`` at df = n_a + n_b − 2 (the pooled-variance approximation of Welch's df)."""
    from scipy import stats

    se = max(design_sd * math.sqrt(1 / n_a + 1 / n_b), floor)
    df = n_a + n_b - 2
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)


def fewest_seeds(mde_at, effect: float, limit: int = 1000) -> int | None:
    """The fewest seeds per arm n (2 ≤ n ≤ ``limit``) whose resolvable effect ``mde_at(n)`` is ≤
    |``effect``|; None when none is (a floor on the SE above the effect)."""
    return next((n for n in range(2, limit + 1) if mde_at(n) <= abs(effect)), None)


# What :func:`compare_arms` does, quoted by the entries that report its comparisons: the resolvable
# effect comes from the design SD where the entry states one (its text then says "at the design
# SD"), from these seeds' observed SDs otherwise; the SE floor applies to both.
COMPARE_RULE = (
    f"Welch's two-sided t-test on the per-seed values, α = {ALPHA:g}, at least {MIN_SEEDS} "
    "seeds per arm, the standard error floored at the measurement's resolution (binomial on "
    "the test-set size for accuracies); a non-significant difference is reported with the "
    f"effect it resolves at power {POWER:g}, (t_(1−α/2) + t_({POWER:g}))·SE, the SE from the "
    "design SD stated in advance where the entry gives one (\"at the design SD\"), else from "
    "the observed SDs")


def compare_arms(a, b, *, alpha: float = ALPHA, power: float = POWER, min_seeds: int = MIN_SEEDS,
                 se_floor: float = 0.0, n_test: int | None = None,
                 design_sd: float | None = None) -> Comparison:
    """Compare arm ``b`` with arm ``a`` (lists of per-seed values, non-finite ones dropped): the
    rule :data:`COMPARE_RULE`.

    Welch's t-test (unequal variances; Welch 1947): diff = mean(b) − mean(a), SE = √(s_a²/n_a +
    s_b²/n_b), Welch–Satterthwaite degrees of freedom, two-sided p. ``decision`` is "higher"/"lower"
    when p < ``alpha``, else "no detectable difference"; the minimum detectable effect ``mde =
    (t_{1−α/2,df} + t_{power,df})·SE`` is the true difference this many seeds with this spread would
    detect with probability ``power``. Fewer than ``min_seeds`` values in an arm: "too few seeds"
    (diff still given). The SE is floored at ``se_floor`` and, for accuracies, at the binomial SE of
    the arm means on ``n_test`` test images (``verdict.binomial_floor``), so arms whose seeds happen
    to agree do not get p ≈ 0 for a one-image difference. Without a floor, identical values (SE = 0,
    deterministic computations) count any nonzero difference as detected (p = 0).

    ``design_sd`` (from :class:`DesignSD`, stated in the entry before it runs): ``mde`` is then
    :func:`design_mde` of it and the floor, a property of the design rather than of these seeds'
    scatter; the test itself is unchanged.
    """
    from scipy import stats

    xa = [v for v in (finite_or_none(v) for v in a) if v is not None]
    xb = [v for v in (finite_or_none(v) for v in b) if v is not None]
    n_a, n_b = len(xa), len(xb)
    if not xa or not xb:
        return Comparison(None, None, None, None, None, n_a, n_b, "too few seeds")
    (ma, sa), (mb, sb) = mean_std(xa), mean_std(xb)
    diff = mb - ma
    if n_a < max(min_seeds, 2) or n_b < max(min_seeds, 2):
        return Comparison(diff, None, None, None, None, n_a, n_b, "too few seeds")
    va, vb = sa**2 / n_a, sb**2 / n_b
    floor = max(se_floor, binomial_floor(ma, mb, n_test, n_a, n_b))
    se = max(math.sqrt(va + vb), floor)
    basis = "observed SD"
    if design_sd is not None:
        basis = "design SD"
        planned = design_mde(design_sd, n_a, n_b, floor, alpha=alpha, power=power)
    if se == 0:
        return Comparison(diff, 0.0, None, 0.0 if diff else 1.0,
                          planned if design_sd is not None else 0.0, n_a, n_b,
                          "no detectable difference" if diff == 0
                          else ("higher" if diff > 0 else "lower"), basis)
    if va + vb > 0:
        df = (va + vb) ** 2 / ((va**2 / (n_a - 1) if va else 0.0)
                               + (vb**2 / (n_b - 1) if vb else 0.0))
    else:  # only the floor: the pooled df
        df = float(n_a + n_b - 2)
    p = float(2 * stats.t.sf(abs(diff) / se, df))
    if design_sd is not None:
        mde = planned
    else:
        mde = float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)
    if p < alpha:
        decision = "higher" if diff > 0 else "lower"
    else:
        decision = "no detectable difference"
    return Comparison(diff, se, float(df), p, mde, n_a, n_b, decision, basis)
