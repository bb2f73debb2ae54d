"""Peng, Yu & Yu — Complete BN on ILSVRC2012: ``peng-table5`` (top-1 accuracy) and ``peng-fig6``
(training loss).

Table 5 and Fig. 6 compare vanilla BN with CBN in ResNet-18, ResNet-50 and EfficientNet-B0, each
with Sigmoid, Tanh, ReLU, SELU and Swish (§6.1–6.2). Both entries share one sweep (same configs,
same run ids: running one entry runs the other's training too):

* BN arm = row ① of Tables 1–4 (``bn`` after the convolution), CBN arm = row ② (``cbn(rho=ρ*,
  amat=true)`` in front of the convolution, Peng Fig. 1(c)); ρ* per activation as in ``common.py``.
* Residual form: Peng write both the BN block (Eq. 13) and the CBN block (Eq. 7) as ``x + δ(y)``,
  the activation before the shortcut sum, so both arms of the ResNets use that form
  (``residual="peng"``); EfficientNet's MBConv blocks have no activation after their sum, so the
  question does not arise there.
* paper preset: torchvision's networks (``tv_resnet18``, ``tv_resnet50``, ``tv_efficientnet_b0``) on
  ImageNet laid out as an image folder (``imagefolder`` source,
  ``$BNLAB_DATA/imagenet/{train,val}``), the PyTorch ImageNet example's augmentation and evaluation
  (224 crops, 256 resize), SGD momentum 0.9, weight decay 1e-4, batch 256, lr 0.1 ÷10 after epochs
  30, 60, 90, 120 epochs (§6.1). The paper prints one number per cell; we run 3 seeds so that the
  comparison has a stated rule.
* smoke preset: bnlab's own ResNet-20 (width ¼, Eq. 7 residual form, replicate padding) stands in
  for ResNet-18 — torchvision cannot be imported in every environment bnlab's smoke runs must work
  in (a CUDA torchvision beside a CPU torch fails at import) — on a generated 10-class image folder
  (`bnlab.data.image_writer`: oriented colour gratings written as real JPEG files, read back through
  the same ``imagefolder`` path with random resized crops of at least 35 % of the area) at 16×16, 16
  epochs of 10 steps with the lr ÷10 after epochs 8 and 12, 3 seeds per arm.

Verdicts use :func:`bnlab.experiments.common.compare_arms` (Welch's t-test over seeds, α = 0.05,
minimum detectable effect at power 0.8) per (network, activation) cell; see `table5_verdict` and
`fig6_verdict`.
"""

from __future__ import annotations

import math
from typing import Any

from bnlab.plots import bars

from ..base import Experiment, Outcome, Plan, RunSpec, register
from bnlab.formatting import fmt, mean_std
from ..common import (CATALOGUE_PILOT, RULE, DesignSD, compare_arms, grouped_finals,
                      mean_curve, mean_over_run, safe_panels, smooth)
from .common import ACT_TITLE, ACTIVATIONS, NON_RELU, status_note, row_spec
from ..rule_stats import arm_values
from ..resolution import family_resolution
from bnlab.data.image_writer import GENERATED
from ..verdicts import RULE as JUDGED_RULE
from ..verdicts import NOT_HELD, conjunction, explain, family, ladder, short_of_effect

ARCHS = ("resnet18", "resnet50", "efficientnet_b0")
ARCH_TITLE = {"resnet18": "ResNet-18", "resnet50": "ResNet-50",
              "efficientnet_b0": "EfficientNet-B0"}
ARMS = ("BN", "CBN")
ARM_ROW = {"BN": "①", "CBN": "②"}  # rows of Tables 1–4 (peng.row_spec)

