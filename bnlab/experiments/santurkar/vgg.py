"""Santurkar et al. 2018, the VGG entries: Fig. 2 (standard / BN / noisy BN) and Fig. 6 (ICS);
Fig. 7 (moments) is in :mod:`bnlab.experiments.santurkar.moments`.

Shared configurations, helpers and the statistical rule are in
:mod:`bnlab.experiments.santurkar.common`. Each verdict is a pure function of per-seed numbers
(``fig2_verdict`` ...), tested on synthetic values.
"""

from __future__ import annotations

import math

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import checks, combine, conjunction, ladder
from ..resolution import family_resolution
from bnlab.formatting import fmt
from ..common import CATALOGUE_PILOT as PILOT, RULE, Comparison, DesignSD, compare_arms, safe_panels
from ..readings import combine_readings, deciding, deciding_record
from ..verdict_data import Verdict
from .common import (
    BN, COS_TOLERANCE, DLN_LR, LITERAL_LR,
    NOISY, STANDARD, curve_panel, distribution_panel, dln_runs,
    first_layer_zero, hist_layers, hist_units, inconclusive_if_tiny, layer_medians, finite_median,
    runs_by_label, finite_values, vgg_runs, arm_runs, compare_text, log_values,
    mean_train_loss, per_seed, pick, probe_layers, sharpness_line, sharpness_panel, vgg_config,
)

# ---- Fig. 2: standard vs BN vs "noisy" BN ------------------------------------------------------

FIG2_LABELS = (STANDARD, BN, NOISY)


def _fig2_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, FIG2_LABELS))


