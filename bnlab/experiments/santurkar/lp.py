"""Santurkar et al. 2018 §3.3, the ℓp-normalization entries: Figs 11–13 (training and loss
landscapes of VGG and DLN under ℓ1, ℓ2, ℓ∞ batch normalizations) and Fig. 14 (VGG activation
distributions under them): their plans and analyses.

Their verdicts, pure functions of per-seed numbers under every reading of the paper that can move
them (the DLN's rate for Figs 11–13, the caption's "normal networks" for Fig. 14), are in
:mod:`bnlab.experiments.santurkar.lp_verdicts`; shared configurations and helpers in
:mod:`bnlab.experiments.santurkar.common`.
"""

from __future__ import annotations

from ..base import Experiment, Outcome, Plan, register
from ..resolution import family_resolution
from bnlab.formatting import fmt
from ..common import safe_panels
from .common import (
    DLN_LR, LITERAL_LR, STANDARD, curve_panel, distribution_panel, dln_runs, hist_layers,
    hist_units, inconclusive_if_tiny, runs_by_label, vgg_runs, arm_runs, distribution_drift,
    mean_train_loss, per_seed, pick, sharpness_line, vgg_config,
)
from .dln import landscape_panels, landscape_summary
from .lp_verdicts import (
    FIG11_DESIGN_SD, FIG14_DESIGN_SD, LITERAL_NET, LP, LP_LABELS, fig11_readings, fig11_record,
    fig14_readings, fig14_record,
)

# The networks of fig11's figures and table: (name = arm prefix before ": ", figure name, the
# paper's figure, the DLN's rate); the DLN at both readings of the paper's rate.
FIG11_NETS = (("VGG", "vgg", "Fig. 11", None), ("DLN", "dln", "Fig. 12", DLN_LR),
              (LITERAL_NET, "dln_literal_lr", "Fig. 12", LITERAL_LR))


def _fig11_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, LP_LABELS, "VGG: ") + dln_runs(preset, LP_LABELS, "DLN: ")
                + dln_runs(preset, LP_LABELS, f"{LITERAL_NET}: ", LITERAL_LR))


def _fig11_analyze(ctx) -> Outcome:
    by_label, arms = runs_by_label(ctx), arm_runs(ctx)
    labels = [label for label in LP_LABELS
              if any(f"{net}: {label}" in by_label for net, *_ in FIG11_NETS)]
    figures, table, losses, landscapes, lines = [], [], {}, {}, []
    for net, fig_name, target, dln_lr in FIG11_NETS:
        lr = vgg_config(ctx.preset, "none")["lr"] if dln_lr is None else dln_lr
        if net == LITERAL_NET and not any(f"{net}: {label}" in arms for label in labels):
            continue  # a store from before the second reading: its figure and rows are left out
        runs = {label: by_label.get(f"{net}: {label}") for label in labels}
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
        lines.append(f"{net}: " + sharpness_line({label: arms.get(f"{net}: {label}", [])
                                                  for label in labels}, lr))
    verdict, summary = fig11_readings(losses, landscapes, inconclusive_if_tiny(ctx))
    return Outcome(figures, table, verdict, f"{summary} {'; '.join(lines)}",
                   fig11_record(verdict, losses, landscapes))


register(Experiment(
    id="santurkar-fig11", paper="santurkar", target="Figs 11–13",
    title="ℓp normalizations (ℓ1, ℓ2, ℓ∞) against standard and BN: training and landscapes",
    claim="Every normalization — BN and the ℓ1, ℓ2, ℓ∞ batch normalizations, which do not fix the "
          "mean and variance of the activations — trains better than the standard network and "
          "makes its loss landscape smoother (smaller loss range and β-smoothness along the "
          "gradient), for the VGG and the DLN (Figs 11–12); every ℓp normalization trains "
          "comparably to BN or better (Fig. 13).",
    smoke_changes="the shared smoke VGG (digits at 16×16, 1/8 width, 600 steps, He init) and DLN "
                  "(600 steps) runs, 3 seeds each, with every arm the paper names: norms none, "
                  "bn, lp_bn(p=1), lp_bn(p=2) and lp_bn(p=inf) (Hoffer's top-10 scale). The DLN "
                  "is trained at both readings of the paper's rate, each its own runs: lr 1e-3 "
                  "(bnlab's conversion, primary) and the literal 1e-2 (the standard and BN arms "
                  "are fig9's); the entry holds or fails only where both agree, else it is "
                  "reading-dependent (inconclusive) with both readings' numbers. Landscapes every "
                  "30 (VGG) / 25 (DLN) steps, histograms every 20 / 10, hessian every 100 / 50. "
                  "Verdict: Welch's t-test over seeds (ln scale) per normalization, criterion and "
                  "network; Fig. 13's 'comparably' = loss below 1.25× BN's.",
    cost={"smoke": "15 VGG + 15 DLN runs at lr 1e-3 (none/bn shared with the other entries): "
                   "measured 7.5 min CPU, 15.6 min wall on 2 cores under a load average of 3–6 "
                   "(one thread); the 15 DLN runs at lr 1e-2 (6 shared with fig9): 3–17 s each, "
                   "≈ 2.5 min wall (one thread, 2026-12-06)",
          "paper": "15 VGG × 15 000 steps on CIFAR-10 + 30 DLN × 10 000 steps (GPU, ≈ 7 h)"},
    plan=_fig11_plan, analyze=_fig11_analyze,
    resolution=family_resolution(
        "direction only: BN and ℓ1/ℓ2/ℓ∞ BN each train faster and have a smoother landscape than "
        "the standard network (Figs 11–12); ℓp trains comparably to or better than BN (Fig. 13)",
        FIG11_DESIGN_SD, 3, unit=" (ln)")))


# ---- Fig. 14: activation distributions under the ℓp normalizations -------------------------------

def _fig14_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, LP_LABELS, "VGG: "))


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
    verdict, summary = fig14_readings(drift, losses, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary, fig14_record(verdict, drift, losses))


register(Experiment(
    id="santurkar-fig14", paper="santurkar", target="Fig. 14",
    title="VGG activation distributions under ℓp normalizations",
    claim="The ℓp normalizations lead to a larger distributional shift of the activations than "
          "normal networks over training, yet optimize better.",
    smoke_changes="the VGG runs of fig11 (digits at 16×16, 1/8 width, 600 steps, 3 seeds, norms "
                  "none, bn and the paper's three ℓp: p = 1, 2, ∞; 2 sampled units per layer every "
                  "20 steps). The shift is a scale-free drift of each sampled unit's distribution "
                  "from the first to the last measurement (centre shift in initial 5–95 % spreads "
                  "+ |ln width ratio|), median over units. The caption's 'normal networks' is "
                  "judged in both readings: the standard network (primary: ℓp drifts more and "
                  "trains better) and the BN network (ℓp drifts more and trains comparably or "
                  "better, Fig. 13's 'loss below 1.25× BN's'); the entry holds or fails only where "
                  "both agree, else it is reading-dependent (inconclusive) with both readings' "
                  "numbers.",
    cost={"smoke": "the 15 VGG runs of fig11: measured 10.7 min wall on 2 cores under a load "
                   "average of 3–5",
          "paper": "the 15 VGG runs of fig11 (GPU)"},
    plan=_fig14_plan, analyze=_fig14_analyze,
    resolution=family_resolution(
        "direction only: ℓp BN's activations drift as much as or more than the standard "
        "network's, yet they train faster (Fig. 14)", FIG14_DESIGN_SD, 3)))
