"""Peng et al. (CBN) figure entries ``peng-fig2`` and ``peng-fig8`` (registered on import; the
catalogue imports this module, :data:`bnlab.experiments.base.ENTRY_MODULES`; ``peng-fig10`` is in
``amat.py``)."""

from __future__ import annotations

import math

from bnlab.formatting import fmt
from bnlab.plots import panels

from ..base import Experiment, Outcome, RunSpec, register
from ..resolution import Resolution, family_resolution
from ..common import (RULE, DesignSD, compare_arms, mean_curve, recipe_config,
                      safe_panels, smooth)
from ..verdicts import holm
from ..run_facts import arm_values, config_test_images
from ..verdicts import COMPARE_RULE
from ..verdict_data import Verdict
from ..verdicts import ALPHA, HELD, MIN_SEEDS, against_bound, conjunction, explain, ladder
from .blocks import block_plan, judged_by_block
from .common import ACT_TITLE, ACTIVATIONS, RHO_GRID, recipe_base, run_config, status_note, cbn_spec
from .eta_tau import FIG2_SKIP, seed_shares
from .eta_tau import band_specs as _band_specs
from .verdict import CHANCE, conjunction_record

# ---- Figs 2–3: η_k and τ_k -----------------------------------------------------------------------

FIG2_SEEDS = (0, 1, 2, 3, 4)
# Full width, as in the paper; half its learning rate. At lr 0.1 CBN (ρ = 1) diverged within 21–35
# steps in 2 of 2 seeds on digits at full width (pilot 2026-11-27); at 0.05 it trains
# (test 99.2–99.4 %). At width ¼ and lr 0.1 (the smoke of 2026-11-26) layer #2 has 4 channels.
FIG2_SMOKE_WIDTH = 1.0
FIG2_SMOKE_LR = 0.05
# Thresholds of the share of channels in range, and the SE floor of a seeds' mean share (a share is
# a mean over ≈ 15 probes of fractions in steps of 1/C; seeds that agree exactly have SD 0)
FIG2_HELD, FIG2_AGAINST, FIG2_SE_FLOOR = 0.9, 0.75, 0.01


def _fig2_runs(preset: str, residual: str) -> list[RunSpec]:
    if preset == "paper":
        # about once an epoch; 390, not 391 (= steps per epoch), so the probes do not all land on
        # the epoch's last, 80-sample batch
        base = {**recipe_base("resnet20", "cifar10", "paper", residual), "probe_every": 390}
    else:
        base = recipe_base("resnet20", "digits", "smoke", residual)
        base = {**base, "probe_every": 6, "lr": FIG2_SMOKE_LR,
                "model_options": {**base["model_options"], "width": FIG2_SMOKE_WIDTH}}
    # Fig. 3's caption: "we set ρ = 1 in the experiment"; ResNet-20's own activation, ReLU.
    return [
        RunSpec(f"CBN (ρ = 1) ResNet-20 · seed {seed}",
                run_config(base, norm=cbn_spec(), placement="pre_linear", activation="relu",
                           seed=seed, probes=["cbn_ratios"]),
                {"norm": cbn_spec(), "seed": seed})
        for seed in FIG2_SEEDS]


def fig2_verdict(shares: dict[tuple[str, str], list[float | None]],
                 tiny: bool = False) -> tuple[str, str]:
    """Theorems 2–3's assumptions "can be commonly satisfied" (Figs 2–3), from per-seed shares of
    channels with 0 ≤ η ≤ 2 and 0 < τ < 1 (:func:`seed_shares`, after the start-up transient) per
    (layer, ratio).

    Primary, pre-declared: every (layer, ratio) share's seed mean significantly ≥ 0.9 (one-sample t
    against the bound, :func:`verdicts.against_bound`; a conjunction, no correction needed) → held.
    Against: some share's seed mean significantly < 0.75 after Holm's correction over the six →
    not held. Otherwise, with a missing share, fewer than 3 seeds or tiny runs: inconclusive. The
    SE of a seed mean is floored at :data:`FIG2_SE_FLOOR`."""
    if not shares or any(v is None for vs in shares.values() for v in vs):
        return ladder(unusable=True), ("no cbn_ratios measurements for some layer"
                                       + (" (tiny runs)" if tiny else ""))
    high, below_keys = _fig2_checks(shares)
    below = [f"{layer.split(' ')[0]} {ratio}" for layer, ratio in below_keys]
    n = min(len(v) for v in shares.values())
    summary = (f"share of channels in range (η ∈ [0, 2], τ ∈ (0, 1)), mean over the last "
               f"{1 - FIG2_SKIP:.0%} of training (after the start-up transient), per seed: "
               + "; ".join(f"{layer.split(' ')[0]} {ratio} "
                           + ", ".join(f"{v:.2f}" for v in vs)
                           for (layer, ratio), vs in shares.items())
               + f"; judged on the seed means against {FIG2_HELD} (held) and {FIG2_AGAINST} "
                 f"(against, Holm over the six), one-sample t, SE ≥ {FIG2_SE_FLOOR}, {n} seeds")
    primary = all(v == HELD for v, _ in high.values()) or None
    verdict = ladder(primary, unusable=tiny or n < MIN_SEEDS, against=bool(below))
    return verdict, summary + explain(
        verdict, inconclusive=" (tiny runs)" if tiny else (
            f" (fewer than {MIN_SEEDS} seeds)" if n < MIN_SEEDS else
            "; some share neither significantly ≥ 0.9 nor significantly < 0.75"),
        held="; the assumptions hold for ≥ 90 % of channels in every layer",
        not_held="; significantly below 75 % of channels: " + ", ".join(below))


