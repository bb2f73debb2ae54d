"""Luo et al. 2019, Fig. 2: ε_gen of the teacher–student BN perceptron against the load α (Fig. 3,
validation loss at α = 1, is in :mod:`bnlab.experiments.luo.fig3`). Shared constants and helpers are
in :mod:`bnlab.experiments.luo.common`."""

from __future__ import annotations

import math

import numpy as np

from bnlab.theory import luo as theory

from ..base import Experiment, Outcome, Plan, register
from ..resolution import Resolution
from bnlab.formatting import finite_or_none, fmt
from ..common import RULE, SETTLE_FRACTION, safe_panels
from ..verdicts import against_bound, explain, ladder, settle
from .common import (FIG2_ZETAS, NOISE_VAR, jsonable_copy, plot_points, factor_test, zeta_by_epochs,
                     zeta_share)


# ================================================================================================
# Fig. 2: generalization error against the load α
# ================================================================================================

_FIG2_SIZES = {
    "paper": {"N": 4096, "M": 32, "epochs": 300, "n_seeds": 3,
              "alphas": (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)},
    "smoke": {"N": 256, "M": 32, "epochs": 150, "n_seeds": 5,
              "alphas": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)},
    "tiny": {"N": 64, "M": 32, "epochs": 3, "n_seeds": 3, "alphas": (1.0, 2.0)},
}
FIG2_FACTOR = 1.5  # "the BN points match the fitted ridge curve": each within a factor 1.5 of it
#: (BN block, no-batch-noise control block, fraction of the epochs): ζ against run length. The full
#: length is the primary; 2/3 is the settling reading (verdicts.settle); 1/3 is reported only.
FIG2_LENGTHS = (("sim", "sim_control", 1.0), ("sim_short", "sim_control_short", SETTLE_FRACTION),
                ("sim_third", "sim_control_third", 1 / 3))
FIG2_CONTROL = "BN with population statistics, i.e. WN with ζ = 0"


def _fig2_simulation(s: dict, student: str, epochs: int, inference: str = "population") -> dict:
    """``student`` ("bn", or the control "wn" with ζ = 0) at every α and seed; ζ fitted to the
    seed-mean points and to each seed's. The seed streams are the simulator's ([0, α index, seed]):
    both students see the same teacher, data, initial w and minibatch order."""
    sim = theory.simulate_teacher_student(
        s["alphas"], student=student, N=s["N"], M=s["M"], noise_var=NOISE_VAR, zeta=0.0,
        epochs=epochs, n_seeds=s["n_seeds"], seed=0, inference=inference)
    alphas, errors = np.asarray(sim["alpha"]), np.asarray(sim["gen_error"])
    per_seed = np.asarray(sim["per_seed"])
    fit, fitted, seed_fits = None, [None] * len(alphas), []
    if np.all(np.isfinite(per_seed)) and np.all(per_seed > 0):
        fit = theory.fit_zeta(alphas, errors, NOISE_VAR)
        fitted = theory.gen_error_wn(alphas, fit, NOISE_VAR)
        seed_fits = [theory.fit_zeta(alphas, per_seed[:, j], NOISE_VAR)
                     for j in range(per_seed.shape[1])]
    return {"alpha": alphas, "gen_error": errors, "per_seed": per_seed, "sem": sim["gen_error_sem"],
            "gamma": sim["gamma"], "fit_zeta": fit, "fitted": fitted, "seed_fit_zeta": seed_fits,
            "epochs": epochs, "student": student}


