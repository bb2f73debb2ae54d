"""Santurkar et al. 2018 §3.3, the ℓp-normalization entries: Figs 11–13 (training and loss
landscapes of VGG and DLN under ℓ1, ℓ2, ℓ∞ batch normalizations) and Fig. 14 (VGG activation
distributions under them).

Shared configurations, helpers and the statistical rule are in
:mod:`bnlab.experiments.santurkar.common`. Each verdict is a pure function of per-seed numbers,
tested on synthetic values.
"""

from __future__ import annotations

import math

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import checks, combine, ladder, tally
from ..resolution import family_resolution
from bnlab.formatting import fmt
from ..common import CATALOGUE_PILOT as PILOT, RULE, DesignSD, compare_arms, safe_panels
from .common import (
    BN, L1, L2, LINF, STANDARD, curve_panel, distribution_panel, dln_runs, hist_layers,
    hist_units, inconclusive_if_tiny, runs_by_label, vgg_runs, arm_runs, compare_text,
    distribution_drift, dln_config, log_values, mean_train_loss, per_seed, pick, sharpness_line,
    vgg_config,
)
from .dln import LANDSCAPE, landscape_panels, landscape_summary, landscape_verdict

# Every arm the paper names (Figs 11–14: ℓ1, ℓ2 and ℓ∞ beside standard and BN), in both presets.
LP_LABELS = (STANDARD, BN, L1, L2, LINF)
NETS = (("VGG", "vgg", "Fig. 11"), ("DLN", "dln", "Fig. 12"))
NORMALIZED = (BN, L1, L2, LINF)  # Figs 11–12: every one against the standard network
LP = (L1, L2, LINF)              # Fig. 13 (against BN) and Fig. 14
# Fig. 13 "comparably or even better than BatchNorm": an ℓp network's mean training loss counts as
# comparable up to this factor above BN's (tested on ln values against ln(COMPARABLE_FACTOR × BN),
# as fig6's tolerance).
COMPARABLE_FACTOR = 1.25


def _fig11_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, LP_LABELS, "VGG: ") + dln_runs(preset, LP_LABELS, "DLN: "))


# Per network (VGG's cross-entropy and the DLN's squared loss are different quantities) and per
# quantity, all on a ln scale: the root-mean-square of the pooled per-arm SDs of that quantity's
# comparisons in the pilot (/work/notes/s5/pilot_sds.log): "loss" pools Figs 11–12's four
# normalizations against standard, "loss vs BN" Fig. 13's three against 1.25× BN (in VGG the
# standard arm scatters four times as much as BN's); the landscape medians pool the four
# normalizations.
FIG11_DESIGN_SD = DesignSD(
    {"VGG loss": 0.24, "VGG loss vs BN": 0.049, "VGG loss_range": 2.2,
     "VGG grad_change_max": 1.1, "VGG beta_smoothness": 0.20, "DLN loss": 0.25,
     "DLN loss vs BN": 0.26, "DLN loss_range": 0.64, "DLN grad_change_max": 0.54,
     "DLN beta_smoothness": 0.26},
    f"{PILOT}; ln scale")