# Table 5, top-1 test accuracy (%), columns Sigmoid, Tanh, ReLU, SELU, Swish; one run per cell.
PAPER_TABLE5: dict[str, dict[str, tuple[float, ...]]] = {
    "resnet18": {"BN": (52.03, 64.45, 70.02, 65.46, 70.81),
                 "CBN": (70.15, 70.12, 70.43, 71.10, 71.39)},
    "resnet50": {"BN": (44.38, 69.35, 76.02, 69.68, 76.21),
                 "CBN": (72.82, 73.93, 76.38, 74.69, 76.75)},
    "efficientnet_b0": {"BN": (55.04, 67.95, 73.71, 69.51, 74.61),
                        "CBN": (70.36, 71.47, 74.05, 72.57, 75.08)},
}
# The "Imp." row as printed (checked against CBN − BN in the tests).
PRINTED_IMPROVEMENTS = {"resnet18": (18.12, 5.67, 0.41, 5.64, 0.58),
                        "resnet50": (28.44, 4.58, 0.36, 5.01, 0.54),
                        "efficientnet_b0": (15.32, 3.52, 0.34, 3.06, 0.47)}

PAPER_MODELS = {"resnet18": ("tv_resnet18", {"residual": "peng"}),
                "resnet50": ("tv_resnet50", {"residual": "peng"}),
                "efficientnet_b0": ("tv_efficientnet_b0", {})}
SEEDS = 3
PAPER_RECIPE = dict(data="imagefolder", data_options={"folder": "imagenet", "image_size": 224,
                                                      "resize_size": 256,
                                                      "cache": "none", "workers": 8},
                    epochs=120, lr=0.1, momentum=0.9, weight_decay=1e-4, batch_size=256,
                    schedule="step:30,60,90",
                    # 120 ImageNet epochs: a GPU or nothing
                    scale_invariant=[], log_every=100, device="cuda")
SMOKE_ARCH = "resnet18"  # the paper column the stand-in is compared with
# Replicate padding: with zero padding, 94 % of the input variance of BN+Sigmoid's 4×4 stage-3 norms
# in this proxy is the padding pattern (81 % at 8×8), against 26–37 % per stage in torchvision's
# ResNet-18 at 224 (measured at initialization, bnlab.models.padding); replicate padding brings it
# to ≈ 0.1 %.
SMOKE_MODEL = ("resnet20", {"width": 0.25, "residual": "peng", "padding_mode": "replicate"})
# Smoke schedule and crops (measured on the first smoke attempt and single trial runs): with
# ImageNet's 30/60/90-of-120 scaled to 16 epochs (lr 0.1 for 40 steps) and crops down to 8 % of a
# 16-pixel image, runs either found the orientations in the first 40 steps or never did (BN+Tanh 62
# / 64 / 19 %, CBN+Sigmoid 22–25 %); half the run at lr 0.1 and crops of at least 35 % of the area
# give the proxy a chance to learn.
SMOKE_RECIPE = dict(data="imagefolder", data_options={"folder": "bnlab-gratings", "generate": True,
                                                      "image_size": 16,
                                                      "resize_size": 18, "crop_scale_min": 0.35},
                    epochs=16, lr=0.1, momentum=0.9, weight_decay=1e-4, batch_size=60,
                    schedule="step:8,12",
                    scale_invariant=[])


def paper_gain(arch: str, activation: str) -> float:
    """CBN − BN of Table 5 in points for one cell."""
    i = ACTIVATIONS.index(activation)
    return PAPER_TABLE5[arch]["CBN"][i] - PAPER_TABLE5[arch]["BN"][i]


def _bases(preset: str) -> list[tuple[str, dict[str, Any]]]:
    if preset == "paper":
        return [(arch, dict(model=model, model_options=dict(options), **PAPER_RECIPE))
                for arch, (model, options) in PAPER_MODELS.items()]
    model, options = SMOKE_MODEL
    return [(SMOKE_ARCH, dict(model=model, model_options=dict(options), **SMOKE_RECIPE))]


def plan(preset: str) -> Plan:
    """BN and CBN × five activations × the preset's networks × 3 seeds (shared by Table 5 and Fig.
    6)."""
    runs = []
    for arch, base in _bases(preset):
        for act in ACTIVATIONS:
            for arm in ARMS:
                norm, placement = row_spec(ARM_ROW[arm], act)
                for seed in range(SEEDS):
                    config = {**base, "norm": norm, "placement": placement, "activation": act,
                              "seed": seed}
                    runs.append(RunSpec(f"{arm} · {ARCH_TITLE[arch]} · {ACT_TITLE[act]} · "
                                        f"seed {seed}", config,
                                        {"arch": arch, "arm": arm, "activation": act, "seed": seed,
                                         "model": base["model"], "norm": norm,
                                         "placement": placement}))
    return Plan(runs=runs)