def fig2_data(preset: str, tiny: bool = False) -> dict:
    """Theory curves of Fig. 2, the BN student's simulated generalization errors, and a control.

    Curves on an α grid: Eq. 14 (corrected α > 1 branch, ``gen_error_sgd``), Eq. 15 with ζ = 0.014
    and 0.25, and Eq. 15 with Eq. 13's ζ = ζ₁₃(M)·λ taking λ = α (the mean eigenvalue of XᵀX, the
    ridge parameter BN's σ_B noise gives; see ``bnlab.theory.luo``). Points: the BN student (β = 0)
    trained by minibatch SGD with batch M, ``n_seeds`` seeds per α; ``fit_zeta`` gives the
    Krogh–Hertz ζ that fits them best (Fig. 2's "best fitter"). The excess test error is computed
    with the population statistics of wᵀx (Luo's h̄, Eq. 3 — the primary points, ``sim``), and again
    for the same students with the training-set statistics that BN's running averages estimate
    (``sim_train_stats``).

    The no-batch-noise control (``sim_control``): the same student trained the same way — same
    seeds, data, initial w, minibatch order, learning rates and cosine schedule — with BN's batch
    statistics μ_B, σ_B replaced by the population statistics μ_P = 0, σ_P = ‖w‖/√N. Its output
    γ(wᵀx − μ_P)/σ_P = γ√N wᵀx/‖w‖ is Sec. 4.1's WN student with ζ = 0, and its gradient is BN's
    without the noise of μ_B and σ_B, so the ζ it fits comes from finite training (early stopping),
    not from batch noise. The other reading, BN with full-training-set statistics at each step,
    differs from this one only by the O(1/√P) offset of the training set's statistics (a
    deterministic function of w, not noise) and costs P/M times more per step.

    ζ against run length: both arms are trained for 1/3, 2/3 and all of the epochs
    (:data:`FIG2_LENGTHS`), each run a full cosine schedule. The simulator returns end-of-run errors
    only, and reading one cosine run part-way would mix the run length with a learning rate still at
    75 % or 25 % of its start. The 2/3 runs are the settling reading.
    """
    s = _FIG2_SIZES["tiny" if tiny else preset]
    M = s["M"]
    grid = np.linspace(0.05, 3.0, 119)
    zeta13 = theory.zeta_linear(M)
    curves = {"vanilla SGD (Eq. 14)": theory.gen_error_sgd(grid, NOISE_VAR)}
    for z in FIG2_ZETAS:
        curves[f"WN, ζ = {z:g} (Eq. 15)"] = theory.gen_error_wn(grid, z, NOISE_VAR)
    curves[f"WN, ζ = Eq. 13 (M = {M}, λ = α)"] = theory.gen_error_wn(grid, zeta13 * grid, NOISE_VAR)
    sims = {"sim_train_stats": _fig2_simulation(s, "bn", s["epochs"], "train")}
    for bn_key, control_key, fraction in FIG2_LENGTHS:
        epochs = max(1, round(s["epochs"] * fraction))
        sims[bn_key] = _fig2_simulation(s, "bn", epochs)
        sims[control_key] = _fig2_simulation(s, "wn", epochs)
    return jsonable_copy({
        "settings": {**{k: v for k, v in s.items() if k != "alphas"}, "noise_var": NOISE_VAR},
        "grid": grid, "curves": curves, **sims,
        "fit_zeta": sims["sim"]["fit_zeta"], "fitted_at_sim": sims["sim"]["fitted"],
        "zeta13": zeta13, "zeta13_max": theory.zeta_linear(M, 4.0),
        "wn_0014_at_1": theory.gen_error_wn(1.0, 0.014, NOISE_VAR),
        "optimal_zeta_at_1": theory.optimal_zeta(1.0, NOISE_VAR),
    })


def _fig2_plan(preset: str) -> Plan:
    def compute(tiny: bool = False) -> dict:
        return fig2_data(preset, tiny)

    return Plan(compute={"fig2": compute})


def _share_text(share: list[float], lo, hi) -> str:
    """Δζ per seed, its mean, and where the tests against Eq. 13's range put it."""
    where = ("inside" if lo.decision == "higher" and hi.decision == "lower" else
             "outside" if lo.decision == "lower" or hi.decision == "higher" else
             "not resolved against")
    return (f"BN's batch-noise share Δζ = ζ_BN − ζ_control = {fmt(share)} (per seed "
            f"{', '.join(f'{v:.4f}' for v in share)}), {where}")


