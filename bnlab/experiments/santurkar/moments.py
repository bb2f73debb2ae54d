"""Santurkar et al. 2018, Fig. 7: the change of a layer's activation moments between successive
steps in the standard, BN and "noisy" BN VGG networks (the runs of Fig. 2, see
:mod:`bnlab.experiments.santurkar.vgg`), judged under both readings of "significantly higher".
"""

from __future__ import annotations

import math

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import checks, conjunction, ladder
from ..resolution import family_resolution
from bnlab.formatting import fmt
from ..common import CATALOGUE_PILOT as PILOT, RULE, Comparison, DesignSD, compare_arms, safe_panels
from ..readings import combine_readings, deciding, deciding_record
from ..verdict_data import Verdict
from .common import (
    BN, NOISY, SHIFT_FACTOR, STANDARD, arm_runs, compare_text, curve_panel, inconclusive_if_tiny,
    layer_key, layer_medians, log_values, mean_train_loss, per_seed, pick, probe_layers,
    runs_by_label, vgg_runs,
)
from .vgg import FIG2_LABELS


# ---- Fig. 7: moments drift --------------------------------------------------------------------

def _fig7_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, FIG2_LABELS))


def _fig7_analyze(ctx) -> Outcome:
    runs = {label: runs_by_label(ctx).get(label) for label in FIG2_LABELS}
    specs = []
    # Layers differ in name (the conv output "features.4.0" without BN, the BN output "features.4.1"
    # with it): pair them by their block "features.4", at depths picked among the blocks every run
    # has.
    block_maps = {label: {layer.rsplit(".", 1)[0]: layer
                          for layer in probe_layers(r, "moments", "mean_change")}
                  if r is not None else {} for label, r in runs.items()}
    present = [m for m in block_maps.values() if m]
    common = sorted(set.intersection(*(set(m) for m in present)), key=layer_key) if present else []
    for block in pick(common, (0.25, 0.75)):
        for quantity, ylabel in (("mean_change", "|Δ mean|"), ("var_change", "|Δ variance|")):
            series = {}
            for label, blocks in block_maps.items():
                if block in blocks:
                    xs, ys = runs[label].series(f"probe/moments/{quantity}/{blocks[block]}")
                    if xs:
                        series[label] = (xs, ys)
            specs.append({"series": series, "xlabel": "step", "ylabel": ylabel, "logy": True,
                          "title": f"block {block} output: {ylabel} per step"})
    specs.append(curve_panel(runs, "train_loss", "training loss (block means)", "loss", logy=True))
    fig = safe_panels(ctx.figure_path("moments"), specs, ncols=3,
                 title="Santurkar Fig. 7: change of activation moments between successive steps")
    arms = arm_runs(ctx)
    changes = {label: {q: per_seed(arms.get(label), lambda r, q=q: layer_medians(r, "moments", q))
                       for q in ("mean_change", "var_change")} for label in FIG2_LABELS}
    losses = {label: per_seed(arms.get(label), mean_train_loss) for label in FIG2_LABELS}
    paper = {STANDARD: "small change of mean and variance", BN: "small change",
             NOISY: "much larger change of both moments than Standard, yet trains faster "
                    "(Figs 2, 7)"}
    table = [{"quantity": f"{label}: median |Δ mean| / |Δ var| per step; mean training loss "
                          "(per seed)",
              "ours": f"{' '.join(fmt(v) for v in changes[label]['mean_change']) or '—'} / "
                      f"{' '.join(fmt(v) for v in changes[label]['var_change']) or '—'}; "
                      f"{' '.join(fmt(v) for v in losses[label]) or '—'}",
              "paper": paper[label]} for label in FIG2_LABELS]
    verdict, summary = fig7_readings(changes, losses, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary, fig7_record(verdict, changes, losses))


# Three different quantities (ln |Δ mean|, ln |Δ variance|, ln mean training loss): one design SD
# each, the pooled per-arm SD of that comparison in the pilot (/work/notes/s5/pilot_sds.log).
FIG7_DESIGN_SD = DesignSD({"mean_change": 0.62, "var_change": 0.43, "loss": 0.24},
                          f"{PILOT}; ln scale")


FIG7_WANTED = {"mean_change": "higher", "var_change": "higher", "loss": "lower"}


