"""Peng, Yu & Yu — Complete BN on ILSVRC2012: ``peng-table5`` (top-1 accuracy) and ``peng-fig6``
(training loss).

Table 5 and Fig. 6 compare vanilla BN with CBN in ResNet-18, ResNet-50 and EfficientNet-B0, each
with Sigmoid, Tanh, ReLU, SELU and Swish (§6.1–6.2). Both entries share one sweep (same configs,
same run ids: running one entry runs the other's training too):

* BN arm = row ① of Tables 1–4 (``bn`` after the convolution), CBN arm = row ② (``cbn(rho=ρ*,
  amat=true)`` in front of the convolution, Peng Fig. 1(c)); ρ* per activation as in ``common.py``.
* Residual form: a reading (:mod:`.blocks`). He's block (the activation after the shortcut sum,
  torchvision's own form, "the original ResNet" of §6.1) is the primary reading, Eq. 7's (the
  activation before the sum, as Peng write both the BN block, Eq. 13, and the CBN block) is trained
  beside it; both arms of a reading share its form. EfficientNet's MBConv blocks have no
  activation after their sum, so the question does not arise there.
* paper preset: torchvision's networks (``tv_resnet18``, ``tv_resnet50``, ``tv_efficientnet_b0``) on
  ImageNet laid out as an image folder (``imagefolder`` source,
  ``$BNLAB_DATA/imagenet/{train,val}``), the PyTorch ImageNet example's augmentation and evaluation
  (224 crops, 256 resize), SGD momentum 0.9, weight decay 1e-4, batch 256, lr 0.1 ÷10 after epochs
  30, 60, 90, 120 epochs (§6.1). The paper prints one number per cell; we run 3 seeds so that the
  comparison has a stated rule.
* smoke preset: bnlab's own ResNet-20 (width ¼, He's and Eq. 7's block forms, replicate padding)
  stands in for ResNet-18 — torchvision cannot be imported in every environment bnlab's smoke runs
  must work in (a CUDA torchvision beside a CPU torch fails at import) — on a generated 10-class
  image folder (`bnlab.data.image_writer`: oriented colour gratings written as real JPEG files, read
  back through the same ``imagefolder`` path with random resized crops of at least 35 % of the
  area) at 16×16, 16 epochs of 10 steps with the lr ÷10 after epochs 8 and 12, 5 seeds per arm.

Verdicts use :func:`bnlab.experiments.common.compare_arms` (Welch's t-test over seeds, α = 0.05,
minimum detectable effect at power 0.8) per (network, activation) cell; see `table5_verdict` and
`fig6_verdict`.
"""

from __future__ import annotations

import math
from typing import Any

from bnlab.plots import bars

from ..base import Experiment, Outcome, RunSpec, register
from bnlab.formatting import fmt, mean_std
from ..common import grouped_finals, mean_curve, mean_over_run, safe_panels, smooth
from .blocks import block_plan, judged_by_block
from .common import ACT_TITLE, ACTIVATIONS, status_note, row_spec
from ..run_facts import arm_values
from ..resolution import family_resolution
from .imagenet_rule import (ARCH_TITLE, ARCHS, FIG6_DESIGN_SD, PAPER_TABLE5,
                            TABLE5_DESIGN_SD, VAL_IMAGES, cell_comparisons,
                            fig6_record, fig6_verdict, paper_gain, table5_record,
                            table5_verdict)

ARMS = ("BN", "CBN")
ARM_ROW = {"BN": "①", "CBN": "②"}  # rows of Tables 1–4 (peng.row_spec)

# the block reading's ``residual=`` option goes to the ResNets (:func:`_bases`)
PAPER_MODELS = {"resnet18": "tv_resnet18", "resnet50": "tv_resnet50",
                "efficientnet_b0": "tv_efficientnet_b0"}
SEEDS = {"smoke": 5, "paper": 3}  # per arm and cell
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
SMOKE_MODEL = ("resnet20", {"width": 0.25, "padding_mode": "replicate"})
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