def fig2_points_verdict(block: dict, control: dict, upper: float) -> tuple[str, str, float | None]:
    """(verdict, summary, max |ln(seed-mean point / fitted curve)|) for one pair of simulation
    blocks of the same run length: the BN student (``block``) and the no-batch-noise control
    (``control``).

    Per α (:func:`luo.common.factor_test`): the BN per-seed points are "within" a factor 1.5 of the
    ridge curve fitted to their seed means when both one-sided Welch tests on ln(point) reject
    (α = 0.05, ≥ 3 seeds), "beyond" when one rejects the other way. BN's batch-noise share
    Δζ = ζ_BN − ζ_control is taken per seed (:func:`luo.common.zeta_share`; the control shares the
    seed's data and batch order) and tested against both ends of Eq. 13's range (0, ``upper``]
    (:func:`verdicts.against_bound`, one-sample t).

    Primary, pre-declared: Δζ significantly above 0 and below ``upper``, and every α's BN point
    within the factor (TOST) → held; Δζ significantly below 0 or above ``upper``, or some α beyond →
    not held; otherwise inconclusive, with what the seeds resolve. ζ_BN itself is reported, not
    judged: the control fits a ζ of its own from finite training (early stopping).
    """
    fit, fitted = finite_or_none(block.get("fit_zeta")), block.get("fitted") or []
    per_seed, alphas = block.get("per_seed") or [], block.get("alpha") or []
    if fit is None or len(per_seed) < 3 or len(per_seed) != len(fitted) or None in fitted:
        return ladder(unusable=True), "too few finite simulation points to fit ζ", None
    share = zeta_share(block, control)
    if not share:
        return (ladder(unusable=True),
                "no per-seed ζ of the no-batch-noise control to pair with BN's", None)
    tests = [(a, *factor_test([f] * len(p), p, FIG2_FACTOR))
             for a, f, p in zip(alphas, fitted, per_seed)]
    lo = against_bound(share, 0.0, "higher")[1]
    hi = against_bound(share, upper, "lower")[1]
    if any(c.decision == "too few seeds" for _, _, c in tests) or lo.decision == "too few seeds":
        return ladder(unusable=True), f"fewer than 3 seeds per α ({RULE})", None
    dev = max(abs(c.diff) for _, _, c in tests)
    beyond = [a for a, d, _ in tests if d == "beyond"]
    unresolved = [a for a, d, _ in tests if d == "unresolved"]
    in_range = lo.decision == "higher" and hi.decision == "lower"
    out_of_range = lo.decision == "lower" or hi.decision == "higher"
    summary = (
        f"{block.get('epochs', '?')} epochs, {len(per_seed[0])} seeds: BN points (population "
        f"statistics) fitted best by ζ_BN = {fit:.4f} (paper: 0.014; per seed "
        f"{fmt(block['seed_fit_zeta'])}); the no-batch-noise control ({FIG2_CONTROL}, same seeds "
        f"and schedule) by ζ_control = {fmt(finite_or_none(control.get('fit_zeta')))}; "
        + _share_text(share, lo, hi) + f" Eq. 13's range (0, {upper:.3f}]; BN point / curve per α: "
        + ", ".join(f"{a:g}: {math.exp(c.diff):.2f} ({d})" for a, d, c in tests))
    verdict = ladder(True if in_range and not unresolved else None,
                     against=out_of_range or bool(beyond))
    resolvable = max((c.mde for _, _, c in tests if c.mde is not None), default=0.0)
    not_resolved = (f"; not resolved at α = {', '.join(f'{a:g}' for a in unresolved)}: these seeds "
                    f"resolve deviations beyond a factor ≈ "
                    f"{FIG2_FACTOR * math.exp(resolvable):.2f}" if unresolved else "")
    return verdict, summary + explain(
        verdict,
        not_held=(f"; beyond a factor {FIG2_FACTOR} at α = {', '.join(f'{a:g}' for a in beyond)}"
                  if beyond else "") + f" (TOST with {RULE})",
        held=f"; every point within a factor {FIG2_FACTOR} (TOST with {RULE})",
        inconclusive=not_resolved
        + ("" if in_range or out_of_range else f"; Δζ resolvable from 0 at ≥ {fmt(lo.mde)}")
        + f" (power 0.8; {RULE})"), dev


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def fig2_verdict(data: dict, tiny: bool) -> tuple[str, str, float | None]:
    """(verdict, summary, max |ln(sim / fitted curve)|) for Fig. 2's claim:
    :func:`fig2_points_verdict` on the full-length BN and control students, combined by
    :func:`verdicts.settle` with the same rule on the pair trained 2/3 as many epochs; the
    training-set-statistics points and ζ against run length are reported beside it.

    Primary, pre-declared: that of :func:`fig2_points_verdict` — BN's batch-noise share
    ζ_BN − ζ_control, per seed, inside Eq. 13's range (0, 4·ζ₁₃(M)], with every α's BN point within
    1.5× of the ridge curve fitted to it."""
    if tiny:
        return (ladder(unusable=True),
                "tiny run (a few SGD epochs): the simulation has not converged", None)
    upper = finite_or_none(data.get("zeta13_max"))
    if upper is None:
        return ladder(unusable=True), "no Eq. 13 range", None
    verdict, summary, dev = fig2_points_verdict(data.get("sim") or {},
                                                data.get("sim_control") or {}, upper)
    short = fig2_points_verdict(data.get("sim_short") or {},
                                data.get("sim_control_short") or {}, upper)
    verdict, summary = settle((verdict, summary), short[:2])
    rows = zeta_by_epochs(data, [(b, c) for b, c, _ in FIG2_LENGTHS])
    if rows:
        summary += "; ζ_BN / ζ_control / Δζ against run length: " + ", ".join(
            f"{r['epochs']} epochs {fmt(_mean(r['bn']))} / {fmt(_mean(r['control']))} / "
            f"{fmt(_mean(r['share']))}" for r in rows)
    other = data.get("sim_train_stats") or {}
    if finite_or_none(other.get("fit_zeta")) is not None:
        o_pairs = [(e, f) for e, f in zip(other.get("gen_error") or [], other.get("fitted") or [])
                   if e and f]
        o_dev = max((abs(math.log(e / f)) for e, f in o_pairs), default=None)
        if o_dev is not None:
            summary += (f" (BN evaluated with training-set statistics instead, as BN's running "
                        f"averages do: ζ = {other['fit_zeta']:.4f}, seed means within a factor "
                        f"{math.exp(o_dev):.2f})")
    return verdict, summary, dev