def _fig2_analyze(ctx) -> Outcome:
    finished = [r for r in ctx.runs if r.status == "finished"]
    fig = panels(ctx.figure_path("eta_tau"), _band_specs(finished), ncols=3,
                 title="Peng Figs 2–3: η_k (top, bound 2) and τ_k (bottom, bound 1) across "
                       f"channels ({ctx.preset})")
    shares = seed_shares(ctx.runs)
    rows = []
    for (layer, ratio), values in shares.items():
        symbol, rng = ("η", "[0, 2]") if ratio == "eta" else ("τ", "(0, 1)")
        rows.append({"quantity": f"share of channels with {symbol} in {rng}, {layer}",
                     "ours": fmt(values, decimals=3),
                     "paper": f"“commonly satisfied” (Fig. {2 if ratio == 'eta' else 3}, no "
                              "number)"})
    verdict, summary = fig2_verdict(shares, ctx.tiny)
    return Outcome([fig], rows, verdict, summary + status_note(ctx), fig2_record(verdict, shares))


def _fig2_checks(shares) -> tuple[dict, list]:
    """Per (layer, ratio): (verdict, comparison) of the seed mean against 0.9, and the keys whose
    mean is significantly below 0.75 (Holm over the six, two-sided: as verdicts.family)."""
    high = {k: against_bound(v, FIG2_HELD, "higher", se_floor=FIG2_SE_FLOOR)
            for k, v in shares.items()}
    low = {k: against_bound(v, FIG2_AGAINST, "lower", se_floor=FIG2_SE_FLOOR)[1]
           for k, v in shares.items()}
    adjusted = holm({k: c.p for k, c in low.items()})
    return high, [k for k, p in adjusted.items() if p is not None and p < ALPHA
                  and low[k].diff < 0]


def fig2_record(verdict: str, shares: dict[tuple[str, str], list[float | None]]) -> Verdict:
    """The structured verdict of Figs 2–3: the (layer, ratio) share the verdict rests on, its seed
    mean − 0.9 (:func:`fig2_verdict`'s checks)."""
    if not shares or any(v is None for vs in shares.values() for v in vs):
        return Verdict(verdict, COMPARE_RULE)
    high, below = _fig2_checks(shares)
    outcome = {k: ladder(high[k][0], against=k in below) for k in shares}
    return conjunction_record(
        verdict, {k: c for k, (_, c) in high.items()}, "higher",
        lambda k: f"share of channels in range − {FIG2_HELD}, {k[0].split(' ')[0]} {k[1]}",
        paper=f"≥ {FIG2_HELD} (\"commonly satisfied\")", outcome=outcome)


