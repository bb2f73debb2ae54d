"""Santurkar et al. 2018, the deep-linear-network entries: Fig. 8 (activation distributions), Fig. 9
(loss landscape along the gradient) and Fig. 10 (gradient predictiveness against the distance
moved).

Shared configurations, helpers and the statistical rule are in
:mod:`bnlab.experiments.santurkar.common`. Each verdict is a pure function of per-seed numbers,
tested on synthetic values.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import bnlab.models as M
from bnlab import data as D
from bnlab.probes import ProbeContext, evaluate_landscape

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import conjunction, decide, ladder
from bnlab.formatting import finite_or_none, fmt
from ..common import RULE, compare_arms, safe_panels
from .common import (
    BN, DLN_LR, DLN_RANGE, NORMS, SEEDS, SMOKE_DLN_STEPS, STANDARD, _band_panel, _curve_panel, _distribution_panel,
    _dln_runs, _hist_layers, _hist_units, _inconclusive_if_tiny, _median, _runs_by_label, _values, arm_runs,
    compare_text, distribution_drift, dln_config, log_values, per_seed, pick, sharpness_line,
    sharpness_panel,
)

FIG6_LABELS = (STANDARD, BN)

# ---- Fig. 8: DLN activation distributions -----------------------------------------------------

def _fig8_plan(preset: str) -> Plan:
    return Plan(runs=_dln_runs(preset, FIG6_LABELS))


def _fig8_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    specs = []
    for label, r in runs.items():
        units = _hist_units(r)
        for layer in pick(_hist_layers(r), (0.1, 0.5, 0.9)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(_distribution_panel(r, unit, f"{label}: {unit}"))
    fig = safe_panels(ctx.figure_path("activations"), specs or [{"title": "no activation histograms"}], ncols=3,
                 title="Santurkar Fig. 8: activation distributions of a 25-layer DLN over training")
    drift = {label: per_seed(arm_runs(ctx).get(label), distribution_drift) for label in FIG6_LABELS}
    table = [{"quantity": f"{label}: median drift of a unit's distribution per seed (centre shift in initial "
                          f"spreads + |ln width ratio|)",
              "ours": " ".join(fmt(v) for v in drift[label]) or "—",
              "paper": {STANDARD: "distributions shift and widen over training (Fig. 8)",
                        BN: "distributions stay stable (Fig. 8)"}[label]} for label in FIG6_LABELS]
    verdict, summary = fig8_verdict(drift, _inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary)


def fig8_verdict(drift: dict[str, list[float]], tiny: str | None = None) -> tuple[str, str]:
    """Fig. 8: BN's activation distributions drift less than the standard DLN's. Primary,
    pre-declared: BN − standard per-seed median drift, lower (:func:`verdicts.decide`)."""
    if tiny:
        return ladder(unusable=True), tiny
    c = compare_arms(drift.get(STANDARD, []), drift.get(BN, []))
    return decide(c, "lower"), ("median drift of a sampled unit's distribution from the first to the last "
                                f"measurement, per seed; {compare_text(c, 'BN − standard')}. {RULE}")


register(Experiment(
    id="santurkar-fig8", paper="santurkar", target="Fig. 8",
    title="Activation distributions of a deep linear network over training",
    claim="Sampled activations of a 25-layer DLN drift in distribution over training without BN and stay "
          "stable with BN (the distributional stability BN is usually credited with).",
    smoke_changes="the paper's DLN (25 layers of width 10, 1000 Gaussian samples, full batch) for 600 instead "
                  "of 10 000 steps at lr 1e-3 (module docstring: the paper's 1e-6 is for its summed loss), 3 "
                  "seeds, 2 units per layer every 10 steps; the figure shows 3 layers (10 %, 50 %, 90 % depth). "
                  "The verdict compares a scale-free drift of the distributions (the figure states no number) "
                  "by Welch's t-test over seeds.",
    cost={"smoke": "≈ 1.5 min CPU (6 DLN runs; shared with fig6/fig9)",
          "paper": "6 DLN runs × 10 000 steps (GPU or CPU, ≈ 30 min)"},
    plan=_fig8_plan, analyze=_fig8_analyze))


# ---- Figs 9 and 10: DLN landscape ----------------------------------------------------------------

LANDSCAPE = {"loss_range": "loss range along the gradient", "grad_change_max": "max ‖∇L(θ) − ∇L(θ − s g)‖",
             "beta_smoothness": "effective β-smoothness"}


def landscape_summary(run) -> dict[str, float | None]:
    """Median over probed steps of the landscape probe's loss range, largest gradient change and
    β."""
    return {k: _median(_values(run, f"probe/landscape/{k}")) for k in LANDSCAPE}


# Fig. 10's replay goes past the paper's 30 × lr ("BN keeps smoothing further")
FIG10_MULTIPLIERS = (0.01, 1000.0)
# the paper's 1e-6 converted as if its loss summed over all 1000 samples and 10 outputs
LITERAL_LR = 1e-2


def fig10_grid(lr: float = DLN_LR, points_per_decade: int = 5) -> list[float]:
    """Log-spaced step sizes over FIG10_MULTIPLIERS × lr plus the exact ends 30 × lr and 300 × lr.

    30 × lr ends the paper's range at our rate; 30 × LITERAL_LR = 300 × lr ends it at the other
    reading of the paper's rate, so both ranges can be cut from one curve."""
    lo, hi = (math.log10(m) for m in FIG10_MULTIPLIERS)
    count = round((hi - lo) * points_per_decade)
    multipliers = {10 ** (lo + i * (hi - lo) / count) for i in range(count + 1)} | {30.0, 300.0}
    return [m * lr for m in sorted(multipliers)]


