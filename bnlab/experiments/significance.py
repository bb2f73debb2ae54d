"""The statistics the verdict rule (:mod:`bnlab.experiments.verdicts`) is made of, with no level or
power of their own: Welch's standard error and degrees of freedom (Welch 1947, "The generalization
of 'Student's' problem when several different population variances are involved"), the resolvable
effect at a given level and power, the binomial floor on an accuracy's standard error and Holm's
step-down (Holm 1979, "A simple sequentially rejective multiple test procedure"). The rule's
constants (α, power, the fewest seeds) and its texts live in ``verdicts`` alone; every function
here takes them as arguments. No plotting, no scipy at import."""

from __future__ import annotations

import math

from bnlab.formatting import finite_or_none, mean_std


def finite_values(values) -> list[float]:
    """``values`` as floats, the non-finite ones (NaN, ±inf, None) dropped."""
    return [v for v in (finite_or_none(v) for v in values) if v is not None]


def welch(xa: list[float], xb: list[float]) -> tuple[float, float, float, tuple[float, float]]:
    """Welch's comparison of ``xb`` with ``xa`` (each ≥ 2 values): (diff = mean(b) − mean(a),
    SE = √(s_a²/n_a + s_b²/n_b), the Welch–Satterthwaite df — the pooled n_a + n_b − 2 where
    neither arm has any spread —, the two arm means)."""
    n_a, n_b = len(xa), len(xb)
    (ma, sa), (mb, sb) = mean_std(xa), mean_std(xb)
    va, vb = sa**2 / n_a, sb**2 / n_b
    if va + vb > 0:
        df = (va + vb) ** 2 / ((va**2 / (n_a - 1) if va else 0.0)
                               + (vb**2 / (n_b - 1) if vb else 0.0))
    else:
        df = float(n_a + n_b - 2)
    return mb - ma, math.sqrt(va + vb), float(df), (ma, mb)


def two_sided_p(diff: float, se: float, df: float) -> float:
    """The two-sided p of t = diff/SE at ``df`` (an exact 0 or 1 where SE = 0: a deterministic
    difference)."""
    if se == 0:
        return 0.0 if diff else 1.0
    from scipy import stats

    return float(2 * stats.t.sf(abs(diff) / se, df))


def short_p(diff: float, effect: float, se: float, df: float) -> float:
    """2·p₁ of the one-sided test H0: the true difference reaches ``effect`` (signed as claimed),
    p₁ = P(T_df ≤ sign·(diff − effect)/SE); with SE = 0 exactly 0 (short) or 1."""
    sign = 1.0 if effect > 0 else -1.0
    if se == 0:
        return 0.0 if sign * (diff - effect) < 0 else 1.0
    from scipy import stats

    return min(1.0, 2 * float(stats.t.cdf(sign * (diff - effect) / se, df)))


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile ``q`` at ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


def resolvable(se: float, df: float, *, alpha: float, power: float) -> float:
    """The true difference a two-sided level-``alpha`` t-test with this SE detects with
    probability ``power``: (t_{1−α/2, df} + t_{power, df})·SE."""
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se


def design_se(design_sd: float, n_a: int, n_b: int, floor: float = 0.0) -> float:
    """The SE a design expects: max(design_sd·√(1/n_a + 1/n_b), ``floor``)."""
    return max(design_sd * math.sqrt(1 / n_a + 1 / n_b), floor)


def binomial_floor(p_a: float, p_b: float, n_test: int | None, n_a: int, n_b: int) -> float:
    """Binomial SE of the difference of two arm-mean accuracies on ``n_test`` test images (0 without
    n_test): √(p_a(1−p_a)/(n_test·n_a) + p_b(1−p_b)/(n_test·n_b))."""
    if not n_test:
        return 0.0
    p_a, p_b = (min(max(p, 0.0), 1.0) for p in (p_a, p_b))
    return math.sqrt(p_a * (1 - p_a) / (n_test * n_a) + p_b * (1 - p_b) / (n_test * n_b))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (Holm 1979): the k-th smallest of m gets max over j ≤ k
    of min(1, (m − j + 1)·p_(j)). None stays None."""
    known = sorted(((p, key) for key, p in pvalues.items() if p is not None), key=lambda t: t[0])
    m, running, out = len(known), 0.0, {key: None for key in pvalues}
    for rank, (p, key) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[key] = running
    return out


def fewest_seeds(mde_at, effect: float, limit: int = 1000) -> int | None:
    """The fewest seeds per arm n (2 ≤ n ≤ ``limit``) whose resolvable effect ``mde_at(n)`` is ≤
    |``effect``|; None when none is (a floor on the SE above the effect)."""
    return next((n for n in range(2, limit + 1) if mde_at(n) <= abs(effect)), None)
