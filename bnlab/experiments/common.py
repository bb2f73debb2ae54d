"""Analysis helpers shared by the catalogue entries (plots and tables from stored runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnlab.formatting import finite_or_none, mean_std
from bnlab.plots import panels
from .rule_stats import arm_values, binomial_floor


def training_curves(ctx, path: Path, *, title: str,
                    metrics=("train_loss", "train_accuracy", "test_accuracy"),
                    logy_loss: bool = False) -> Path:
    """One panel per metric, one curve per run label."""
    specs = []
    for metric in metrics:
        series = {r.label: r.series(metric) for r in ctx.runs}
        series = {k: v for k, v in series.items() if v[0]}
        specs.append({"series": series, "xlabel": "step", "ylabel": metric, "title": metric,
                      "logy": logy_loss and metric.endswith("loss")})
    return panels(path, specs, title=title)


def final_table(ctx, *, paper: dict[str, str] | None = None,
                metrics=("train_loss", "train_accuracy", "test_accuracy")) -> list[dict]:
    rows = []
    for r in ctx.runs:
        row = {"run": r.label, "status": r.status}
        for m in metrics:
            row[m] = r.final(m)
        if paper is not None:
            row["paper"] = paper.get(r.label, "—")
        rows.append(row)
    return rows


def tail_mean(run, metric: str, k: int = 3) -> float | None:
    """Mean of the last ``k`` finite values of a run's metric series (None if it has none)."""
    values = [v for v in (finite_or_none(v) for v in run.series(metric)[1]) if v is not None]
    return sum(values[-k:]) / len(values[-k:]) if values else None


