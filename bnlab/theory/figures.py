"""The figures ``bnlab theory NAME --plot PATH`` draws (matplotlib, Agg backend), from the results
of the theory modules' functions. matplotlib is imported on first use: the theory modules import
without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import luo, mbn


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def luo_zeta(path: Path, ms, rows: list[dict]) -> Path:
    """ζ(M): Eq. 13 exact, λ/2M and the Monte Carlo of :func:`bnlab.theory.luo.zeta_table`."""
    fig, ax = _pyplot().subplots(figsize=(5, 3.5))
    ax.loglog(ms, [r["zeta_exact"] for r in rows], "o-", label="Eq. 13 exact")
    ax.loglog(ms, [r["zeta_large_M"] for r in rows], "--", label="λ/2M")
    ax.loglog(ms, [r["zeta_mc"] for r in rows], "x", label="Monte Carlo")
    ax.set_xlabel("batch size M")
    ax.set_ylabel("ζ")
    ax.legend()
    return _save(fig, path)


def luo_gen_error(path: Path, alphas, zetas, noise_var: float) -> Path:
    """ε_gen(α) of SGD (Eq. 14) and of WN for each ζ (Eqs. 15-16) on a fine grid."""
    grid = np.linspace(0.02, max(list(alphas) + [3.0]), 400)
    fig, ax = _pyplot().subplots(figsize=(5.5, 4))
    ax.plot(grid, np.minimum(luo.gen_error_sgd(grid, noise_var), 5), label="SGD (Eq. 14)")
    for z in zetas:
        ax.plot(grid, luo.gen_error_wn(grid, z, noise_var), label=f"WN ζ={z:g}")
    ax.set_ylim(0, 2.5)
    ax.set_xlabel("α = P/N")
    ax.set_ylabel("ε_gen")
    ax.legend()
    return _save(fig, path)


def luo_teacher_student(path: Path, alphas, res: dict, noise_var: float, student: str) -> Path:
    """Fig. 2: the simulated student (:func:`bnlab.theory.luo.teacher_student_vs_theory`) on the
    curves."""
    grid = np.linspace(0.05, max(alphas) * 1.05, 300)
    fig, ax = _pyplot().subplots(figsize=(5.5, 4))
    ax.plot(grid, np.minimum(luo.gen_error_sgd(grid, noise_var), 5), label="SGD")
    ax.plot(grid, luo.gen_error_wn(grid, luo.zeta_linear(res["settings"]["M"]), noise_var),
            label="WN ζ (Eq. 13)")
    ax.plot(grid, luo.gen_error_wn(grid, noise_var, noise_var), ":", label="WN ζ = σ² (optimal)")
    ax.errorbar(alphas, res["gen_error"], yerr=res["gen_error_sem"], fmt="ks",
                label=f"{student} simulation")
    ax.set_ylim(0, 2.5)
    ax.set_xlabel("α = P/N")
    ax.set_ylabel("ε_gen")
    ax.legend()
    return _save(fig, path)


def luo_dynamics(path: Path, fine: dict, sim: dict | None, simulate: int) -> Path:
    """γ, R, L from the ODE (``fine``: a dense :func:`bnlab.theory.luo.integrate_order_parameters`)
    and the simulated students (``sim``) if any."""
    fig, ax = _pyplot().subplots(figsize=(5.5, 4))
    for key in ("gamma", "R", "L"):
        (line,) = ax.plot(fine["t"], fine[key], label=f"{key} (ODE)")
        if sim is not None:
            ax.plot(sim["t"], sim[key], "o", ms=4, color=line.get_color(),
                    label=f"{key} (N={simulate})")
    ax.set_xlabel("t = j/N")
    ax.legend()
    return _save(fig, path)


def mbn_theorem1(path: Path, ms, n_batches: int, kurtosis: float | None, seed: int) -> Path:
    """Histograms of ξ_σ (same draws as :func:`bnlab.theory.mbn.theorem1_report`) against
    χ²(m−1)/m."""
    from scipy import stats

    fig, axes = _pyplot().subplots(1, len(ms), figsize=(3 * len(ms), 3), squeeze=False)
    for ax, m in zip(axes[0], ms):
        _, xs = mbn.simulate_batch_noise(m, n_batches, kurtosis=kurtosis, seed=seed + m)
        ax.hist(xs, bins=80, density=True, alpha=0.6)
        grid = np.linspace(max(1e-4, xs.min()), xs.max(), 300)
        ax.plot(grid, stats.chi2(m - 1, scale=1 / m).pdf(grid), label="χ²(m−1)/m")
        ax.set_title(f"ξ_σ, m={m}")
    axes[0][0].legend()
    return _save(fig, path)


def mbn_momentum(path: Path, ms, lams, res: dict) -> Path:
    """Variance of the moving mean against m per momentum λ: simulation and theory."""
    fig, ax = _pyplot().subplots(figsize=(5, 3.5))
    for i, lam in enumerate(lams):
        ax.loglog(ms, res["var_mu"][i], "o", label=f"λ={lam:g} sim")
        ax.loglog(ms, res["var_mu_theory"][i], "-", color=ax.lines[-1].get_color())
    ax.set_xlabel("batch size m")
    ax.set_ylabel("Var of moving mean")
    ax.legend(fontsize=7)
    return _save(fig, path)


def arora_equivalence(path: Path, res: dict) -> Path:
    """The effective learning rates η/‖w_t‖² of :func:`bnlab.theory.arora.run_intrinsic_pair`."""
    fig, ax = _pyplot().subplots(figsize=(5, 3.5))
    ax.plot(res["eff_lr"])
    ax.set_xlabel("step")
    ax.set_ylabel("effective lr η/‖w_t‖²")
    return _save(fig, path)


def arora_rate(path: Path, lrs, res: dict) -> Path:
    """min_t ‖∇L‖ against T per η_w in both settings of
    :func:`bnlab.theory.arora.convergence_rates`."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, mode in zip(axes, ("auto", "projected")):
        r = res[mode]
        for i, lr in enumerate(lrs):
            ax.loglog(r["T"], r["min_grad"][i], label=f"η_w={lr:g}")
        ax.loglog(r["T"], r["min_grad"][:, 0].max() / r["T"] ** 0.5, "k:", label="T^-1/2")
        ax.set_title(mode)
        ax.set_xlabel("T")
    axes[0].set_ylabel("min_t ‖∇L‖")
    axes[0].legend(fontsize=7)
    return _save(fig, path)
