"""Arora, Li & Lyu, "Theoretical Analysis of Auto Rate-Tuning by Batch Normalization" (ICLR 2019),
arXiv:1812.03981.

* Theorem 2.5: plain (S)GD on a scale-invariant weight w equals an adaptive projected method on
  v = w/‖w‖: v_{t+1} = Π(v_t − (η/G_t)∇_v F), G_{t+1} = G_t + (η²/G_t)‖∇_v F‖², G_0 = ‖w_0‖².
  :func:`run_intrinsic_pair` runs both on the same minibatch sequence; :func:`intrinsic_equivalence`
  returns the largest deviation between the trajectories. The effective learning rate η/G_t
  decays automatically (Lemma 2.4: ‖w_t‖² only grows).
* Theorem 3.1: with η_g tuned, full-batch GD reaches min_{t<T} ‖∇L(V_t; g_t)‖ = Õ(T^{-1/2}) for
  *any* η_w. :func:`convergence_rate` measures min_t ‖∇L‖ and √(Σ_t‖∇L‖²/T) against T for several
  η_w, fits their log–log slopes, and runs "Setting 2" (w projected back to the unit sphere each
  step, so the effective rate stays η_w) for contrast.

The test problem is a small fully-batch-normalised network in float64: h = BN(X W) with every
column of W scale-invariant, out = softplus(γ ⊙ h + β) · a, squared loss; g = (γ, β, a) are the
scale-variant parameters (smooth activation, as the theorems require).

CORRECTION: Sec. 2.4 says the smoothing ε of BN should be replaced by ε‖w‖₂ to keep w scale
invariant. σ² = wᵀSw scales as c², so the term must be ε‖w‖₂² (which is what Eq. 8's norm
‖w‖_{S+εI} = √(wᵀ(S+εI)w) actually contains); ε‖w‖₂ breaks the invariance. ``eps_mode`` selects
"scaled" (ε‖w‖², invariant), "linear" (the printed ε‖w‖) or "constant" (PyTorch's ε); the tests
show that only "scaled" keeps Lemma 2.4 and Theorem 2.5 exact. Other slips: Theorem 3.1 states
η_g = 2(1 − c_g)/L^gg while the text before it assumes (1 − c_g)/L^gg, and the constant C_i of
Lemma 3.2 has L_i^{vg²} where its proof uses 2L_i^{vg²}; neither changes the rate.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from bnlab.spec import check_choice

from ._common import check_int, check_positive, loglog_slope

__all__ = ["ScaleInvariantNet", "run_intrinsic_pair", "intrinsic_equivalence", "convergence_rate",
           "convergence_rates", "convergence_table", "sgd_convergence_rate"]


def _softplus(u: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, u)


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * u))


class ScaleInvariantNet:
    """h = BN(XW) (columns of W scale-invariant), out = softplus(γ⊙h + β)·a, loss = mean (out − y)².

    Data: X ~ N(0, 1) (n × d); y from a random teacher of the same form plus noise, so the loss
    has a non-trivial landscape. Forward and backward are written by hand in numpy float64
    (autograd is ~50× slower at this size); :meth:`torch_loss` is the same loss in torch, used by
    the tests to check the hand-written gradient.
    """

    def __init__(
        self, *, n: int = 64, d: int = 8, width: int = 4, eps: float = 1e-6,
        eps_mode: str = "scaled", seed: int = 0
    ) -> None:
        self.eps = float(eps)
        self.eps_mode = check_choice("eps_mode", eps_mode, ("scaled", "linear", "constant"))
        rng = np.random.default_rng(seed)
        self.n, self.d = check_int("n", n, minimum=4), check_int("d", d, minimum=1)
        self.width = width
        self.X = rng.standard_normal((n, d))
        W_t = rng.standard_normal((d, width))
        g_t = (np.ones(width), np.zeros(width), rng.standard_normal(width))
        self.y = self._forward(W_t, g_t, self.X)[0] + 0.1 * rng.standard_normal(n)
        self.W0 = rng.standard_normal((d, width))
        self.g0 = (np.ones(width), np.zeros(width), 0.5 * rng.standard_normal(width))

    def _smoothing(self, norm2: np.ndarray) -> np.ndarray:
        if self.eps_mode == "scaled":
            return self.eps * norm2
        if self.eps_mode == "linear":
            return self.eps * np.sqrt(norm2)
        return np.full_like(norm2, self.eps)

    def _forward(self, W, g, X):
        gamma, beta, a = g
        z = X @ W
        c = z - z.mean(axis=0)
        norm2 = np.sum(W * W, axis=0)
        s = np.sqrt(np.mean(c * c, axis=0) + self._smoothing(norm2))
        h = c / s
        u = gamma * h + beta
        p = _softplus(u)
        return p @ a, (c, s, h, u, p, norm2)

    def loss(self, W, g, idx=None) -> float:
        X, y = (self.X, self.y) if idx is None else (self.X[idx], self.y[idx])
        out, _ = self._forward(W, g, X)
        return float(np.mean((out - y) ** 2))

    def grads(self, W, g, idx=None):
        """(∇_W F, (∇_γ F, ∇_β F, ∇_a F)) of the minibatch loss, by hand-written backprop."""
        X, y = (self.X, self.y) if idx is None else (self.X[idx], self.y[idx])
        gamma, beta, a = g
        out, (c, s, h, u, p, norm2) = self._forward(W, g, X)
        m = X.shape[0]
        dout = 2.0 * (out - y) / m
        da = p.T @ dout
        du = dout[:, None] * a[None, :] * _sigmoid(u)
        dgamma = np.sum(du * h, axis=0)
        dbeta = np.sum(du, axis=0)
        dh = du * gamma
        # h = c/s, s² = mean(c²) + smoothing(‖w‖²)
        ds = -np.sum(dh * c, axis=0) / s**2
        dvar = ds / (2.0 * s)  # also the derivative w.r.t. the smoothing term
        dc = dh / s + dvar * 2.0 * c / m
        dz = dc - dc.mean(axis=0)
        dW = X.T @ dz
        if self.eps_mode == "scaled":
            dW += dvar * self.eps * 2.0 * W
        elif self.eps_mode == "linear":
            dW += dvar * self.eps * W / np.sqrt(norm2)
        return dW, (dgamma, dbeta, da)

    def torch_loss(self, W, g, idx=None):
        """The same loss with torch ops (W, g torch tensors), for checking :meth:`grads`."""
        X = torch.as_tensor(self.X if idx is None else self.X[idx])
        y = torch.as_tensor(self.y if idx is None else self.y[idx])
        gamma, beta, a = g
        z = X @ W
        c = z - z.mean(dim=0)
        norm2 = (W * W).sum(dim=0)
        smoothings = {"scaled": self.eps * norm2, "linear": self.eps * torch.sqrt(norm2),
                      "constant": self.eps}
        smooth = smoothings[self.eps_mode]
        h = c / torch.sqrt((c * c).mean(dim=0) + smooth)
        out = torch.nn.functional.softplus(gamma * h + beta) @ a
        return ((out - y) ** 2).mean()


def run_intrinsic_pair(
    *,
    steps: int = 300,
    lr_w: float = 0.5,
    lr_g: float = 0.05,
    batch_size: int = 16,
    n: int = 64,
    d: int = 8,
    width: int = 4,
    init_scale: float = 1.0,
    eps: float = 1e-6,
    eps_mode: str = "scaled",
    seed: int = 0,
) -> dict:
    """Run SGD on (W, g) and the intrinsic adaptive update of Theorem 2.5 on (V, G, g) side by side.

    Both see the same minibatch sequence (seeded). Returns per-step arrays: dev_v (max over
    columns of ‖v_t − w_t/‖w_t‖‖), dev_G (max relative |G_t − ‖w_t‖²|/G_t), dev_g (‖g_t − g'_t‖),
    G (per column, from the intrinsic run), eff_lr = η/G_t, the norm growth predicted by Lemma 2.4
    (‖w_{t+1}‖² − ‖w_t‖² − η²‖∇_w F‖², which must be 0) and the loss.
    """
    check_positive("lr_w", lr_w)
    check_positive("lr_g", lr_g, strict=False)
    net = ScaleInvariantNet(n=n, d=d, width=width, eps=eps, eps_mode=eps_mode, seed=seed)
    rng = np.random.default_rng(seed + 1)
    W = net.W0 * init_scale
    g1 = tuple(p.copy() for p in net.g0)
    V = W / np.linalg.norm(W, axis=0)
    G = np.sum(W * W, axis=0)
    g2 = tuple(p.copy() for p in net.g0)
    rec = {k: [] for k in ("dev_v", "dev_G", "dev_g", "G", "eff_lr", "lemma24_residual", "loss")}
    for _ in range(check_int("steps", steps, minimum=1)):
        idx = rng.choice(n, size=batch_size, replace=False) if batch_size < n else None
        gW, gg1 = net.grads(W, g1, idx)
        gV, gg2 = net.grads(V, g2, idx)
        norm2_before = np.sum(W * W, axis=0)
        W = W - lr_w * gW
        g1 = tuple(p - lr_g * dp for p, dp in zip(g1, gg1))
        step = V - (lr_w / G) * gV
        V = step / np.linalg.norm(step, axis=0)
        G = G + lr_w**2 / G * np.sum(gV * gV, axis=0)
        g2 = tuple(p - lr_g * dp for p, dp in zip(g2, gg2))
        norm2 = np.sum(W * W, axis=0)
        rec["lemma24_residual"].append(
            float(np.max(np.abs(norm2 - norm2_before - lr_w**2 * np.sum(gW * gW, axis=0)) / norm2))
        )
        rec["dev_v"].append(float(np.max(np.linalg.norm(V - W / np.sqrt(norm2), axis=0))))
        rec["dev_G"].append(float(np.max(np.abs(G - norm2) / G)))
        rec["dev_g"].append(float(math.sqrt(sum(float(np.sum((a - b) ** 2))
                                                for a, b in zip(g1, g2)))))
        rec["G"].append(G.copy())
        rec["eff_lr"].append(lr_w / G)
        rec["loss"].append(net.loss(W, g1))
    return {k: np.asarray(v) for k, v in rec.items()}


def intrinsic_equivalence(**kwargs) -> float:
    """Largest deviation between SGD on w and the adaptive update on v of Theorem 2.5.

    max over steps of max(dev_v, dev_G, dev_g) from :func:`run_intrinsic_pair` (keyword arguments
    are passed on). ~1e-13 in float64 with the scale-invariant smoothing; it grows with
    ``eps_mode="constant"``, where w is no longer scale invariant.
    """
    r = run_intrinsic_pair(**kwargs)
    return float(max(r["dev_v"].max(), r["dev_G"].max(), r["dev_g"].max()))


def convergence_rate(
    lr_ws: Sequence[float] = (0.01, 0.1, 1.0, 10.0, 100.0),
    *,
    steps: int = 2000,
    lr_g: float = 0.05,
    n: int = 64,
    d: int = 8,
    width: int = 4,
    projected: bool = False,
    seed: int = 0,
) -> dict:
    """Theorem 3.1 measured: full-batch GD for several η_w, ‖∇L(V_t; g_t)‖ against T.

    For each η_w returns, on a log grid of T: ``min_grad`` = min_{t<T} ‖∇L‖ (the theorem's
    quantity) and ``rms_grad`` = √(Σ_{t<T}‖∇L‖²/T). The proof bounds Σ_t ‖∇_v L‖² by a constant
    depending on η_w (the weight norms G_t stay bounded), so rms_grad ends up on a T^{-1/2} line —
    slope ``rms_slope`` ≈ −1/2 over the last decade — and min_grad ≤ rms_grad. ``G_final`` shows the
    norms settle. ``projected=True`` is the paper's Setting 2: w is renormalised to ‖w‖ = 1 after
    every step, which removes the auto-tuning (effective rate fixed at η_w).
    """
    net = ScaleInvariantNet(n=n, d=d, width=width, seed=seed)
    steps = check_int("steps", steps, minimum=10)
    T_grid = np.unique(np.round(np.logspace(0, math.log10(steps), 25)).astype(int))
    out = {"T": T_grid, "lr_w": np.asarray(lr_ws, dtype=np.float64), "projected": projected}
    mins, rmss, slopes_min, slopes_rms, G_final, grad_sq_sum = [], [], [], [], [], []
    for lr_w in lr_ws:
        check_positive("lr_w", lr_w)
        W = net.W0 / np.linalg.norm(net.W0, axis=0)
        g = tuple(p.copy() for p in net.g0)
        norms = np.empty(steps)
        for t in range(steps):
            gW, gg = net.grads(W, g)
            # Lemma 2.2: ∇_v F = ‖w‖ ∇_w F column by column, so no second backward pass is needed.
            gV = gW * np.linalg.norm(W, axis=0)
            norms[t] = math.sqrt(float(np.sum(gV * gV)) + sum(float(np.sum(p * p)) for p in gg))
            W = W - lr_w * gW
            if projected:
                W = W / np.linalg.norm(W, axis=0)
            g = tuple(p - lr_g * dp for p, dp in zip(g, gg))
            if not np.isfinite(norms[t]):
                norms[t:] = np.nan
                break
        run_min = np.fmin.accumulate(norms)
        run_rms = np.sqrt(np.cumsum(norms**2) / np.arange(1, steps + 1))
        mins.append(run_min[T_grid - 1])
        rmss.append(run_rms[T_grid - 1])
        tail = T_grid >= max(2, steps // 10)
        slopes_min.append(loglog_slope(T_grid[tail], run_min[T_grid[tail] - 1]))
        slopes_rms.append(loglog_slope(T_grid[tail], run_rms[T_grid[tail] - 1]))
        G_final.append(float(np.max(np.sum(W * W, axis=0))))
        grad_sq_sum.append(float(np.nansum(norms**2)))
    out.update(
        min_grad=np.asarray(mins), rms_grad=np.asarray(rmss), min_slope=np.asarray(slopes_min),
        rms_slope=np.asarray(slopes_rms), G_final=np.asarray(G_final),
        grad_sq_sum=np.asarray(grad_sq_sum),
    )
    return out


def convergence_rates(lrs: Sequence[float], *, steps: int = 2000, lr_g: float = 0.05,
                      seed: int = 0) -> dict:
    """Theorem 3.1 in both settings: ``auto`` (plain GD, norms grow, the rate tunes itself) and
    ``projected`` (Setting 2, ‖w‖ = 1), each :func:`convergence_rate` over the rates ``lrs``."""
    return {"auto": convergence_rate(lrs, steps=steps, lr_g=lr_g, seed=seed),
            "projected": convergence_rate(lrs, steps=steps, lr_g=lr_g, seed=seed, projected=True)}


def convergence_table(rates: dict, lrs: Sequence[float]) -> list[dict]:
    """One row per setting and η_w of :func:`convergence_rates`: min and rms ‖∇L‖ at the last T,
    their log-log slopes against T (Theorem 3.1: −1/2) and the final ‖w‖²."""
    rows = []
    for mode in ("auto", "projected"):
        r = rates[mode]
        for i, lr in enumerate(lrs):
            rows.append({"setting": mode, "lr_w": lr, "min_grad_T": float(r["min_grad"][i][-1]),
                         "rms_grad_T": float(r["rms_grad"][i][-1]),
                         "rms_slope": float(r["rms_slope"][i]),
                         "min_slope": float(r["min_slope"][i]),
                         "max_norm_sq": float(r["G_final"][i])})
    return rows


def sgd_convergence_rate(
    lr_ws: Sequence[float] = (0.01, 0.1, 1.0, 10.0, 100.0),
    *,
    steps: int = 2000,
    lr_g: float = 0.05,
    batches: int = 4,
    alpha: float = 0.0,
    seed: int = 0,
) -> dict:
    """Theorem 4.2 measured: SGD with η_w,t = η_w (t+1)^−α and η_g,t = η_g (t+1)^−1/2 for several
    η_w.

    The data of :class:`ScaleInvariantNet` are split into ``batches`` fixed minibatches, each
    normalised with its own statistics (BN's train mode); L is their mean, so ∇L (the theorem's
    quantity) is the mean of the minibatch gradients, exactly. Each step draws one minibatch
    uniformly (``seed``). Returns on a log grid of T the running mean (1/T) Σ_{t<T} ‖∇L(V_t; g_t)‖²
    (``mean_sq``; Eq. 13 bounds the min, and the proof the η-weighted mean, by Õ(log T/√T)), its
    log-log slope over the last decade (``slope_sq``; the bound's own slope there is
    ``bound_slope_sq`` = slope of log T/√T) and the final max ‖w‖².
    """
    net = ScaleInvariantNet(n=64, d=8, width=4, seed=seed)
    steps = check_int("steps", steps, minimum=10)
    parts = np.array_split(np.arange(net.n), check_int("batches", batches, minimum=1))
    rng = np.random.default_rng(seed + 1)
    T_grid = np.unique(np.round(np.logspace(0, math.log10(steps), 25)).astype(int))
    tail = T_grid >= max(2, steps // 10)
    bound = np.log(T_grid[tail] + 1.0) / np.sqrt(T_grid[tail])
    out = {"T": T_grid, "lr_w": np.asarray(lr_ws, dtype=np.float64), "alpha": alpha,
           "bound_slope_sq": loglog_slope(T_grid[tail], bound)}
    curves, slopes, norms_final = [], [], []
    for lr_w in lr_ws:
        check_positive("lr_w", lr_w)
        W, g = net.W0.copy(), tuple(p.copy() for p in net.g0)
        sq = np.full(steps, np.nan)
        for t in range(steps):
            per = [net.grads(W, g, idx) for idx in parts]
            gW = sum(p[0] for p in per) / len(per)
            gg = [sum(p[1][i] for p in per) / len(per) for i in range(3)]
            # Lemma 2.2: ∇_v L = ‖w‖ ∇_w L column by column
            sq[t] = (float(np.sum((gW * np.linalg.norm(W, axis=0)) ** 2))
                     + sum(float(np.sum(p * p)) for p in gg))
            if not np.isfinite(sq[t]):
                break
            bW, bg = per[int(rng.integers(len(parts)))]
            W = W - lr_w * (t + 1) ** -alpha * bW
            g = tuple(p - lr_g * (t + 1) ** -0.5 * dp for p, dp in zip(g, bg))
        mean_sq = np.cumsum(sq) / np.arange(1, steps + 1)
        curves.append(mean_sq[T_grid - 1])
        slopes.append(loglog_slope(T_grid[tail], mean_sq[T_grid[tail] - 1])
                      if np.isfinite(mean_sq[-1]) else np.nan)
        norms_final.append(float(np.max(np.sum(W * W, axis=0))))
    out.update(mean_sq=np.asarray(curves), slope_sq=np.asarray(slopes),
               max_norm_sq=np.asarray(norms_final))
    return out
