"""Santurkar et al. 2018, the deep-linear-network entries: Fig. 8 (activation distributions) and
Fig. 9 (loss landscape along the gradient). Fig. 10 (gradient predictiveness against the distance
moved, from a replay of these DLNs) is in :mod:`bnlab.experiments.santurkar.predictiveness`.

Shared configurations, helpers and the statistical rule are in
:mod:`bnlab.experiments.santurkar.common`. Each verdict is a pure function of per-seed numbers,
tested on synthetic values.
"""

from __future__ import annotations

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import RULE as JUDGED_RULE
from ..verdicts import Design, conjunction, judge, ladder
from ..resolution import design_resolution, family_resolution
from bnlab.formatting import fmt
from ..common import CATALOGUE_PILOT, RULE, Comparison, DesignSD, compare_arms, safe_panels
from .common import (
    BN, DLN_LR, LITERAL_LR, STANDARD,
    band_panel, curve_panel, distribution_panel, dln_runs, hist_layers,
    SEEDS, hist_units, inconclusive_if_tiny, finite_median, runs_by_label, finite_values,
    arm_runs,
    compare_text, distribution_drift, log_values, per_seed, pick, sharpness_line, sharpness_panel,
)

FIG6_LABELS = (STANDARD, BN)

# ---- Fig. 8: DLN activation distributions -----------------------------------------------------

def _fig8_plan(preset: str) -> Plan:
    return Plan(runs=dln_runs(preset, FIG6_LABELS))


