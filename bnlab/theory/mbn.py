"""Yong, Huang, Meng, Hua & Zhang, "Momentum Batch Normalization for Deep Learning with Small
Batch Size" (ECCV 2020), supplementary Theorems 1 and 2.

Supplementary material only (the main text is not used here). Notation: for a batch x_1..x_m of
i.i.d. samples with mean μ and standard deviation σ, μ_B and σ_B² are the batch mean and the
(biased, as in BN) batch variance, and

    ξ_μ = (μ − μ_B)/σ,      ξ_σ = σ_B²/σ²,      BN(x) = (x − μ_B)/σ_B = (x̃ + ξ_μ)/√ξ_σ,

with x̃ = (x − μ)/σ. Everything below is invariant to the affine map x → (x − μ)/σ, so samples
are drawn standardised.

Contents
--------
* Theorem 1: :func:`simulate_batch_noise`, :func:`xi_sigma_moments`, :func:`theorem1_report`
  (KS distances of ξ_μ to N(0, 1/m) and of ξ_σ to χ²(m−1)/m, N(1, 2/m) and N(1, (κ−1)/m)).
* Theorem 2: :func:`theorem2_terms` (l, R^add, R^mul, R by quadrature under Theorem 1's laws),
  :func:`theorem2_leading_order` (the O(1/m) Taylor terms) and :func:`expected_loss_mc`
  (Monte Carlo over real batches).
* The moving statistics of MBN: :func:`moving_average_noise`, :func:`moving_noise_curve`.

CORRECTIONS found while deriving (each has a test):
  1. Theorem 1's non-Gaussian limit: Var[(x−μ)²/σ²] = κ − 1 for the usual kurtosis
     κ = E[(x−μ)⁴]/σ⁴ (3 for a Gaussian), so ξ_σ → N(1, (κ−1)/m), not N(1, κ/m); the printed
     form would give 3/m for Gaussian data and contradict the χ²(m−1)/m limit (variance 2/m) it
     is meant to reduce to. The proof also drops the 1/m in "p(Σ((x_i−μ)/σ)²)".
  2. Theorem 2: R(x) = Σ_n E[ξ_μ^n]/n! dⁿR^mul/dxⁿ — the printed E[ξ_μ]ⁿ is identically 0
     (E ξ_μ = 0) and would delete the cross term; the proof's fifth line repeats l(x) where
     R^mul(x) belongs.
  3. Exact finite-m moments: E[ξ_σ] = (m−1)/m, Var[ξ_σ] = ((m−1)/m)² (κ/m − (m−3)/(m(m−1))),
     which is 2(m−1)/m² for Gaussian data.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import optimize, special, stats

from ._common import check_int, gauss_hermite, ks_distance

__all__ = [
    "standardized_samples",
    "simulate_batch_noise",
    "xi_sigma_moments",
    "theorem1_report",
    "theorem2_terms",
    "theorem2_leading_order",
    "expected_loss_mc",
    "moving_average_noise",
    "moving_noise_curve",
    "theorem2_cosine",
]

_GAUSSIAN_KURTOSIS = 3.0
_UNIFORM_KURTOSIS = 1.8


def _gennorm_shape(kurtosis: float) -> float:
    """Shape β of the generalised normal with Pearson kurtosis Γ(5/β)Γ(1/β)/Γ(3/β)² = κ (κ >
    1.8)."""

    def f(log_beta: float) -> float:
        b = math.exp(log_beta)
        return (special.gammaln(5 / b) + special.gammaln(1 / b) - 2 * special.gammaln(3 / b)
                - math.log(kurtosis))

    return math.exp(optimize.brentq(f, math.log(0.05), math.log(2000.0), xtol=1e-12))


def standardized_samples(shape, kurtosis: float | None, rng: np.random.Generator) -> np.ndarray:
    """Mean-0, variance-1 samples with Pearson kurtosis κ = E[x⁴] (None or 3: Gaussian).

    κ > 1.8: generalised normal (scipy ``gennorm``; β = 2 Gaussian, β = 1 Laplace, κ = 6).
    1 ≤ κ ≤ 1.8: mixture of a Rademacher ±1 (probability p) and a uniform on [−√3, √3], whose
    E[x⁴] = p + 1.8(1 − p).
    """
    if kurtosis is None or kurtosis == _GAUSSIAN_KURTOSIS:
        return rng.standard_normal(shape)
    kurtosis = float(kurtosis)
    if not math.isfinite(kurtosis) or kurtosis < 1.0:
        raise ValueError("kurtosis (Pearson, E[x^4]/sigma^4) must be a finite number >= 1; got "
                         f"{kurtosis!r}")
    if kurtosis <= _UNIFORM_KURTOSIS:
        p = (_UNIFORM_KURTOSIS - kurtosis) / (_UNIFORM_KURTOSIS - 1.0)
        rademacher = rng.integers(0, 2, size=shape) * 2.0 - 1.0
        uniform = rng.uniform(-math.sqrt(3.0), math.sqrt(3.0), size=shape)
        return np.where(rng.random(shape) < p, rademacher, uniform)
    beta = _gennorm_shape(kurtosis)
    # → unit variance
    scale = math.sqrt(math.exp(special.gammaln(1 / beta) - special.gammaln(3 / beta)))
    return stats.gennorm.rvs(beta, scale=scale, size=shape, random_state=rng)


def simulate_batch_noise(
    m: int, n_batches: int, *, kurtosis: float | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_batches`` batches of ``m`` i.i.d. samples and return (ξ_μ, ξ_σ), each of length
    n_batches.

    ξ_μ = (μ − μ_B)/σ and ξ_σ = σ_B²/σ² with the biased batch variance σ_B² = (1/m)Σ(x_i − μ_B)².
    ``kurtosis`` is the Pearson kurtosis of the input distribution (None = Gaussian); see
    :func:`standardized_samples`.
    """
    m = check_int("m (batch size)", m, minimum=2)
    n_batches = check_int("n_batches", n_batches, minimum=1)
    x = standardized_samples((n_batches, m), kurtosis, np.random.default_rng(seed))
    mu_b = x.mean(axis=1)
    return -mu_b, x.var(axis=1)


