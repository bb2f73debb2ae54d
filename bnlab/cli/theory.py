"""`bnlab theory ...`: every calculator of bnlab.theory as a command.

`bnlab theory list` shows them; `bnlab theory NAME [options]` prints a table, `--json` prints the
full result as JSON instead, and `--plot PATH` (where offered) draws the curves with matplotlib's
Agg backend. Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from bnlab.cli.theory_common import (JSON, PLOT, emit_result, parse_floats, parse_ints,
                                     plot_written, run_or_exit)

from bnlab.theory import arora, figures, luo, mbn, peng, santurkar

theory_app = typer.Typer(help="The papers' closed forms and simulators (bnlab.theory).",
                         no_args_is_help=True)

#: name -> (paper, what it computes); the order is the order of `bnlab theory list`.
CALCULATORS: dict[str, tuple[str, str]] = {
    "luo-zeta": ("Luo et al. Eq. 13 / Thm 1",
                 "ζ(M) for the linear Gaussian case: exact, large-M λ/2M, Monte Carlo"),
    "luo-gen-error": ("Luo et al. Eqs. 14-16",
                      "generalization error vs load α: SGD and WN with ζ (Fig. 2 curves)"),
    "luo-teacher-student": ("Luo et al. Fig. 2",
                            "BN student trained by SGD on P = αN samples vs the WN curve"),
    "luo-dynamics": ("Luo et al. Eqs. 9-11",
                     "order-parameter ODE (γ, R, L), optionally against a direct simulation"),
    "luo-rates": ("Luo et al. Table 2, Props 1-3",
                  "fixed point, Jacobian eigenvalues, η_max and η_eff of BN/WN/SGD"),
    "mbn-theorem1": ("MBN Theorem 1",
                     "laws of ξ_μ and ξ_σ: moments and KS distances by simulation"),
    "mbn-theorem2": ("MBN Theorem 2",
                     "E[l((x+ξ_μ)/√ξ_σ)] vs l + R_add + R_mul + R (quadrature, Monte Carlo)"),
    "mbn-momentum": ("MBN moving statistics",
                     "noise of the moving mean/variance vs batch size m and momentum λ"),
    "santurkar": ("Santurkar et al. Thms 4.1, 4.2",
                  "gradient and curvature bounds on a BN layer, with slack"),
    "santurkar-lemma45": ("Santurkar et al. Lemma 4.5",
                          "distance to the closest BN optimum kW* vs to W*"),
    "arora-equivalence": ("Arora et al. Thm 2.5",
                          "SGD on w vs the adaptive update on v = w/‖w‖: max deviation"),
    "arora-rate": ("Arora et al. Thm 3.1",
                   "min_t ‖∇L‖ against T for several η_w (T^-1/2), with Setting 2"),
    "peng-terms": ("Peng et al. Thm 1",
                   "T1, T2, T3 from recorded grad_stats (JSON) or a synthetic run"),
}


@theory_app.command("list")
def list_calculators(as_json: bool = JSON) -> None:
    """Every calculator with its paper and what it computes."""
    rows = [{"name": k, "paper": p, "computes": c} for k, (p, c) in CALCULATORS.items()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['name']:<20} {r['paper']:<32} {r['computes']}")


@theory_app.command("luo-zeta")
def luo_zeta(
    m_values: str = typer.Option("8,16,32,64,128,256", "--m",
                                 help="Batch sizes M (comma-separated)."),
    lam: float = typer.Option(
        1.0, help="λ in Eq. 13 (use λ = α for the ridge parameter of a P = αN set)."
    ),
    n_batches: int = typer.Option(100_000, help="Monte Carlo batches per M."),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """ζ(M) of Eq. 13 (exact), its large-M limit λ/2M, and Monte Carlo of E[(1 − σ_P/σ_B)²]."""
    ms = parse_ints(m_values, "--m")
    rows = run_or_exit(lambda: luo.zeta_table(ms, lam, n_batches, seed=seed))
    emit_result(rows, rows, as_json,
                ["penalty_with_mean_mc: E[(ĥ−h̄)²] incl. the μ_B noise Eq. 13 drops (≈ 1/M more)."])
    if plot:
        plot_written(figures.luo_zeta(plot, ms, rows))


@theory_app.command("luo-gen-error")
def luo_gen_error(
    alphas: str = typer.Option("0.25,0.5,0.75,0.9,1.1,1.25,1.5,2,3,4", "--alpha",
                               help="Loads α = P/N."),
    zetas: str = typer.Option("0.014,0.0206,0.25", "--zeta",
                              help="Krogh-Hertz ridge parameters ζ for WN."),
    noise_var: float = typer.Option(0.25, help="Teacher noise variance σ²."),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """ε_gen(α) of vanilla SGD (Eq. 14, corrected sign) and of WN with each ζ (Eqs. 15-16)."""
    al = parse_floats(alphas, "--alpha")
    zs = parse_floats(zetas, "--zeta")
    rows = run_or_exit(lambda: luo.gen_error_table(al, zs, noise_var))
    emit_result({"noise_var": noise_var, "rows": rows}, rows, as_json,
                [f"optimum ζ* = noise variance = {noise_var:g}"])
    if plot:
        plot_written(figures.luo_gen_error(plot, al, zs, noise_var))


@theory_app.command("luo-teacher-student")
def luo_teacher_student(
    alphas: str = typer.Option("0.5,1,1.5,2,3", "--alpha", help="Loads α = P/N."),
    preset: str = typer.Option("test",
                               help="Sizes: test (N=256), cpu (N=1024), paper (N=4096, slow)."),
    student: str = typer.Option("bn", help="bn, wn or sgd."),
    inference: str = typer.Option("population", help="population (Luo's h̄) or train statistics."),
    noise_var: float = typer.Option(0.25),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Fig. 2's squares: train the student by SGD (batch M) and compare with the WN curve of Eq.
    13's ζ."""
    al = parse_floats(alphas, "--alpha")
    res = run_or_exit(lambda: luo.teacher_student_vs_theory(
        al, noise_var=noise_var, student=student, preset=preset, inference=inference, seed=seed))
    rows = [
        {"alpha": a, "simulated": e, "sem": s, "wn(zeta_eq13)": w, "wn(alpha*zeta_eq13)": wr,
         "sgd": g}
        for a, e, s, w, wr, g in zip(
            al, res["gen_error"], res["gen_error_sem"], res["wn_eq13"], res["wn_eq13_ridge"],
            res["sgd_curve"]
        )
    ]
    emit_result(res, rows, as_json,
                [f"best-fit Krogh-Hertz ζ = {res['fitted_zeta']:.4g}; Eq. 13 ζ(M) = "
                 f"{luo.zeta_linear(res['settings']['M']):.4g}"])
    if plot:
        plot_written(figures.luo_teacher_student(plot, al, res, noise_var, student))