# ---- verdicts ------------------------------------------------------------------------------------

def _cell_text(arch: str, act: str) -> str:
    return f"{ARCH_TITLE[arch]}/{ACT_TITLE[act]}"


def _cell_comparisons(cells: dict, archs: list[str], design_sd: float | None = None,
                      n_test: int | None = None) -> dict:
    """CBN − BN per (network, activation) cell by ``compare_arms`` (Welch, α = 0.05, ≥ 3 seeds),
    its resolvable effect from ``design_sd`` when given, its SE floored at the binomial SE on
    ``n_test`` validation images when given (accuracies)."""
    return {(arch, act): compare_arms(cells.get((arch, "BN", act), []),
                                      cells.get((arch, "CBN", act), []), design_sd=design_sd,
                                      n_test=n_test)
            for arch in archs for act in ACTIVATIONS}


# Validation images a top-1 accuracy is counted on: the generated gratings folder's (10 classes ×
# 30) in smoke, ILSVRC2012's 50,000 in paper. The binomial floor on the SE (rule 3).
VAL_IMAGES = {"smoke": GENERATED["classes"] * GENERATED["val_per_class"], "paper": 50_000}


# Design SD of one seed's top-1 (fraction): the root-mean-square over the five activations of the
# pooled per-arm SD of CBN − BN in the pilot (0.20, 0.35, 0.18, 0.37, 0.029; diverged seeds count
# as chance, 10 %), so the cells' resolvable effect is fixed before the runs.
TABLE5_DESIGN_SD = DesignSD(0.26, CATALOGUE_PILOT + ", RMS over the 5 activations")


def table5_verdict(cells: dict[tuple[str, str, str], list[float]], tiny: bool = False,
                   design_sd: DesignSD = TABLE5_DESIGN_SD,
                   n_test: int | None = VAL_IMAGES["smoke"]) -> tuple[str, str]:
    """Verdict on Table 5 from final top-1 accuracies (fractions) per (arch, arm, activation), one
    per seed.

    Claim: CBN's top-1 accuracy is higher than BN's with every activation in every network, by
    several points with Sigmoid, Tanh and SELU (paper: +3.1 to +28.4) and by less than a point with
    ReLU and Swish. Rule (:data:`RULE`) per (network, activation) cell: `compare_arms` (CBN − BN;
    Welch, α = 0.05, ≥ 3 seeds per arm, the SE floored at the binomial SE on ``n_test`` validation
    images, the resolvable effect from ``design_sd``, :data:`TABLE5_DESIGN_SD`, stated in advance).
    "not held": some cell against the claim after Holm's correction over the cells — CBN
    significantly lower (:func:`verdicts.family`), or the 95 % CI short of the paper's gain
    (:func:`verdicts.short_of_effect`: the data reject a gain of the paper's size). "held": every
    Sigmoid/Tanh/SELU cell significantly higher and no cell against the claim (a ReLU/Swish cell
    may be below resolution). Otherwise — a Sigmoid/Tanh/SELU cell not significantly higher, too
    few seeds, or tiny runs — "inconclusive", naming the effect the design could resolve. Primary,
    pre-declared: CBN − BN top-1 in every Sigmoid/Tanh/SELU cell, higher (a conjunction).

    Without a design SD, a cell with no detectable difference counted against the claim when
    the minimum detectable effect computed from *these seeds' own scatter* was below the paper's
    gain (a "precise null"): three seeds that happened to agree, with no floor on the SE, were
    enough.
    """
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    if not archs:
        return ladder(unusable=True), "no finished runs" + (" (tiny runs)" if tiny else "")
    lines, against, unresolved = [], [], []
    comps = _cell_comparisons(cells, archs, design_sd.of(), n_test)
    lower = family(comps, "higher")
    short = short_of_effect(comps, {key: paper_gain(*key) / 100 for key in comps})
    for arch in archs:
        for act in ACTIVATIONS:
            comp = comps[(arch, act)]
            gain = paper_gain(arch, act)
            lines.append(f"{_cell_text(arch, act)} {comp.text(100)} [paper {gain:+.2f}]")
            if lower[(arch, act)] == NOT_HELD or short[(arch, act)]:
                against.append(_cell_text(arch, act)
                               + (" (lower)" if lower[(arch, act)] == NOT_HELD
                                  else f" (95 % CI short of {gain:+.2f})"))
            elif comp.decision != "higher" and (act in NON_RELU
                                                or comp.decision == "too few seeds"):
                unresolved.append(f"{_cell_text(arch, act)} (resolvable ≥ "
                                  + (f"{100 * comp.mde:.2g}" if comp.mde is not None else "—")
                                  + f" vs paper {gain:+.2f} points)")
    floor = f", SE floored on {n_test} validation images" if n_test else ""
    summary = ("top-1 gain of CBN over BN, points: " + "; ".join(lines) + f". Rule: {JUDGED_RULE}; "
               f"resolvable effects at the {design_sd.text(100, ' points')}{floor}.")
    verdict = ladder(True if not unresolved else None, unusable=tiny, against=bool(against))
    return verdict, summary + explain(
        verdict, not_held=" Against the claim (Holm over the cells): " + ", ".join(against) + ".",
        inconclusive=" (tiny runs: a few steps each)" if tiny
        else " Not resolved: " + ", ".join(unresolved) + ".",
        held=" CBN is significantly better with Sigmoid, Tanh and SELU and nowhere worse.")


