"""Luo et al.: the order-parameter dynamics (Sec. 3, Eqs. 9-11, Appendix 2) and Table 2's rates.

Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR 2019),
arXiv:1809.00846. Conventions and the ``CORRECTION`` marks: see :mod:`bnlab.theory.luo`, which
re-exports everything here.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import integrate, optimize, special

from bnlab.spec import check_choice

from ._common import check_positive, gauss_hermite


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
    raise ValueError(f"no closed form for activation {activation!r}; closed forms exist for "
                     "'relu', 'linear'")


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
    i1 = (2 * Q * R / ((math.pi + math.pi * Q * Q) * math.sqrt(2 + 2 * Q * Q - Q * Q * R * R))
          - 2 * Q * Q / ((math.pi + math.pi * Q * Q) * math.sqrt(1 + 2 * Q * Q)))
    i2 = 4 / (math.pi * math.sqrt(1 + 2 * Q * Q)) * (
        math.asin(1 / (1 + 3 * Q * Q))
        - math.asin(1 / (math.sqrt(1 + 3 * Q * Q)
                         * math.sqrt(2 * (1 + 2 * Q * Q) - 2 * Q * Q * R * R)))
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
    return (float(np.sum(ww * delta * s)), float(np.sum(ww * delta**2)),
            float(np.sum(ww * delta * t)))


def ode_rhs(gamma: float, R: float, L: float, *, eta: float, zeta: float,
            activation: str = "relu", **kw):
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
    sol = integrate.solve_ivp(f, (0.0, t_max), [gamma0, R0, L0], t_eval=t_eval, rtol=1e-8,
                              atol=1e-10)
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


def fixed_point(zeta: float, activation: str = "relu",
                L0: float = 1.0) -> tuple[float, float, float]:
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
            f"dI{k + 1}_dR": _dR(
                lambda r, k=k: order_parameter_integrals(gamma, r, activation)[k], R)
            for k in range(3)
        }
        hg = 1e-5 * max(1.0, gamma)
        i1_up = order_parameter_integrals(gamma + hg, R, activation)[0]
        i1_down = order_parameter_integrals(gamma - hg, R, activation)[0]
        d["dI1_dgamma"] = (i1_up - i1_down) / (2 * hg)
    d.update({"I1": i1, "I2": i2, "I3": i3})
    return d


def jacobian(gamma: float, R: float, L: float, *, eta: float, zeta: float,
             activation: str = "relu", h: float = 1e-6):
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
    g0, R0, L0 = (fixed_point(zeta_eff, activation, L0) if method == "bn"
                  else (1.0, 1.0, L0 if method == "wn" else 1.0))
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
    st = stability(zeta, eta=eta, L0=L0, activation=activation, method=method,
                   include_i2_term=include_i2_term)
    return float(st["eta_max"]), float(st["eta_eff"])