def _fig2_ratios(data: dict) -> tuple[dict, dict]:
    """Series of BN point / fitted curve per α (seed means) for each simulation block, and the seed
    range of the primary (population-statistics) block as a band."""
    ratio_series, bands = {}, {}
    for key, name in (("sim", "population statistics"),
                      ("sim_short", "population statistics, 2/3 epochs"),
                      ("sim_train_stats", "training-set statistics")):
        block = data.get(key) or {}
        fitted = block.get("fitted") or []
        rows = [(a, e / f, [p / f for p in ps if p]) for a, e, f, ps in zip(
            block.get("alpha") or [], block.get("gen_error") or [], fitted,
            block.get("per_seed") or []) if e and f]
        if rows:
            label = f"{name} (fit ζ = {fmt(finite_or_none(block.get('fit_zeta')))})"
            ratio_series[label] = plot_points([r[0] for r in rows], [r[1] for r in rows])
            if key == "sim" and all(r[2] for r in rows):
                bands["population statistics: seed range"] = (
                    [r[0] for r in rows], [min(r[2]) for r in rows], [max(r[2]) for r in rows])
    return ratio_series, bands


def _fig2_point_series(data: dict) -> tuple[dict, dict]:
    """ε_gen against α: theory curves, BN points (all and 2/3 of the epochs), the control's."""
    grid = data.get("grid") or []
    series = {label: (grid, ys) for label, ys in (data.get("curves") or {}).items()}
    style = {}
    M = (data.get("settings") or {}).get("M", "?")
    for key, label, look in (
            ("sim", f"BN simulation (M = {M}), population statistics",
             {"marker": "s", "color": "k"}),
            ("sim_short", "BN simulation, 2/3 of the epochs (settling)",
             {"marker": "o", "mfc": "none", "color": "0.4"}),
            ("sim_control", f"control: {FIG2_CONTROL}", {"marker": "^", "color": "tab:red"})):
        block = data.get(key) or {}
        if block.get("alpha"):
            label = f"{label}, {block.get('epochs')} epochs"
            series[label] = plot_points(block["alpha"], block["gen_error"])
            style[label] = {"ls": "none", "ms": 5, **look}
    return series, style