# Design SD of one seed's mean training loss (nats): the root-mean-square over the five activations
# of the pooled per-arm SD of CBN − BN in the pilot (0.22, 0.68, 0.32, 0.38, 0.15; diverged seeds
# count as ln 10).
FIG6_DESIGN_SD = DesignSD(0.39, CATALOGUE_PILOT + ", RMS over the 5 activations")


def fig6_verdict(cells: dict[tuple[str, str, str], list[float]], tiny: bool = False,
                 design_sd: DesignSD = FIG6_DESIGN_SD) -> tuple[str, str]:
    """Verdict on Fig. 6 from each run's mean training loss per (arch, arm, activation), one per
    seed.

    Claim (§6.2): CBN's training loss converges faster than BN's, consistently (every network, every
    activation). Rule per cell: `compare_arms` on the mean training loss (CBN − BN; Welch, α =
    0.05). "not held": CBN's mean loss significantly higher in some cell; "held": significantly
    lower in every cell; otherwise (a cell without a significant difference — the mde is stated —,
    too few seeds or tiny runs) "inconclusive". Fig. 6 prints curves only, so there is no paper
    effect size to compare the mde with. Primary, pre-declared: CBN − BN mean training loss in every
    cell, lower (:func:`verdicts.conjunction`: "significantly higher" judged with Holm's correction
    over the cells). Resolvable effects at ``design_sd`` (:data:`FIG6_DESIGN_SD`).
    """
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    if not archs:
        return ladder(unusable=True), "no finished runs" + (" (tiny runs)" if tiny else "")
    lines, higher, unresolved = [], [], []
    comps = _cell_comparisons(cells, archs, design_sd.of())
    holm_outcome = family(comps, "lower")
    for arch in archs:
        for act in ACTIVATIONS:
            comp = comps[(arch, act)]
            lines.append(f"{_cell_text(arch, act)} {comp.text()}")
            if holm_outcome[(arch, act)] == NOT_HELD:
                higher.append(_cell_text(arch, act))
            elif comp.decision != "lower":
                unresolved.append(_cell_text(arch, act)
                                  + (f" (resolvable ≥ {comp.mde:.2g})" if comp.mde is not None
                                     else " (too few seeds)"))
    summary = ("mean training loss of CBN minus BN over the run: " + "; ".join(lines)
               + f". Rule: {RULE}; resolvable effects at the {design_sd.text()}.")
    verdict = ladder(conjunction(comps, "lower"), unusable=tiny)
    return verdict, summary + explain(
        verdict, not_held=" CBN converges slower (Holm) in: " + ", ".join(higher) + ".",
        inconclusive=" (tiny runs: a few steps each)" if tiny
        else " Not resolved: " + ", ".join(unresolved) + ".",
        held=" CBN's training loss is significantly lower in every cell.")


