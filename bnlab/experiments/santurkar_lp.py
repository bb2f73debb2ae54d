"""Santurkar et al. 2018 §3.3, the ℓp-normalization entries: Figs 11–13 (training and loss landscapes of VGG and
DLN under ℓ1, ℓ2, ℓ∞ batch normalizations) and Fig. 14 (VGG activation distributions under them).

Shared configurations, helpers and the statistical rule are in :mod:`bnlab.experiments.santurkar_common`.
Each verdict is a pure function of per-seed numbers, tested on synthetic values.
"""

from __future__ import annotations

from .base import Experiment, Outcome, Plan, register
from .common import RULE, compare_arms, safe_panels
from .santurkar_common import (
    BN, L1, L2, LINF, STANDARD, _curve_panel, _distribution_panel, _dln_runs, _fmt, _hist_layers, _hist_units,
    _inconclusive_if_tiny, _runs_by_label, _vgg_runs, arm_runs, combine, compare_text, decide, distribution_drift,
    dln_config, log_values, mean_train_loss, per_seed, pick, sharpness_line, vgg_config,
)
from .santurkar_dln import LANDSCAPE, _landscape_panels, landscape_summary, landscape_verdict

LP_LABELS = (STANDARD, BN, L1, L2, LINF)
SMOKE_LP_LABELS = (STANDARD, BN, L1, LINF)  # ℓ2 is BN up to where ε enters (measured equal, see docs)
NETS = (("VGG", "vgg", "Fig. 11"), ("DLN", "dln", "Fig. 12"))


def _labels(preset: str) -> tuple[str, ...]:
    return LP_LABELS if preset == "paper" else SMOKE_LP_LABELS


def _fig11_plan(preset: str) -> Plan:
    labels = _labels(preset)
    return Plan(runs=_vgg_runs(preset, labels, "VGG: ") + _dln_runs(preset, labels, "DLN: "))


def fig11_verdict(losses: dict[str, list[float]], landscapes: dict[str, list[dict]], normalized: list[str],
                  tiny: str | None = None) -> tuple[str, str]:
    """Figs 11–13: every normalization trains better (ln mean training loss) and has a smoother landscape
    (:func:`landscape_verdict`) than the standard network. Keys are ``"<net>: <label>"``; held when every
    comparison detects the claimed difference, not held when one detects the opposite."""
    if tiny:
        return "inconclusive", tiny
    verdicts, parts = [], []
    for net, _, _ in NETS:
        std = f"{net}: {STANDARD}"
        for label in normalized:
            key = f"{net}: {label}"
            c = compare_arms(log_values(losses.get(std, [])), log_values(losses.get(key, [])))
            land, comps, _ = landscape_verdict({STANDARD: landscapes.get(std, []), label: landscapes.get(key, [])},
                                               label)
            verdicts += [decide(c, "lower"), land]
            parts.append(f"{key}: loss {c.decision}, " + ", ".join(f"{LANDSCAPE[k]} {comps[k].decision}"
                                                                    for k in LANDSCAPE))
    counts = {v: verdicts.count(v) for v in ("held", "not held", "inconclusive")}
    return combine(verdicts), (f"{counts['held']} of {len(verdicts)} checks (training loss; landscape = all three "
                               f"medians) favour the normalized network detectably, {counts['not held']} the "
                               f"standard one, {counts['inconclusive']} undecided — " + "; ".join(parts)
                               + f". {RULE}")


def _fig11_analyze(ctx) -> Outcome:
    by_label, arms = _runs_by_label(ctx), arm_runs(ctx)
    labels = [l for l in LP_LABELS if f"VGG: {l}" in by_label or f"DLN: {l}" in by_label]
    figures, table, losses, landscapes = [], [], {}, {}
    for net, fig_name, target in NETS:
        runs = {label: by_label.get(f"{net}: {label}") for label in labels}
        lr = (vgg_config if net == "VGG" else dln_config)(ctx.preset, "none")["lr"]
        specs = [_curve_panel(runs, "train_loss", f"(a) {net} training loss", "loss", logy=True)]
        specs += _landscape_panels(runs, f"{net}: ", lr)
        figures.append(safe_panels(ctx.figure_path(f"{fig_name}_lp"), specs, ncols=5,
                                   title=f"Santurkar {target}: {net} with ℓp normalizations (seed 0)"))
        for label in labels:
            key = f"{net}: {label}"
            losses[key] = per_seed(arms.get(key), mean_train_loss)
            landscapes[key] = [landscape_summary(r) for r in arms.get(key, [])]
            table.append({"quantity": f"{key}: mean training loss; median loss range; median β (per seed)",
                          "ours": "; ".join(" ".join(_fmt(v) for v in values) or "—" for values in (
                              losses[key], [s["loss_range"] for s in landscapes[key]],
                              [s["beta_smoothness"] for s in landscapes[key]])),
                          "paper": "worst training, roughest landscape" if label == STANDARD else
                                   "trains better and smoother than Standard (Figs 11–13)"})
    normalized = [l for l in labels if l != STANDARD]
    verdict, summary = fig11_verdict(losses, landscapes, normalized, _inconclusive_if_tiny(ctx))
    def lr_of(net: str) -> float:
        return (vgg_config if net == "VGG" else dln_config)(ctx.preset, "none")["lr"]

    lines = "; ".join(f"{net}: " + sharpness_line({l: arms.get(f"{net}: {l}", []) for l in labels}, lr_of(net))
                      for net, _, _ in NETS)
    return Outcome(figures, table, verdict, f"{summary} {lines}")