def xi_sigma_moments(m: int, kurtosis: float | None = None) -> tuple[float, float]:
    """Exact E[ξ_σ] = (m−1)/m and Var[ξ_σ] = ((m−1)/m)²(κ/m − (m−3)/(m(m−1))) for i.i.d. samples.

    (The variance of the unbiased sample variance is σ⁴(κ/m − (m−3)/(m(m−1))); ξ_σ is (m−1)/m times
    it.) For Gaussian data (κ = 3) this is 2(m−1)/m², the variance of χ²(m−1)/m.
    """
    m = check_int("m (batch size)", m, minimum=2)
    k = _GAUSSIAN_KURTOSIS if kurtosis is None else float(kurtosis)
    c = (m - 1) / m
    return c, c * c * (k / m - (m - 3) / (m * (m - 1)))


def theorem1_report(
    m: int, n_batches: int = 20_000, *, kurtosis: float | None = None, seed: int = 0
) -> dict:
    """Theorem 1 by simulation: KS distances and moments of ξ_μ and ξ_σ for batch size m.

    KS distances: ξ_μ vs N(0, 1/m); ξ_σ vs χ²(m−1)/m (exact for Gaussian data), vs N(1, 2/m),
    vs the corrected limit N(1, (κ−1)/m) and vs the printed N(1, κ/m). ``ks_noise_floor`` ≈
    1.36/√n is the 95% KS critical value: distances below it are indistinguishable from sampling.
    """
    xi_mu, xi_sigma = simulate_batch_noise(m, n_batches, kurtosis=kurtosis, seed=seed)
    k = _GAUSSIAN_KURTOSIS if kurtosis is None else float(kurtosis)
    mean_th, var_th = xi_sigma_moments(m, kurtosis)
    chi2 = stats.chi2(df=m - 1, scale=1.0 / m)
    return {
        "m": m,
        "n_batches": n_batches,
        "kurtosis": k,
        "ks_xi_mu_normal": ks_distance(xi_mu, stats.norm(0, 1 / math.sqrt(m)).cdf),
        "ks_xi_sigma_chi2": ks_distance(xi_sigma, chi2.cdf),
        "ks_xi_sigma_normal_2_over_m": ks_distance(xi_sigma, stats.norm(1, math.sqrt(2 / m)).cdf),
        "ks_xi_sigma_normal_corrected": ks_distance(
            xi_sigma, stats.norm(1, math.sqrt(max(k - 1, 1e-12) / m)).cdf),
        "ks_xi_sigma_normal_printed": ks_distance(xi_sigma, stats.norm(1, math.sqrt(k / m)).cdf),
        "ks_noise_floor": 1.36 / math.sqrt(n_batches),
        "xi_mu_mean": float(xi_mu.mean()),
        "xi_mu_var": float(xi_mu.var(ddof=1)),
        "xi_mu_var_theory": 1.0 / m,
        "xi_sigma_mean": float(xi_sigma.mean()),
        "xi_sigma_mean_theory": mean_th,
        "xi_sigma_var": float(xi_sigma.var(ddof=1)),
        "xi_sigma_var_theory": var_th,
        "xi_sigma_var_times_m": float(xi_sigma.var(ddof=1) * m),
    }


# ---------------------------------------------------------------------------------------------
# Theorem 2
# ---------------------------------------------------------------------------------------------


