"""Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR
2019), arXiv:1809.00846. Everything below was derived again; the
places where the printed formulas are wrong are marked ``CORRECTION`` and each has a test.

Contents
--------
* Regularization strength ζ (Theorem 1, Eq. 4; linear/Gaussian case Eq. 13 and Appendix 1):
  :func:`zeta_linear`, :func:`zeta_linear_large_m`, :func:`inverse_sigma_moments`,
  :func:`zeta_linear_mc`, :func:`bn_output_noise_mc`, :func:`zeta_relu_estimate`, :func:`zeta_relu_mc`.
* Generalization error against the load α = P/N (Sec. 4.1): :func:`gen_error_sgd` (Eq. 14),
  :func:`krogh_hertz_G` (Eq. 16), :func:`gen_error_wn` (Eq. 15), :func:`optimal_zeta`,
  :func:`ridge_gen_error_mc` (random-matrix Monte Carlo of the same quantity), :func:`fit_zeta`.
* Order-parameter dynamics (Eqs. 9–11, Appendix 2): :func:`order_parameter_integrals`
  (I₁, I₂, I₃ closed form for ReLU/linear, Gauss–Hermite quadrature for any activation),
  :func:`ode_rhs`, :func:`integrate_order_parameters`, :func:`relu_fixed_point`, :func:`fixed_point`,
  :func:`jacobian`, :func:`stability`, :func:`learning_rates` (Table 2, Propositions 1–3).
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
from typing import Callable, Sequence

import numpy as np
from scipy import integrate, optimize, special

from ._common import check_choice, check_int, check_positive, gauss_hermite
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
]


# ---------------------------------------------------------------------------------------------
# ζ: the regularization strength (Theorem 1, Eq. 13)
# ---------------------------------------------------------------------------------------------


def _check_batch(M: int) -> int:
    M = check_int("M (batch size)", M, minimum=2)
    if M <= 3:
        # E[σ_B^-2] = M/(σ²(M-3)) is infinite for M <= 3 (χ²_{M-1} has no -1 moment).
        raise ValueError(f"M (batch size) must be >= 4 for the Gaussian ζ formulas (E[1/σ_B²] diverges); got {M}")
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
    e_inv = math.sqrt(M / 2.0) * math.exp(special.gammaln((M - 2) / 2) - special.gammaln((M - 1) / 2))
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


def bn_output_noise_mc(M: int, n_batches: int = 100_000, *, include_mean: bool = True, seed: int = 0) -> float:
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
    h: np.ndarray, M: int, *, gamma: float = 1.0, beta: float = 0.0, n_batches: int = 20_000, seed: int = 0
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
        [rng.permutation(h.size)[: per_perm * M].reshape(per_perm, M) for _ in range(-(-n_batches // per_perm))]
    )[:n_batches]
    hb = h[idx]
    h_hat = gamma * (hb - hb.mean(axis=1, keepdims=True)) / hb.std(axis=1, keepdims=True) + beta
    h_bar = gamma * (hb - mu) / sd + beta
    return float(np.mean(_sigmoid(h_bar) / 2.0 * (h_hat - h_bar) ** 2) / gamma**2)


# ---------------------------------------------------------------------------------------------
# Generalization error (Sec. 4.1, Eqs. 14-16)
# ---------------------------------------------------------------------------------------------


def gen_error_sgd(alpha, noise_var: float):
    """Eq. 14 corrected: excess test error of the minimum-norm least-squares (pseudo-inverse) student.

        ε_gen = 1 − α + α σ²/(1 − α)   (α < 1),      ε_gen = σ²/(α − 1)   (α > 1),  ∞ at α = 1.

    CORRECTION: the paper prints ε²/(1 − α) for α > 1, which is negative. The pseudo-inverse error
    is σ²·(1/N) tr (XᵀX)⁻¹ and the inverse Marchenko–Pastur mean gives 1/(α − 1); it is also the
    ζ → 0 limit of Eq. 15. Checked against a random-matrix simulation in the tests.
    """
    noise_var = check_positive("noise_var", noise_var, strict=False)
    a = np.asarray(alpha, dtype=np.float64)
    if np.any(a <= 0):
        raise ValueError("alpha must be > 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a < 1, 1 - a + a * noise_var / (1 - a), noise_var / (a - 1))
    out = np.where(a == 1, np.inf, out)
    return float(out) if out.ndim == 0 else out


def gen_error_sgd_printed(alpha, noise_var: float):
    """Eq. 14 exactly as printed (negative for α > 1); kept only to document the slip."""
    a = np.asarray(alpha, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a < 1, 1 - a + a * noise_var / (1 - a), noise_var / (1 - a))
    return float(out) if out.ndim == 0 else out


def krogh_hertz_G(alpha, zeta):
    """Eq. 16: G(ζ) = (1/N) tr (XᵀX + ζI)⁻¹ for X with i.i.d. N(0, 1/N) entries, P = αN rows.

        G = [1 − α − ζ + √((ζ + (1+√α)²)(ζ + (1−√α)²))] / (2ζ)

    (the Stieltjes transform of the Marchenko–Pastur law at −ζ).
    """
    a = np.asarray(alpha, dtype=np.float64)
    z = np.asarray(zeta, dtype=np.float64)
    if np.any(z <= 0):
        raise ValueError("zeta must be > 0 in G; use gen_error_sgd for ζ = 0")
    s = np.sqrt((z + (1 + np.sqrt(a)) ** 2) * (z + (1 - np.sqrt(a)) ** 2))
    out = (1 - a - z + s) / (2 * z)
    return float(out) if out.ndim == 0 else out


def gen_error_wn(alpha, zeta, noise_var: float):
    """Eq. 15: ε_gen = σ² ∂(ζG)/∂ζ − ζ² ∂G/∂ζ, the Krogh–Hertz error of ridge regression.

    With S = √((ζ+a₊)(ζ+a₋)), a± = (1 ± √α)², S' = (2ζ + a₊ + a₋)/(2S), the derivatives are done
    analytically:  ε_gen = [(σ² − ζ)(S' − 1) + 1 − α − ζ + S] / 2.
    ``zeta`` is the ridge parameter of the summed loss (see module docstring); ζ = 0 falls back to
    :func:`gen_error_sgd`. The minimum over ζ is at ζ = σ² for every α: dε/dζ = (σ² − ζ)(2G' + ζG'').
    """
    noise_var = check_positive("noise_var", noise_var, strict=False)
    a = np.asarray(alpha, dtype=np.float64)
    z = np.asarray(zeta, dtype=np.float64)
    if np.any(a <= 0):
        raise ValueError("alpha must be > 0")
    if np.any(z < 0):
        raise ValueError("zeta must be >= 0")
    a, z = np.broadcast_arrays(a, z)
    ap, am = (1 + np.sqrt(a)) ** 2, (1 - np.sqrt(a)) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sqrt((z + ap) * (z + am))
        sp = (2 * z + ap + am) / (2 * s)
        out = ((noise_var - z) * (sp - 1) + 1 - a - z + s) / 2
    zero = z == 0
    if np.any(zero):
        out = np.where(zero, gen_error_sgd(np.where(zero, a, 2.0), noise_var), out)
    return float(out) if out.ndim == 0 else out


def optimal_zeta(alpha: float, noise_var: float) -> float:
    """Numerical argmin_ζ of :func:`gen_error_wn` (the theory says ζ* = noise_var)."""
    res = optimize.minimize_scalar(
        lambda lz: gen_error_wn(alpha, math.exp(lz), noise_var), bounds=(-12, 5), method="bounded",
        options={"xatol": 1e-10},
    )
    return float(math.exp(res.x))


def ridge_gen_error_mc(
    alpha: float, zeta: float, noise_var: float, *, N: int = 400, n_trials: int = 8, seed: int = 0
) -> dict:
    """Random-matrix Monte Carlo of the quantity in Eqs. 14–16.

    Draws X (P×N, entries N(0, 1/N)), w* (‖w*‖² = N), y = Xw* + noise, solves the ridge problem
    w = (XᵀX + ζI)⁻¹Xᵀy (ζ = 0: minimum-norm pseudo-inverse) and returns mean and standard error
    of ‖w − w*‖²/N over ``n_trials`` draws.
    """
    N = check_int("N", N, minimum=2)
    P = max(1, int(round(alpha * N)))
    rng = np.random.default_rng(seed)
    errs = []
    for _ in range(check_int("n_trials", n_trials, minimum=1)):
        X = rng.standard_normal((P, N)) / math.sqrt(N)
        w_star = rng.standard_normal(N)
        w_star *= math.sqrt(N) / np.linalg.norm(w_star)
        y = X @ w_star + math.sqrt(noise_var) * rng.standard_normal(P)
        if zeta > 0:
            w = np.linalg.solve(X.T @ X + zeta * np.eye(N), X.T @ y)
        else:
            w = np.linalg.lstsq(X, y, rcond=None)[0]
        errs.append(float(np.sum((w - w_star) ** 2) / N))
    errs = np.asarray(errs)
    return {"mean": float(errs.mean()), "sem": float(errs.std(ddof=1) / math.sqrt(errs.size)) if errs.size > 1 else 0.0}


def fit_zeta(alphas: Sequence[float], gen_errors: Sequence[float], noise_var: float) -> float:
    """Least-squares fit (in log error) of the Krogh–Hertz ζ to measured points (Fig. 2's "best fitter")."""
    a = np.asarray(alphas, dtype=np.float64)
    e = np.asarray(gen_errors, dtype=np.float64)

    def loss(lz: float) -> float:
        return float(np.sum((np.log(gen_error_wn(a, math.exp(lz), noise_var)) - np.log(e)) ** 2))

    res = optimize.minimize_scalar(loss, bounds=(-12, 3), method="bounded", options={"xatol": 1e-8})
    return float(math.exp(res.x))


# ---------------------------------------------------------------------------------------------
# Order-parameter dynamics (Sec. 3, Eqs. 9-11; Appendix 2)
# ---------------------------------------------------------------------------------------------


def _relu(x):
    return np.maximum(x, 0.0)


def _relu_prime(x):
    return np.greater(x, 0).astype(np.float64) if isinstance(x, np.ndarray) else float(x > 0)


def _erf(x):
    return special.erf(x / math.sqrt(2.0))


def _erf_prime(x):
    return math.sqrt(2.0 / math.pi) * np.exp(-(np.square(x)) / 2.0)


ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "relu": (_relu, _relu_prime),
    "erf": (_erf, _erf_prime),  # the paper's stand-in for sigmoid: erf(x/√2)
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "linear": (lambda x: x, lambda x: np.ones_like(x) if isinstance(x, np.ndarray) else 1.0),
}


def _relu_terms(R: float) -> tuple[float, float, float, float]:
    """a(R) = πR + 2√(1−R²) + 2R arcsin R and b(R) = π + 2R√(1−R²) + 2 arcsin R with derivatives.

    With (s, t) jointly Gaussian, Var s = γ², Var t = 1, Cov = γR:
    E[s⁺t⁺] = γ a(R)/(4π), E[1{s>0} 1{t>0} t²] = b(R)/(4π).
    """
    R = float(np.clip(R, -1.0, 1.0))
    c = math.sqrt(max(0.0, 1.0 - R * R))
    asr = math.asin(R)
    a = math.pi * R + 2 * c + 2 * R * asr
    b = math.pi + 2 * R * c + 2 * asr
    return a, b, math.pi + 2 * asr, 4 * c


def _closed_integrals(gamma: float, R: float, activation: str) -> tuple[float, float, float]:
    if activation == "relu":
        a, b, _, _ = _relu_terms(R)
        i1 = gamma * a / (4 * math.pi) - gamma**2 / 2
        # CORRECTION: the paper's I₂ has πR where π belongs (its middle term); b(R) is right.
        i2 = b / (4 * math.pi) - gamma * a / (2 * math.pi) + gamma**2 / 2
        i3 = b / (4 * math.pi) - gamma * R / 2
        return i1, i2, i3
    if activation == "linear":
        return gamma * R - gamma**2, 1 - 2 * gamma * R + gamma**2, 1 - gamma * R
    raise ValueError(f"no closed form for activation {activation!r}; closed forms exist for 'relu', 'linear'")


def relu_integrals_printed(gamma: float, R: float) -> tuple[float, float, float]:
    """I₁, I₂, I₃ for ReLU exactly as printed in Appendix 2 (I₂ carries the πR slip)."""
    R = float(np.clip(R, -1.0, 1.0))
    c = math.sqrt(max(0.0, 1.0 - R * R))
    asr = math.asin(R)
    i1 = gamma * (math.pi * R + 2 * c + 2 * R * asr) / (4 * math.pi) - gamma**2 / 2
    i2 = gamma**2 / 2 + (math.pi * R + 2 * R * c + 2 * asr) / (4 * math.pi) - gamma * (
        math.pi * R + 2 * c + 2 * R * asr
    ) / (2 * math.pi)
    i3 = (math.pi + 2 * R * c + 2 * asr) / (4 * math.pi) - gamma * R / 2
    return i1, i2, i3


def erf_integrals_printed(gamma: float, R: float) -> tuple[float, float]:
    """I₁ and I₂ for g(x) = erf(x/√2) exactly as printed in Appendix 2 (Proposition 2's proof).

    I₁ agrees with quadrature; the printed I₂ does not (e.g. γ = 0.8, R = 1: 0.0173 against the
    correct 0.0021), so the erf case is computed by quadrature here.
    """
    Q = float(gamma)
    i1 = 2 * Q * R / ((math.pi + math.pi * Q * Q) * math.sqrt(2 + 2 * Q * Q - Q * Q * R * R)) - 2 * Q * Q / (
        (math.pi + math.pi * Q * Q) * math.sqrt(1 + 2 * Q * Q)
    )
    i2 = 4 / (math.pi * math.sqrt(1 + 2 * Q * Q)) * (
        math.asin(1 / (1 + 3 * Q * Q))
        - math.asin(1 / (math.sqrt(1 + 3 * Q * Q) * math.sqrt(2 * (1 + 2 * Q * Q) - 2 * Q * Q * R * R)))
    )
    return i1, i2


def order_parameter_integrals(
    gamma: float, R: float, activation: str = "relu", *, method: str = "auto", n_nodes: int = 96
) -> tuple[float, float, float]:
    """I₁ = ⟨δ s⟩, I₂ = ⟨δ²⟩ (xᵀx → 1), I₃ = ⟨δ t⟩ with δ = g'(s)(g(t) − g(s)).

    s = w̃ᵀx ~ N(0, γ²) is the student's and t = w*ᵀx ~ N(0, 1) the teacher's pre-activation,
    Cov(s, t) = γR. ``method``: "closed" (ReLU, linear), "quadrature" (2-D Gauss–Hermite with
    ``n_nodes``² points, any activation in :data:`ACTIVATIONS`), "auto" (closed when available).
    """
    check_choice("activation", activation, ACTIVATIONS)
    check_choice("method", method, ("auto", "closed", "quadrature"))
    if method == "closed" or (method == "auto" and activation in ("relu", "linear")):
        return _closed_integrals(gamma, R, activation)
    g, gp = ACTIVATIONS[activation]
    x, w = gauss_hermite(n_nodes)
    u, v = np.meshgrid(x, x, indexing="ij")
    ww = np.outer(w, w)
    R = float(np.clip(R, -1.0, 1.0))
    s = gamma * u
    t = R * u + math.sqrt(max(0.0, 1 - R * R)) * v
    delta = gp(s) * (g(t) - g(s))
    return float(np.sum(ww * delta * s)), float(np.sum(ww * delta**2)), float(np.sum(ww * delta * t))


def ode_rhs(gamma: float, R: float, L: float, *, eta: float, zeta: float, activation: str = "relu", **kw):
    """Right-hand side of Eqs. 9–11 (derived again; they agree with the paper):

        dγ/dt = η I₁/γ − η ζ γ
        dR/dt = η γ I₃/L² − η R I₁/L² − η² γ² R I₂/(2L⁴)
        dL/dt = η² γ² I₂/(2L³)

    t = j/N. This is the student of Eqs. 6–7 with the γ step η/N (see simulate_online_student).
    """
    i1, i2, i3 = order_parameter_integrals(gamma, R, activation, **kw)
    dg = eta * i1 / gamma - eta * zeta * gamma
    dR = eta * gamma * i3 / L**2 - eta * R * i1 / L**2 - eta**2 * gamma**2 * R * i2 / (2 * L**4)
    dL = eta**2 * gamma**2 * i2 / (2 * L**3)
    return dg, dR, dL


def integrate_order_parameters(
    *,
    eta: float,
    zeta: float,
    gamma0: float = 0.5,
    R0: float = 0.2,
    L0: float = 1.0,
    t_max: float = 20.0,
    n_points: int = 201,
    activation: str = "relu",
) -> dict:
    """Integrate Eqs. 9–11 (RK45, tight tolerances); returns t, gamma, R, L arrays."""
    check_positive("eta", eta)
    check_positive("zeta", zeta, strict=False)

    def f(_t, y):
        return ode_rhs(y[0], min(y[1], 1.0), y[2], eta=eta, zeta=zeta, activation=activation)

    t_eval = np.linspace(0.0, t_max, n_points)
    sol = integrate.solve_ivp(f, (0.0, t_max), [gamma0, R0, L0], t_eval=t_eval, rtol=1e-8, atol=1e-10)
    if not sol.success:  # pragma: no cover - only on pathological inputs
        raise RuntimeError(f"ODE integration failed: {sol.message}")
    return {"t": sol.t, "gamma": sol.y[0], "R": np.minimum(sol.y[1], 1.0), "L": sol.y[2]}


def relu_fixed_point(zeta: float, L0: float = 1.0) -> tuple[float, float, float]:
    """Fixed point (γ₀, R₀, L₀) of Eqs. 9–11 at small η for ReLU: γ₀ = 1/(2ζ+1), R₀ = 1.

    dγ/dt = 0 at R = 1 gives (1 − γ)/2 = ζγ. L is not fixed by the O(η) system (dL/dt = O(η²) ≥ 0):
    L₀ is whatever norm training reached, so it is passed through.
    """
    zeta = check_positive("zeta", zeta, strict=False)
    return 1.0 / (2.0 * zeta + 1.0), 1.0, float(L0)


def fixed_point(zeta: float, activation: str = "relu", L0: float = 1.0) -> tuple[float, float, float]:
    """(γ₀, 1, L₀) for any activation: R = 1 always solves γI₃ = RI₁; γ₀ solves I₁(γ,1) = ζγ²."""
    check_choice("activation", activation, ACTIVATIONS)
    if activation == "relu":
        return relu_fixed_point(zeta, L0)

    def h(g):
        return order_parameter_integrals(g, 1.0, activation)[0] - zeta * g * g

    hi = 1.0
    while h(hi) > 0 and hi < 64:
        hi *= 2
    return float(optimize.brentq(h, 1e-6, hi, xtol=1e-13)), 1.0, float(L0)


def _dR(fun: Callable[[float], float], R: float, h: float = 1e-4) -> float:
    """d/dR, one-sided (second order) at the boundary R = 1 where the integrals end."""
    if R >= 1.0 - 2 * h:
        return (3 * fun(R) - 4 * fun(R - h) + fun(R - 2 * h)) / (2 * h)
    return (fun(R + h) - fun(R - h)) / (2 * h)


def _derivatives(gamma: float, R: float, activation: str) -> dict:
    i1, i2, i3 = order_parameter_integrals(gamma, R, activation)
    if activation == "relu":
        a, b, da, db = _relu_terms(R)
        d = {
            "dI1_dR": gamma * da / (4 * math.pi),
            "dI2_dR": db / (4 * math.pi) - gamma * da / (2 * math.pi),
            "dI3_dR": db / (4 * math.pi) - gamma / 2,
            "dI1_dgamma": a / (4 * math.pi) - gamma,
        }
    else:
        d = {
            f"dI{k + 1}_dR": _dR(lambda r, k=k: order_parameter_integrals(gamma, r, activation)[k], R)
            for k in range(3)
        }
        hg = 1e-5 * max(1.0, gamma)
        d["dI1_dgamma"] = (
            order_parameter_integrals(gamma + hg, R, activation)[0] - order_parameter_integrals(gamma - hg, R, activation)[0]
        ) / (2 * hg)
    d.update({"I1": i1, "I2": i2, "I3": i3})
    return d


def jacobian(gamma: float, R: float, L: float, *, eta: float, zeta: float, activation: str = "relu", h: float = 1e-6):
    """3×3 Jacobian of (dγ/dt, dR/dt, dL/dt) by finite differences.

    At R = 1 the R-derivative is one-sided (second-order backward). The ReLU integrals contain
    √(1 − R²), so that difference has an O(√h) error; it is removed by Richardson extrapolation
    in √h: D = 2·D(h) − D(4h).
    """
    state = np.array([gamma, R, L], dtype=np.float64)

    def f(st):
        return np.array(ode_rhs(*st, eta=eta, zeta=zeta, activation=activation))

    def backward(step):
        e = np.array([0.0, step, 0.0])
        return (3 * f(state) - 4 * f(state - e) + f(state - 2 * e)) / (2 * step)

    J = np.zeros((3, 3))
    for k in range(3):
        if k == 1 and R + h > 1.0:
            J[:, k] = 2 * backward(h) - backward(4 * h)
        else:
            e = np.zeros(3)
            e[k] = h
            J[:, k] = (f(state + e) - f(state - e)) / (2 * h)
    return J


def stability(
    zeta: float,
    *,
    eta: float = 0.1,
    L0: float = 1.0,
    activation: str = "relu",
    method: str = "bn",
    include_i2_term: bool = True,
) -> dict:
    """Eigenvalues at the fixed point (Proposition 1, Eq. 12, Table 2) for BN / WN / SGD.

    λ_Q = η(∂I₁/∂γ / γ₀ − 2ζ)      (ReLU: −η(ζ + 1/2))
    λ_R = (D η γ₀ / (2L₀²)) (η_max − η_eff),  η_max = (∂(γ₀I₃ − I₁)/(γ₀∂R) − ζγ₀) / (D/2),
    η_eff = η γ₀/L₀², D = ∂I₂/∂R + I₂.

    CORRECTIONS: (i) Proposition 1's statement has −ηζQ₀ in λ_Q; its own proof (and the derivative
    of I₁/γ − ζγ with I₁ = ζγ₀² at the fixed point) gives −2ηζ. The ReLU value is −η(ζ+1/2), not
    −ζ − 1/2 (η is missing). (ii) ∂(R I₂)/∂R = I₂ + ∂I₂/∂R: the paper drops I₂, which at the BN
    fixed point is (1−γ₀)²/2 = 2ζ²/(1+2ζ)² (zero for WN/SGD). ``include_i2_term=False`` reproduces
    the printed Table 2. Both are checked against the finite-difference Jacobian of Eqs. 9–11.
    """
    check_choice("method", method, ("bn", "wn", "sgd"))
    zeta_eff = zeta if method == "bn" else 0.0
    g0, R0, L0 = fixed_point(zeta_eff, activation, L0) if method == "bn" else (1.0, 1.0, L0 if method == "wn" else 1.0)
    d = _derivatives(g0, R0, activation)
    D = d["dI2_dR"] + (d["I2"] if include_i2_term else 0.0)
    eta_max = ((g0 * d["dI3_dR"] - d["dI1_dR"]) / g0 - zeta_eff * g0) / (D / 2)
    eta_eff = eta * g0 / L0**2 if method != "sgd" else eta
    lam_R = D * eta * g0 / (2 * L0**2) * (eta_max - eta_eff)
    lam_Q = eta * (d["dI1_dgamma"] / g0 - 2 * zeta_eff)
    out = {
        "gamma0": g0,
        "R0": R0,
        "L0": L0,
        "lambda_Q": lam_Q,
        "lambda_R": lam_R,
        "eta_max": eta_max,
        "eta_eff": eta_eff,
        "dI2_dR": d["dI2_dR"],
        "I2": d["I2"],
    }
    if method != "sgd":
        J = jacobian(g0, R0, L0, eta=eta, zeta=zeta_eff, activation=activation)
        out["jacobian"] = J
        out["lambda_Q_fd"] = float(J[0, 0])
        out["lambda_R_fd"] = float(J[1, 1])
        out["eigenvalues_fd"] = np.sort(np.linalg.eigvals(J[:2, :2]).real)
    return out


def learning_rates(
    method: str,
    zeta: float = 0.0,
    *,
    eta: float = 1.0,
    L0: float = 1.0,
    activation: str = "relu",
    include_i2_term: bool = True,
) -> tuple[float, float]:
    """(η_max, η_eff) of Table 2 for ``method`` in {"bn", "wn", "sgd"}.

    For ReLU, η_max^wn = η_max^sgd = 2 and η_max^bn = 2 + 4ζ (+O(ζ²) from the I₂ term), so
    Proposition 3's η_max^bn ≥ η_max^{wn,sgd} + 2ζ holds with room (the gap is 4ζ).
    η_eff: BN ηγ₀/L₀², WN η/L₀², SGD η.
    """
    st = stability(zeta, eta=eta, L0=L0, activation=activation, method=method, include_i2_term=include_i2_term)
    return float(st["eta_max"]), float(st["eta_eff"])


# ---------------------------------------------------------------------------------------------
# Simulators
# ---------------------------------------------------------------------------------------------


def simulate_online_student(
    *,
    N: int = 1000,
    eta: float = 1.0,
    zeta: float = 0.1,
    t_max: float = 10.0,
    gamma0: float = 0.5,
    R0: float = 0.2,
    L0: float = 1.0,
    activation: str = "relu",
    n_students: int = 1,
    n_records: int = 101,
    seed: int = 0,
) -> dict:
    """The student of Sec. 3 trained online (one fresh sample per step), to compare with the ODE.

    Updates (Eqs. 6–7), δ = g'(w̃ᵀx)[g(w*ᵀx) − g(w̃ᵀx)], w̃ = √N γ w/‖w‖, x ~ N(0, I/N):
        w ← w + η δ (γ√N x/‖w‖ − (w̃ᵀx) w/‖w‖²)
        γ ← γ + (η/N) (δ √N wᵀx/‖w‖ − ζγ)

    CORRECTION: Eq. 7 prints the γ step as η(...) without 1/N, but Eq. 8 — and hence Eq. 9 — needs
    (γ²)^{j+1} − (γ²)^j = (1/N)(...), i.e. a step η/N. The tests check the trajectories against
    :func:`integrate_order_parameters` at this scaling.

    ``n_students`` independent students (own teacher, own samples) are run side by side in one
    vectorised loop; the returned t = j/N, gamma, R, L are their means, and gamma_all, R_all, L_all
    (shape n_records × n_students) the individual trajectories. Fluctuations are O(1/√N).
    """
    N = check_int("N", N, minimum=2)
    K = check_int("n_students", n_students, minimum=1)
    check_choice("activation", activation, ACTIVATIONS)
    if not -1.0 <= R0 <= 1.0:
        raise ValueError(f"R0 must lie in [-1, 1]; got {R0}")
    g, gp = ACTIVATIONS[activation]
    rng = np.random.default_rng(seed)
    sqrtN = math.sqrt(N)
    w_star = rng.standard_normal((K, N))
    w_star *= sqrtN / np.linalg.norm(w_star, axis=1, keepdims=True)
    u = rng.standard_normal((K, N))
    u -= np.sum(u * w_star, axis=1, keepdims=True) / N * w_star
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    w = L0 * sqrtN * (R0 * w_star / sqrtN + math.sqrt(1 - R0**2) * u)
    gamma = np.full(K, float(gamma0))
    steps = int(round(t_max * N))
    record_steps = np.unique(np.linspace(0, steps, n_records).round().astype(int))
    ts, gs, Rs, Ls = [], [], [], []
    chunk = max(1, 2**22 // (K * N))  # ~32 MB of samples at a time
    rec = 0
    for start in range(0, steps + 1, chunk):
        stop = min(start + chunk, steps + 1)
        xs = rng.standard_normal((stop - start, K, N)) / sqrtN
        teacher = np.einsum("jkn,kn->jk", xs, w_star)  # t = w*ᵀx for the whole chunk
        for k in range(stop - start):
            j = start + k
            nw2 = np.einsum("kn,kn->k", w, w)
            nw = np.sqrt(nw2)
            if rec < record_steps.size and j == record_steps[rec]:
                ts.append(j / N)
                gs.append(gamma.copy())
                Rs.append(np.einsum("kn,kn->k", w, w_star) / (nw * sqrtN))
                Ls.append(nw / sqrtN)
                rec += 1
            if j == steps:
                break
            x = xs[k]
            wx = np.einsum("kn,kn->k", w, x)
            s = sqrtN * gamma * wx / nw
            delta = gp(s) * (g(teacher[k]) - g(s))
            w *= (1.0 - eta * delta * s / nw2)[:, None]
            w += (eta * delta * gamma * sqrtN / nw)[:, None] * x
            gamma = gamma + (eta / N) * (delta * sqrtN * wx / nw - zeta * gamma)
    G, Rr, Ll = np.array(gs), np.array(Rs), np.array(Ls)
    return {
        "t": np.array(ts), "gamma": G.mean(axis=1), "R": Rr.mean(axis=1), "L": Ll.mean(axis=1),
        "gamma_all": G, "R_all": Rr, "L_all": Ll,
    }


#: Sizes for :func:`simulate_teacher_student`. "paper" is Fig. 2's (N = 4096, M = 32).
TEACHER_STUDENT_PRESETS: dict[str, dict] = {
    "paper": {"N": 4096, "M": 32, "epochs": 300, "n_seeds": 1},
    "cpu": {"N": 1024, "M": 32, "epochs": 300, "n_seeds": 2},
    "test": {"N": 256, "M": 32, "epochs": 200, "n_seeds": 2},
}


def simulate_teacher_student(
    alphas: Sequence[float] = (0.5, 1.0, 1.5, 2.0, 3.0),
    *,
    student: str = "bn",
    N: int = 512,
    M: int = 32,
    noise_var: float = 0.25,
    zeta: float = 0.0,
    epochs: int = 300,
    lr: float | None = None,
    lr_gamma: float = 0.05,
    n_seeds: int = 2,
    inference: str = "population",
    seed: int = 0,
    preset: str | None = None,
) -> dict:
    """Fig. 2's simulation: a linear student trained by minibatch SGD on P = αN noisy teacher samples.

    Students (``student``):
      * "bn":  y = γ (wᵀx − μ_B)/σ_B (β frozen at 0), batch statistics of each minibatch of M.
      * "wn":  y = √N γ wᵀx/‖w‖ with the penalty (ζ/α)·γ² on the averaged loss, i.e. Krogh–Hertz
               ridge parameter ``zeta`` (a check of the simulator against :func:`gen_error_wn`).
      * "sgd": y = wᵀx from w = 0 (approaches the pseudo-inverse, Eq. 14).
    Training: ``epochs`` passes over the data in random minibatches of M, SGD with a cosine
    schedule from ``lr`` (on w; default M/4, which gives the same progress per epoch for every M —
    including full batch, M = P — and is stable for M ≪ N) and ``lr_gamma`` (on γ). ``preset``
    (see :data:`TEACHER_STUDENT_PRESETS`) overrides N, M, epochs and n_seeds. The BN/WN output is invariant to ‖w‖, so w
    is rescaled to ‖w‖ = √N after each step: the function is unchanged and the effective learning
    rate stays ``lr`` instead of decaying as ‖w‖ grows (Arora et al., Thm 2.5). w starts at Xᵀy, the
    direction plain SGD from zero takes first, so that no random null-space component is left over
    at α < 1 (the theory's students start from zero).

    Generalization error (excess test error, exact for x ~ N(0, I/N)): with ``inference`` =
    "population" the BN student is evaluated with the population statistics of the input
    distribution, μ_P = 0, σ_P = ‖w‖/√N (Luo's h̄, Eq. 3/5); with "train" it uses the mean and
    standard deviation of wᵀx over the training set (what BN's running averages estimate).
    Returns plain arrays: alpha, gen_error (mean over seeds), gen_error_sem, per_seed, gamma.
    """
    if preset is not None:
        check_choice("preset", preset, TEACHER_STUDENT_PRESETS)
        p = TEACHER_STUDENT_PRESETS[preset]
        N, M, epochs, n_seeds = p["N"], p["M"], p["epochs"], p["n_seeds"]
    check_choice("student", student, ("bn", "wn", "sgd"))
    check_choice("inference", inference, ("population", "train"))
    N = check_int("N", N, minimum=4)
    M = check_int("M", M, minimum=2)
    n_seeds = check_int("n_seeds", n_seeds, minimum=1)
    lr = M / 4.0 if lr is None else check_positive("lr", lr)
    alphas = [float(a) for a in alphas]
    per_seed = np.zeros((len(alphas), n_seeds))
    gammas = np.zeros((len(alphas), n_seeds))
    for ia, alpha in enumerate(alphas):
        check_positive("alpha", alpha)
        P = int(round(alpha * N))
        if P < M:
            raise ValueError(f"alpha*N = {P} samples is fewer than one batch of M = {M}")
        for s in range(n_seeds):
            rng = np.random.default_rng([seed, ia, s])
            err, gam = _train_linear_student(
                rng, student, N, P, M, noise_var, zeta / alpha, epochs, lr, lr_gamma, inference
            )
            per_seed[ia, s] = err
            gammas[ia, s] = gam
    sem = per_seed.std(axis=1, ddof=1) / math.sqrt(n_seeds) if n_seeds > 1 else np.zeros(len(alphas))
    return {
        "alpha": np.array(alphas),
        "gen_error": per_seed.mean(axis=1),
        "gen_error_sem": sem,
        "per_seed": per_seed,
        "gamma": gammas.mean(axis=1),
        "settings": {
            "student": student, "N": N, "M": M, "noise_var": noise_var, "zeta": zeta, "epochs": epochs,
            "lr": lr, "lr_gamma": lr_gamma, "n_seeds": n_seeds, "inference": inference, "seed": seed,
        },
    }


def _train_linear_student(rng, student, N, P, M, noise_var, zeta_gamma, epochs, lr, lr_gamma, inference):
    # numpy float64 with hand-written gradients: ~5x faster than autograd at these tiny sizes.
    X = rng.standard_normal((P, N)) / math.sqrt(N)
    w_star = rng.standard_normal(N)
    w_star *= math.sqrt(N) / np.linalg.norm(w_star)
    y = X @ w_star + math.sqrt(noise_var) * rng.standard_normal(P)
    n_batches = P // M
    total = max(1, epochs * n_batches)
    sqrtN = math.sqrt(N)
    if student == "sgd":
        w = np.zeros(N)
        gamma = 1.0
    else:
        w = X.T @ y
        w *= sqrtN / np.linalg.norm(w)
        gamma = 0.5
    step = 0
    for _ in range(epochs):
        perm = rng.permutation(P)[: n_batches * M].reshape(n_batches, M)
        for idx in perm:
            xb, yb = X[idx], y[idx]
            sched = 0.5 * (1.0 + math.cos(math.pi * step / total))
            step += 1
            h = xb @ w
            if student == "sgd":
                w -= lr * sched * (2.0 / M) * (xb.T @ (h - yb))
                continue
            if student == "bn":
                c = h - h.mean()
                sd = math.sqrt(float(c @ c) / M)
                hhat = c / sd
                gz = 2.0 * (gamma * hhat - yb) / M  # d mean(e²) / d output
                # BN backward (Santurkar et al., Fact C.1): γ/σ (g − mean g − ĥ mean(g ĥ))
                gh = gamma / sd * (gz - gz.mean() - hhat * float(gz @ hhat) / M)
                g_gamma = float(gz @ hhat)
                gw = xb.T @ gh
            else:  # wn: output √N γ wᵀx/‖w‖, penalty ζ_γ γ² on the averaged loss
                nw = np.linalg.norm(w)
                hhat = sqrtN * h / nw
                gz = 2.0 * (gamma * hhat - yb) / M
                g_gamma = float(gz @ hhat) + 2.0 * zeta_gamma * gamma
                gw = xb.T @ (gamma * sqrtN / nw * gz)
                gw -= float(gw @ w) / float(w @ w) * w  # the −(w̃ᵀx) w/‖w‖² part of Eq. 6
            w -= lr * sched * gw
            w *= sqrtN / np.linalg.norm(w)
            gamma -= lr_gamma * sched * g_gamma
    if student == "sgd":
        w_eff, offset = w, 0.0
    elif student == "bn" and inference == "train":
        h_all = X @ w
        sd = h_all.std()
        w_eff = gamma * w / sd
        offset = gamma * h_all.mean() / sd
    else:
        w_eff, offset = gamma * sqrtN * w / np.linalg.norm(w), 0.0
    return float(np.sum((w_eff - w_star) ** 2) / N + offset**2), float(gamma)