def _is_cbn(factors: dict) -> bool:
    return factors.get("arm") == "CBN"


def _bases(preset: str, residual: str) -> list[tuple[str, dict[str, Any]]]:
    if preset == "paper":
        return [(arch, dict(model=model, model_options={"residual": residual}
                            if "resnet" in arch else {}, **PAPER_RECIPE))
                for arch, model in PAPER_MODELS.items()]
    model, options = SMOKE_MODEL
    return [(SMOKE_ARCH, dict(model=model, model_options={**options, "residual": residual},
                              **SMOKE_RECIPE))]


def _runs(preset: str, residual: str) -> list[RunSpec]:
    """BN and CBN × five activations × the preset's networks × its seeds in one block form (shared
    by Table 5 and Fig. 6; EfficientNet's runs are the same in both forms, trained once)."""
    runs = []
    for arch, base in _bases(preset, residual):
        for act in ACTIVATIONS:
            for arm in ARMS:
                norm, placement = row_spec(ARM_ROW[arm], act)
                for seed in range(SEEDS["paper" if preset == "paper" else "smoke"]):
                    config = {**base, "norm": norm, "placement": placement, "activation": act,
                              "seed": seed}
                    runs.append(RunSpec(f"{arm} · {ARCH_TITLE[arch]} · {ACT_TITLE[act]} · "
                                        f"seed {seed}", config,
                                        {"arch": arch, "arm": arm, "activation": act, "seed": seed,
                                         "model": base["model"], "norm": norm,
                                         "placement": placement}))
    return runs


plan = block_plan(_runs)


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
    comps = cell_comparisons(cells, archs, TABLE5_DESIGN_SD.of(), _val_images(ctx))
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
    return Outcome(figures, rows, verdict, summary + status_note(ctx),
                   table5_record(verdict, cells, n_test=_val_images(ctx)))


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
    return Outcome([figure], rows, verdict, summary + status_note(ctx),
                   fig6_record(verdict, cells))


_SMOKE = ("bnlab's ResNet-20 at width ¼ (replicate padding) stands in for ResNet-18, in He's "
          "block form (the primary reading) and Eq. 7's beside it (ResNet-50 and EfficientNet-B0 "
          "are not run); a generated 10-class folder of oriented colour gratings (600 training, "
          "300 validation JPEGs) at 16×16 instead of ImageNet, read through the same image-folder "
          "source with random resized crops of at least 35 % of the area; 16 epochs of 10 steps "
          "(batch 60), lr 0.1 ÷10 after epochs 8 and 12; 5 seeds per arm. The proxy can resolve "
          "gains of a few points, not ReLU's or Swish's +0.3–0.6.")
_COST = {"smoke": "100 runs × 160 steps (shared by the pair; 50 per block form); 30 per form took "
                  "313 s of CPU with one thread, measured",
         "paper": "150 runs (3 networks × 5 activations × 2 arms × 3 seeds; the ResNets' in both "
                  "block forms) × 120 ImageNet epochs "
                  "(GPU; the paper used 8 per run; not run here)"}

register(Experiment(
    id="peng-table5", paper="peng", target="Table 5",
    title="BN vs CBN on ILSVRC2012: ResNet-18, ResNet-50, EfficientNet-B0, five activations "
          "(top-1)",
    claim=("CBN's top-1 accuracy beats BN's with every activation in every network, by several "
           "points with Sigmoid, Tanh and SELU (+3.1 to +28.4) and by less than one with ReLU and "
           "Swish."),
    smoke_changes=_SMOKE, cost=_COST, plan=plan,
    analyze=judged_by_block(_table5_analyze, _is_cbn),
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
    smoke_changes=_SMOKE, cost=_COST, plan=plan,
    analyze=judged_by_block(_fig6_analyze, _is_cbn),
    resolution=family_resolution(
        "direction only: CBN's training loss below BN's for every network and activation (Fig. 6)",
        FIG6_DESIGN_SD, 3, unit=" in training loss per activation")))
