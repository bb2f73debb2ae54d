"""Luo et al.: the generalization error against the load α = P/N (Sec. 4.1, Eqs. 14-16).

Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR 2019),
arXiv:1809.00846. Conventions and the ``CORRECTION`` marks: see :mod:`bnlab.theory.luo`, which
re-exports everything here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import optimize

from ._common import check_int, check_positive


# ---------------------------------------------------------------------------------------------
# Generalization error (Sec. 4.1, Eqs. 14-16)
# ---------------------------------------------------------------------------------------------


def gen_error_sgd(alpha, noise_var: float):
    """Eq. 14 corrected: excess test error of the minimum-norm least-squares (pseudo-inverse)
    student.

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
    analytically:  ε_gen = [(σ² − ζ)(S' − 1) + 1 − α − ζ + S] / 2. ``zeta`` is the ridge parameter
    of the summed loss (see module docstring); ζ = 0 falls back to :func:`gen_error_sgd`. The
    minimum over ζ is at ζ = σ² for every α: dε/dζ = (σ² − ζ)(2G' + ζG'').
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
    return {"mean": float(errs.mean()),
            "sem": float(errs.std(ddof=1) / math.sqrt(errs.size)) if errs.size > 1 else 0.0}


def fit_zeta(alphas: Sequence[float], gen_errors: Sequence[float], noise_var: float) -> float:
    """Least-squares fit (in log error) of the Krogh–Hertz ζ to measured points (Fig. 2's "best
    fitter")."""
    a = np.asarray(alphas, dtype=np.float64)
    e = np.asarray(gen_errors, dtype=np.float64)

    def loss(lz: float) -> float:
        return float(np.sum((np.log(gen_error_wn(a, math.exp(lz), noise_var)) - np.log(e)) ** 2))

    res = optimize.minimize_scalar(loss, bounds=(-12, 3), method="bounded", options={"xatol": 1e-8})
    return float(math.exp(res.x))