register(Experiment(
    id="santurkar-fig11", paper="santurkar", target="Figs 11–13",
    title="ℓp normalizations (ℓ1, ℓ2, ℓ∞) against standard and BN: training and landscapes",
    claim="Every normalization — BN and the ℓ1, ℓ2, ℓ∞ batch normalizations, which do not fix the mean and "
          "variance of the activations — trains better than the standard network and makes its loss landscape "
          "smoother (smaller loss range and β-smoothness along the gradient), for the VGG and the DLN.",
    smoke_changes="the shared smoke VGG (digits at 16×16, 1/8 width, 600 steps, He init) and DLN (600 steps, lr "
                  "1e-3) runs, 3 seeds each, with norms none, bn, lp_bn(p=1) and lp_bn(p=inf) (Hoffer's top-10 "
                  "scale); ℓ2 is left to the paper preset to stay in budget (it is BN up to where ε enters). "
                  "Landscapes every 30 (VGG) / 25 (DLN) steps, histograms every 20 / 10, hessian every 100 / 50. "
                  "Verdict: Welch's t-test over seeds (ln scale) per normalization, criterion and network.",
    cost={"smoke": "≈ 10 min CPU (12 VGG + 12 DLN runs; none/bn shared with the other entries)",
          "paper": "15 VGG × 15 000 steps on CIFAR-10 + 15 DLN × 10 000 steps (GPU, ≈ 6 h)"},
    plan=_fig11_plan, analyze=_fig11_analyze))


# ---- Fig. 14: activation distributions under the ℓp normalizations ---------------------------------

def _fig14_plan(preset: str) -> Plan:
    return Plan(runs=_vgg_runs(preset, _labels(preset), "VGG: "))


def fig14_verdict(drift: dict[str, list[float]], losses: dict[str, list[float]], lp: list[str],
                  tiny: str | None = None) -> tuple[str, str]:
    """Fig. 14: the ℓp normalizations shift the activation distributions more than the standard ('normal')
    network does (per-seed median drift, :func:`distribution_drift`), yet train better (ln mean training
    loss). BN's drift is reported beside it (the caption's "normal networks" could also mean BN)."""
    if tiny:
        return "inconclusive", tiny
    verdicts, parts = [], []
    for label in lp:
        more = compare_arms(drift.get(STANDARD, []), drift.get(label, []))
        better = compare_arms(log_values(losses.get(STANDARD, [])), log_values(losses.get(label, [])))
        vs_bn = compare_arms(drift.get(BN, []), drift.get(label, []))
        verdicts += [decide(more, "higher"), decide(better, "lower")]
        parts.append(f"{label}: {compare_text(more, 'drift − standard')}, drift vs BN {vs_bn.decision}, "
                     f"{compare_text(better, 'mean training loss − standard', log=True)}")
    return combine(verdicts), "per seed: " + "; ".join(parts) + f". {RULE}"


def _fig14_analyze(ctx) -> Outcome:
    by_label, arms = _runs_by_label(ctx), arm_runs(ctx)
    labels = [l for l in LP_LABELS if f"VGG: {l}" in by_label]
    specs = []
    for label in labels:
        r = by_label[f"VGG: {label}"]
        units = _hist_units(r)
        for layer in pick(_hist_layers(r), (0.25, 0.75)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(_distribution_panel(r, unit, f"{label}: {unit}"))
    fig = safe_panels(ctx.figure_path("vgg_lp_activations"), specs or [{"title": "no activation histograms"}],
                      ncols=4, title="Santurkar Fig. 14: VGG activation distributions under ℓp normalizations (seed 0)")
    drift = {l: per_seed(arms.get(f"VGG: {l}"), distribution_drift) for l in labels}
    losses = {l: per_seed(arms.get(f"VGG: {l}"), mean_train_loss) for l in labels}
    table = [{"quantity": f"VGG {l}: median distribution drift; mean training loss (per seed)",
              "ours": f"{' '.join(_fmt(v) for v in drift[l]) or '—'}; {' '.join(_fmt(v) for v in losses[l]) or '—'}",
              "paper": "ℓp: larger distributional shift than normal networks, yet better optimization (Fig. 14)"
              if l in (L1, L2, LINF) else "reference"} for l in labels]
    lp = [l for l in labels if l in (L1, L2, LINF)]
    verdict, summary = fig14_verdict(drift, losses, lp, _inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="santurkar-fig14", paper="santurkar", target="Fig. 14",
    title="VGG activation distributions under ℓp normalizations",
    claim="The ℓp normalizations lead to a larger distributional shift of the activations than normal networks "
          "over training, yet optimize better.",
    smoke_changes="the VGG runs of fig11 (digits at 16×16, 1/8 width, 600 steps, 3 seeds; 2 sampled units per "
                  "layer every 20 steps). The shift is a scale-free drift of each sampled unit's distribution "
                  "from the first to the last measurement (centre shift in initial 5–95 % spreads + |ln width "
                  "ratio|), median over units; compared with the standard network (and reported against BN).",
    cost={"smoke": "≈ 6.5 min CPU (12 VGG runs, shared with fig11)",
          "paper": "the 15 VGG runs of fig11 (GPU)"},
    plan=_fig14_plan, analyze=_fig14_analyze))