register(Experiment(
    id="peng-fig2", paper="peng", target="Figs 2–3",
    title="Distributions of η_k (Theorem 2) and τ_k (Theorem 3) across channels during training",
    claim="The assumptions of Theorems 2 and 3, 0 ≤ η_k = (μ_B − β)/E[x] ≤ 2 and 0 < τ_k = "
          "γ/(ρσ_B) < 1, are commonly satisfied in practice (ResNet-20 with CBN, ρ = 1, CIFAR-10).",
    smoke_changes="digits at 16×16 instead of CIFAR-10, ResNet-20 at full width in Eq. 7's block "
                  "form, lr 0.05 instead of 0.1 (at 0.1 CBN diverged within 35 steps in 2 of 2 "
                  "seeds), 15 epochs (180 steps), a probe every 6 steps instead of once an epoch, "
                  "5 seeds; the verdict reads the second half of training (after the start-up "
                  "transient). E[x] is replaced by the moving average μ_A as in the paper.",
    cost={"smoke": "5 runs per block form, ≈ 55 s each with one thread, measured",
          "paper": "5 runs, 120 epochs of ResNet-20 on CIFAR-10 with a probe per epoch (GPU, "
                   "~30 min each)"},
    plan=block_plan(_fig2_runs), analyze=judged_by_block(_fig2_analyze, lambda factors: True),
    resolution=Resolution(
        "direction only: 0 ≤ η ≤ 2 and 0 < τ < 1 hold for most channels in practice (Figs 2–3)",
        "each layer's share of channels in range, mean of 5 seeds, against 0.9 (held) and 0.75 "
        "(against, Holm over the six shares) by a one-sample t with the SE floored at 0.01: "
        "shares of 1.00 in every seed clear 0.9; a mean of 0.30 with SD 0.05 falls significantly "
        "short of 0.75; layer #2 has 16 channels",
        "the pilot of 2026-11-27 at full width, lr 0.05, seeds 0–2 (layer #2 η 0.44–0.68, τ "
        "0.06–0.13; layers #8/#14 0.99–1.00)")))


# ---- Figs 8–9: sensitivity to ρ -----------------------------------------------------------------

def _fig8_runs(preset: str, residual: str) -> list[RunSpec]:
    if preset == "paper":
        # Figs 8–9's captions: VGG-16 on CIFAR-100 (§6.4's text says ResNet-20); VGG has no
        # shortcut, so both block readings are the same runs (the sweep trains them once)
        base = recipe_base("vgg16", "cifar100", "paper")
    else:
        # the earlier, cheaper smoke recipe (15 epochs, width ¼): Table 1's smoke moved to noisy
        # digits at width ½ over 40 epochs, so no runs are shared with it any more
        base = recipe_base("resnet20", "cifar10", "smoke", residual)
    runs = []
    for act in ACTIVATIONS:
        # the judged claim: 5 seeds; the rest shown
        for seed in FIG8_SEEDS if act in FIG8_JUDGED else (0,):
            runs.append(RunSpec(f"BN · {ACT_TITLE[act]} · seed {seed}",
                                run_config(base, norm="bn", placement="pre_activation",
                                           activation=act, seed=seed),
                                {"activation": act, "rho": None, "seed": seed}))
            for rho in RHO_GRID:
                runs.append(RunSpec(f"CBN ρ={rho:g} · {ACT_TITLE[act]} · seed {seed}",
                                    run_config(base, norm=cbn_spec(rho=rho), placement="pre_linear",
                                               activation=act, seed=seed),
                                    {"activation": act, "rho": rho, "seed": seed}))
    return runs


def _is_cbn(factors: dict) -> bool:
    return factors.get("rho") is not None


FIG8_JUDGED = ("sigmoid", "tanh")  # "even the worst ρ beats vanilla BN with Sigmoid or Tanh"
FIG8_SEEDS = (0, 1, 2, 3, 4)


# Design SD of one seed's final test accuracy (fraction): the root-mean-square of the pooled per-arm
# SD of worst-ρ CBN − BN for Sigmoid and Tanh in the pilot (0.033, 0.0050), the smoke run
# of 2026-11-27 (63 runs; the catalogue run of 2026-11-26 stored none of this
# entry). Its worst-ρ arms
# sat at chance with SD ≈ 0, so this is about BN's seed SD / √2: two arms that both train may
# scatter more.
FIG8_DESIGN_SD = DesignSD(0.023, "pilot: the smoke run of 2026-11-27, 3 seeds/arm, RMS "
                                 "over Sigmoid and Tanh")