def _chi2_rule(m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes/weights for E[f(ξ_σ)], ξ_σ ~ χ²(m−1)/m (generalised Gauss–Laguerre in c/2)."""
    a = (m - 1) / 2.0 - 1.0
    y, w = special.roots_genlaguerre(n, a)
    return 2.0 * y / m, w / math.exp(special.gammaln((m - 1) / 2.0))


def theorem2_terms(
    loss: Callable[[np.ndarray], np.ndarray], x, m: int, *, n_nodes: int = 80
) -> dict:
    """Terms of Theorem 2 at points ``x`` for a smooth loss l, under Theorem 1's noise laws.

    With ξ_μ ~ N(0, 1/m) independent of ξ_σ ~ χ²(m−1)/m (exact for Gaussian data, by Cochran's
    theorem) and l analytic, the Taylor series of the paper sum to expectations:
        R^add(x) = Σ E[ξ_μⁿ]/n! l⁽ⁿ⁾(x)        = E[l(x + ξ_μ)] − l(x)
        R^mul(x) = E[l(x/√ξ_σ)] − l(x)
        R(x)     = Σ E[ξ_μⁿ]/n! R^mul⁽ⁿ⁾(x)   = E[R^mul(x + ξ_μ)] − R^mul(x) (corrected, see module)
    and l + R^add + R^mul + R = E[l((x + ξ_μ)/√ξ_σ)] (``expected``). All expectations are computed
    by Gauss–Hermite × generalised Gauss–Laguerre quadrature; ``loss`` must accept numpy arrays.
    """
    # m >= 4: for m = 2, 3 the ratio ξ_μ/√ξ_σ is Cauchy / t₂ distributed and a fixed-node rule
    # is off by ~1% (seen against Monte Carlo at m = 2).
    m = check_int("m (batch size)", m, minimum=4)
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    hu, hw = gauss_hermite(n_nodes)
    xi_mu = hu / math.sqrt(m)
    xs, ws = _chi2_rule(m, n_nodes)
    inv_sqrt = 1.0 / np.sqrt(xs)

    def e_mul(points):  # E over ξ_σ of l(p/√ξ_σ) for each point
        return np.einsum("j,...j->...", ws, loss(points[..., None] * inv_sqrt))

    lx = loss(x)
    shifted = x[:, None] + xi_mu[None, :]
    r_add = loss(shifted) @ hw - lx
    r_mul = e_mul(x) - lx
    r_mul_shifted = e_mul(shifted) - loss(shifted)
    r_cross = r_mul_shifted @ hw - r_mul
    expected = np.einsum("i,j,kij->k", hw, ws, loss(shifted[:, :, None] * inv_sqrt[None, None, :]))
    return {"x": x, "loss": lx, "R_add": r_add, "R_mul": r_mul, "R": r_cross, "expected": expected}


def theorem2_leading_order(d1, d2, x, m: int) -> dict:
    """O(1/m) terms of Theorem 2 from l'(x) = ``d1`` and l''(x) = ``d2`` (arrays at points ``x``).

    E[ξ_μ²] = 1/m gives R^add ≈ l''/(2m). Writing ξ_σ = 1 + ε with E ε = −1/m, E ε² = (2m−1)/m²:
    x(1+ε)^{−1/2} = x(1 − ε/2 + 3ε²/8 + …), so R^mul ≈ (5/(4m)) x l'(x) + x² l''(x)/(4m). R is
    O(1/m²). The error of l + R^add + R^mul against the exact expectation is O(1/m²) (tested).
    """
    x = np.asarray(x, dtype=np.float64)
    d1 = np.asarray(d1, dtype=np.float64)
    d2 = np.asarray(d2, dtype=np.float64)
    return {"R_add": d2 / (2 * m), "R_mul": 5 * x * d1 / (4 * m) + x * x * d2 / (4 * m)}


def expected_loss_mc(
    loss: Callable[[np.ndarray], np.ndarray],
    x,
    m: int,
    n_batches: int = 100_000,
    *,
    kurtosis: float | None = None,
    seed: int = 0,
) -> dict:
    """Monte Carlo of E[l((x + ξ_μ)/√ξ_σ)] with (ξ_μ, ξ_σ) from real simulated batches.

    Returns mean and standard error at each point of ``x``. ``x`` plays the standardised sample
    x̃ of Theorem 2, which treats it as fixed (independent of the batch noise).
    """
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    xi_mu, xi_sigma = simulate_batch_noise(m, n_batches, kurtosis=kurtosis, seed=seed)
    vals = loss((x[:, None] + xi_mu[None, :]) / np.sqrt(xi_sigma)[None, :])
    return {"x": x, "mean": vals.mean(axis=1),
            "sem": vals.std(axis=1, ddof=1) / math.sqrt(n_batches)}


# ---------------------------------------------------------------------------------------------
# MBN's moving statistics
# ---------------------------------------------------------------------------------------------


def moving_average_noise(
    m: int,
    momentum: float,
    n_steps: int = 20_000,
    *,
    burn_in: int | None = None,
    kurtosis: float | None = None,
    seed: int = 0,
) -> dict:
    """Noise of MBN's normaliser: μ_M ← λμ_M + (1−λ)μ_B, σ_M² ← λσ_M² + (1−λ)σ_B², by simulation.

    ``momentum`` λ is the weight of the history, as in the MBN paper (PyTorch's ``momentum`` is
    1 − λ). With i.i.d. batches each moving statistic is an AR(1) process, so at stationarity
        Var[μ_M]/σ² = (1−λ)/(1+λ) · 1/m,      Var[σ_M²]/σ⁴ = (1−λ)/(1+λ) · Var[ξ_σ],
    i.e. the mean noise of plain BN with the equivalent batch size m(1+λ)/(1−λ). Returns the
    simulated variances (after ``burn_in`` steps, default 10/(1−λ)), these predictions, and the
    equivalent batch size.
    """
    m = check_int("m (batch size)", m, minimum=2)
    if not 0.0 <= momentum < 1.0:
        raise ValueError("momentum (weight of the history, lambda) must be in [0, 1); got "
                         f"{momentum!r}")
    n_steps = check_int("n_steps", n_steps, minimum=10)
    burn = (int(10 / (1 - momentum)) + 1 if burn_in is None
            else check_int("burn_in", burn_in, minimum=0))
    xi_mu, xi_sigma = simulate_batch_noise(m, n_steps + burn, kurtosis=kurtosis, seed=seed)
    mu_b, var_b = -xi_mu, xi_sigma
    from scipy.signal import lfilter

    # EMA as a linear filter y_t = λ y_{t-1} + (1−λ) u_t started at the population values (0, 1).
    a = [1.0, -momentum]
    b = [1.0 - momentum]
    mu_m = lfilter(b, a, mu_b, zi=[momentum * 0.0])[0][burn:]
    var_m = lfilter(b, a, var_b, zi=[momentum * 1.0])[0][burn:]
    shrink = (1 - momentum) / (1 + momentum)
    mean_var, var_var = xi_sigma_moments(m, kurtosis)
    return {
        "m": m,
        "momentum": momentum,
        "var_mu": float(mu_m.var()),
        "var_mu_theory": shrink / m,
        "var_mu_plain_bn": 1.0 / m,
        "mean_sigma2": float(var_m.mean()),
        "mean_sigma2_theory": mean_var,
        "var_sigma2": float(var_m.var()),
        "var_sigma2_theory": shrink * var_var,
        "var_sigma2_plain_bn": var_var,
        "equivalent_batch_size": m * (1 + momentum) / (1 - momentum),
    }


def moving_noise_curve(
    ms: Sequence[int] = (2, 4, 8, 16, 32),
    momenta: Sequence[float] = (0.0, 0.5, 0.9, 0.99),
    n_steps: int = 20_000,
    *,
    seed: int = 0,
) -> dict:
    """:func:`moving_average_noise` on a grid: arrays (len(momenta) × len(ms)) for plotting."""
    shape = (len(momenta), len(ms))
    out = {k: np.zeros(shape) for k in ("var_mu", "var_mu_theory", "var_sigma2",
                                        "var_sigma2_theory")}
    for i, lam in enumerate(momenta):
        for j, m in enumerate(ms):
            r = moving_average_noise(m, lam, n_steps, seed=seed + 7919 * i + j)
            for k in out:
                out[k][i, j] = r[k]
    out["m"] = np.asarray(ms)
    out["momentum"] = np.asarray(momenta)
    return out


def theorem2_cosine(m: int, omega: float, xs, n_batches: int = 200_000, *, seed: int = 0) -> dict:
    """Theorem 2 for the bounded, analytic test loss l(x) = cos(ωx) at the points ``xs``: the terms
    (:func:`theorem2_terms`), their leading order (:func:`theorem2_leading_order`, l' = −ω sin ωx,
    l'' = −ω² cos ωx) and the Monte Carlo of E[l] over real batches (:func:`expected_loss_mc`)."""
    xs = np.asarray(xs, dtype=np.float64)

    def loss(x):
        return np.cos(omega * x)

    terms = theorem2_terms(loss, xs, m)
    lead = theorem2_leading_order(-omega * np.sin(omega * xs), -omega**2 * np.cos(omega * xs),
                                  xs, m)
    return {"terms": terms, "leading_order": lead,
            "monte_carlo": expected_loss_mc(loss, xs, m, n_batches, seed=seed)}