def fig7_comparisons(changes: dict[str, dict[str, list[float]]], losses: dict[str, list[float]],
                     design_sd: DesignSD = FIG7_DESIGN_SD,
                     factor: float = SHIFT_FACTOR) -> dict[str, Comparison]:
    """Fig. 7's three checks: ln(noisy BN's median moment change) against ln(``factor`` ×
    standard's), for the mean and the variance, and noisy BN − standard ln mean training loss."""
    comps = {}
    for q in ("mean_change", "var_change"):
        std = [v + math.log(factor) for v in log_values(changes.get(STANDARD, {}).get(q, []))]
        comps[q] = compare_arms(std, log_values(changes.get(NOISY, {}).get(q, [])),
                                design_sd=design_sd.of(q))
    comps["loss"] = compare_arms(log_values(losses.get(STANDARD, [])),
                                 log_values(losses.get(NOISY, [])), design_sd=design_sd.of("loss"))
    return comps


def fig7_verdict(changes: dict[str, dict[str, list[float]]], losses: dict[str, list[float]],
                 tiny: str | None = None, *, design_sd: DesignSD = FIG7_DESIGN_SD,
                 factor: float = SHIFT_FACTOR) -> tuple[str, str]:
    """Fig. 7: noisy BN changes both moments per step far more than the standard network (≥
    ``factor`` ×, tested on ln values against ln(factor × standard); SHIFT_FACTOR by default) and
    still trains faster (ln mean training loss). Primary, pre-declared: the conjunction of the three
    (:func:`verdicts.conjunction`, Holm for "against"); resolvable effects at ``design_sd``."""
    if tiny:
        return ladder(unusable=True), tiny
    comps = fig7_comparisons(changes, losses, design_sd, factor)
    parts = [compare_text(comps[q], f"noisy BN − {factor:g}× standard, median |Δ "
                                    f"{q.split('_')[0]}|", log=True)
             for q in ("mean_change", "var_change")]
    parts.append(compare_text(comps["loss"], "noisy BN − standard, mean training loss", log=True))
    return conjunction(comps, FIG7_WANTED), ("per seed: " + "; ".join(parts)
                                             + f". Resolution: {design_sd.text()}. {RULE}")


# The caption's "significantly higher ICS than standard networks": bnlab's primary reading is "at
# least twice the standard network's change" (SHIFT_FACTOR); the other, "detectably higher" (a
# factor 1), is judged beside it by the same rule.
FIG7_READINGS = ((f"“significantly higher” = at least {SHIFT_FACTOR:g}× the standard network's "
                  "change", SHIFT_FACTOR),
                 ("“significantly higher” = detectably higher (× 1)", 1.0))


def fig7_readings(changes: dict[str, dict[str, list[float]]], losses: dict[str, list[float]],
                  tiny: str | None = None) -> tuple[str, str]:
    """Fig. 7 under both readings of "significantly higher" (:data:`FIG7_READINGS`, bnlab's
    primary first), combined by :func:`readings.combine_readings`."""
    if tiny:
        return ladder(unusable=True), tiny
    return combine_readings([(name, *fig7_verdict(changes, losses, factor=factor))
                             for name, factor in FIG7_READINGS])


def fig7_record(verdict: str, changes: dict[str, dict[str, list[float]]],
                losses: dict[str, list[float]]) -> Verdict:
    """The verdict as data: the check of the primary reading (≥ 2×) it rests on."""
    comps = fig7_comparisons(changes, losses)
    names = {q: f"noisy BN − {SHIFT_FACTOR:g}× standard, ln median |Δ {q.split('_')[0]}|"
             for q in ("mean_change", "var_change")}
    names["loss"] = "noisy BN − standard, ln mean training loss"
    key = deciding(checks(comps, FIG7_WANTED), comps)
    paper = "higher (direction only)" if key != "loss" else "lower (direction only)"
    return deciding_record(verdict, checks(comps, FIG7_WANTED), comps, names, paper=paper,
                           unit=" (ln)")


register(Experiment(
    id="santurkar-fig7", paper="santurkar", target="Fig. 7",
    title="Change of activation moments per step: standard, BN, noisy BN",
    claim="'Noisy' BN layers change the mean and variance of a layer's activations between "
          "successive steps far more than a standard network does, yet the network trains better "
          "(cf. Fig. 2).",
    smoke_changes="the shared smoke VGG runs of fig2 (digits at 16×16, 1/8 width, 600 steps, He "
                  "init, 3 seeds), moments probe every 15 steps; layers are the BN outputs (conv "
                  "outputs without BN), paired across networks by depth. 'Significantly higher': "
                  "Welch's t-test over seeds of ln(noisy BN's median change) against ln(2 × "
                  "standard's).",
    cost={"smoke": "≈ 5 min CPU (the 9 runs of fig2; free after fig2)",
          "paper": "the 3 runs of fig2 (GPU)"},
    plan=_fig7_plan, analyze=_fig7_analyze,
    resolution=family_resolution(
        "direction only: noisy BN's moments change far more per step than the standard "
        "network's, yet it trains faster (Figs 2, 7)", FIG7_DESIGN_SD, 3, unit=" (ln)")))

