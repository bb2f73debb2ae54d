"""Santurkar et al. 2018, Fig. 10: gradient predictiveness against the distance moved along the
gradient, from a plain full-batch SGD replay of the deep linear networks of
:mod:`bnlab.experiments.santurkar.dln` (same configurations and seeds).

Both readings of the paper's rate (module docstring of :mod:`bnlab.experiments.santurkar`) are
replayed, each trained at its own rate, as ``santurkar-fig9`` trains its two arm pairs: lr 1e-3
(bnlab's conversion) judged over [1/100, 30] × 1e-3, and lr 1e-2 (the literal conversion) judged
over [1/100, 30] × 1e-2. The entry holds (or fails) only where both readings agree; otherwise it
is inconclusive, decided by the rate and not by BN. Each replay keeps the whole curve
‖∇L(θ) − ∇L(θ − s g)‖, L(θ − s g) over step sizes s up to 1000 × its rate. The verdict is a pure
function of per-seed numbers, tested on synthetic values.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import bnlab.models as M
from bnlab import data as D
from bnlab.probes import ProbeContext, evaluate_landscape

from ..base import Experiment, Outcome, Plan, register
from ..verdicts import RULE as JUDGED_RULE
from ..verdicts import Design, judge, ladder
from ..resolution import design_resolution
from bnlab.formatting import finite_or_none, fmt
from ..common import RULE, compare_arms, safe_panels
from .common import (
    BN, DLN_LR, DLN_RANGE, NORMS, SEEDS, SMOKE_DLN_STEPS, STANDARD, inconclusive_if_tiny,
    finite_median, compare_text, dln_config, log_values,
)
from .dln import FIG6_LABELS, LANDSCAPE, LITERAL_LR

# Fig. 10's replay goes past the paper's 30 × lr ("BN keeps smoothing further")
FIG10_MULTIPLIERS = (0.01, 1000.0)


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
    out: dict[str, Any] = {}
    for lr in (DLN_LR, LITERAL_LR):
        replay: dict[str, Any] = {"at_steps": list(at), "lr": lr, "step_sizes": fig10_grid(lr),
                                  "runs": {}}
        for label in FIG6_LABELS:
            for seed in seeds:
                config = dln_config(preset, NORMS[label], seed, lr)
                replay["runs"].setdefault(label, []).append(_replay(config, at))
        if lr == DLN_LR:
            out.update(replay)
        else:
            out[LITERAL_KEY] = replay
    return out


# where predictiveness_curves keeps the replay trained at LITERAL_LR (beside the lr 1e-3 one)
LITERAL_KEY = "trained_at_literal_lr"


def _replay(cfg: dict, at: tuple[int, ...]) -> dict:
    """Train one DLN config with plain full-batch SGD at its ``lr``, evaluating the landscape at
    the steps ``at`` on :func:`fig10_grid` of that rate."""
    lr = cfg["lr"]
    grid = torch.tensor(fig10_grid(lr), dtype=torch.float64)
    ds = D.load(cfg["data"], **cfg["data_options"], seed=cfg["seed"])
    model = M.create("dln", norm=cfg["norm"], input_shape=ds.input_shape,
                     num_classes=ds.num_outputs, seed=cfg["seed"], **cfg["model_options"])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
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
            res = evaluate_landscape(ProbeContext(model, loss_fn, (x, y), step, optimizer=opt),
                                     grid, "naive")
            curves.append({"step": step,
                           "grad_change": [finite_or_none(v) for v in res.grad_changes],
                           "loss": [finite_or_none(v) for v in res.losses],
                           "grad_norm": res.grad_norm, "loss_at_theta": res.loss})
        opt.step()
    return {"seed": cfg["seed"], "status": status, "curves": curves}


def window_summary(curve: dict, step_sizes: list[float], lo: float,
                   hi: float) -> dict[str, float | None]:
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
            curves = ([c for c in info.get("curves") or [] if c.get("step")]
                      or info.get("curves") or [])
            for name, (lo, hi) in windows.items():
                summaries = [window_summary(c, sizes, lo, hi) for c in curves]
                out[label][name].append({k: finite_median([sm[k] for sm in summaries])
                                         for k in LANDSCAPE})
    return out


def _fig10_panels(pred: dict, prefix: str = "") -> list[dict]:
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
                          "ylabel": ylabel, "title": f"{prefix}training step {step} (seed 0)",
                          "logx": True, "logy": True, "markers": True})
    return specs


# Fig. 10 plots curves, no number: the paper's effect is a direction. Design SD: the pooled SD of
# one seed's ln max gradient change in the smoke pilot of 2026-11-26 (SE 0.46 at 3/3 seeds, so SD ≈
# 0.46·√(3/2)).
FIG10_DESIGN = Design("BN − standard ln max gradient change over [1/100, 30] × lr",
                      paper_effect=-1.0, design_sd=0.56, n_seeds=len(SEEDS),
                      source="smoke pilot 2026-11-26", magnitude_known=False)
# The reading trained at the literal rate, judged by the same rule; no pilot of its own before the
# runs, so the lr 1e-3 pilot's SD (its observed SD is printed beside it)
FIG10_LITERAL_DESIGN = Design("BN − standard ln max gradient change over [1/100, 30] × 1e-2, "
                              "trained at 1e-2", paper_effect=-1.0, design_sd=0.56,
                              n_seeds=len(SEEDS), source="the lr 1e-3 reading's smoke pilot "
                              "(2026-11-26), assumed", magnitude_known=False)


def _grad_changes(windows: dict, name: str) -> tuple[list[float], list[float]]:
    return tuple([s["grad_change_max"] for s in windows.get(label, {}).get(name, [])
                  if s["grad_change_max"] is not None] for label in (STANDARD, BN))


def beta_edge(windows: dict, lr: float) -> dict[str, list[float]]:
    """Per arm, per seed: the effective β over [1/100, 30] × lr times lr/2 (1 = gradient descent's
    stability edge 2/lr, where a net trained at lr sits when it trains at the edge of
    stability). A window measured without β (a replay that stored only the gradient change)
    gives no value rather than failing the verdict."""
    return {label: [s["beta_smoothness"] * lr / 2 for s in windows.get(label, {}).get("ours", [])
                    if s.get("beta_smoothness") is not None] for label in FIG6_LABELS}


def fig10_verdict(windows: dict[str, dict[str, list[dict]]], tiny: str | None = None,
                  literal: dict[str, dict[str, list[dict]]] | None = None) -> tuple[str, str]:
    """Fig. 10 at both readings of the paper's rate, each trained at its own rate: gradients are
    more predictive with BN. Per seed, the median over the evaluated training steps (step 0 left
    out: both nets start from a random init) of max ‖∇L(θ) − ∇L(θ − s g)‖ over the paper's range
    [1/100, 30] × lr of the replay trained at lr; BN − standard on a ln scale, lower
    (:func:`verdicts.judge`) at lr 1e-3 (:data:`FIG10_DESIGN`) and at lr 1e-2 (``literal``, the
    windows of the replay trained at 1e-2; :data:`FIG10_LITERAL_DESIGN`). As in
    ``santurkar-fig9``: held or not held only where the readings agree, else inconclusive. The
    1e-2 window cut from the 1e-3 replay and the range beyond 30 × lr are reported beside it."""
    if tiny:
        return ladder(unusable=True), tiny
    parts, verdicts = [], []
    for trained, design, rate in ((windows, FIG10_DESIGN, DLN_LR),
                                  (literal or {}, FIG10_LITERAL_DESIGN, LITERAL_LR)):
        std, bn = _grad_changes(trained, "ours")
        j = judge(log_values(std), log_values(bn), design)
        verdicts.append(j.verdict)
        edge = beta_edge(trained, rate)
        parts.append(f"trained at lr {rate:g}, [1/100, 30] × {rate:g}: {j.verdict}: "
                     f"{j.text(design)}; β·lr/2 per seed, standard "
                     f"{fmt(edge[STANDARD]) if edge[STANDARD] else '—'}, BN "
                     f"{fmt(edge[BN]) if edge[BN] else '—'}")
    for name, text in (("literal", f"[1/100, 30] × {LITERAL_LR:g} cut from the lr {DLN_LR:g} "
                                   "replay"),
                       ("beyond", f"(30, {FIG10_MULTIPLIERS[1]:g}] × {DLN_LR:g}")):
        c = compare_arms(*(log_values(v) for v in _grad_changes(windows, name)))
        parts.append(compare_text(c, f"{text}: BN − standard, max gradient change", log=True))
    verdict = ladder(verdicts[0], unusable=verdicts[0] != verdicts[1])
    return verdict, ("per seed, median over training steps: " + "; ".join(parts)
                     + f". Primary at each reading: {JUDGED_RULE}; both readings must agree. "
                     f"Reported windows: {RULE}")


def _fig10_plan(preset: str) -> Plan:
    return Plan(compute={"predictiveness": lambda tiny=False: predictiveness_curves(preset, tiny)})


def _fig10_analyze(ctx) -> Outcome:
    pred = (ctx.data or {}).get("predictiveness") or {}
    literal = pred.get(LITERAL_KEY) or {}
    panels = _fig10_panels(pred) + _fig10_panels(literal, f"trained at lr {LITERAL_LR:g} · ")
    fig = safe_panels(ctx.figure_path("predictiveness"), panels or [{"title": "no replay data"}],
                      ncols=3, title="Santurkar Fig. 10: gradient change and loss along the "
                                     "gradient, against the step size, at both rate readings")
    windows, literal_windows = _replay_windows(pred), _replay_windows(literal)
    table = []
    for trained, name, text in (
            (windows, "ours", f"trained at {DLN_LR:g}, [1/100, 30] × {DLN_LR:g}"),
            (literal_windows, "ours", f"trained at {LITERAL_LR:g}, [1/100, 30] × {LITERAL_LR:g}"),
            (windows, "literal", f"trained at {DLN_LR:g}, [1/100, 30] × {LITERAL_LR:g}"),
            (windows, "beyond", f"trained at {DLN_LR:g}, (30, {FIG10_MULTIPLIERS[1]:g}] × "
                                f"{DLN_LR:g}")):
        for k in LANDSCAPE:
            per_arm = [" ".join(fmt(s[k]) for s in trained.get(label, {}).get(name, [])) or "—"
                       for label in FIG6_LABELS]
            table.append({"quantity": f"{text}: median {LANDSCAPE[k]} per seed, standard / BN",
                          "ours": " / ".join(per_arm),
                          "paper": "BN much smaller, also beyond 30 × lr (Figs 9, 10)"})
    for trained, rate in ((windows, DLN_LR), (literal_windows, LITERAL_LR)):
        edge = beta_edge(trained, rate)
        table.append({"quantity": f"trained at {rate:g}: effective β × lr / 2 per seed over "
                                  f"[1/100, 30] × {rate:g}, standard / BN (1 = the stability "
                                  "edge 2/lr)",
                      "ours": " / ".join(" ".join(fmt(v) for v in edge[label]) or "—"
                                         for label in FIG6_LABELS),
                      "paper": "—"})
    verdict, summary = fig10_verdict(windows, inconclusive_if_tiny(ctx), literal_windows)
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="santurkar-fig10", paper="santurkar", target="Fig. 10",
    title="Gradient predictiveness against the distance moved along the gradient, DLN with and "
          "without BN",
    claim="At a given training step, the ℓ2 change between the gradient and the gradients seen "
          "while moving along it grows much more slowly with the distance moved in a DLN with BN: "
          "gradients are more predictive.",
    smoke_changes="a plain full-batch SGD replay of the smoke DLNs at both readings of the "
                  "paper's rate, each trained at its own rate (lr 1e-3, bnlab's conversion, and "
                  "the literal 1e-2; 600 steps, 3 seeds per arm), evaluated at steps 0, 200 and "
                  "600 on 27 log-spaced step sizes from 1/100 to 1000 × lr (the paper's range ends "
                  "at 30 × lr). Verdict: Welch's t-test over seeds of the median (steps 200, 600) "
                  "of the largest gradient change over [1/100, 30] × lr, ln scale, at each rate; "
                  "inconclusive if the two rates disagree (as santurkar-fig9).",
    cost={"smoke": "≈ 2 min CPU (12 DLN replays of 600 steps, 3 landscape evaluations each)",
          "paper": "12 replays × 10 000 steps (≈ 40 min on a CPU)"},
    plan=_fig10_plan, analyze=_fig10_analyze, resolution=design_resolution(FIG10_DESIGN)))
