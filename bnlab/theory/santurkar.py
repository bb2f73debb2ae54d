"""Santurkar, Tsipras, Ilyas & Madry, "How Does Batch Normalization Help Optimization?" (NeurIPS
2018), Appendix C: Theorem 4.1 (gradient), Theorem 4.2 (curvature) and Lemma 4.5. arXiv:1805.11604.

Setup (one unit j over a batch of m): y ∈ Rᵐ are the pre-BN activations, μ, σ² their batch mean
and biased variance, ŷ = (y − μ)/σ, z = γŷ + β. The BN network's loss is L̂(y) = L(z(y)) where L is
the loss of the identical network without BN evaluated at its layer output (so ĝ := ∇_z L̂ = ∇_y L
and H := ∇²_z L̂ = ∇²_y L at that point, the paper's assumption). BN is written here with torch
ops (the project's own layers are not used), and every quantity is obtained by autograd in float64.

Derivation (checked in the tests). ∂z/∂y = (γ/σ) P with P = I − 11ᵀ/m − ŷŷᵀ/m, the orthogonal
projection onto the complement of span{1, ŷ} (1 ⊥ ŷ, ‖1‖² = ‖ŷ‖² = m). Hence

  Thm 4.1:  ‖∇_y L̂‖² = (γ²/σ²) ĝᵀPĝ = (γ²/σ²) (‖ĝ‖² − ⟨1, ĝ⟩²/m − ⟨ĝ, ŷ⟩²/m)      (equality)

  CORRECTION: the paper prints 1/√m in the last term. Since 1/√m > 1/m for m > 1, the printed
  right-hand side is *smaller* than the true value whenever ⟨ĝ, ŷ⟩ ≠ 0, so the printed "≤" is
  false; the projection gives exactly 1/m (Eq. 8 → 9 of the proof drops ‖ŷ‖² = m under a square).

  Thm 4.2:  with v = ∇_y L̂ (which lies in range P), the second derivative of ŷ along v is
  −ŷ‖v‖²/(mσ²) (σ(t)² = σ² + t²‖v‖²/m because v ⊥ 1, ŷ), so
      vᵀ ∇²_y L̂ v = (γ²/σ²) vᵀHv − (γ/(mσ²)) ⟨ĝ, ŷ⟩ ‖v‖²                                (equality)
  which is the theorem's first statement holding with equality. Its second statement replaces
  vᵀHv by ĝᵀHĝ under the informal assumption that "H preserves the relative norms of ĝ and v";
  :func:`theorem42` reports whether it holds for the layer at hand.

  Lemma 4.5:  for k = ⟨W*, W₀⟩/‖W*‖² > 0, ‖W₀ − kW*‖² = ‖W₀ − W*‖² − ‖W*‖²(1 − k)²  (equality;
  kW* is the projection of W₀ on the ray of optima that scale invariance creates).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from bnlab.spec import check_choice

from ._common import check_int

__all__ = ["LOSSES", "batchnorm_1d", "bn_layer_quantities", "theorem41", "theorem42", "lemma45",
           "theorems_table", "lemma45_random"]


def batchnorm_1d(y: torch.Tensor, gamma: float | torch.Tensor, beta: float | torch.Tensor,
                 eps: float = 0.0):
    """Training-mode BN of one unit over the batch (biased variance), written with torch ops."""
    mu = y.mean()
    var = ((y - mu) ** 2).mean()
    return gamma * (y - mu) / torch.sqrt(var + eps) + beta


def _mse(z, target):
    return 0.5 * ((z - target) ** 2).sum()


def _logistic(z, target):
    # labels ±1 from the sign of the target
    return torch.nn.functional.softplus(-torch.sign(target) * z).sum()


def _quartic(z, target):
    # a non-convex loss with indefinite Hessian: Σ ((z − t)² − 1)² / 4
    return (((z - target) ** 2 - 1.0) ** 2).sum() / 4.0


def _cross_term(z, target):
    # couples the batch entries, so H is not diagonal
    return (0.5 * ((z - target) ** 2).sum() + 0.1 * (z.sum() * (z * target).sum())
            + torch.tanh(z).pow(2).sum())


LOSSES: dict[str, Callable] = {"mse": _mse, "logistic": _logistic, "quartic": _quartic,
                               "coupled": _cross_term}


def bn_layer_quantities(
    y, *, gamma: float = 1.0, beta: float = 0.0, loss: str | Callable = "mse", target=None,
    seed: int = 0
) -> dict:
    """Gradients and Hessians of a BN unit and of the same loss without BN, by autograd (float64).

    ``loss``: a name in :data:`LOSSES` or a callable ``loss(z, target) -> scalar``; ``target``
    defaults to a seeded standard-normal vector. Returns numpy arrays: y_hat, sigma, g_hat (= ∇_z
    L), H (= ∇²_z L), grad_y (= ∇_y L̂), hess_y (= ∇²_y L̂).
    """
    loss_fn = LOSSES[check_choice("loss", loss, LOSSES)] if isinstance(loss, str) else loss
    y = torch.as_tensor(np.asarray(y, dtype=np.float64))
    if y.ndim != 1 or y.numel() < 2:
        raise ValueError("y must be a 1-D batch of at least 2 activations")
    m = y.numel()
    if target is None:
        gen = torch.Generator().manual_seed(seed)
        target = torch.randn(m, generator=gen, dtype=torch.float64)
    target = torch.as_tensor(np.asarray(target, dtype=np.float64))
    z0 = batchnorm_1d(y, gamma, beta).detach()

    def loss_z(z):
        return loss_fn(z, target)

    def loss_y(yy):
        return loss_fn(batchnorm_1d(yy, gamma, beta), target)

    zr = z0.clone().requires_grad_(True)
    g_hat = torch.autograd.grad(loss_z(zr), zr)[0]
    H = torch.autograd.functional.hessian(loss_z, z0)
    yr = y.clone().requires_grad_(True)
    grad_y = torch.autograd.grad(loss_y(yr), yr)[0]
    hess_y = torch.autograd.functional.hessian(loss_y, y)
    sigma = float(torch.sqrt(((y - y.mean()) ** 2).mean()))
    return {
        "m": m,
        "gamma": float(gamma),
        "sigma": sigma,
        "y_hat": ((y - y.mean()) / sigma).numpy(),
        "g_hat": g_hat.numpy(),
        "H": H.numpy(),
        "grad_y": grad_y.numpy(),
        "hess_y": hess_y.numpy(),
    }


def _sample_layer(m: int, seed: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal(m) + rng.standard_normal()


def theorem41(
    y=None, *, m: int = 16, gamma: float = 1.5, beta: float = 0.3, loss: str | Callable = "mse",
    seed: int = 0, target=None, scale: float = 2.0,
) -> dict:
    """Theorem 4.1 on a BN unit: both sides, the corrected right-hand side and the printed one.

    ``lhs`` = ‖∇_y L̂‖² (autograd through BN); ``rhs`` = (γ²/σ²)(‖ĝ‖² − ⟨1,ĝ⟩²/m − ⟨ĝ,ŷ⟩²/m), equal
    to lhs; ``rhs_printed`` uses 1/√m. ``reduction`` = 1 − σ² lhs/(γ² ‖ĝ‖²): the fraction of the
    (rescaled) gradient that BN removes. ``printed_violated`` is True when lhs > rhs_printed. ``y``
    defaults to a seeded batch N(c, scale²) of size ``m``.
    """
    y = (_sample_layer(check_int("m", m, minimum=2), seed, scale) if y is None
         else np.asarray(y, dtype=np.float64))
    q = bn_layer_quantities(y, gamma=gamma, beta=beta, loss=loss, target=target, seed=seed)
    m, s, g, yh = q["m"], q["sigma"], q["g_hat"], q["y_hat"]
    c = gamma**2 / s**2
    lhs = float(q["grad_y"] @ q["grad_y"])
    rhs = c * (g @ g - g.sum() ** 2 / m - (g @ yh) ** 2 / m)
    rhs_printed = c * (g @ g - g.sum() ** 2 / m - (g @ yh) ** 2 / math.sqrt(m))
    return {
        "m": m,
        "sigma": s,
        "gamma": gamma,
        "lhs": lhs,
        "rhs": float(rhs),
        "rhs_printed": float(rhs_printed),
        "slack": float(rhs - lhs),
        "slack_printed": float(rhs_printed - lhs),
        "printed_violated": bool(lhs > rhs_printed * (1 + 1e-12) + 1e-15),
        "mean_term": float(g.sum() ** 2 / m),
        "correlation_term": float((g @ yh) ** 2 / m),
        "no_bn_grad_sq": float(g @ g),
        "reduction": float(1.0 - lhs / (c * (g @ g))),
    }


def theorem42(
    y=None, *, m: int = 16, gamma: float = 1.5, beta: float = 0.3, loss: str | Callable = "quartic",
    seed: int = 0, target=None, scale: float = 2.0,
) -> dict:
    """Theorem 4.2 on a BN unit: the curvature along the gradient, both statements.

    ``lhs`` = vᵀ∇²_y L̂ v with v = ∇_y L̂ (autograd Hessian through BN);
    ``rhs`` = (γ²/σ²) vᵀHv − (γ/(mσ²))⟨ĝ,ŷ⟩‖v‖² (first statement; holds with equality);
    ``rhs_second`` = (γ²/σ²)(ĝᵀHĝ − (1/(mγ))⟨ĝ,ŷ⟩‖v‖²) (second statement, needs the paper's
    "H preserves relative norms" assumption; ``second_holds`` says whether it does here).
    """
    y = (_sample_layer(check_int("m", m, minimum=2), seed, scale) if y is None
         else np.asarray(y, dtype=np.float64))
    q = bn_layer_quantities(y, gamma=gamma, beta=beta, loss=loss, target=target, seed=seed)
    m, s, g, yh, H = q["m"], q["sigma"], q["g_hat"], q["y_hat"], q["H"]
    v = q["grad_y"]
    lhs = float(v @ q["hess_y"] @ v)
    corr = float(g @ yh)
    rhs = gamma**2 / s**2 * float(v @ H @ v) - gamma / (m * s**2) * corr * float(v @ v)
    rhs_second = gamma**2 / s**2 * (float(g @ H @ g) - corr * float(v @ v) / (m * gamma))
    return {
        "m": m,
        "sigma": s,
        "gamma": gamma,
        "lhs": lhs,
        "rhs": float(rhs),
        "rhs_second": float(rhs_second),
        "slack": float(rhs - lhs),
        "slack_second": float(rhs_second - lhs),
        "second_holds": bool(lhs <= rhs_second + 1e-10 * max(1.0, abs(lhs))),
        "curvature_no_bn": float(g @ H @ g),
        "g_dot_yhat": corr,
    }


def lemma45(w0, w_star, *, n_samples: int = 64, seed: int = 0) -> dict:
    """Lemma 4.5: distance from W₀ to the closest BN optimum kW* versus to the optimum W*.

    Returns k, both squared distances, the predicted gap ‖W*‖²(1 − k)², the gap measured, the
    minimum of ‖W₀ − cW*‖² over c > 0 found numerically (it is at c = k), and the loss of a BN
    network (torch BN over a seeded batch, target generated by W*) at W* and at kW* — equal by
    scale invariance, which is what makes kW* an optimum.
    """
    w0 = np.asarray(w0, dtype=np.float64).ravel()
    ws = np.asarray(w_star, dtype=np.float64).ravel()
    if w0.shape != ws.shape:
        raise ValueError(f"w0 and w_star must have the same shape; got {w0.shape} and {ws.shape}")
    k = float(w0 @ ws / (ws @ ws))
    if k <= 0:
        raise ValueError("Lemma 4.5 needs <W0, W*> > 0 (k > 0); the scaled optimum kW* is not on "
                         "the BN ray")
    d_std = float(np.sum((w0 - ws) ** 2))
    d_bn = float(np.sum((w0 - k * ws) ** 2))
    cs = np.linspace(1e-3, 3 * max(k, 1.0), 20001)
    dists = np.sum((w0[None, :] - cs[:, None] * ws[None, :]) ** 2, axis=1)
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n_samples, ws.size, generator=gen, dtype=torch.float64)
    target = batchnorm_1d(X @ torch.as_tensor(ws), 1.0, 0.0)

    def bn_loss(w):
        return float(((batchnorm_1d(X @ torch.as_tensor(w), 1.0, 0.0) - target) ** 2).mean())

    return {
        "k": k,
        "dist_sq_standard": d_std,
        "dist_sq_bn": d_bn,
        "gap": d_std - d_bn,
        "gap_predicted": float(ws @ ws * (1 - k) ** 2),
        "argmin_c": float(cs[np.argmin(dists)]),
        "bn_loss_at_w_star": bn_loss(ws),
        "bn_loss_at_k_w_star": bn_loss(k * ws),
    }


def theorems_table(ms, losses, *, gamma: float = 1.5, seed: int = 0) -> list[dict]:
    """Theorems 4.1 and 4.2 per loss and batch size m: both sides, the printed 1/√m form and whether
    it is violated, BN's reduction, and Theorem 4.2's second bound."""
    rows = []
    for loss in losses:
        for m in ms:
            a = theorem41(m=m, gamma=gamma, loss=loss, seed=seed)
            b = theorem42(m=m, gamma=gamma, loss=loss, seed=seed)
            rows.append({
                "loss": loss, "m": m, "grad_sq": a["lhs"], "thm41_rhs": a["rhs"],
                "thm41_printed": a["rhs_printed"], "printed_violated": a["printed_violated"],
                "bn_reduction": a["reduction"], "curv": b["lhs"], "thm42_rhs": b["rhs"],
                "thm42_second": b["rhs_second"], "second_holds": b["second_holds"],
            })
    return rows


def lemma45_random(dim: int = 10, *, seed: int = 0) -> dict:
    """Lemma 4.5 on random W0, W* of ``dim`` entries, W* flipped so that <W0, W*> > 0."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(dim)
    ws = rng.standard_normal(dim)
    if w0 @ ws <= 0:
        ws = -ws
    return lemma45(w0, ws, seed=seed)