def fig11_verdict(losses: dict[str, list[float]], landscapes: dict[str, list[dict]],
                  tiny: str | None = None, *,
                  design_sd: DesignSD = FIG11_DESIGN_SD) -> tuple[str, str]:
    """Figs 11–13 for every arm the paper names (keys ``"<net>: <label>"``, per-seed values; a
    missing arm leaves its checks undecided). Figs 11–12: BN, ℓ1, ℓ2 and ℓ∞ each train better (ln
    mean training loss) and have a smoother landscape (:func:`landscape_verdict`: all three medians)
    than the standard network. Fig. 13: each ℓp network trains "comparably or even better than
    BatchNorm" — its ln mean training loss detectably below ln(COMPARABLE_FACTOR × BN's). Primary,
    pre-declared: the conjunction of these checks (:func:`verdicts.checks`): held when every check
    detects the claim, not held when one detects the opposite after Holm's correction over all of
    them (22 uncorrected checks gave a spurious opposite result 43 % of the time), else
    inconclusive (the parts give each check's resolvable effect, at ``design_sd``: keys
    "<net> loss" and "<net> <landscape quantity>")."""
    if tiny:
        return ladder(unusable=True), tiny
    figs, fig13, parts, parts13 = {}, {}, [], []
    for net, _, _ in NETS:
        std = f"{net}: {STANDARD}"
        for label in NORMALIZED:
            key = f"{net}: {label}"
            c = compare_arms(log_values(losses.get(std, [])), log_values(losses.get(key, [])),
                             design_sd=design_sd.of(f"{net} loss"))
            pair = {STANDARD: landscapes.get(std, []), label: landscapes.get(key, [])}
            _, comps, _ = landscape_verdict(pair, label, design_sd=design_sd, key_prefix=f"{net} ")
            figs.update({(key, "loss"): c, **{(key, k): comps[k] for k in LANDSCAPE}})
            parts.append(f"{key}: loss {c.decision}, "
                         + ", ".join(f"{LANDSCAPE[k]} {comps[k].decision}" for k in LANDSCAPE))
        bn = [v + math.log(COMPARABLE_FACTOR) for v in log_values(losses.get(f"{net}: {BN}", []))]
        for label in LP:
            ours = log_values(losses.get(f"{net}: {label}", []))
            c = fig13[(net, label)] = compare_arms(bn, ours,
                                                   design_sd=design_sd.of(f"{net} loss vs BN"))
            what = f"{label} − {COMPARABLE_FACTOR:g}× BN, mean training loss"
            parts13.append(f"{net}: " + compare_text(c, what, log=True))
    outcome = checks({**figs, **fig13}, "lower")
    # per arm, as in the figures: the loss check and the landscape check (all three medians)
    per_arm = [v for key in dict.fromkeys(key for key, _ in figs)
               for v in (outcome[(key, "loss")], combine([outcome[(key, k)] for k in LANDSCAPE]))]
    summary = ("Figs 11–12, against the standard network (training loss; landscape = all three "
               f"medians): {tally(per_arm)} — " + "; ".join(parts)
               + f". Fig. 13, ℓp comparable to BN (loss below {COMPARABLE_FACTOR:g}× BN's): "
               f"{tally(outcome[k] for k in fig13)} — " + "; ".join(parts13)
               + f". Holm over all {len(outcome)} checks for 'against'. Resolution: "
               f"{design_sd.text()}. {RULE}")
    return combine(list(outcome.values())), summary


def _fig11_analyze(ctx) -> Outcome:
    by_label, arms = runs_by_label(ctx), arm_runs(ctx)
    labels = [label for label in LP_LABELS if f"VGG: {label}" in by_label
              or f"DLN: {label}" in by_label]
    figures, table, losses, landscapes = [], [], {}, {}
    for net, fig_name, target in NETS:
        runs = {label: by_label.get(f"{net}: {label}") for label in labels}
        lr = (vgg_config if net == "VGG" else dln_config)(ctx.preset, "none")["lr"]
        specs = [curve_panel(runs, "train_loss", f"(a) {net} training loss", "loss", logy=True)]
        specs += landscape_panels(runs, f"{net}: ", lr)
        title = f"Santurkar {target}: {net} with ℓp normalizations (seed 0)"
        figures.append(safe_panels(ctx.figure_path(f"{fig_name}_lp"), specs, ncols=5, title=title))
        for label in labels:
            key = f"{net}: {label}"
            losses[key] = per_seed(arms.get(key), mean_train_loss)
            landscapes[key] = [landscape_summary(r) for r in arms.get(key, [])]
            table.append({"quantity": f"{key}: mean training loss; median loss range; median β "
                                      "(per seed)",
                          "ours": "; ".join(" ".join(fmt(v) for v in values) or "—" for values in (
                              losses[key], [s["loss_range"] for s in landscapes[key]],
                              [s["beta_smoothness"] for s in landscapes[key]])),
                          "paper": "worst training, roughest landscape" if label == STANDARD else
                                   "trains better and smoother than Standard (Figs 11–12)" + (
                                       ", comparably to or better than BN (Fig. 13)" if label in LP
                                       else "")})
    verdict, summary = fig11_verdict(losses, landscapes, inconclusive_if_tiny(ctx))

    def lr_of(net: str) -> float:
        return (vgg_config if net == "VGG" else dln_config)(ctx.preset, "none")["lr"]

    def line(net: str) -> str:
        return f"{net}: " + sharpness_line({label: arms.get(f"{net}: {label}", [])
                                            for label in labels}, lr_of(net))

    lines = "; ".join(line(net) for net, _, _ in NETS)
    return Outcome(figures, table, verdict, f"{summary} {lines}")