# ---- analysis ------------------------------------------------------------------------------------

# classes of the data each preset trains on (smoke: the generated 10-class folder; paper:
# ILSVRC2012): a diverged run counts as a chance-level classifier, a failure of its arm
CLASSES = {"smoke": 10, "paper": 1000}


def _classes(ctx) -> int:
    return CLASSES.get(ctx.preset, CLASSES["smoke"])


def _loss_cells(ctx) -> dict[tuple[str, str, str], list[float]]:
    """Per-seed mean training loss per (arch, arm, activation); a diverged run counts as ln C, the
    loss of a chance-level classifier (failure of its arm, not missing data)."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for r in ctx.runs:
        key = (r.factors.get("arch"), r.factors.get("arm"), r.factors.get("activation"))
        cells.setdefault(key, []).extend(
            arm_values([r], lambda run: mean_over_run(run, "train_loss"),
                       math.log(_classes(ctx)))[0])
    return cells


def _val_images(ctx) -> int:
    return VAL_IMAGES.get(ctx.preset, VAL_IMAGES["smoke"])


def _pct_text(values: list[float]) -> str:
    """Per-seed accuracies as points: mean ± std (n=…), by the entries' one formatter."""
    mean, std = mean_std(values)
    return fmt(None if mean is None else 100 * mean, std=None if std is None else 100 * std,
               n=len(values), decimals=2)


def _table5_analyze(ctx) -> Outcome:
    cells = grouped_finals(ctx, ("arch", "arm", "activation"), "test_accuracy",
                           failure_value=1 / _classes(ctx))
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    # the cells' comparisons exactly as table5_verdict makes them
    comps = _cell_comparisons(cells, archs, TABLE5_DESIGN_SD.of(), _val_images(ctx))
    rows, ours, errs, paper = [], {}, {}, {}
    for arch in archs:
        for i, act in enumerate(ACTIVATIONS):
            group = f"{ARCH_TITLE[arch]}\n{ACT_TITLE[act]}"
            ours[group], errs[group], paper[group] = {}, {}, {}
            for arm in ARMS:
                values = cells.get((arch, arm, act), [])
                rows.append({"quantity": f"{ARCH_TITLE[arch]} · {ACT_TITLE[act]} · {arm} top-1 (%)",
                             "ours": _pct_text(values),
                             "paper": f"{PAPER_TABLE5[arch][arm][i]:.2f} (1 run)"})
                mean, std = mean_std(values)
                ours[group][arm] = float("nan") if mean is None else 100 * mean
                errs[group][arm] = 0.0 if std is None else 100 * std
                paper[group][arm] = PAPER_TABLE5[arch][arm][i]
            rows.append({"quantity": f"{ARCH_TITLE[arch]} · {ACT_TITLE[act]} · CBN − BN (points)",
                         "ours": comps[(arch, act)].text(100),
                         "paper": f"{paper_gain(arch, act):+.2f}"})
    figures = [bars(ctx.figure_path("top1_ours"), ours, errors=errs, ylabel="top-1 accuracy (%)",
                    title=f"Peng Table 5 (ours, {ctx.preset}): BN vs CBN"),
               bars(ctx.figure_path("top1_paper"), paper, ylabel="top-1 accuracy (%)",
                    title="Peng Table 5 as printed (ILSVRC2012)")]
    verdict, summary = table5_verdict(cells, ctx.tiny, n_test=_val_images(ctx))
    return Outcome(figures, rows, verdict, summary + status_note(ctx))