def spearman(xs, ys) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 2 points or a
    constant side."""
    from scipy import stats

    if len(xs) < 2 or len(xs) != len(ys):
        return None
    rx, ry = stats.rankdata(xs), stats.rankdata(ys)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


# ---- appended for the Peng / Arora entries ----------------------------------------------------

def grouped_finals(ctx, keys: tuple[str, ...], metric: str, *,
                   failure_value: float) -> dict[tuple, list[float]]:
    """Final ``metric`` of every run grouped by the values of the factors ``keys`` (e.g. ("row",
    "activation")).

    A diverged run, or a finished one without a finite final value, enters its group as
    ``failure_value`` (chance accuracy, ...): a failure of that arm, never missing data
    (:func:`rule_stats.arm_values`). Crashed or interrupted runs are left out; a group
    whose runs all crashed is present with an empty list, so callers can tell "no runs" from "no
    usable runs".
    """
    groups: dict[tuple, list[float]] = {}
    for r in ctx.runs:
        key = tuple(r.factors.get(k) for k in keys)
        values = groups.setdefault(key, [])
        values.extend(arm_values([r], lambda run: run.final(metric), failure_value)[0])
    return groups


def smooth(xs, ys, points: int = 60) -> tuple[list, list]:
    """Block means of a long (x, y) series down to about ``points`` points (non-finite values
    skipped)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if finite_or_none(y) is not None]
    if len(pairs) <= points:
        return [p[0] for p in pairs], [p[1] for p in pairs]
    size = -(-len(pairs) // points)
    out_x, out_y = [], []
    for i in range(0, len(pairs), size):
        block = pairs[i:i + size]
        out_x.append(block[-1][0])
        out_y.append(sum(p[1] for p in block) / len(block))
    return out_x, out_y


def safe_panels(path, specs: list[dict], **kwargs):
    """``plots.panels`` with log axes switched off where a panel has no positive finite value to
    show (matplotlib refuses a log axis without one: empty series of tiny runs, diverged runs)."""
    fixed = []
    for spec in specs:
        spec = dict(spec)
        for axis, index in (("logy", 1), ("logx", 0)):
            if spec.get(axis):
                values = [finite_or_none(v) for xy in (spec.get("series") or {}).values()
                          for v in xy[index]]
                if not any(v is not None and v > 0 for v in values):
                    spec[axis] = False
        fixed.append(spec)
    return panels(path, fixed, **kwargs)


# ---- the stated statistical rule for comparing two arms over seeds -------------------------------

MIN_SEEDS = 3
ALPHA = 0.05
POWER = 0.8


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


# The pilot of the conjunctive and family entries' design SDs: the smoke catalogue run of
# 2026-11-26, re-analysed with each comparison's pooled per-arm SD recorded (docs: experiments).
CATALOGUE_PILOT = "pilot: the smoke catalogue run of 2026-11-26, 3 seeds/arm"


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
RULE = (f"Welch's two-sided t-test on the per-seed values, α = {ALPHA:g}, at least {MIN_SEEDS} "
        "seeds per arm, the standard error floored at the measurement's resolution (binomial on "
        "the test-set size for accuracies); a non-significant difference is reported with the "
        f"effect it resolves at power {POWER:g}, (t_(1−α/2) + t_({POWER:g}))·SE, the SE from the "
        "design SD stated in advance where the entry gives one (\"at the design SD\"), else from "
        "the observed SDs")


def compare_arms(a, b, *, alpha: float = ALPHA, power: float = POWER, min_seeds: int = MIN_SEEDS,
                 se_floor: float = 0.0, n_test: int | None = None,
                 design_sd: float | None = None) -> Comparison:
    """Compare arm ``b`` with arm ``a`` (lists of per-seed values, non-finite ones dropped): the
    rule :data:`RULE`.

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


def seed_means(lists) -> list[float]:
    """Per seed, the mean of the lists' i-th values (each list one panel's or activation's per-seed
    values, in seed order), for the seeds every list has: the per-seed value of a primary averaged
    over panels. Different panels' runs of one seed are separate runs, so the i-th means are one
    draw each."""
    lists = [list(v) for v in lists]
    n = min((len(v) for v in lists), default=0)
    return [sum(v[i] for v in lists) / len(lists) for i in range(n)]


def mean_curve(runs, metric: str) -> tuple[list, list]:
    """(steps, mean over ``runs`` of ``metric`` at each step): :func:`mean_series` of the runs'
    series."""
    return mean_series([r.series(metric) for r in runs])


def mean_series(series) -> tuple[list, list]:
    """(steps, mean of the (steps, values) ``series`` at each step), over the steps every series
    recorded (seeds of one arm share their logging steps; a run that stopped early shortens the
    curve). Non-finite values are skipped in the mean; a step where every value is non-finite is
    left out."""
    series = [(list(s), list(v)) for s, v in series if s]
    if not series:
        return [], []
    length = min(len(s) for s, _ in series)
    steps, means = [], []
    for i in range(length):
        values = [v for v in (finite_or_none(vals[i]) for _, vals in series) if v is not None]
        if values:
            steps.append(series[0][0][i])
            means.append(sum(values) / len(values))
    return steps, means


def value_at_fraction(curve: tuple[list, list], fraction: float) -> float | None:
    """The value of a (steps, values) curve at the first step ≥ ``fraction`` of its last step (None
    if empty)."""
    steps, values = curve
    if not steps:
        return None
    target = steps[-1] * fraction
    return next(v for s, v in zip(steps, values) if s >= target)


# where ``verdicts.settle`` reads a verdict a second time (schedules without steps)
SETTLE_FRACTION = 2 / 3


def recipe_config(ctx) -> dict | None:
    """The config of the first run an entry plans for ``ctx``'s preset: the recipe its runs share
    (schedule, data, test split), read by analyses that need it; None for an empty plan."""
    runs = ctx.experiment.plan(ctx.preset).runs
    return runs[0].config if runs else None


def mean_over_run(run, metric: str = "train_loss", fraction: float = 1.0) -> float | None:
    """Mean of a finished run's finite ``metric`` values logged up to ``fraction`` of its last step:
    for the training loss, the area under the curve over its length (lower = faster convergence).
    None for a run that did not finish or logged nothing. ``fraction`` < 1 reads the same measure
    earlier in training, for ``verdicts.settle``."""
    if run is None or run.status != "finished":
        return None
    steps, values = run.series(metric)
    if not steps:
        return None
    limit = steps[-1] * fraction
    kept = [v for s, v in zip(steps, values) if s <= limit and finite_or_none(v) is not None]
    return sum(kept) / len(kept) if kept else None