def predictiveness_curves(preset: str = "smoke", tiny: bool = False) -> dict:
    """Fig. 10: ‖∇L(θ) − ∇L(θ − s g)‖ and L(θ − s g) against the step s along the gradient, DLN ±
    BN, per seed.

    Replays each DLN of :func:`dln_config` (same model, data and rate; a plain full-batch SGD loop,
    weights and data drawn with each of :data:`SEEDS`) and at a few steps evaluates the landscape
    with :func:`bnlab.probes.evaluate_landscape` (naive, exact) on :func:`fig10_grid`. The training
    probe keeps only the range over its grid; this keeps the whole curve, and reaches past the
    paper's 30 × lr up to 1000 × lr, which also covers [1/100, 30] × 1e-2 (the literal conversion of
    the paper's rate, module docstring of :mod:`bnlab.experiments.santurkar`).
    """
    at = {"paper": (0, 1000, 10000), "smoke": (0, 200, SMOKE_DLN_STEPS)}[preset]
    seeds = SEEDS[:1] if tiny else SEEDS
    if tiny:
        at = (0, 2)
    out: dict[str, Any] = {"at_steps": list(at), "lr": DLN_LR, "step_sizes": fig10_grid(), "runs": {}}
    for label in FIG6_LABELS:
        for seed in seeds:
            out["runs"].setdefault(label, []).append(_replay(dln_config(preset, NORMS[label], seed), at))
    return out


def _replay(cfg: dict, at: tuple[int, ...]) -> dict:
    """Train one DLN config with plain full-batch SGD, evaluating the landscape at the steps
    ``at``."""
    grid = torch.tensor(fig10_grid(), dtype=torch.float64)
    ds = D.load(cfg["data"], **cfg["data_options"], seed=cfg["seed"])
    model = M.create("dln", norm=cfg["norm"], input_shape=ds.input_shape, num_classes=ds.num_outputs,
                     seed=cfg["seed"], **cfg["model_options"])
    opt = torch.optim.SGD(model.parameters(), lr=DLN_LR)
    x, y = ds.x_train, ds.y_train
    loss_fn = torch.nn.functional.mse_loss
    curves, status = [], "finished"
    for step in range(max(at) + 1):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if not torch.isfinite(loss):
            status = "diverged"
            break
        loss.backward()
        if step in at:
            res = evaluate_landscape(ProbeContext(model, loss_fn, (x, y), step, optimizer=opt), grid, "naive")
            curves.append({"step": step, "grad_change": [finite_or_none(v) for v in res.grad_changes],
                           "loss": [finite_or_none(v) for v in res.losses], "grad_norm": res.grad_norm,
                           "loss_at_theta": res.loss})
        opt.step()
    return {"seed": cfg["seed"], "status": status, "curves": curves}


def window_summary(curve: dict, step_sizes: list[float], lo: float, hi: float) -> dict[str, float | None]:
    """Loss range, largest gradient change and effective β of one Fig. 10 curve over s ∈ [lo, hi].

    Same definitions as the landscape probe (:class:`bnlab.probes.LandscapeResult`): the range of
    L(θ − s g), max ‖∇L(θ) − ∇L(θ − s g)‖ and max of that over s‖g‖; non-finite points are
    skipped."""
    rows = [(s, loss, d) for s, loss, d in zip(step_sizes, curve["loss"], curve["grad_change"])
            if lo * (1 - 1e-9) <= s <= hi * (1 + 1e-9)]
    losses = [loss for _, loss, _ in rows if loss is not None]
    changes = [(s, d) for s, _, d in rows if d is not None]
    g = curve.get("grad_norm") or 0.0
    betas = [d / (s * g) for s, d in changes if s > 0 and g > 0]
    return {"loss_range": (max(losses) - min(losses)) if losses else None,
            "grad_change_max": max(d for _, d in changes) if changes else None,
            "beta_smoothness": max(betas) if betas else None}