def _fig8_analyze(ctx) -> Outcome:
    runs = {label: runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    specs = []
    for label, r in runs.items():
        units = hist_units(r)
        for layer in pick(hist_layers(r), (0.1, 0.5, 0.9)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(distribution_panel(r, unit, f"{label}: {unit}"))
    fig = safe_panels(ctx.figure_path("activations"),
                      specs or [{"title": "no activation histograms"}], ncols=3,
                 title="Santurkar Fig. 8: activation distributions of a 25-layer DLN over training")
    drift = {label: per_seed(arm_runs(ctx).get(label), distribution_drift) for label in FIG6_LABELS}
    table = [{"quantity": f"{label}: median drift of a unit's distribution per seed (centre shift "
                          "in initial spreads + |ln width ratio|)",
              "ours": " ".join(fmt(v) for v in drift[label]) or "—",
              "paper": {STANDARD: "distributions shift and widen over training (Fig. 8)",
                        BN: "distributions stay stable (Fig. 8)"}[label]} for label in FIG6_LABELS]
    verdict, summary = fig8_verdict(drift, inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary)


# The paper shows distributions (Fig. 8), no number: its effect is a direction. Design SD: the
# pooled SD of one seed's drift in the smoke pilot of 2026-11-26 (BN − standard −0.89, SE 0.15 at
# 3/3 seeds, so SD ≈ 0.15·√(3/2)).
FIG8_DESIGN = Design("BN − standard median drift of a unit's distribution", paper_effect=-1.0,
                     design_sd=0.18, n_seeds=len(SEEDS), source="smoke pilot 2026-11-26",
                     magnitude_known=False)


def fig8_verdict(drift: dict[str, list[float]], tiny: str | None = None) -> tuple[str, str]:
    """Fig. 8: BN's activation distributions drift less than the standard DLN's. Primary,
    pre-declared (:data:`FIG8_DESIGN`): BN − standard per-seed median drift, lower
    (:func:`verdicts.judge`)."""
    if tiny:
        return ladder(unusable=True), tiny
    j = judge(drift.get(STANDARD, []), drift.get(BN, []), FIG8_DESIGN)
    return ladder(j.verdict), ("median drift of a sampled unit's distribution from the first to "
                               f"the last measurement, per seed; {j.text(FIG8_DESIGN)}. "
                               f"Rule: {JUDGED_RULE}")


register(Experiment(
    id="santurkar-fig8", paper="santurkar", target="Fig. 8",
    title="Activation distributions of a deep linear network over training",
    claim="Sampled activations of a 25-layer DLN drift in distribution over training without BN "
          "and stay stable with BN (the distributional stability BN is usually credited with).",
    smoke_changes="the paper's DLN (25 layers of width 10, 1000 Gaussian samples, full batch) for "
                  "600 instead of 10 000 steps at lr 1e-3 (module docstring: the paper's 1e-6 is "
                  "for its summed loss), 3 seeds, 2 units per layer every 10 steps; the figure "
                  "shows 3 layers (10 %, 50 %, 90 % depth). The verdict compares a scale-free "
                  "drift of the distributions (the figure states no number) by Welch's t-test over "
                  "seeds.",
    cost={"smoke": "≈ 1.5 min CPU (6 DLN runs; shared with fig6/fig9)",
          "paper": "6 DLN runs × 10 000 steps (GPU or CPU, ≈ 30 min)"},
    plan=_fig8_plan, analyze=_fig8_analyze, resolution=design_resolution(FIG8_DESIGN)))


# ---- Fig. 9: DLN landscape ---------------------------------------------------------------------

LANDSCAPE = {"loss_range": "loss range along the gradient",
             "grad_change_max": "max ‖∇L(θ) − ∇L(θ − s g)‖",
             "beta_smoothness": "effective β-smoothness"}


def landscape_summary(run) -> dict[str, float | None]:
    """Median over probed steps of the landscape probe's loss range, largest gradient change and
    β."""
    return {k: finite_median(finite_values(run, f"probe/landscape/{k}")) for k in LANDSCAPE}




def landscape_panels(runs: dict, prefix: str, lr: float) -> list[dict]:
    beta = curve_panel(runs, "probe/landscape/beta_smoothness",
                       f"{prefix}effective β-smoothness (dashed: 2/lr)", "β", logy=True)
    # gradient descent's stability edge: sharper directions make a step overshoot
    beta["hline"] = 2.0 / lr
    return [
        band_panel(runs, "probe/landscape/loss_min", "probe/landscape/loss_max",
                   "probe/landscape/loss", f"{prefix}loss landscape (loss along the gradient)",
                   "loss", logy=True),
        band_panel(runs, "probe/landscape/grad_change_min", "probe/landscape/grad_change_max",
                   None, f"{prefix}gradient predictiveness", "‖∇L(θ) − ∇L(θ − s g)‖", logy=True),
        beta,
        sharpness_panel(runs, lr, prefix),
    ]


# Three quantities (ln loss range, ln max gradient change, ln β) at each of fig9's two rates: the
# pooled per-arm SDs of the pilot. Per rate, because at the literal 1e-2 the standard arm scatters
# eight to twenty times as much as at 1e-3 (one pooled number would state the declared rate's
# resolution at the other rate's spread).
FIG9_DESIGN_SD = DesignSD(
    {"lr 1e-3 loss_range": 0.66, "lr 1e-3 grad_change_max": 0.54,
     "lr 1e-3 beta_smoothness": 0.23, "lr 1e-2 loss_range": 5.2,
     "lr 1e-2 grad_change_max": 5.0, "lr 1e-2 beta_smoothness": 4.7},
    f"{CATALOGUE_PILOT}; ln scale")
FIG9_KEY_PREFIX = "lr 1e-3 "  # the declared rate's keys (DLN_LR)


def landscape_verdict(summaries: dict[str, list[dict]], normalized: str, tiny: str | None = None,
                      *, design_sd: DesignSD = FIG9_DESIGN_SD,
                      key_prefix: str = FIG9_KEY_PREFIX) -> tuple[str, dict[str, Comparison], str]:
    """Is ``normalized``'s landscape smoother than the standard network's? Per seed, the three
    medians of :func:`landscape_summary`, compared on a ln scale: held when all three are detectably
    smaller, not held when one is detectably larger after Holm's correction over the three
    (:func:`verdicts.conjunction`). Fig. 9's primary, pre-declared: this conjunction for BN. Returns
    (verdict, comparisons by quantity, text). Each comparison's resolvable effect is stated at
    ``design_sd.of(key_prefix + quantity)`` (fig11 declares one per network)."""
    def logs(label: str, k: str) -> list[float]:
        return log_values([s[k] for s in summaries.get(label, []) if s[k] is not None])

    comparisons = {k: compare_arms(logs(STANDARD, k), logs(normalized, k),
                                   design_sd=design_sd.of(key_prefix + k)) for k in LANDSCAPE}
    text = "; ".join(compare_text(c, f"{LANDSCAPE[k]}, {normalized} − standard", log=True)
                     for k, c in comparisons.items())
    if tiny:
        return ladder(unusable=True), comparisons, tiny
    return conjunction(comparisons, "lower"), comparisons, text


LITERAL_ARM = "lr 1e-2 · "  # fig9's second reading: the arms trained at LITERAL_LR
_RATE_KEYS = {DLN_LR: FIG9_KEY_PREFIX, LITERAL_LR: "lr 1e-2 "}  # FIG9_DESIGN_SD's keys per rate


def _fig9_plan(preset: str) -> Plan:
    return Plan(runs=dln_runs(preset, FIG6_LABELS)
                + dln_runs(preset, FIG6_LABELS, LITERAL_ARM, LITERAL_LR))


def _beta_edge(summaries: dict[str, list[dict]], lr: float) -> dict[str, list[float | None]]:
    """β·lr/2 per seed and arm: 1 is gradient descent's stability edge 2/lr."""
    return {label: [None if s["beta_smoothness"] is None else s["beta_smoothness"] * lr / 2
                    for s in rows]
            for label, rows in summaries.items()}


def fig9_readings(arms: dict, tiny: str | None, *, design_sd: DesignSD = FIG9_DESIGN_SD
                  ) -> tuple[str, list[dict], str]:
    """Fig. 9 at both readings of the paper's rate (module docstring): trained at 1e-3 (ours) and at
    1e-2 (the literal conversion). Pre-declared primary: :func:`landscape_verdict` for BN at each
    reading; the entry holds (or fails) only if both readings agree, else it is inconclusive
    (decided by the rate, not by BN). Beside each β, β·lr/2: BN's sits near 1 at both rates, at the
    edge of stability, so its raw β tracks 2/lr and a β comparison across rates says more about lr
    than about BN."""
    verdicts, table, texts = [], [], []
    for lr, prefix in ((DLN_LR, ""), (LITERAL_LR, LITERAL_ARM)):
        summaries = {label: [landscape_summary(r) for r in arms.get(prefix + label, [])]
                     for label in FIG6_LABELS}
        verdict, _, text = landscape_verdict(summaries, BN, tiny, design_sd=design_sd,
                                             key_prefix=_RATE_KEYS[lr])
        verdicts.append(verdict)
        texts.append(f"lr {lr:g}: {verdict} ({text})")
        table += [{"quantity": f"median {LANDSCAPE[k]} over training, [1/100, 30] × {lr:g}, per "
                               "seed: standard / BN",
                   "ours": " / ".join(" ".join(fmt(s[k]) for s in summaries[label]) or "—"
                                      for label in FIG6_LABELS),
                   "paper": FIG9_PAPER[k] if lr == DLN_LR else "—"} for k in LANDSCAPE]
        edge = _beta_edge(summaries, lr)
        table.append({"quantity": f"median β × lr / 2 per seed at lr {lr:g}, standard / BN (1 = "
                                  "the stability edge)",
                      "ours": " / ".join(" ".join(fmt(v) for v in edge[label]) or "—"
                                         for label in FIG6_LABELS),
                      "paper": "—"})
    verdict = ladder(verdicts[0], unusable=verdicts[0] != verdicts[1])
    return verdict, table, "; ".join(texts) + f"; resolution: {design_sd.text()}"


FIG9_PAPER = {"loss_range": "BN much smaller (Fig. 9a)",
              "grad_change_max": "BN much smaller (Fig. 9b)",
              "beta_smoothness": "BN smaller (Fig. 9c)"}


def _fig9_analyze(ctx) -> Outcome:
    runs = {label: runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    arms = arm_runs(ctx)
    specs = landscape_panels(runs, "", DLN_LR)
    specs.append(curve_panel(runs, "train_loss", "training loss", "loss", logy=True))
    fig9 = safe_panels(ctx.figure_path("landscape"), specs, ncols=5,
                       title="Santurkar Fig. 9: DLN landscape along the gradient, [1/100, 30] × lr "
                             "(seed 0)")
    verdict, table, text = fig9_readings(arms, inconclusive_if_tiny(ctx))
    caveat = ("both readings must agree; BN's β·lr/2 near 1 at a rate means it trains at the "
              "stability edge 2/lr there, so its raw β is set by the rate")
    literal = {k: v for k, v in arms.items() if k.startswith(LITERAL_ARM)}
    ours = {k: v for k, v in arms.items() if k not in literal}
    sharpness = f"at lr {DLN_LR:g}, {sharpness_line(ours, DLN_LR)}; at lr {LITERAL_LR:g}, " \
                f"{sharpness_line(literal, LITERAL_LR)}"
    return Outcome([fig9], table, verdict, f"medians over training per seed: {text}; {caveat}; "
                                           f"{sharpness}. {RULE}")


register(Experiment(
    id="santurkar-fig9", paper="santurkar", target="Fig. 9",
    title="DLN loss landscape, gradient change and β-smoothness with and without BN",
    claim="Along the gradient direction, over steps of [1/100, 30] × lr, a DLN with BN has a much "
          "smaller loss range, a smaller gradient change and a smaller effective β-smoothness than "
          "without BN.",
    smoke_changes="the paper's DLN and range at both readings of its rate, lr 1e-3 (module "
                  "docstring) and the literal 1e-2, for 600 instead of 10 000 steps, 3 seeds per "
                  "arm, landscape (8 linear points) every 25 steps, hessian (12 Lanczos steps, 4 "
                  "Hutchinson vectors) every 50. Verdict: Welch's t-test over seeds of each run's "
                  "median (ln scale), at each rate; inconclusive if the two rates disagree.",
    cost={"smoke": "≈ 3 min CPU (12 DLN runs; the 6 at lr 1e-3 shared with fig6/fig8)",
          "paper": "6 DLN runs × 10 000 steps (≈ 30 min on a CPU)"},
    plan=_fig9_plan, analyze=_fig9_analyze,
    resolution=family_resolution(
        "direction only: BN's loss range, gradient change and β-smoothness far below the "
        "standard DLN's (Fig. 9)", FIG9_DESIGN_SD, 3, unit=" (ln)")))