register(Experiment(
    id="santurkar-fig11", paper="santurkar", target="Figs 11–13",
    title="ℓp normalizations (ℓ1, ℓ2, ℓ∞) against standard and BN: training and landscapes",
    claim="Every normalization — BN and the ℓ1, ℓ2, ℓ∞ batch normalizations, which do not fix the "
          "mean and variance of the activations — trains better than the standard network and "
          "makes its loss landscape smoother (smaller loss range and β-smoothness along the "
          "gradient), for the VGG and the DLN (Figs 11–12); every ℓp normalization trains "
          "comparably to BN or better (Fig. 13).",
    smoke_changes="the shared smoke VGG (digits at 16×16, 1/8 width, 600 steps, He init) and DLN "
                  "(600 steps, lr 1e-3) runs, 3 seeds each, with every arm the paper names: norms "
                  "none, bn, lp_bn(p=1), lp_bn(p=2) and lp_bn(p=inf) (Hoffer's top-10 scale). "
                  "Landscapes every 30 (VGG) / 25 (DLN) steps, histograms every 20 / 10, hessian "
                  "every 100 / 50. Verdict: Welch's t-test over seeds (ln scale) per "
                  "normalization, criterion and network; Fig. 13's 'comparably' = loss below 1.25× "
                  "BN's.",
    cost={"smoke": "15 VGG + 15 DLN runs (none/bn shared with the other entries): measured 7.5 min "
                   "CPU, 15.6 min wall on 2 cores under a load average of 3–6 (one thread)",
          "paper": "15 VGG × 15 000 steps on CIFAR-10 + 15 DLN × 10 000 steps (GPU, ≈ 6 h)"},
    plan=_fig11_plan, analyze=_fig11_analyze,
    resolution=family_resolution(
        "direction only: BN and ℓ1/ℓ2/ℓ∞ BN each train faster and have a smoother landscape than "
        "the standard network (Figs 11–12); ℓp trains comparably to or better than BN (Fig. 13)",
        FIG11_DESIGN_SD, 3, unit=" (ln)")))


# ---- Fig. 14: activation distributions under the ℓp normalizations -------------------------------

def _fig14_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, LP_LABELS, "VGG: "))


# Two quantities (the drift, the ln mean training loss): one design SD each, the root-mean-square
# over the three ℓp arms of the pooled per-arm SDs in the pilot (/work/notes/s5/pilot_sds.log).
FIG14_DESIGN_SD = DesignSD({"drift": 0.17, "loss": 0.24}, f"{PILOT}; loss on a ln scale")