def _landscape_panels(runs: dict, prefix: str, lr: float) -> list[dict]:
    beta = _curve_panel(runs, "probe/landscape/beta_smoothness", f"{prefix}effective β-smoothness (dashed: 2/lr)",
                        "β", logy=True)
    # gradient descent's stability edge: sharper directions make a step overshoot
    beta["hline"] = 2.0 / lr
    return [
        _band_panel(runs, "probe/landscape/loss_min", "probe/landscape/loss_max", "probe/landscape/loss",
                    f"{prefix}loss landscape (loss along the gradient)", "loss", logy=True),
        _band_panel(runs, "probe/landscape/grad_change_min", "probe/landscape/grad_change_max", None,
                    f"{prefix}gradient predictiveness", "‖∇L(θ) − ∇L(θ − s g)‖", logy=True),
        beta,
        sharpness_panel(runs, lr, prefix),
    ]


def landscape_verdict(summaries: dict[str, list[dict]], normalized: str, tiny: str | None = None
                      ) -> tuple[str, dict[str, object], str]:
    """Is ``normalized``'s landscape smoother than the standard network's? Per seed, the three
    medians of :func:`landscape_summary`, compared on a ln scale: held when all three are detectably
    smaller, not held when one is detectably larger after Holm's correction over the three
    (:func:`verdicts.conjunction`). Fig. 9's primary, pre-declared: this conjunction for BN. Returns
    (verdict, comparisons by quantity, text)."""
    comparisons = {k: compare_arms(log_values([s[k] for s in summaries.get(STANDARD, []) if s[k] is not None]),
                                   log_values([s[k] for s in summaries.get(normalized, []) if s[k] is not None]))
                   for k in LANDSCAPE}
    text = "; ".join(compare_text(c, f"{LANDSCAPE[k]}, {normalized} − standard", log=True)
                     for k, c in comparisons.items())
    if tiny:
        return ladder(unusable=True), comparisons, tiny
    return conjunction(comparisons, "lower"), comparisons, text


LITERAL_ARM = "lr 1e-2 · "  # fig9's second reading: the arms trained at LITERAL_LR


def _fig9_plan(preset: str) -> Plan:
    return Plan(runs=_dln_runs(preset, FIG6_LABELS) + _dln_runs(preset, FIG6_LABELS, LITERAL_ARM, LITERAL_LR))


def _beta_edge(summaries: dict[str, list[dict]], lr: float) -> dict[str, list[float | None]]:
    """β·lr/2 per seed and arm: 1 is gradient descent's stability edge 2/lr."""
    return {label: [None if s["beta_smoothness"] is None else s["beta_smoothness"] * lr / 2 for s in rows]
            for label, rows in summaries.items()}


def fig9_readings(arms: dict, tiny: str | None) -> tuple[str, list[dict], str]:
    """Fig. 9 at both readings of the paper's rate (module docstring): trained at 1e-3 (ours) and at
    1e-2 (the literal conversion). Pre-declared primary: :func:`landscape_verdict` for BN at each
    reading; the entry holds (or fails) only if both readings agree, else it is inconclusive
    (decided by the rate, not by BN). Beside each β, β·lr/2: BN's sits near 1 at both rates, at the
    edge of stability, so its raw β tracks 2/lr and a β comparison across rates says more about lr
    than about BN."""
    verdicts, table, texts = [], [], []
    for lr, prefix in ((DLN_LR, ""), (LITERAL_LR, LITERAL_ARM)):
        summaries = {label: [landscape_summary(r) for r in arms.get(prefix + label, [])] for label in FIG6_LABELS}
        verdict, _, text = landscape_verdict(summaries, BN, tiny)
        verdicts.append(verdict)
        texts.append(f"lr {lr:g}: {verdict} ({text})")
        table += [{"quantity": f"median {LANDSCAPE[k]} over training, [1/100, 30] × {lr:g}, per seed: standard / BN",
                   "ours": " / ".join(" ".join(fmt(s[k]) for s in summaries[label]) or "—" for label in FIG6_LABELS),
                   "paper": FIG9_PAPER[k] if lr == DLN_LR else "—"} for k in LANDSCAPE]
        edge = _beta_edge(summaries, lr)
        table.append({"quantity": f"median β × lr / 2 per seed at lr {lr:g}, standard / BN (1 = the stability edge)",
                      "ours": " / ".join(" ".join(fmt(v) for v in edge[label]) or "—" for label in FIG6_LABELS),
                      "paper": "—"})
    verdict = ladder(verdicts[0], unusable=verdicts[0] != verdicts[1])
    return verdict, table, "; ".join(texts)