@theory_app.command("luo-dynamics")
def luo_dynamics(
    eta: float = typer.Option(1.0),
    zeta: float = typer.Option(0.1),
    activation: str = typer.Option("relu", help="relu, erf, tanh or linear."),
    gamma0: float = typer.Option(0.5),
    r0: float = typer.Option(0.2, "--r0"),
    l0: float = typer.Option(1.0, "--l0"),
    t_max: float = typer.Option(10.0),
    simulate: int = typer.Option(0, help="Also run N-dimensional students with this N (0: no)."),
    students: int = typer.Option(4, help="Independent students averaged when --simulate is given."),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Integrate Eqs. 9-11 and (optionally) compare with a direct simulation of the student."""
    start = dict(eta=eta, zeta=zeta, gamma0=gamma0, R0=r0, L0=l0, t_max=t_max,
                 activation=activation)
    res = run_or_exit(lambda: luo.dynamics_vs_simulation(**start, simulate=simulate,
                                                         students=students, seed=seed))
    ode, sim = res["ode"], res.get("simulation")
    rows = []
    for i, t in enumerate(ode["t"]):
        row = {"t": float(t), "gamma": float(ode["gamma"][i]), "R": float(ode["R"][i]),
               "L": float(ode["L"][i])}
        if sim is not None:
            row.update(gamma_sim=float(sim["gamma"][i]), R_sim=float(sim["R"][i]),
                       L_sim=float(sim["L"][i]))
        rows.append(row)
    g0, _, _ = res["fixed_point"]
    emit_result(res, rows, as_json, [f"fixed point γ0 = {g0:.6g}, R0 = 1 (small-η limit)"])
    if plot:
        fine = luo.integrate_order_parameters(**start, n_points=200)
        plot_written(figures.luo_dynamics(plot, fine, sim, simulate))


@theory_app.command("luo-rates")
def luo_rates(
    zetas: str = typer.Option("0,0.01,0.05,0.1,0.2", "--zeta"),
    eta: float = typer.Option(0.1),
    l0: float = typer.Option(1.0, "--l0"),
    activation: str = typer.Option("relu"),
    as_json: bool = JSON,
) -> None:
    """Fixed point, λ_Q, λ_R (analytic and finite-difference) and η_max, η_eff for BN, WN, SGD."""
    rows = run_or_exit(lambda: luo.rates_table(parse_floats(zetas, "--zeta"), eta=eta, L0=l0,
                                               activation=activation))
    emit_result(rows, rows, as_json,
                ["eta_max_printed drops the I2 term of ∂(R·I2)/∂R (Table 2 as printed)."])


@theory_app.command("mbn-theorem1")
def mbn_theorem1(
    m_values: str = typer.Option("2,4,8,16,32,64", "--m"),
    kurtosis: Optional[float] = typer.Option(None,
                                             help="Pearson kurtosis of the inputs (Gaussian: 3)."),
    n_batches: int = typer.Option(20_000),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Moments and KS distances of ξ_μ, ξ_σ against N(0,1/m), χ²(m−1)/m and the normal limits."""
    ms = parse_ints(m_values, "--m")
    reports = run_or_exit(lambda: [mbn.theorem1_report(m, n_batches, kurtosis=kurtosis,
                                                       seed=seed + m) for m in ms])
    keys = ("m", "xi_mu_var", "xi_mu_var_theory", "xi_sigma_mean", "xi_sigma_mean_theory",
            "xi_sigma_var", "xi_sigma_var_theory", "ks_xi_mu_normal", "ks_xi_sigma_chi2",
            "ks_xi_sigma_normal_corrected", "ks_xi_sigma_normal_printed")
    rows = [{k: r[k] for k in keys} for r in reports]
    emit_result(reports, rows, as_json, [f"KS 95% noise floor: {reports[0]['ks_noise_floor']:.4f}"])
    if plot:
        plot_written(figures.mbn_theorem1(plot, ms, n_batches, kurtosis, seed))


@theory_app.command("mbn-theorem2")
def mbn_theorem2(
    m: int = typer.Option(8),
    omega: float = typer.Option(1.0, help="Test loss l(x) = cos(ω x) (bounded, analytic)."),
    points: str = typer.Option("-2,-1,-0.5,0,0.5,1,2", "--x"),
    n_batches: int = typer.Option(200_000),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
) -> None:
    """Theorem 2's expansion l + R_add + R_mul + R against Monte Carlo over real batches."""
    xs = np.array(parse_floats(points, "--x"))
    res = run_or_exit(lambda: mbn.theorem2_cosine(m, omega, xs, n_batches, seed=seed))
    t, lo, mc = res["terms"], res["leading_order"], res["monte_carlo"]
    rows = [
        {
            "x": float(x), "l": float(t["loss"][i]), "R_add": float(t["R_add"][i]),
            "R_mul": float(t["R_mul"][i]), "R": float(t["R"][i]),
            "l+R_add+R_mul+R": float(t["expected"][i]),
            "leading_order": float(t["loss"][i] + lo["R_add"][i] + lo["R_mul"][i]),
            "monte_carlo": float(mc["mean"][i]), "mc_sem": float(mc["sem"][i]),
        }
        for i, x in enumerate(xs)
    ]
    emit_result(res, rows, as_json,
                ["R uses E[ξ_μ^n] (the printed E[ξ_μ]^n is 0 and drops this term)."])


@theory_app.command("mbn-momentum")
def mbn_momentum(
    m_values: str = typer.Option("2,4,8,16,32", "--m"),
    momenta: str = typer.Option("0,0.5,0.9,0.99", "--momentum", help="λ = weight of the history."),
    n_steps: int = typer.Option(20_000),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Variance of MBN's moving mean/variance over steps against (1−λ)/(1+λ) × the batch noise."""
    ms, lams = parse_ints(m_values, "--m"), parse_floats(momenta, "--momentum")
    res = run_or_exit(lambda: mbn.moving_noise_curve(ms, lams, n_steps, seed=seed))
    rows = [
        {"momentum": lam, "m": m, "var_mu": res["var_mu"][i, j],
         "var_mu_theory": res["var_mu_theory"][i, j], "var_sigma2": res["var_sigma2"][i, j],
         "var_sigma2_theory": res["var_sigma2_theory"][i, j],
         "equivalent_m": m * (1 + lam) / (1 - lam)}
        for i, lam in enumerate(lams) for j, m in enumerate(ms)
    ]
    emit_result(res, rows, as_json)
    if plot:
        plot_written(figures.mbn_momentum(plot, ms, lams, res))


@theory_app.command("santurkar")
def santurkar_cmd(
    m_values: str = typer.Option("4,16,64", "--m"),
    losses: str = typer.Option("mse,logistic,quartic,coupled", "--loss"),
    gamma: float = typer.Option(1.5),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
) -> None:
    """Theorems 4.1 and 4.2 on a BN layer: both sides via autograd, the slack, the printed 1/√m
    form."""
    names = [s.strip() for s in losses.split(",") if s.strip()]
    rows = run_or_exit(lambda: santurkar.theorems_table(parse_ints(m_values, "--m"), names,
                                                        gamma=gamma, seed=seed))
    emit_result(rows, rows, as_json)


@theory_app.command("santurkar-lemma45")
def santurkar_lemma45(
    dim: int = typer.Option(10),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
) -> None:
    """Lemma 4.5 on random W0, W* (with <W0, W*> > 0)."""
    res = run_or_exit(lambda: santurkar.lemma45_random(dim, seed=seed))
    emit_result(res, [res], as_json)


@theory_app.command("arora-equivalence")
def arora_equivalence(
    steps: int = typer.Option(300),
    lr_w: float = typer.Option(0.5),
    lr_g: float = typer.Option(0.05),
    batch_size: int = typer.Option(16),
    eps_mode: str = typer.Option(
        "scaled", help="BN smoothing: scaled (ε‖w‖²), linear (ε‖w‖, printed), constant."
    ),
    eps: float = typer.Option(1e-3),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Theorem 2.5: run SGD on w and the adaptive projected update on v together; print the gaps."""
    res = run_or_exit(lambda: arora.run_intrinsic_pair(
        steps=steps, lr_w=lr_w, lr_g=lr_g, batch_size=batch_size, eps=eps, eps_mode=eps_mode,
        seed=seed
    ))
    idx = sorted({0, steps // 10, steps // 4, steps // 2, steps - 1})
    rows = [
        {"step": i + 1, "dev_v": res["dev_v"][i], "dev_G": res["dev_G"][i],
         "dev_g": res["dev_g"][i], "eff_lr_min": float(res["eff_lr"][i].min()),
         "eff_lr_max": float(res["eff_lr"][i].max()), "loss": res["loss"][i]}
        for i in idx
    ]
    dev = max(res["dev_v"].max(), res["dev_G"].max(), res["dev_g"].max())
    emit_result(res, rows, as_json, [f"max deviation between the trajectories: {dev:.3e}"])
    if plot:
        plot_written(figures.arora_equivalence(plot, res))


@theory_app.command("arora-rate")
def arora_rate(
    lr_ws: str = typer.Option("0.01,0.1,1,10,100", "--lr-w"),
    steps: int = typer.Option(2000),
    lr_g: float = typer.Option(0.05),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
    plot: Optional[Path] = PLOT,
) -> None:
    """Theorem 3.1: min_t ‖∇L‖ and rms ‖∇L‖ against T for several η_w, auto-tuned and projected."""
    lrs = parse_floats(lr_ws, "--lr-w")
    res = run_or_exit(lambda: arora.convergence_rates(lrs, steps=steps, lr_g=lr_g, seed=seed))
    notes = ["auto: plain GD (norms grow, rate auto-tuned); projected: Setting 2 (‖w‖ = 1)."]
    emit_result(res, arora.convergence_table(res, lrs), as_json, notes)
    if plot:
        plot_written(figures.arora_rate(plot, lrs, res))


@theory_app.command("peng-terms")
def peng_terms(
    records: Optional[Path] = typer.Option(
        None, help="JSON object of per-step series (probe/grad_stats/sq_norm, "
                   "probe/grad_stats/variance, lr)."
    ),
    lr_key: str = typer.Option("lr", help="Key of the learning-rate series in --records."),
    lr: Optional[float] = typer.Option(None, help="Constant learning rate (instead of a series)."),
    initial_loss: Optional[float] = typer.Option(None, help="F(w_0) (required with --records)."),
    loss_lower_bound: float = typer.Option(0.0, help="F* (0 for non-negative losses)."),
    lipschitz: Optional[float] = typer.Option(None, help="Gradient Lipschitz constant, if known."),
    micro_batches: Optional[int] = typer.Option(
        None, help="grad_stats' k, to convert to the training batch."
    ),
    n_steps: Optional[int] = typer.Option(
        None, help="Steps of the run (when the probe ran every few steps)."
    ),
    synthetic: bool = typer.Option(
        False, help="Use a synthetic least-squares SGD run instead of --records."
    ),
    seed: int = typer.Option(0),
    as_json: bool = JSON,
) -> None:
    """Peng et al. Theorem 1: T1, T2, T3 and their sum, from recorded statistics or a synthetic
    run."""
    def compute():
        if synthetic:
            return peng.synthetic_terms(seed=seed)
        if records is None:
            raise ValueError("give --records FILE.json or --synthetic")
        if initial_loss is None:
            raise ValueError("--initial-loss is required with --records")
        data = json.loads(records.read_text())
        lrs = lr if lr is not None else data.get(lr_key)
        if lrs is None:
            raise ValueError(f"no learning rate: pass --lr or a {lr_key!r} series in the records")
        return peng.terms_from_records(
            data, lrs=lrs, initial_loss=initial_loss, loss_lower_bound=loss_lower_bound,
            lipschitz=lipschitz, n_steps=n_steps, micro_batches=micro_batches,
        )

    res = run_or_exit(compute)
    emit_result(res, [res], as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(theory_app, name="theory")