def fig14_verdict(drift: dict[str, list[float]], losses: dict[str, list[float]],
                  tiny: str | None = None, *,
                  design_sd: DesignSD = FIG14_DESIGN_SD) -> tuple[str, str]:
    """Fig. 14 for every ℓp arm the paper names (ℓ1, ℓ2, ℓ∞; a missing arm leaves its checks
    undecided): each shifts the activation distributions more than the standard ('normal') network
    does (per-seed median drift, :func:`distribution_drift`), yet trains better (ln mean training
    loss). BN's drift is reported beside it (the caption's "normal networks" could also mean BN).
    Primary, pre-declared: the conjunction of the six checks (:func:`verdicts.checks`, Holm over
    them for "against"); resolvable effects at ``design_sd``."""
    if tiny:
        return ladder(unusable=True), tiny
    comps, wanted, parts = {}, {}, []
    for label in LP:
        more = compare_arms(drift.get(STANDARD, []), drift.get(label, []),
                            design_sd=design_sd.of("drift"))
        better = compare_arms(log_values(losses.get(STANDARD, [])),
                              log_values(losses.get(label, [])), design_sd=design_sd.of("loss"))
        vs_bn = compare_arms(drift.get(BN, []), drift.get(label, []))
        comps.update({(label, "drift"): more, (label, "loss"): better})
        wanted.update({(label, "drift"): "higher", (label, "loss"): "lower"})
        parts.append(f"{label}: {compare_text(more, 'drift − standard')}, drift vs BN "
                     f"{vs_bn.decision}, "
                     f"{compare_text(better, 'mean training loss − standard', log=True)}")
    outcome = checks(comps, wanted)
    return combine(list(outcome.values())), (
        f"per seed, {tally(outcome.values())} (Holm over the checks for 'against'): "
        + "; ".join(parts) + f". Resolution: {design_sd.text()}. {RULE}")


def _fig14_analyze(ctx) -> Outcome:
    by_label, arms = runs_by_label(ctx), arm_runs(ctx)
    labels = [label for label in LP_LABELS if f"VGG: {label}" in by_label]
    specs = []
    for label in labels:
        r = by_label[f"VGG: {label}"]
        units = hist_units(r)
        for layer in pick(hist_layers(r), (0.25, 0.75)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(distribution_panel(r, unit, f"{label}: {unit}"))
    fig = safe_panels(ctx.figure_path("vgg_lp_activations"),
                      specs or [{"title": "no activation histograms"}], ncols=4,
                      title="Santurkar Fig. 14: VGG activation distributions under ℓp "
                            "normalizations (seed 0)")
    drift = {label: per_seed(arms.get(f"VGG: {label}"), distribution_drift) for label in labels}
    losses = {label: per_seed(arms.get(f"VGG: {label}"), mean_train_loss) for label in labels}
    table = [{"quantity": f"VGG {label}: median distribution drift; mean training loss (per seed)",
              "ours": f"{' '.join(fmt(v) for v in drift[label]) or '—'}; "
                      f"{' '.join(fmt(v) for v in losses[label]) or '—'}",
              "paper": "ℓp: larger distributional shift than normal networks, yet better "
                       "optimization (Fig. 14)"
              if label in LP else "reference"} for label in labels]
    verdict, summary = fig14_verdict(drift, losses, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="santurkar-fig14", paper="santurkar", target="Fig. 14",
    title="VGG activation distributions under ℓp normalizations",
    claim="The ℓp normalizations lead to a larger distributional shift of the activations than "
          "normal networks over training, yet optimize better.",
    smoke_changes="the VGG runs of fig11 (digits at 16×16, 1/8 width, 600 steps, 3 seeds, norms "
                  "none, bn and the paper's three ℓp: p = 1, 2, ∞; 2 sampled units per layer every "
                  "20 steps). The shift is a scale-free drift of each sampled unit's distribution "
                  "from the first to the last measurement (centre shift in initial 5–95 % spreads "
                  "+ |ln width ratio|), median over units; compared with the standard network (and "
                  "reported against BN).",
    cost={"smoke": "the 15 VGG runs of fig11: measured 10.7 min wall on 2 cores under a load "
                   "average of 3–5",
          "paper": "the 15 VGG runs of fig11 (GPU)"},
    plan=_fig14_plan, analyze=_fig14_analyze,
    resolution=family_resolution(
        "direction only: ℓp BN's activations drift as much as or more than the standard "
        "network's, yet they train faster (Fig. 14)", FIG14_DESIGN_SD, 3)))