FIG9_PAPER = {"loss_range": "BN much smaller (Fig. 9a)", "grad_change_max": "BN much smaller (Fig. 9b)",
              "beta_smoothness": "BN smaller (Fig. 9c)"}


def _fig9_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    arms = arm_runs(ctx)
    specs = _landscape_panels(runs, "", DLN_LR)
    specs.append(_curve_panel(runs, "train_loss", "training loss", "loss", logy=True))
    fig9 = safe_panels(ctx.figure_path("landscape"), specs, ncols=5,
                       title="Santurkar Fig. 9: DLN landscape along the gradient, [1/100, 30] × lr (seed 0)")
    verdict, table, text = fig9_readings(arms, _inconclusive_if_tiny(ctx))
    caveat = ("both readings must agree; BN's β·lr/2 near 1 at a rate means it trains at the stability "
              "edge 2/lr there, so its raw β is set by the rate")
    literal = {k: v for k, v in arms.items() if k.startswith(LITERAL_ARM)}
    ours = {k: v for k, v in arms.items() if k not in literal}
    sharpness = f"at lr {DLN_LR:g}, {sharpness_line(ours, DLN_LR)}; at lr {LITERAL_LR:g}, " \
                f"{sharpness_line(literal, LITERAL_LR)}"
    return Outcome([fig9], table, verdict, f"medians over training per seed: {text}; {caveat}; {sharpness}. {RULE}")


register(Experiment(
    id="santurkar-fig9", paper="santurkar", target="Fig. 9",
    title="DLN loss landscape, gradient change and β-smoothness with and without BN",
    claim="Along the gradient direction, over steps of [1/100, 30] × lr, a DLN with BN has a much smaller loss "
          "range, a smaller gradient change and a smaller effective β-smoothness than without BN.",
    smoke_changes="the paper's DLN and range at both readings of its rate, lr 1e-3 (module docstring) and the "
                  "literal 1e-2, for 600 instead of 10 000 steps, 3 seeds per arm, landscape (8 linear points) "
                  "every 25 steps, hessian (12 Lanczos steps, 4 Hutchinson vectors) every 50. Verdict: Welch's "
                  "t-test over seeds of each run's median (ln scale), at each rate; inconclusive if the two "
                  "rates disagree.",
    cost={"smoke": "≈ 3 min CPU (12 DLN runs; the 6 at lr 1e-3 shared with fig6/fig8)",
          "paper": "6 DLN runs × 10 000 steps (≈ 30 min on a CPU)"},
    plan=_fig9_plan, analyze=_fig9_analyze))


# ---- Fig. 10: gradient predictiveness against the distance moved ---------------------------------

def _replay_windows(pred: dict) -> dict[str, dict[str, list[dict[str, float | None]]]]:
    """Per arm and window, per seed: the median over the replay's evaluation steps after step 0 of
    :func:`window_summary`, for the paper's range at our rate ([1/100, 30] × lr), at the literal
    conversion ([1/100, 30] × 1e-2) and beyond ((30, 1000] × lr: "BN keeps smoothing", Fig. 9's
    caption)."""
    lr = pred.get("lr") or DLN_LR
    sizes = pred.get("step_sizes") or []
    windows = {"ours": (DLN_RANGE[0] * lr, DLN_RANGE[1] * lr),
               "literal": (DLN_RANGE[0] * LITERAL_LR, DLN_RANGE[1] * LITERAL_LR),
               "beyond": (DLN_RANGE[1] * lr, FIG10_MULTIPLIERS[1] * lr)}
    out: dict[str, dict[str, list]] = {}
    for label, seeds in (pred.get("runs") or {}).items():
        out[label] = {name: [] for name in windows}
        for info in seeds:
            curves = [c for c in info.get("curves") or [] if c.get("step")] or info.get("curves") or []
            for name, (lo, hi) in windows.items():
                summaries = [window_summary(c, sizes, lo, hi) for c in curves]
                out[label][name].append({k: _median([sm[k] for sm in summaries]) for k in LANDSCAPE})
    return out