def _fig2_analyze(ctx) -> Outcome:
    runs = {label: runs_by_label(ctx).get(label) for label in FIG2_LABELS}
    specs = [curve_panel(runs, "train_loss", "training loss (block means)", "loss", logy=True),
             curve_panel(runs, "train_accuracy", "training accuracy (batch, block means)",
                         "accuracy"),
             curve_panel(runs, "test_accuracy", "test accuracy", "accuracy", points=200)]
    for label in (BN, NOISY):
        r = runs.get(label)
        units = hist_units(r)
        layers = hist_layers(r)
        for layer in pick(layers, (0.2, 0.8)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(distribution_panel(r, unit, f"{label}: activation {unit}"))
    arms = arm_runs(ctx)
    losses = {label: per_seed(arms.get(label), mean_train_loss) for label in FIG2_LABELS}
    finals = {label: (r.final("train_accuracy") if r is not None else None,
                      r.final("test_accuracy") if r is not None else None)
              for label, r in runs.items()}
    paper = {STANDARD: "trains slowest; test acc. 80 % (App. A.1, CIFAR-10, no augmentation)",
             BN: "trains fastest; test acc. 83 % (App. A.1)",
             NOISY: "trains like BN, faster than Standard, despite the noise (Fig. 2)"}
    table = [{"quantity": f"{label}: mean training loss per seed / seed 0's final train acc. / "
                          "test acc.",
              "ours": f"{' '.join(fmt(v) for v in losses[label]) or '—'} / {fmt(finals[label][0])} "
                      f"/ {fmt(finals[label][1])}",
              "paper": paper[label]} for label in FIG2_LABELS]
    lr = vgg_config(ctx.preset, "none")["lr"]
    fig = safe_panels(ctx.figure_path("training_curves"), specs + [sharpness_panel(runs, lr)],
                      ncols=3, title="Santurkar Fig. 2: VGG with standard, BN and noisy BN layers "
                                     "(seed 0)")
    verdict, summary = fig2_verdict(losses, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, f"{summary}; {sharpness_line(arms, lr)}",
                   fig2_record(verdict, losses))


# "trains as well as BN": noisy BN's mean training loss within a factor 1.25 of BN's
NOISY_MARGIN = math.log(1.25)
# One per check, ln mean training loss, the pooled per-arm SDs of the pilot: the standard arm
# scatters four times as much as BN's and noisy BN's, so one pooled number would state check (2)'s
# resolution at the standard network's spread (ln 0.55 against its margin ln 1.25 = 0.22).
FIG2_DESIGN_SD = DesignSD({"vs standard": 0.24, "vs BN": 0.059}, f"{PILOT}; ln loss")


def fig2_verdict(losses: dict[str, list[float]], tiny: str | None = None, *,
                 design_sd: DesignSD = FIG2_DESIGN_SD) -> tuple[str, str]:
    """Fig. 2, both halves of the claim. Per seed, the mean training loss over the run (area under
    the curve, ln scale: ∞ for a diverged run). (1) noisy BN trains faster than the standard
    network: noisy − standard detectably lower (:func:`compare_arms`). (2) noisy BN trains as well
    as BN, pre-declared as "within a factor 1.25": held when noisy − (BN + ln 1.25) is detectably
    negative, not held when noisy − (BN + ln 1.25) is detectably positive (noisy BN worse than BN by
    more than the margin), else inconclusive. Both halves held → held; either not held → not held
    (after Holm's correction over the two, :func:`verdicts.checks`). Primary, pre-declared: the
    conjunction of (1) and (2). Each check's resolvable effect is stated at ``design_sd``."""
    if tiny:
        return ladder(unusable=True), tiny
    std, bn, noisy = (log_values(losses.get(k, [])) for k in (STANDARD, BN, NOISY))
    c = compare_arms(std, noisy, design_sd=design_sd.of("vs standard"))
    margin = compare_arms([v + NOISY_MARGIN for v in bn], noisy, design_sd=design_sd.of("vs BN"))
    plain = compare_arms(bn, noisy, design_sd=design_sd.of("vs BN"))
    first, second = checks({1: c, 2: margin}, "lower").values()
    return combine([first, second]), (
        f"(1) noisy BN − standard, {compare_text(c, 'mean training loss per seed', log=True)} → "
        f"{first}; (2) noisy BN − BN {compare_text(plain, 'same', log=True)}; against the margin "
        f"ln 1.25: {margin.decision} → {second}. Resolution: {design_sd.text()}. {RULE}")


def fig2_record(verdict: str, losses: dict[str, list[float]], *,
                design_sd: DesignSD = FIG2_DESIGN_SD) -> Verdict:
    """The verdict as data: the check of :func:`fig2_verdict` it rests on
    (:func:`readings.deciding`). Check (2) is judged against the margin; its record is noisy BN −
    BN itself (the number the summary prints), the paper's side the margin ln 1.25."""
    std, bn, noisy = (log_values(losses.get(k, [])) for k in (STANDARD, BN, NOISY))
    c = compare_arms(std, noisy, design_sd=design_sd.of("vs standard"))
    margin = compare_arms([v + NOISY_MARGIN for v in bn], noisy, design_sd=design_sd.of("vs BN"))
    plain = compare_arms(bn, noisy, design_sd=design_sd.of("vs BN"))
    names = {1: "noisy BN − standard, ln mean training loss",
             2: "noisy BN − BN, ln mean training loss"}
    outcome = checks({1: c, 2: margin}, "lower")
    comparisons = {1: c, 2: plain}
    paper = {1: "lower (direction only)", 2: f"≤ {NOISY_MARGIN:.3g} (within a factor 1.25 of BN's)"}
    key = deciding(outcome, {1: c, 2: margin})
    return Verdict.from_comparison(verdict, names[key], comparisons[key], paper=paper[key],
                                   unit=" (ln)")


register(Experiment(
    id="santurkar-fig2", paper="santurkar", target="Fig. 2",
    title="Training with standard, BN and noisy BN VGG",
    claim="BN with injected, time-varying covariate shift ('noisy' BN) still trains as well as BN "
          "and better than the standard network: ICS reduction is not what makes BN work.",
    smoke_changes="digits upsampled to 16×16 instead of CIFAR-10, VGG at 1/8 width, 600 steps (≈ "
                  "53 epochs of digits) instead of 15 000, He instead of Glorot init (with Glorot "
                  "the 11-layer standard VGG stays at chance for the whole smoke budget), 3 seeds "
                  "per arm. The runs carry the ics/moments/histograms/landscape/hessian probes so "
                  "that fig6, fig7, fig11 and fig14 reuse them. Both halves of the claim are "
                  "judged: 'faster than standard' by Welch's t-test over seeds of the ln mean "
                  "training loss over the run, 'as well as BN' as within a factor 1.25 of BN's "
                  "(pre-declared margin).",
    cost={"smoke": "≈ 5 min CPU, one thread (9 VGG runs of 600 steps with probes, ≈ 32 s each)",
          "paper": "9 runs × 15 000 steps VGG on CIFAR-10 (GPU, ≈ 3 h with probes)"},
    plan=_fig2_plan, analyze=_fig2_analyze,
    resolution=family_resolution(
        "direction only: noisy BN's training curve on BN's, far below the standard network's "
        "(Fig. 2; App. A.1's test accuracies: 80 % standard, 83 % BN)", FIG2_DESIGN_SD, 3,
        unit=" (ln mean training loss)")))


# ---- Fig. 6: ICS (Definition 2.1) -------------------------------------------------------------

FIG6_LABELS = (STANDARD, BN)


# The DLN half's second reading of the paper's rate (module docstring of
# :mod:`bnlab.experiments.santurkar`): fig9's runs trained at the literal 1e-2 (same configs).
LITERAL_DLN = "DLN lr 1e-2: "


def _fig6_plan(preset: str) -> Plan:
    return Plan(runs=vgg_runs(preset, FIG6_LABELS, "VGG: ")
                + dln_runs(preset, FIG6_LABELS, "DLN: ")
                + dln_runs(preset, FIG6_LABELS, LITERAL_DLN, LITERAL_LR))


def ics_summary(run) -> tuple[float | None, float | None]:
    """(median cos(G, G'), median ‖G − G'‖) over probed steps and layers, the first layer left
    out."""
    if run is None:
        return None, None
    skip = first_layer_zero(run)
    cos = [v for layer in probe_layers(run, "ics", "cos") if layer not in skip
           for v in finite_values(run, f"probe/ics/cos/{layer}")]
    return finite_median(cos), layer_medians(run, "ics", "l2", skip_zero=True)


# The networks of fig6's figure and table: (name, arm prefix); the DLN also at the literal rate.
FIG6_NETS = (("VGG", "VGG: "), ("DLN", "DLN: "), (f"DLN at lr {LITERAL_LR:g}", LITERAL_DLN))


def _fig6_panels(runs: dict, net: str) -> list[dict]:
    reference = runs[STANDARD] or runs[BN]
    layers = [name for name in probe_layers(reference, "ics", "l2")
              if name not in first_layer_zero(reference)] if reference is not None else []
    specs = []
    for layer in pick(layers, (0.3, 0.9)):
        for quantity, ylabel in (("l2", "‖G − G′‖₂"), ("cos", "cos(G, G′)")):
            series = {}
            for label, r in runs.items():
                if r is not None:
                    xs, ys = r.series(f"probe/ics/{quantity}/{layer}")
                    if xs:
                        series[label] = (xs, ys)
            specs.append({"series": series, "xlabel": "step", "ylabel": ylabel, "markers": True,
                          "title": f"{net} layer {layer}: {ylabel}", "logy": quantity == "l2"})
    return specs


def _fig6_analyze(ctx) -> Outcome:
    by_label = runs_by_label(ctx)
    arms = arm_runs(ctx)
    specs, table = [], []
    cos: dict[tuple[str, str], list[float]] = {}
    for net, prefix in FIG6_NETS:
        if not any(f"{prefix}{label}" in arms for label in FIG6_LABELS) and net not in (
                "VGG", "DLN"):
            continue  # a store from before the second reading: its rows are left out
        specs += _fig6_panels({label: by_label.get(f"{prefix}{label}") for label in FIG6_LABELS},
                              net)
        l2 = {}
        for label in FIG6_LABELS:
            seeds = arms.get(f"{prefix}{label}")
            cos[(net, label)] = per_seed(seeds, lambda r: ics_summary(r)[0])
            l2[label] = per_seed(seeds, lambda r: ics_summary(r)[1])
        table.append({"quantity": f"{net}: median cos(G, G′) per seed, standard / BN",
                      "ours": " / ".join(" ".join(fmt(v) for v in cos[(net, label)]) or "—"
                                         for label in FIG6_LABELS),
                      "paper": "BN similar or lower (worse) than standard (Fig. 6)"})
        table.append({"quantity": f"{net}: median ‖G − G′‖₂ per seed, standard / BN",
                      "ours": " / ".join(" ".join(fmt(v) for v in l2[label]) or "—"
                                         for label in FIG6_LABELS),
                      "paper": "BN similar or larger (worse) than standard (Fig. 6)"})
    fig = safe_panels(ctx.figure_path("ics"), specs or [{"title": "no ICS measurements"}], ncols=4,
                      title="Santurkar Fig. 6: ICS (Definition 2.1) with and without BN (seed 0)")
    verdict, summary = fig6_readings(cos, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary, fig6_record(verdict, cos))


# One design SD per network (the two nets' cos scatter differs five-fold in the pilot), each the
# pooled per-arm SD of that network's comparison in the pilot (/work/notes/s5/pilot_sds.log).
FIG6_DESIGN_SD = DesignSD({"VGG": 0.063, "DLN": 0.32}, f"{PILOT}; median cos(G, G′), per network")


def fig6_comparisons(cos: dict[tuple[str, str], list[float]],
                     design_sd: DesignSD = FIG6_DESIGN_SD) -> dict[str, Comparison]:
    """Per network (VGG, DLN): BN's per-seed median cos(G, G′) against standard's + tolerance."""
    return {net: compare_arms([v + COS_TOLERANCE for v in cos.get((net, STANDARD), [])],
                              cos.get((net, BN), []), design_sd=design_sd.of(net))
            for net in ("VGG", "DLN")}


def fig6_verdict(cos: dict[tuple[str, str], list[float]], tiny: str | None = None, *,
                 design_sd: DesignSD = FIG6_DESIGN_SD) -> tuple[str, str]:
    """Fig. 6: BN's ICS is similar or worse. Per seed, the median cos(G, G′) over steps and layers
    (first layer out); 'similar' allows BN up to COS_TOLERANCE above standard. Per network: held
    when BN's cos is detectably below standard's + tolerance, not held when detectably above it
    (Holm over the two networks), else inconclusive. Primary, pre-declared: the conjunction over VGG
    and DLN (:func:`verdicts.conjunction`); resolvable effects at ``design_sd``."""
    if tiny:
        return ladder(unusable=True), tiny
    comps = fig6_comparisons(cos, design_sd)
    parts = [f"{net} " + compare_text(c, f"BN − (standard + {COS_TOLERANCE})")
             for net, c in comps.items()]
    return conjunction(comps, "lower"), ("median cos(G, G′) over probed steps and layers (first "
                                         "layer excluded), per seed; "
                                         + "; ".join(parts)
                                         + f". Resolution: {design_sd.text()}. {RULE}")


# The DLN trained at the literal rate: no pilot of its own before its runs, so the lr 1e-3 pilot's
# SD (the observed spread is in the summary's SE).
FIG6_LITERAL_DESIGN_SD = DesignSD(
    {"VGG": 0.063, "DLN": 0.32}, f"{PILOT}; median cos(G, G′), per network; the DLN at lr 1e-2: "
    "the lr 1e-3 pilot's SD, assumed")


def _literal_cos(cos: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], list[float]]:
    """fig6's values with the DLN trained at the literal rate in the DLN's place."""
    literal = f"DLN at lr {LITERAL_LR:g}"
    return {**cos, **{("DLN", label): cos.get((literal, label), []) for label in FIG6_LABELS}}


