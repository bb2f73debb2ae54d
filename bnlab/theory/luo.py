"""Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR
2019), arXiv:1809.00846. Everything below was derived again; the
places where the printed formulas are wrong are marked ``CORRECTION`` and each has a test.

Contents
--------
* Regularization strength ζ (Theorem 1, Eq. 4; linear/Gaussian case Eq. 13 and Appendix 1):
  :func:`zeta_linear`, :func:`zeta_linear_large_m`, :func:`inverse_sigma_moments`,
  :func:`zeta_linear_mc`, :func:`bn_output_noise_mc`, :func:`zeta_relu_estimate`,
  :func:`zeta_relu_mc`.
* Generalization error against the load α = P/N (Sec. 4.1): :func:`gen_error_sgd` (Eq. 14),
  :func:`krogh_hertz_G` (Eq. 16), :func:`gen_error_wn` (Eq. 15), :func:`optimal_zeta`,
  :func:`ridge_gen_error_mc` (random-matrix Monte Carlo of the same quantity), :func:`fit_zeta`.
* Order-parameter dynamics (Eqs. 9–11, Appendix 2): :func:`order_parameter_integrals`
  (I₁, I₂, I₃ closed form for ReLU/linear, Gauss–Hermite quadrature for any activation),
  :func:`ode_rhs`, :func:`integrate_order_parameters`, :func:`relu_fixed_point`,
  :func:`fixed_point`, :func:`jacobian`, :func:`stability`, :func:`learning_rates` (Table 2,
  Propositions 1–3).
* Simulators: :func:`simulate_online_student` (the student of Sec. 3 trained sample by sample, to
  compare with the ODE) and :func:`simulate_teacher_student` (Fig. 2: a BN / WN / plain linear
  student trained by minibatch SGD on P = αN samples).

Conventions
-----------
* Inputs x ~ N(0, I/N); teacher w* with ‖w*‖² = N, so w*ᵀx ~ N(0, 1); teacher noise variance
  ``noise_var`` (the paper's ε² / δ²).
* The generalization error is the excess test error E_x[(w*ᵀx − student(x))²] (what Eqs. 14–16
  compute), not "validation loss − training loss".
* ``zeta`` in :func:`gen_error_wn` is the Krogh–Hertz ridge parameter of the *summed* loss
  Σ_j (y_j − wᵀx_j)² + ζ‖w‖². A penalty ζ_γ·γ² added to the *averaged* loss (1/P)Σ_j(...)², as in
  the paper's WN student with ‖w̃‖² = Nγ², is the same ridge problem with ζ = α·ζ_γ. Eq. 13's
  "λ, an eigenvalue of the correlation matrix" plays exactly this role: the mean eigenvalue of
  XᵀX is α, so ``zeta_linear(M, lam=alpha)`` is the ridge parameter that BN's σ_B noise produces.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import special

from ._common import check_int, check_positive
from .luo_dynamics import (
    ACTIVATIONS,
    erf_integrals_printed,
    fixed_point,
    integrate_order_parameters,
    jacobian,
    learning_rates,
    ode_rhs,
    order_parameter_integrals,
    relu_fixed_point,
    relu_integrals_printed,
    stability,
)
from .luo_generalization import (
    fit_zeta,
    gen_error_sgd,
    gen_error_sgd_printed,
    gen_error_wn,
    krogh_hertz_G,
    optimal_zeta,
    ridge_gen_error_mc,
)
from .luo_simulators import (TEACHER_STUDENT_PRESETS, simulate_online_student,
                             simulate_teacher_student)
from .luo_zeta import zeta_terms

__all__ = [
    "zeta_linear",
    "zeta_linear_large_m",
    "inverse_sigma_moments",
    "zeta_linear_mc",
    "bn_output_noise_mc",
    "zeta_relu_estimate",
    "zeta_relu_mc",
    "gen_error_sgd",
    "gen_error_sgd_printed",
    "krogh_hertz_G",
    "gen_error_wn",
    "optimal_zeta",
    "ridge_gen_error_mc",
    "fit_zeta",
    "ACTIVATIONS",
    "order_parameter_integrals",
    "relu_integrals_printed",
    "erf_integrals_printed",
    "ode_rhs",
    "integrate_order_parameters",
    "relu_fixed_point",
    "fixed_point",
    "jacobian",
    "stability",
    "learning_rates",
    "simulate_online_student",
    "simulate_teacher_student",
    "TEACHER_STUDENT_PRESETS",
    "zeta_table",
    "gen_error_table",
    "teacher_student_vs_theory",
    "dynamics_vs_simulation",
    "rates_table",
]


# ---------------------------------------------------------------------------------------------
# ζ: the regularization strength (Theorem 1, Eq. 13)
# ---------------------------------------------------------------------------------------------


def _check_batch(M: int) -> int:
    M = check_int("M (batch size)", M, minimum=2)
    if M <= 3:
        # E[σ_B^-2] = M/(σ²(M-3)) is infinite for M <= 3 (χ²_{M-1} has no -1 moment).
        raise ValueError("M (batch size) must be >= 4 for the Gaussian ζ formulas (E[1/σ_B²] "
                         f"diverges); got {M}")
    return M


def inverse_sigma_moments(M: int) -> tuple[float, float]:
    """E[σ_P/σ_B] and E[σ_P²/σ_B²] for a batch of M Gaussian samples (biased batch variance).

    Mσ_B²/σ_P² ~ χ²_{M-1}, and for k = M-1: E[(χ²_k)^{-1/2}] = Γ((k-1)/2)/(√2 Γ(k/2)),
    E[(χ²_k)^{-1}] = 1/(k-2). Hence

        E[σ_P/σ_B]   = √(M/2) Γ((M-2)/2) / Γ((M-1)/2),
        E[σ_P²/σ_B²] = M/(M-3) = M Γ((M-3)/2) / (2 Γ((M-1)/2)).

    CORRECTION (Appendix 1 of the paper): the printed E(σ_B^{-2}) = (M/σ_P²) Γ((M-3)/2)/Γ((M-1)/2)
    lacks the factor 1/2 (it would be 2M/(M-3)), and E(σ_B^{-1}) has √(2σ_P) where √2·σ_P is
    meant. Eq. 13 itself uses the right factor. Checked against Monte Carlo in the tests.
    """
    M = _check_batch(M)
    e_inv = math.sqrt(M / 2.0) * math.exp(special.gammaln((M - 2) / 2)
                                          - special.gammaln((M - 1) / 2))
    e_inv2 = M / (M - 3.0)
    return e_inv, e_inv2


def zeta_linear(M: int, lam: float = 1.0) -> float:
    """Eq. 13: ζ = λ·E[(1 − σ_P/σ_B)²] for the linear student with Gaussian input, batch size M.

        ζ = λ (1 + M Γ((M−3)/2) / (2 Γ((M−1)/2)) − √(2M) Γ((M−2)/2) / Γ((M−1)/2)).

    ``zeta_linear(32) ≈ 0.0206``; for large M it tends to λ/(2M) (:func:`zeta_linear_large_m`).
    See the module docstring for what λ means (use ``lam=alpha`` to get the Krogh–Hertz ridge
    parameter of a P = αN training set).
    """
    lam = check_positive("lam", lam, strict=False)
    e_inv, e_inv2 = inverse_sigma_moments(M)
    return float(lam * (1.0 + e_inv2 - 2.0 * e_inv))


def zeta_linear_large_m(M: int, lam: float = 1.0) -> float:
    """Large-M limit of Eq. 13 (and Theorem 1 with ρ = 0, F_γ = 2λ): ζ ≈ λ/(2M)."""
    M = check_int("M (batch size)", M, minimum=1)
    return float(check_positive("lam", lam, strict=False) / (2.0 * M))


def zeta_linear_mc(M: int, n_batches: int = 200_000, *, seed: int = 0) -> float:
    """Monte Carlo of E[(1 − σ_P/σ_B)²] over batches of M standard Gaussians (ζ/λ of Eq. 13)."""
    M = _check_batch(M)
    n_batches = check_int("n_batches", n_batches, minimum=2)
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n_batches, M))
    sigma_b = h.std(axis=1)  # biased, as in BN
    return float(np.mean((1.0 - 1.0 / sigma_b) ** 2))


def bn_output_noise_mc(M: int, n_batches: int = 100_000, *, include_mean: bool = True,
                       seed: int = 0) -> float:
    """Per-unit-γ² penalty that BN's batch noise adds to a squared loss, by Monte Carlo.

    Returns E[(ĥ_j − h̄_j)²] for Gaussian h: ĥ_j = (h_j − μ_B)/σ_B uses the statistics of the batch
    that contains sample j (as BN does), h̄_j = h_j uses the population ones. With
    ``include_mean=False`` only σ_B is random (ĥ_j = h_j/σ_B), which is Eq. 13's quantity up to the
    O(1/M²) self-inclusion correlation. For the squared loss of the teacher–student model the
    μ_B noise adds ≈ 1/M, which Eq. 13 drops ("can be neglected"); this function measures both.
    """
    M = _check_batch(M)
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((check_int("n_batches", n_batches, minimum=1), M))
    mu_b = h.mean(axis=1, keepdims=True)
    sigma_b = h.std(axis=1, keepdims=True)
    h_hat = (h - mu_b) / sigma_b if include_mean else h / sigma_b
    return float(np.mean((h_hat - h) ** 2))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return special.expit(x)


def zeta_relu_estimate(h: np.ndarray, M: int, *, gamma: float = 1.0, beta: float = 0.0) -> dict:
    """Theorem 1 (Eq. 4) as an estimator from recorded pre-BN activations ``h`` of one unit.

        ζ = (ρ+2)/(8M) · F_γ  +  (1/2M) · mean_j σ(h̄_j),

    h̄_j = γ (h_j − μ_P)/σ_P + β, ρ = excess kurtosis of h, σ = logistic sigmoid (A'' of the
    softplus partition function that stands in for ReLU), and F_γ = mean_j σ(h̄_j)·((h_j−μ_P)/σ_P)²
    (the Fisher information of γ, Appendix 1). Returns the terms as floats under the keys of
    :func:`bnlab.theory.luo_zeta.zeta_terms` (the one estimator, shared with the
    ``bn_regularization`` probe): ``zeta``, ``sigma_term``, ``mu_term``, ``kurtosis``, ``fisher``.
    """
    h = np.asarray(h, dtype=np.float64).ravel()
    if h.size < 4:
        raise ValueError("h must contain at least 4 activations")
    M = check_int("M (batch size)", M, minimum=2)
    if h.std() == 0:
        raise ValueError("h has zero variance; ζ is undefined")
    return {key: float(value) for key, value in zeta_terms(h, M, gamma, beta, "relu").items()}


def zeta_relu_mc(
    h: np.ndarray, M: int, *, gamma: float = 1.0, beta: float = 0.0, n_batches: int = 20_000,
    seed: int = 0
) -> float:
    """Direct Monte Carlo of the quadratic term R^q/γ² that Theorem 1 reduces to ζ.

    R^q = mean_j A''(h̄_j)/2 · E[(ĥ_j − h̄_j)²], with batches of M drawn (without replacement) from
    ``h`` and ĥ_j normalised by the statistics of its own batch. Agreement with
    :func:`zeta_relu_estimate` up to O(1/M²) checks the derivation (delta method for σ_B, Eq. 2).
    """
    h = np.asarray(h, dtype=np.float64).ravel()
    M = check_int("M (batch size)", M, minimum=2)
    if h.size < M:
        raise ValueError(f"need at least M={M} activations, got {h.size}")
    rng = np.random.default_rng(seed)
    mu, sd = h.mean(), h.std()
    # Batches without replacement, as an epoch of BN training draws them: shuffle, cut into
    # consecutive batches of M, repeat with fresh shuffles until n_batches are collected.
    per_perm = h.size // M
    idx = np.concatenate(
        [rng.permutation(h.size)[: per_perm * M].reshape(per_perm, M)
         for _ in range(-(-n_batches // per_perm))]
    )[:n_batches]
    hb = h[idx]
    h_hat = gamma * (hb - hb.mean(axis=1, keepdims=True)) / hb.std(axis=1, keepdims=True) + beta
    h_bar = gamma * (hb - mu) / sd + beta
    return float(np.mean(_sigmoid(h_bar) / 2.0 * (h_hat - h_bar) ** 2) / gamma**2)


# ---------------------------------------------------------------------------------------------
# Tables (what `bnlab theory luo-*` prints)
# ---------------------------------------------------------------------------------------------


def zeta_table(ms: Sequence[int], lam: float = 1.0, n_batches: int = 100_000, *,
               seed: int = 0) -> list[dict]:
    """Per batch size M: Eq. 13's ζ exact, its large-M limit λ/2M, λ × the Monte Carlo of
    E[(1 − σ_P/σ_B)²], and the Monte Carlo of E[(ĥ − h̄)²] with the μ_B noise Eq. 13 drops."""
    return [{"M": m, "zeta_exact": zeta_linear(m, lam), "zeta_large_M": zeta_linear_large_m(m, lam),
             "zeta_mc": lam * zeta_linear_mc(m, n_batches, seed=seed),
             "penalty_with_mean_mc": bn_output_noise_mc(m, n_batches, seed=seed)} for m in ms]


def gen_error_table(alphas: Sequence[float], zetas: Sequence[float],
                    noise_var: float) -> list[dict]:
    """Per load α: ε_gen of SGD (Eq. 14, corrected) and of WN with each ridge ζ (Eqs. 15-16)."""
    rows = []
    for a in alphas:
        row = {"alpha": a, "sgd": float(gen_error_sgd(a, noise_var))}
        for z in zetas:
            row[f"wn_zeta={z:g}"] = float(gen_error_wn(a, z, noise_var))
        rows.append(row)
    return rows


def teacher_student_vs_theory(alphas: Sequence[float], *, noise_var: float = 0.25,
                              **simulation) -> dict:
    """Fig. 2: :func:`simulate_teacher_student` (``simulation`` its options) with the WN curve at
    Eq. 13's ζ(M) (``wn_eq13``) and at α·ζ(M) (``wn_eq13_ridge``), the SGD curve and the best-fit
    ζ."""
    res = simulate_teacher_student(alphas, noise_var=noise_var, **simulation)
    M = res["settings"]["M"]
    res["wn_eq13"] = np.array([gen_error_wn(a, zeta_linear(M), noise_var) for a in alphas])
    res["wn_eq13_ridge"] = np.array([gen_error_wn(a, zeta_linear(M, a), noise_var) for a in alphas])
    res["sgd_curve"] = np.array([gen_error_sgd(a, noise_var) for a in alphas])
    res["fitted_zeta"] = fit_zeta(alphas, res["gen_error"], noise_var)
    return res


def dynamics_vs_simulation(*, eta: float, zeta: float, gamma0: float, R0: float, L0: float,
                           t_max: float, activation: str = "relu", simulate: int = 0,
                           students: int = 4, n_points: int = 11, seed: int = 0) -> dict:
    """Eqs. 9-11 integrated (``ode``), the fixed point, and with ``simulate`` = N > 0 the mean of
    ``students`` N-dimensional online students at the same times (``simulation``)."""
    res = {"ode": integrate_order_parameters(eta=eta, zeta=zeta, gamma0=gamma0, R0=R0, L0=L0,
                                             t_max=t_max, n_points=n_points, activation=activation)}
    if simulate:
        res["simulation"] = simulate_online_student(N=simulate, eta=eta, zeta=zeta, gamma0=gamma0,
                                                    R0=R0, L0=L0, t_max=t_max,
                                                    activation=activation, n_students=students,
                                                    n_records=n_points, seed=seed)
    res["fixed_point"] = fixed_point(zeta, activation)
    return res


def rates_table(zetas: Sequence[float], *, eta: float, L0: float = 1.0,
                activation: str = "relu") -> list[dict]:
    """Table 2 per ζ and method (bn, wn, sgd): fixed point, λ_Q, λ_R (analytic and finite
    difference), η_max (and as printed, without the I2 term of ∂(R·I2)/∂R) and η_eff."""
    rows = []
    for z in zetas:
        for method in ("bn", "wn", "sgd"):
            st = stability(z, eta=eta, L0=L0, activation=activation, method=method)
            printed = stability(z, eta=eta, L0=L0, activation=activation, method=method,
                                include_i2_term=False)
            rows.append({
                "zeta": z, "method": method, "gamma0": st["gamma0"], "lambda_Q": st["lambda_Q"],
                "lambda_R": st["lambda_R"], "lambda_R_fd": st.get("lambda_R_fd", float("nan")),
                "eta_max": st["eta_max"], "eta_max_printed": printed["eta_max"],
                "eta_eff": st["eta_eff"],
            })
    return rows
