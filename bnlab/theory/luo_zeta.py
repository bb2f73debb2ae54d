"""Luo et al.'s regularization strength ζ estimated from data: the one estimator (numpy only).

Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR 2019),
arXiv:1809.00846, Theorem 1 (Eq. 4). Used by :func:`bnlab.theory.luo.zeta_relu_estimate` and by the
``bn_regularization`` probe (bnlab.probes), so it needs neither scipy nor matplotlib: the probes
import with torch and numpy alone.

With z = (h − μ_P)/σ_P (population statistics of the P values of one unit), h̄ = γ z + β and M the
batch size:

    ρ = E z⁴ − 3                      (excess kurtosis; the paper's ρ = (C − σ⁴)/σ⁴ − 2)
    F_γ = (1/P) Σ A''(h̄) z²           (the Fisher information of γ, Appendix 1)
    sigma_term = (ρ + 2) F_γ / (8M)    (σ_B noise)
    mu_term = (1/P) Σ A''(h̄) / (2M)   (μ_B noise)
    ζ = sigma_term + mu_term           (the implied penalty is ζγ²)

(Eq. 2 prints Var σ_B = (ρ+2)/(4M); it is σ_P²(ρ+2)/(4M), which is what makes E(σ_P/σ_B − 1)² =
(ρ+2)/(4M) in the proof — ζ is unaffected.)
"""

from __future__ import annotations

import numpy as np

#: A'' of the partition function standing in for each activation (``relu``: the softplus one).
ACTIVATIONS = ("relu", "linear", "tanh", "sigmoid")
#: The keys of :func:`zeta_terms` (also the ``bn_regularization`` probe's metric names).
ZETA_KEYS = ("kurtosis", "fisher", "sigma_term", "mu_term", "zeta")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))  # 1/(1 + e^-x) without overflow


def second_derivative(activation: str, h: np.ndarray) -> np.ndarray:
    """A''(h): ``relu`` → sigmoid (softplus' second derivative, the paper's smooth ReLU), ``linear``
    → 1, ``tanh`` → 1 − tanh², ``sigmoid`` → σ(1 − σ)."""
    if activation == "relu":
        return _sigmoid(h)
    if activation == "linear":
        return np.ones_like(h)
    if activation == "tanh":
        return 1.0 - np.tanh(h) ** 2
    if activation == "sigmoid":
        s = _sigmoid(h)
        return s * (1.0 - s)
    raise ValueError(f"unknown activation {activation!r}; valid activations: "
                     f"{', '.join(ACTIVATIONS)}")


def zeta_terms(h, batch_size: int, gamma=1.0, beta=0.0,
               activation: str = "relu") -> dict[str, np.ndarray]:
    """Theorem 1's terms per unit from pre-BN values ``h`` of shape (P,) or (C, P) (float64).

    ``gamma``/``beta`` are scalars or one per unit. Returns :data:`ZETA_KEYS` as arrays of shape
    () or (C,). A unit with zero variance gives non-finite terms (ζ is undefined there).
    """
    if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
            or batch_size < 2):
        raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}")
    h = np.asarray(h, dtype=np.float64)
    if h.ndim not in (1, 2):
        raise ValueError(f"h must have shape (P,) or (C, P), got {h.shape}")
    gamma = np.asarray(gamma, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    if h.ndim == 2:
        gamma, beta = gamma.reshape(-1, 1), beta.reshape(-1, 1)
    mean = h.mean(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (h - mean) / h.std(axis=-1, keepdims=True)
    kurtosis = np.mean(z**4, axis=-1) - 3.0
    a2 = second_derivative(activation, gamma * z + beta)
    fisher = np.mean(a2 * z * z, axis=-1)
    sigma_term = (kurtosis + 2.0) * fisher / (8.0 * batch_size)
    mu_term = np.mean(a2, axis=-1) / (2.0 * batch_size)
    return {"kurtosis": kurtosis, "fisher": fisher, "sigma_term": sigma_term, "mu_term": mu_term,
            "zeta": sigma_term + mu_term}