def fig6_readings(cos: dict[tuple[str, str], list[float]],
                  tiny: str | None = None) -> tuple[str, str]:
    """Fig. 6 at both readings of the paper's DLN rate (bnlab's 1e-3, the primary, and the literal
    1e-2; module docstring of :mod:`bnlab.experiments.santurkar`), each :func:`fig6_verdict`
    (the VGG half is the same runs in both); combined by :func:`readings.combine_readings`: the
    entry holds or fails only where both agree."""
    if tiny:
        return ladder(unusable=True), tiny
    readings = [(f"DLN trained at lr {DLN_LR:g}", *fig6_verdict(cos)),
                (f"DLN trained at lr {LITERAL_LR:g}",
                 *fig6_verdict(_literal_cos(cos), design_sd=FIG6_LITERAL_DESIGN_SD))]
    return combine_readings(readings)


def fig6_record(verdict: str, cos: dict[tuple[str, str], list[float]]) -> Verdict:
    """The verdict as data: the check of the primary reading (DLN at lr 1e-3) it rests on
    (:func:`readings.deciding`)."""
    comps = fig6_comparisons(cos)
    return deciding_record(verdict, checks(comps, "lower"), comps,
                           lambda net: f"{net}: BN − (standard + {COS_TOLERANCE}), median "
                                       f"cos(G, G′), DLN at lr {DLN_LR:g}",
                           paper="lower or similar (direction only)")


