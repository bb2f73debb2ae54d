"""Peng, Yu & Yu, "Re-Thinking the Effectiveness of Batch Normalization and Beyond" (Complete BN,
CBN), Theorem 1 (Sec. 3 and Appendix A).

Theorem 1 (derived again). Let F be 𝓛-smooth, w_{k+1} = w_k − α_k v_k with any update direction v_k
(plain SGD: the minibatch gradient; momentum/Adam-like: a weighted gradient sum), α_k ≤ 1/𝓛 and
α_{k+1} ≤ α_k. Smoothness gives F(w_{k+1}) ≤ F(w_k) − α_k⟨∇F_k, v_k⟩ + 𝓛α_k²‖v_k‖²/2, and −⟨a, b⟩ ≤
−‖a‖²/2 + ‖b − a‖²/2 turns this into (α_k/2)‖∇F_k‖² ≤ F(w_k) − F(w_{k+1}) + (α_k/2)‖v_k − ∇F_k‖² +
(𝓛α_k²/2)‖v_k‖². Summing k = 0..K−1, F(w_K) ≥ F*, α_k ≥ α_{K−1} and 𝓛α_k ≤ 1: (1/K) Σ_k ‖∇F(w_k)‖²
≤  T₁ + T₂ + T₃, T₁ = 2(F(w_0) − F*)/(α_{K−1} K),  T₂ = Σ_k α_k ‖v_k‖²/(K α_{K−1}),  T₃ = Σ_k α_k
‖v_k − ∇F_k‖²/(K α_{K−1}), and ((1/K) Σ‖∇F_k‖)² is below the left side by Cauchy–Schwarz. The
inequality holds for every trajectory with the realized values (and so in expectation). Keeping 𝓛
instead of using 𝓛α_k ≤ 1 gives the tighter T₂' = 𝓛 Σ_k α_k² ‖v_k‖²/(K α_{K−1}) (``T2_tight``).

CORRECTIONS (to the printed statement and proof): T₂ has E‖∇v_k‖² where E‖v_k‖² is meant; Eq. 16 has
α_{k+1} in front of ⟨∇F, v − ∇F⟩ where α_k is meant and Eq. 17 has E[F(w_k)] on the left where
E[F(w_{k+1})] is meant; the sums run over k = 1..K while the telescoping starts at w_0, so with w_0
in T₁ the consistent range is k = 0..K−1 (used here); "α_k ≤ α_k" should read α_K ≤ α_k.

Recorded runs. :func:`theorem1_terms` takes plain arrays (one entry per recorded step): learning
rates α_k, E‖v_k‖² and E‖v_k − ∇F_k‖². :func:`terms_from_records` reads them from a run's records
under the keys of the ``grad_stats`` probe (``probe/grad_stats/sq_norm``,
``probe/grad_stats/variance``); that probe measures micro-batches of B/k samples, and
``micro_batches=k`` rescales to the training batch B assuming independent samples:
variance_B = variance_m/k and E‖g_B‖² = E‖g_m‖² − variance_m (1 − 1/k) (approximate under BN,
whose samples interact through the batch statistics).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ._common import check_int, check_positive

__all__ = [
    "SQ_NORM_KEY",
    "VARIANCE_KEY",
    "theorem1_terms",
    "terms_from_records",
    "gradient_norm_lhs",
    "estimate_lipschitz",
    "simulate_quadratic_sgd",
    "synthetic_terms",
]

SQ_NORM_KEY = "probe/grad_stats/sq_norm"
VARIANCE_KEY = "probe/grad_stats/variance"


def _as_1d(name: str, x, n: int | None = None) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains non-finite values")
    if n is not None and a.size != n:
        raise ValueError(f"{name} has {a.size} entries, expected {n} (one per recorded step)")
    return a


def theorem1_terms(
    lrs: Sequence[float],
    sq_norms: Sequence[float],
    variances: Sequence[float],
    *,
    initial_loss: float,
    loss_lower_bound: float = 0.0,
    lipschitz: float | None = None,
    n_steps: int | None = None,
) -> dict:
    """T₁, T₂, T₃ of Theorem 1 from per-step statistics given as plain numbers/arrays.

    Parameters: ``lrs`` α_k, ``sq_norms`` E‖v_k‖², ``variances`` E‖v_k − ∇F(w_k)‖² (same length: the
    recorded steps, in order), ``initial_loss`` F(w_0), ``loss_lower_bound`` F* (0 for non-negative
    losses), optional ``lipschitz`` 𝓛 (enables ``T2_tight`` and the α ≤ 1/𝓛 check), ``n_steps`` K
    (defaults to the number of entries; pass the run's step count when the probe ran every few
    steps — the sums are then estimated as K times the mean over recorded steps).

    Returns T1, T2, T3, bound = T1 + T2 + T3, T2_tight and bound_tight (when 𝓛 is given), K, and the
    assumption checks ``lr_nonincreasing`` and ``lr_below_inverse_lipschitz``.
    """
    a = _as_1d("lrs", lrs)
    if np.any(a <= 0):
        raise ValueError("learning rates must be positive")
    sq = _as_1d("sq_norms", sq_norms, a.size)
    var = _as_1d("variances", variances, a.size)
    if np.any(sq < 0) or np.any(var < 0):
        raise ValueError("sq_norms and variances must be non-negative")
    K = a.size if n_steps is None else check_int("n_steps", n_steps, minimum=1)
    gap = float(initial_loss) - float(loss_lower_bound)
    if gap < 0:
        raise ValueError("initial_loss must be >= loss_lower_bound (F(w_0) >= F*)")
    a_last = float(a[-1])
    out = {
        "K": K,
        "T1": 2.0 * gap / (a_last * K),
        "T2": float(np.mean(a * sq)) / a_last,
        "T3": float(np.mean(a * var)) / a_last,
        "lr_nonincreasing": bool(np.all(np.diff(a) <= 1e-15 * a[:-1])),
    }
    out["bound"] = out["T1"] + out["T2"] + out["T3"]
    if lipschitz is not None:
        L = check_positive("lipschitz", lipschitz)
        out["T2_tight"] = L * float(np.mean(a * a * sq)) / a_last
        out["bound_tight"] = out["T1"] + out["T2_tight"] + out["T3"]
        out["lr_below_inverse_lipschitz"] = bool(np.all(a <= 1.0 / L * (1 + 1e-12)))
    return out


def terms_from_records(
    records: Mapping[str, Sequence[float]],
    *,
    lrs: Sequence[float] | float,
    initial_loss: float,
    loss_lower_bound: float = 0.0,
    lipschitz: float | None = None,
    n_steps: int | None = None,
    micro_batches: int | None = None,
    sq_norm_key: str = SQ_NORM_KEY,
    variance_key: str = VARIANCE_KEY,
) -> dict:
    """:func:`theorem1_terms` fed from recorded ``grad_stats`` series (see module docstring).

    ``records`` maps metric names to per-step values (as stored by the probes); ``lrs`` is one value
    per recorded step or a constant. ``micro_batches`` = the probe's k, to convert its micro-batch
    statistics to the training batch size (None: use them as they are).
    """
    for key in (sq_norm_key, variance_key):
        if key not in records:
            raise ValueError(f"records lack {key!r}; available: "
                             f"{', '.join(sorted(records)) or 'none'}")
    sq = _as_1d(sq_norm_key, records[sq_norm_key])
    var = _as_1d(variance_key, records[variance_key], sq.size)
    if micro_batches is not None:
        k = check_int("micro_batches", micro_batches, minimum=1)
        sq = sq - var * (1.0 - 1.0 / k)
        var = var / k
    a = np.full(sq.size, float(lrs)) if np.isscalar(lrs) else _as_1d("lrs", lrs, sq.size)
    return theorem1_terms(
        a, sq, var, initial_loss=initial_loss, loss_lower_bound=loss_lower_bound,
        lipschitz=lipschitz, n_steps=n_steps
    )


def gradient_norm_lhs(full_grad_norms: Sequence[float]) -> dict:
    """Left-hand sides: mean_sq = (1/K)Σ‖∇F_k‖² (what the proof bounds) and ((1/K)Σ‖∇F_k‖)²
    (printed)."""
    g = _as_1d("full_grad_norms", full_grad_norms)
    return {"mean_sq": float(np.mean(g * g)), "mean_squared": float(np.mean(g) ** 2)}


def estimate_lipschitz(params: Sequence, grads: Sequence) -> float:
    """max_k ‖∇F(w_{k+1}) − ∇F(w_k)‖ / ‖w_{k+1} − w_k‖ over consecutive recorded (w_k, ∇F(w_k)).

    A lower bound on 𝓛 along the trajectory (the secant slopes); use full-batch gradients.
    """
    P = [np.asarray(p, dtype=np.float64).ravel() for p in params]
    G = [np.asarray(g, dtype=np.float64).ravel() for g in grads]
    if len(P) != len(G) or len(P) < 2:
        raise ValueError("need at least two (params, grads) pairs of equal count")
    best = 0.0
    for k in range(len(P) - 1):
        dw = np.linalg.norm(P[k + 1] - P[k])
        if dw > 0:
            best = max(best, float(np.linalg.norm(G[k + 1] - G[k]) / dw))
    return best


def simulate_quadratic_sgd(
    *,
    n: int = 256,
    d: int = 20,
    batch_size: int = 8,
    steps: int = 400,
    lr_scale: float = 0.5,
    decay: float = 0.0,
    momentum: float = 0.0,
    noise: float = 0.5,
    seed: int = 0,
) -> dict:
    """A synthetic run with everything known: least squares f_i(w) = ½(a_iᵀw − b_i)², minibatch SGD.

    𝓛 = λ_max(AᵀA/n) (smoothness of F), α_k = lr_scale/(𝓛 (1 + decay·k)) (non-increasing, ≤ 1/𝓛 for
    lr_scale ≤ 1), v_k = momentum·v_{k−1} + minibatch gradient. Records per step the realized
    ‖v_k‖², ‖v_k − ∇F(w_k)‖², ‖∇F(w_k)‖ and, for plain SGD, the exact expectations E‖v_k‖² and
    E‖v_k − ∇F(w_k)‖² over the minibatch draw (sampling without replacement). Returns arrays plus
    F(w_0), F* and 𝓛.
    """
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, d)) / math.sqrt(d)
    b = A @ rng.standard_normal(d) + noise * rng.standard_normal(n)
    L = float(np.linalg.eigvalsh(A.T @ A / n).max())
    w_opt = np.linalg.lstsq(A, b, rcond=None)[0]

    def F(w):
        return 0.5 * float(np.mean((A @ w - b) ** 2))

    w = np.zeros(d)
    v = np.zeros(d)
    out = {k: [] for k in ("lr", "sq_norm", "variance", "grad_norm", "exp_sq_norm", "exp_variance")}
    # finite-population correction for sampling without replacement
    fpc = (n - batch_size) / (n - 1)
    for k in range(check_int("steps", steps, minimum=1)):
        r = A @ w - b
        per_sample = A * r[:, None]  # ∇f_i
        full = per_sample.mean(axis=0)
        idx = rng.choice(n, size=batch_size, replace=False)
        g = per_sample[idx].mean(axis=0)
        v = momentum * v + g
        lr = lr_scale / (L * (1.0 + decay * k))
        tr_cov = float(np.sum((per_sample - full) ** 2) / n) / batch_size * fpc
        out["lr"].append(lr)
        out["sq_norm"].append(float(v @ v))
        out["variance"].append(float((v - full) @ (v - full)))
        out["grad_norm"].append(float(np.linalg.norm(full)))
        out["exp_variance"].append(tr_cov)
        out["exp_sq_norm"].append(float(full @ full) + tr_cov)
        w = w - lr * v
    res = {k: np.asarray(val) for k, val in out.items()}
    res.update({"initial_loss": F(np.zeros(d)), "loss_min": F(w_opt), "lipschitz": L})
    return res


def synthetic_terms(*, seed: int = 0) -> dict:
    """Theorem 1's terms on a synthetic least-squares SGD run (:func:`simulate_quadratic_sgd`), with
    the left-hand side mean ‖∇F‖² of the same run (``lhs_mean_sq_grad``)."""
    run = simulate_quadratic_sgd(seed=seed)
    terms = theorem1_terms(run["lr"], run["sq_norm"], run["variance"],
                           initial_loss=run["initial_loss"], loss_lower_bound=run["loss_min"],
                           lipschitz=run["lipschitz"])
    terms["lhs_mean_sq_grad"] = gradient_norm_lhs(run["grad_norm"])["mean_sq"]
    return terms