def _fig10_panels(pred: dict) -> list[dict]:
    lr = pred.get("lr") or DLN_LR
    multiples = [v / lr for v in pred.get("step_sizes") or []]
    runs = pred.get("runs") or {}
    specs = []
    for quantity, ylabel in (("grad_change", "‖∇L(θ) − ∇L(θ − s g)‖"), ("loss", "L(θ − s g)")):
        for index, step in enumerate(pred.get("at_steps") or []):
            series = {}
            for label, seeds in runs.items():
                curves = (seeds[0].get("curves") or []) if seeds else []
                if index < len(curves):
                    series[label] = (multiples, curves[index][quantity])
            specs.append({"series": series, "xlabel": "step size s / lr (paper's range ends at 30)",
                          "ylabel": ylabel, "title": f"training step {step} (seed 0)", "logx": True, "logy": True,
                          "markers": True})
    return specs


def fig10_verdict(windows: dict[str, dict[str, list[dict]]], tiny: str | None = None) -> tuple[str, str]:
    """Fig. 10: gradients are more predictive with BN. Per seed, the median over the evaluated
    training steps (step 0 left out: both nets start from a random init) of max ‖∇L(θ) − ∇L(θ − s
    g)‖ over the paper's range [1/100, 30] × lr; BN − standard on a ln scale. The literal-rate
    window and the range beyond 30 × lr are reported beside it. Primary, pre-declared: that BN −
    standard difference, lower (:func:`verdicts.decide`)."""
    if tiny:
        return ladder(unusable=True), tiny
    parts, verdict = [], ladder()
    for name, text in (("ours", f"[1/100, 30] × {DLN_LR:g}"), ("literal", f"[1/100, 30] × {LITERAL_LR:g}"),
                       ("beyond", f"(30, {FIG10_MULTIPLIERS[1]:g}] × {DLN_LR:g}")):
        std, bn = ([s["grad_change_max"] for s in windows.get(label, {}).get(name, [])
                    if s["grad_change_max"] is not None] for label in (STANDARD, BN))
        c = compare_arms(log_values(std), log_values(bn))
        if name == "ours":
            verdict = decide(c, "lower")
        parts.append(compare_text(c, f"{text}: BN − standard, max gradient change", log=True))
    return verdict, "per seed, median over training steps: " + "; ".join(parts) + f". {RULE}"


def _fig10_plan(preset: str) -> Plan:
    return Plan(compute={"predictiveness": lambda tiny=False: predictiveness_curves(preset, tiny)})


def _fig10_analyze(ctx) -> Outcome:
    pred = (ctx.data or {}).get("predictiveness") or {}
    fig = safe_panels(ctx.figure_path("predictiveness"), _fig10_panels(pred) or [{"title": "no replay data"}],
                      ncols=3, title="Santurkar Fig. 10: gradient change and loss along the gradient, "
                                     "against the step size")
    windows = _replay_windows(pred)
    table = []
    for name, text in (("ours", f"[1/100, 30] × {DLN_LR:g}"), ("literal", f"[1/100, 30] × {LITERAL_LR:g}"),
                       ("beyond", f"(30, {FIG10_MULTIPLIERS[1]:g}] × {DLN_LR:g}")):
        for k in LANDSCAPE:
            table.append({"quantity": f"{text}: median {LANDSCAPE[k]} per seed, standard / BN",
                          "ours": " / ".join(" ".join(fmt(s[k]) for s in windows.get(label, {}).get(name, []))
                                             or "—" for label in FIG6_LABELS),
                          "paper": "BN much smaller, also beyond 30 × lr (Figs 9, 10)"})
    verdict, summary = fig10_verdict(windows, _inconclusive_if_tiny(ctx))
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="santurkar-fig10", paper="santurkar", target="Fig. 10",
    title="Gradient predictiveness against the distance moved along the gradient, DLN with and without BN",
    claim="At a given training step, the ℓ2 change between the gradient and the gradients seen while moving along "
          "it grows much more slowly with the distance moved in a DLN with BN: gradients are more predictive.",
    smoke_changes="a plain full-batch SGD replay of the smoke DLNs (lr 1e-3, 600 steps, 3 seeds per arm) "
                  "evaluated at steps 0, 200 and 600 on 27 log-spaced step sizes from 1/100 to 1000 × lr (the "
                  "paper's range ends at 30 × lr). Verdict: Welch's t-test over seeds of the median (steps 200, "
                  "600) of the largest gradient change over [1/100, 30] × lr, ln scale.",
    cost={"smoke": "≈ 50 s CPU (6 DLN replays of 600 steps, 3 landscape evaluations each)",
          "paper": "6 replays × 10 000 steps (≈ 20 min on a CPU)"},
    plan=_fig10_plan, analyze=_fig10_analyze))