def _fig6_analyze(ctx) -> Outcome:
    cells = _loss_cells(ctx)
    archs = sorted({a for a, _, _ in cells if a in ARCHS}, key=ARCHS.index)
    specs, rows = [], []
    for arch in archs:
        for act in ACTIVATIONS:
            series = {}
            for arm in ARMS:
                runs = [r for r in ctx.runs if (r.factors.get("arch"), r.factors.get("arm"),
                                                r.factors.get("activation")) == (arch, arm, act)]
                finished = [r for r in runs if r.status == "finished"]
                curve = smooth(*mean_curve(finished, "train_loss"))
                series[f"{arm} (mean of {len(finished)} seeds)"] = curve
                mean, std = mean_std(cells.get((arch, arm, act), []))
                spread = f" ± {std:.3f}" if std else ""
                rows.append({"quantity": f"{ARCH_TITLE[arch]} · {ACT_TITLE[act]} · {arm} mean "
                                         "training loss",
                             "ours": "—" if mean is None else f"{mean:.3f}" + spread,
                             "paper": "curve only (Fig. 6)"})
            specs.append({"series": series, "xlabel": "step", "ylabel": "training loss",
                          "title": f"{ARCH_TITLE[arch]} · {ACT_TITLE[act]}", "logy": True})
    figure = safe_panels(ctx.figure_path("training_loss"), specs, ncols=5,
                         title=f"Peng Fig. 6 (ours, {ctx.preset}): training loss, BN vs CBN")
    verdict, summary = fig6_verdict(cells, ctx.tiny)
    return Outcome([figure], rows, verdict, summary + status_note(ctx))


_SMOKE = ("bnlab's ResNet-20 at width ¼ (Eq. 7 residual form, replicate padding) stands in for "
          "ResNet-18 (ResNet-50 and EfficientNet-B0 are not run); a generated 10-class folder of "
          "oriented colour gratings (600 training, 300 validation JPEGs) at 16×16 instead of "
          "ImageNet, read through the same image-folder source with random resized crops of at "
          "least 35 % of the area; 16 epochs of 10 steps (batch 60), lr 0.1 ÷10 after epochs 8 and "
          "12; 3 seeds per arm. The proxy can resolve gains of a few points, not ReLU's or Swish's "
          "+0.3–0.6.")
_COST = {"smoke": "30 runs × 160 steps (shared by the pair): 313 s of CPU with one thread, "
                  "measured",
         "paper": "90 runs (3 networks × 5 activations × 2 arms × 3 seeds) × 120 ImageNet epochs "
                  "(GPU; the paper used 8 per run; not run here)"}

register(Experiment(
    id="peng-table5", paper="peng", target="Table 5",
    title="BN vs CBN on ILSVRC2012: ResNet-18, ResNet-50, EfficientNet-B0, five activations "
          "(top-1)",
    claim=("CBN's top-1 accuracy beats BN's with every activation in every network, by several "
           "points with Sigmoid, Tanh and SELU (+3.1 to +28.4) and by less than one with ReLU and "
           "Swish."),
    smoke_changes=_SMOKE, cost=_COST, plan=plan, analyze=_table5_analyze,
    resolution=family_resolution(
        "CBN − BN top-1, ResNet-18: Sigmoid +18.1, Tanh +5.7, SELU +5.6, ReLU +0.4, Swish +0.6 "
        "points (Table 5)", TABLE5_DESIGN_SD, 3, scale=100, unit=" points per activation",
        smallest_effect=0.0564)))

register(Experiment(
    id="peng-fig6", paper="peng", target="Fig. 6",
    title="Training loss of BN vs CBN on ILSVRC2012: ResNet-18, ResNet-50, EfficientNet-B0, five "
          "activations",
    claim="CBN's training loss converges faster than BN's, consistently across networks and "
          "activations.",
    smoke_changes=_SMOKE, cost=_COST, plan=plan, analyze=_fig6_analyze,
    resolution=family_resolution(
        "direction only: CBN's training loss below BN's for every network and activation (Fig. 6)",
        FIG6_DESIGN_SD, 3, unit=" in training loss per activation")))
