"""Luo et al.: simulators of the students (Sec. 3 online student; Fig. 2 teacher-student).

Luo, Wang, Shao & Peng, "Towards Understanding Regularization in Batch Normalization" (ICLR 2019),
arXiv:1809.00846. Conventions and the ``CORRECTION`` marks: see :mod:`bnlab.theory.luo`, which
re-exports everything here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from bnlab.spec import check_choice

from ._common import check_int, check_positive
from .luo_dynamics import ACTIVATIONS


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
    rng = np.random.default_rng(seed)
    w_star, w = _initial_students(rng, K, N, R0, L0)
    steps = int(round(t_max * N))
    record_steps = np.unique(np.linspace(0, steps, n_records).round().astype(int))
    ts, gs, Rs, Ls = _run_online(rng, w_star, w, np.full(K, float(gamma0)), steps, record_steps,
                                 eta, zeta, ACTIVATIONS[activation])
    G, Rr, Ll = np.array(gs), np.array(Rs), np.array(Ls)
    return {
        "t": np.array(ts), "gamma": G.mean(axis=1), "R": Rr.mean(axis=1), "L": Ll.mean(axis=1),
        "gamma_all": G, "R_all": Rr, "L_all": Ll,
    }


def _initial_students(rng, K: int, N: int, R0: float, L0: float) -> tuple[np.ndarray, np.ndarray]:
    """K teachers w* (‖w*‖² = N) and students w with overlap R0 and length L0 (per √N)."""
    sqrtN = math.sqrt(N)
    w_star = rng.standard_normal((K, N))
    w_star *= sqrtN / np.linalg.norm(w_star, axis=1, keepdims=True)
    u = rng.standard_normal((K, N))
    u -= np.sum(u * w_star, axis=1, keepdims=True) / N * w_star
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return w_star, L0 * sqrtN * (R0 * w_star / sqrtN + math.sqrt(1 - R0**2) * u)


def _run_online(rng, w_star, w, gamma, steps, record_steps, eta, zeta, activation):
    """Eqs. 6-7 (γ step η/N) one fresh sample per step; (t, γ, R, L) at ``record_steps``."""
    g, gp = activation
    K, N = w.shape
    sqrtN = math.sqrt(N)
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
    return ts, gs, Rs, Ls


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
    """Fig. 2's simulation: a linear student trained by minibatch SGD on P = αN noisy teacher
    samples.

    Students (``student``):
      * "bn":  y = γ (wᵀx − μ_B)/σ_B (β frozen at 0), batch statistics of each minibatch of M.
      * "wn":  y = √N γ wᵀx/‖w‖ with the penalty (ζ/α)·γ² on the averaged loss, i.e. Krogh–Hertz
        ridge parameter ``zeta`` (a check of the simulator against :func:`gen_error_wn`).
      * "sgd": y = wᵀx from w = 0 (approaches the pseudo-inverse, Eq. 14). Training: ``epochs``
        passes over the data in random minibatches of M, SGD with a cosine schedule from ``lr`` (on
        w; default M/4, which gives the same progress per epoch for every M — including full batch,
        M = P — and is stable for M ≪ N) and ``lr_gamma`` (on γ). ``preset`` (see
        :data:`TEACHER_STUDENT_PRESETS`) overrides N, M, epochs and n_seeds. The BN/WN output is
        invariant to ‖w‖, so w is rescaled to ‖w‖ = √N after each step: the function is unchanged
        and the effective learning rate stays ``lr`` instead of decaying as ‖w‖ grows (Arora et al.,
        Thm 2.5). w starts at Xᵀy, the direction plain SGD from zero takes first, so that no random
        null-space component is left over at α < 1 (the theory's students start from zero).

    Generalization error (excess test error, exact for x ~ N(0, I/N)): with ``inference`` =
    "population" the BN student is evaluated with the population statistics of the input
    distribution, μ_P = 0, σ_P = ‖w‖/√N (Luo's h̄, Eq. 3/5); with "train" it uses the mean and
    standard deviation of wᵀx over the training set (what BN's running averages estimate).
    Returns plain arrays: alpha, gen_error (mean over seeds), gen_error_sem, per_seed, gamma.
    """
    check_choice("student", student, ("bn", "wn", "sgd"))
    check_choice("inference", inference, ("population", "train"))
    N, M, epochs, n_seeds, lr = _teacher_student_sizes(preset, N, M, epochs, n_seeds, lr)
    alphas = [float(a) for a in alphas]
    per_seed, gammas = np.zeros((len(alphas), n_seeds)), np.zeros((len(alphas), n_seeds))
    for ia, alpha in enumerate(alphas):
        P = _samples(alpha, N, M)
        for s in range(n_seeds):
            per_seed[ia, s], gammas[ia, s] = _train_linear_student(
                np.random.default_rng([seed, ia, s]), student, N, P, M, noise_var, zeta / alpha,
                epochs, lr, lr_gamma, inference)
    settings = {"student": student, "N": N, "M": M, "noise_var": noise_var, "zeta": zeta,
                "epochs": epochs, "lr": lr, "lr_gamma": lr_gamma, "n_seeds": n_seeds,
                "inference": inference, "seed": seed}
    sem = (per_seed.std(axis=1, ddof=1) / math.sqrt(n_seeds) if n_seeds > 1
           else np.zeros(len(alphas)))
    return {"alpha": np.array(alphas), "gen_error": per_seed.mean(axis=1), "gen_error_sem": sem,
            "per_seed": per_seed, "gamma": gammas.mean(axis=1), "settings": settings}


def _teacher_student_sizes(preset, N, M, epochs, n_seeds, lr) -> tuple[int, int, int, int, float]:
    """N, M, epochs, n_seeds (from ``preset`` when given) checked, and lr (default M/4)."""
    if preset is not None:
        check_choice("preset", preset, TEACHER_STUDENT_PRESETS)
        p = TEACHER_STUDENT_PRESETS[preset]
        N, M, epochs, n_seeds = p["N"], p["M"], p["epochs"], p["n_seeds"]
    N = check_int("N", N, minimum=4)
    M = check_int("M", M, minimum=2)
    n_seeds = check_int("n_seeds", n_seeds, minimum=1)
    return N, M, epochs, n_seeds, M / 4.0 if lr is None else check_positive("lr", lr)


def _samples(alpha: float, N: int, M: int) -> int:
    """P = αN training samples, at least one batch of M."""
    check_positive("alpha", alpha)
    P = int(round(alpha * N))
    if P < M:
        raise ValueError(f"alpha*N = {P} samples is fewer than one batch of M = {M}")
    return P


def _train_linear_student(rng, student, N, P, M, noise_var, zeta_gamma, epochs, lr, lr_gamma,
                          inference):
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