def _fig2_zeta_panel(rows: list[dict]) -> dict:
    """ζ against run length: seed means of ζ_BN, ζ_control and Δζ; Δζ's seed range as a band."""
    xs = [r["epochs"] for r in rows]
    series = {"ζ_BN (fit to BN points)": (xs, [_mean(r["bn"]) for r in rows]),
              f"ζ_control ({FIG2_CONTROL})": (xs, [_mean(r["control"]) for r in rows]),
              "Δζ = ζ_BN − ζ_control (BN's batch noise)": (xs, [_mean(r["share"]) for r in rows])}
    band = {"Δζ: seed range": (xs, [min(r["share"]) for r in rows],
                               [max(r["share"]) for r in rows])} if rows else {}
    return {"series": series, "band": band, "markers": True, "hline": 0.014,
            "xlabel": "epochs (cosine schedule)", "ylabel": "fitted ζ",
            "title": "ζ against run length (dashed: the paper's 0.014)"}


def _fig2_zeta_rows(data: dict) -> list[dict]:
    """Table rows: ζ_BN, ζ_control and the per-seed share at full length; ζ against run length."""
    sim, control = data.get("sim") or {}, data.get("sim_control") or {}
    share = zeta_share(sim, control)
    rows = [
        {"quantity": "ζ best fitting the BN points (M = 32)",
         "ours": fmt(finite_or_none(data.get("fit_zeta"))), "paper": "0.014"},
        {"quantity": f"ζ best fitting the no-batch-noise control ({FIG2_CONTROL}; same seeds, "
                     "data, schedule)",
         "ours": fmt(finite_or_none(control.get("fit_zeta"))),
         "paper": "— (no control; 0.014 read as BN's)"},
        {"quantity": "BN's batch-noise share Δζ = ζ_BN − ζ_control, per seed (primary)",
         "ours": (f"{fmt(share)}: " + ", ".join(f"{v:.4f}" for v in share)) if share else "—",
         "paper": "0.014 (all of ζ attributed to batch noise)"},
    ]
    for r in zeta_by_epochs(data, [(b, c) for b, c, _ in FIG2_LENGTHS]):
        rows.append({"quantity": f"ζ_BN / ζ_control / Δζ after {r['epochs']} epochs (mean ± SD)",
                     "ours": " / ".join(fmt(r[k]) for k in ("bn", "control", "share")),
                     "paper": "300 epochs: 0.014 (BN only)"})
    return rows


