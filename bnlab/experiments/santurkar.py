"""Santurkar, Tsipras, Ilyas & Madry 2018 — How does batch normalization help optimization?"""

from __future__ import annotations

from .base import Experiment, Outcome, Plan, RunSpec, register
from .common import final_table, training_curves

# ---- Fig. 2: standard vs BN vs "noisy" BN ------------------------------------------------------

_FIG2_NORMS = {"Standard": "none", "Standard + BatchNorm": "bn", 'Standard + "Noisy" BatchNorm': "noisy_bn"}


def _fig2_plan(preset: str) -> Plan:
    if preset == "paper":
        base = dict(model="vgg_santurkar", data="cifar10", epochs=40, lr=0.1, batch_size=128, momentum=0.0)
    else:
        base = dict(model="vgg_santurkar", model_options={"width": 0.125}, data="digits", epochs=8, lr=0.1,
                    batch_size=128, eval_every=12)
    return Plan(runs=[RunSpec(label, {**base, "norm": norm, "seed": 0}, {"norm": norm})
                      for label, norm in _FIG2_NORMS.items()])


def _fig2_analyze(ctx) -> Outcome:
    fig = training_curves(ctx, ctx.figure_path("training_curves"), title="Santurkar Fig. 2 (train / test accuracy)")
    rows = final_table(ctx, paper={"Standard": "≈ 0.88 test acc (VGG, CIFAR-10)",
                                   "Standard + BatchNorm": "≈ 0.90 test acc; trains faster",
                                   'Standard + "Noisy" BatchNorm': "≈ BN; trains faster than Standard"})
    acc = {r.label: r.final("train_accuracy") for r in ctx.runs}
    if any(v is None for v in acc.values()):
        return Outcome([fig], rows, "inconclusive", "a run did not finish")
    noisy, bn, std = (acc[k] for k in ('Standard + "Noisy" BatchNorm', "Standard + BatchNorm", "Standard"))
    held = noisy >= std - 0.01
    return Outcome([fig], rows, "held" if held else "not held",
                   f"final train accuracy: standard {std:.3f}, BN {bn:.3f}, noisy BN {noisy:.3f}; noisy BN "
                   f"{'matches or beats' if held else 'falls behind'} standard despite the injected covariate shift")


register(Experiment(
    id="santurkar-fig2", paper="santurkar", target="Fig. 2",
    title="Training with standard, BN and noisy BN VGG",
    claim="BN with injected, time-varying covariate shift ('noisy' BN) still trains as well as BN and better "
          "than the standard network: ICS reduction is not what makes BN work.",
    smoke_changes="digits (8×8) instead of CIFAR-10, VGG at 1/8 width, 8 epochs, one seed: the ordering of the "
                  "curves is what is checked, not their values.",
    cost={"smoke": "≈1 min CPU", "paper": "3 runs × 40 epochs VGG on CIFAR-10 (GPU, ~1 h)"},
    plan=_fig2_plan, analyze=_fig2_analyze))