def fig8_verdict(acc: dict[str, dict[float | None, list[float]]], tiny: bool = False,
                 design_sd: DesignSD = FIG8_DESIGN_SD,
                 n_test: int | None = None) -> tuple[str, str]:
    """§6.4: (a) with Sigmoid and Tanh even the worst ρ beats vanilla BN (judged); (b) Sigmoid/Tanh
    are more sensitive to ρ than ReLU/SELU/Swish (reported: range over the grid of the seed-mean
    accuracy).

    ``acc[activation][rho]`` = per-seed final test accuracies, ``rho=None`` the BN baseline. For
    (a), per judged activation, the ρ with the lowest mean against BN by :data:`common.RULE`
    (Welch's t, ≥ 3 seeds): held if higher for both, not held if lower for either (Holm over the
    two), else inconclusive with the resolvable effect. Primary, pre-declared: worst-ρ CBN − BN,
    higher, for Sigmoid and for Tanh (:func:`verdicts.conjunction`). Resolvable effects at
    ``design_sd`` (:data:`FIG8_DESIGN_SD`); SEs floored at the binomial SE on ``n_test`` test
    images.
    """
    mean = {a: {rho: sum(v) / len(v) for rho, v in d.items() if v} for a, d in acc.items()}
    found = _fig8_comparisons(acc, design_sd, n_test)
    if found is None:
        return ladder(unusable=True), ("too few finished runs for Sigmoid or Tanh"
                                       + (" (tiny runs)" if tiny else ""))
    worst, comps = found
    cbn = {a: [v for rho, v in d.items() if rho is not None] for a, d in mean.items() if len(d) > 2}
    spans = {a: max(v) - min(v) for a, v in cbn.items()}
    robust = [spans[a] for a in ("relu", "selu", "swish") if a in spans]
    summary = "worst-ρ CBN − BN test accuracy, points: " + "; ".join(
        f"{ACT_TITLE[a]} (ρ = {worst[a]:g}) {comps[a].text(100)}" for a in FIG8_JUDGED)
    robust_text = f", ReLU/SELU/Swish {sum(robust) / len(robust):.3f}" if robust else ""
    summary += ("; accuracy range over ρ (reported, not judged: one seed for ReLU/SELU/Swish): "
                f"Sigmoid/Tanh {(spans['sigmoid'] + spans['tanh']) / 2:.3f}" + robust_text
                + f"; resolvable effects at the {design_sd.text(100, ' points')}")
    few = any(c.decision == "too few seeds" for c in comps.values())
    verdict = ladder(conjunction(comps, "higher"), unusable=tiny or few)
    mde = max((c.mde for c in comps.values() if c.mde is not None), default=0.0)
    return verdict, summary + explain(
        verdict, not_held="; the worst ρ is significantly worse than BN (Holm)",
        held="; even the worst ρ beats BN with Sigmoid and Tanh",
        inconclusive=" (tiny runs)" if tiny else f"; fewer than 3 seeds ({RULE})" if few else
        f"; resolvable ≥ {100 * mde:.2g} points ({RULE})")


def _fig8_comparisons(acc, design_sd: DesignSD, n_test: int | None):
    """Per judged activation, the worst ρ (lowest mean accuracy) and worst-ρ CBN − BN; None
    without BN and two ρ for each."""
    mean = {a: {rho: sum(v) / len(v) for rho, v in d.items() if v} for a, d in acc.items()}
    if any(a not in mean or None not in mean[a] or len(mean[a]) < 3 for a in FIG8_JUDGED):
        return None
    worst = {a: min((rho for rho in mean[a] if rho is not None), key=lambda rho: mean[a][rho])
             for a in FIG8_JUDGED}
    return worst, {a: compare_arms(acc[a][None], acc[a][worst[a]], design_sd=design_sd.of(),
                                   n_test=n_test) for a in FIG8_JUDGED}


def fig8_accuracies(by_rho: dict[float | None, list]) -> dict[float | None, list[float]]:
    """Per ρ (None: BN), the runs' final test accuracies: a diverged run scores chance (rule 4:
    the arm's failure, not missing data; ReLU, SELU and Swish diverge at ρ = 0.25), a crashed one
    is left out."""
    return {rho: arm_values(runs, lambda r: r.final("test_accuracy"), CHANCE)[0]
            for rho, runs in by_rho.items()}