def _fig2_analyze(ctx) -> Outcome:
    data = ctx.data.get("fig2") or {}
    sim = data.get("sim") or {}
    series, style = _fig2_point_series(data)
    other = data.get("sim_train_stats") or {}
    ratio_series, bands = _fig2_ratios(data)
    fig = safe_panels(ctx.figure_path("gen_error_vs_alpha"), [
        {"series": series, "style": style, "xlabel": "α = P/N", "ylabel": "ε_gen", "logy": True,
         "title": f"noise variance {NOISE_VAR}"},
        {"series": ratio_series, "band": bands, "xlabel": "α = P/N",
         "ylabel": "BN ε_gen / best-fit WN curve", "hline": 1.0, "markers": True,
         "title": f"seed means and range (verdict: within ×/÷ {FIG2_FACTOR})"},
        _fig2_zeta_panel(zeta_by_epochs(data, [(b, c) for b, c, _ in FIG2_LENGTHS])),
    ], title="Luo Fig. 2: generalization error vs effective load")
    verdict, summary, dev = fig2_verdict(data, ctx.tiny)
    n_seeds = (data.get("settings") or {}).get("n_seeds", "?")
    at1 = None
    for a, e in zip(sim.get("alpha") or [], sim.get("gen_error") or []):
        if a == 1.0:
            at1 = e
    ratios = ", ".join(f"{a:g}: {e / f:.2f} ({min(ps) / f:.2f}–{max(ps) / f:.2f})"
                       for a, e, f, ps in zip(sim.get("alpha") or [], sim.get("gen_error") or [],
                                              data.get("fitted_at_sim") or [],
                                              sim.get("per_seed") or [])
                       if e and f and ps and None not in ps)
    table = _fig2_zeta_rows(data) + [
        {"quantity": "ζ best fitting BN evaluated at training-set statistics",
         "ours": fmt(finite_or_none(other.get("fit_zeta"))), "paper": "— (not stated)"},
        {"quantity": "Eq. 13 ζ per unit λ at M = 32",
         "ours": fmt(finite_or_none(data.get("zeta13"))),
         "paper": "≈ 0.02 (ζ ≈ 0.02 λ, λ ∈ [0, 4])"},
        {"quantity": "max factor between BN points and fitted curve",
         "ours": fmt(None if dev is None else math.exp(dev)),
         "paper": "points 'clearly match' the ζ = 0.014 curve"},
        {"quantity": f"BN point / fitted curve, per α: seed mean (seed range, {n_seeds} seeds)",
         "ours": ratios or "—", "paper": "≈ 1"},
        {"quantity": "BN ε_gen at α = 1 (simulation)", "ours": fmt(finite_or_none(at1)),
         "paper": f"≈ WN ζ = 0.014 curve ({fmt(finite_or_none(data.get('wn_0014_at_1')))}); SGD "
                  "diverges"},
        {"quantity": "ζ minimizing ε_gen (α = 1)",
         "ours": fmt(finite_or_none(data.get("optimal_zeta_at_1"))),
         "paper": "0.25, the noise variance"},
    ]
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="luo-fig2", paper="luo", target="Fig. 2",
    title="Generalization error vs effective load α: SGD, WN + ζγ², BN",
    claim="BN's batch statistics act as a ridge regularizer: the simulated BN student's ε_gen "
          "follows the WN + ζγ² curve with ζ ≈ 0.014, inside Eq. 13's ζ ≈ 0.02λ, while vanilla SGD "
          "diverges at α = 1.",
    smoke_changes=(
        "N = 256 inputs instead of 4096 (P = αN), 7 values of α, 150 epochs, 5 seeds: the finite-N "
        "fluctuations are larger but the curves are the same functions of α. Added: a "
        "no-batch-noise control — the same student with BN's batch statistics replaced by the "
        "population ones (= WN with ζ = 0), same seeds, data, batch order and schedule — whose own "
        "fitted ζ is finite training's (early stopping's) share; the verdict judges BN's share "
        "ζ_BN − ζ_control per seed. Both arms also run 50 and 100 epochs (ζ against run length; "
        "100 is the settling reading)."),
    cost={"smoke": "≈ 30 s CPU (numpy; 9 simulations of 5 seeds × 7 α)",
          "paper": "N = 4096, 9 α values, 300 epochs, 3 seeds; BN and control at 1/3, 2/3 and "
                   "all of the epochs plus BN's training-set evaluation: ≈ 5 × 3 × 170 s ≈ 45 min "
                   "on one CPU core"},
    plan=_fig2_plan, analyze=_fig2_analyze,
    resolution=Resolution(
        "ζ ≈ 0.014 for BN's student, inside Eq. 13's ζ ≈ 0.02λ (Fig. 2; the BN points on the "
        "WN + ζγ² curve)",
        "BN's batch-noise share ζ_BN − ζ_control > 0 when ≥ ≈ 0.005 (one-sample t, 5 seeds, SE "
        "0.0016), and each α's BN point within 1.5× of the fitted curve where its ln-SE ≤ ≈ 0.1 "
        "(not at α = 0.25: a factor ≈ 1.9 there)",
        "the catalogue run of 2026-11-26 (150 epochs, 5 seeds): Δζ = 0.0108 ± 0.0016")))