register(Experiment(
    id="santurkar-fig6", paper="santurkar", target="Fig. 6",
    title="Internal covariate shift (Definition 2.1) with and without BN",
    claim="Networks with BN have similar or even larger ICS — the change of a layer's gradient "
          "when the preceding layers are updated, ‖G − G′‖ and cos(G, G′) — than standard "
          "networks, while training better.",
    smoke_changes="VGG: the shared smoke VGG runs of fig2 (digits at 16×16, 1/8 width, 600 steps, "
                  "He init, 3 seeds), ICS every 30 steps. DLN: the paper's 25 layers of width 10 "
                  "on 1000 Gaussian samples, full batch, 600 instead of 10 000 steps, 3 seeds, ICS "
                  "every 25 steps. 'Similar or worse': per seed the median cos(G, G′) over steps "
                  "and layers; Welch's t-test of BN against standard + 0.02.",
    cost={"smoke": "≈ 5 min CPU (6 VGG + 6 DLN runs; the VGG runs are fig2's)",
          "paper": "6 VGG × 15 000 steps on CIFAR-10 + 6 DLN × 10 000 steps (GPU, ≈ 2 h)"},
    plan=_fig6_plan, analyze=_fig6_analyze,
    resolution=family_resolution(
        "direction only: BN's cos(G, G′) similar to or below the standard network's (Fig. 6)",
        FIG6_DESIGN_SD, 3, unit=" in median cos(G, G′)")))