def _fig8_analyze(ctx) -> Outcome:
    acc: dict[str, dict] = {}
    loss_specs, acc_specs = [], []
    for act in ACTIVATIONS:
        runs = [r for r in ctx.runs if r.factors.get("activation") == act]
        if not runs:
            continue
        by_rho: dict[float | None, list] = {}
        for r in runs:
            by_rho.setdefault(r.factors.get("rho"), []).append(r)
        acc[act] = fig8_accuracies(by_rho)
        series, style = {}, {}
        for rho, rs in by_rho.items():
            name = (("BN" if rho is None else f"ρ={rho:g}")
                    + (f" (n={len(rs)})" if len(rs) > 1 else ""))
            series[name] = smooth(*mean_curve(rs, "train_loss"))
            if rho is None:
                style[name] = {"color": "k", "ls": "--"}
        loss_specs.append({"series": series, "style": style, "xlabel": "step",
                           "ylabel": "training loss", "title": ACT_TITLE[act], "logy": True})
        points = sorted((rho, sum(v) / len(v)) for rho, v in acc[act].items() if rho is not None
                        and v)
        # log2 ρ on a linear axis: −2 … 3 label the grid 0.25 … 8 readably
        acc_specs.append({"series": {"CBN": ([math.log2(p[0]) for p in points],
                                             [p[1] for p in points])},
                          "hline": (sum(acc[act][None]) / len(acc[act][None])) if acc[act].get(None)
                          else None,
                          "xlabel": "log2 ρ (dashed: BN)",
                          "ylabel": "final test accuracy, mean over seeds",
                          "markers": True, "title": ACT_TITLE[act]})
    fig_loss = safe_panels(ctx.figure_path("training_loss_vs_rho"), loss_specs, ncols=5,
                           title="Peng Fig. 8: training loss of CBN for ρ ∈ {0.25 … 8} and BN "
                                 f"({ctx.preset})")
    fig_acc = panels(ctx.figure_path("test_accuracy_vs_rho"), acc_specs, ncols=5,
                     title="Peng Figs 8–9: final test accuracy of CBN vs ρ, BN dashed "
                           f"({ctx.preset})")
    rows = []
    for act, values in acc.items():
        for rho in (None, *RHO_GRID):
            if rho not in values:
                continue
            arm = "BN" if rho is None else f"CBN ρ={rho:g}"
            ours = ("—" if not values[rho] else
                    " / ".join(f"{v:.3f}" for v in values[rho]) + f" (n={len(values[rho])})")
            paper = ("robust to ρ" if act in ("relu", "selu", "swish") else
                     "sensitive to ρ; worst ρ still beats BN")
            rows.append({"quantity": f"test accuracy · {ACT_TITLE[act]} · {arm}", "ours": ours,
                         "paper": paper + " (curves only, no numbers)"})
    config = recipe_config(ctx)
    n_test = config_test_images(config) if config else None
    verdict, summary = fig8_verdict(acc, ctx.tiny, n_test=n_test)
    return Outcome([fig_loss, fig_acc], rows, verdict, summary + status_note(ctx),
                   fig8_record(verdict, acc, n_test=n_test))


def fig8_record(verdict: str, acc: dict[str, dict[float | None, list[float]]],
                design_sd: DesignSD = FIG8_DESIGN_SD, n_test: int | None = None) -> Verdict:
    """The structured verdict of Figs 8–9: worst-ρ CBN − BN test accuracy (points) for the judged
    activation the verdict rests on (:func:`fig8_verdict`'s conjunction)."""
    found = _fig8_comparisons(acc, design_sd, n_test)
    if found is None:
        return Verdict(verdict, COMPARE_RULE)
    worst, comps = found
    return conjunction_record(
        verdict, comps, "higher",
        lambda a: f"worst-ρ CBN − BN test accuracy, {ACT_TITLE[a]} (ρ = {worst[a]:g})",
        paper="higher (direction only)", scale=100, unit=" pt")


register(Experiment(
    id="peng-fig8", paper="peng", target="Figs 8–9",
    title="Sensitivity of CBN to ρ ∈ {0.25, 0.5, 1, 2, 4, 8}, five activations",
    claim="A moderately large ρ speeds up training and lowers the final loss; Sigmoid and Tanh are "
          "sensitive to ρ, ReLU/SELU/Swish robust; even the worst ρ beats vanilla BN with Sigmoid "
          "or Tanh.",
    smoke_changes="digits, ResNet-20 at width 1/4 (the paper's figures use VGG-16 on CIFAR-100; "
                  "its text says ResNet-20), digits at 16×16, Eq. 7's block form, 15 epochs (180 "
                  "steps); Sigmoid and Tanh (the judged claim) 5 seeds per ρ and for BN, "
                  "ReLU/SELU/Swish one (shown).",
    cost={"smoke": "91 runs per block form (Sigmoid and Tanh: 5 seeds × (BN + 6 ρ); ReLU, SELU, "
                   "Swish: one seed); 63 of them took 3 min 17 s on 2 idle cores (2026-11-28)",
          "paper": "91 runs × 120 epochs of VGG-16 on CIFAR-100 (GPU)"},
    plan=block_plan(_fig8_runs), analyze=judged_by_block(_fig8_analyze, _is_cbn),
    resolution=family_resolution(
        "direction only: even the worst ρ beats vanilla BN with Sigmoid and with Tanh (§6.4, "
        "Figs 8–9)", FIG8_DESIGN_SD, 3, scale=100, unit=" points of test accuracy")))
