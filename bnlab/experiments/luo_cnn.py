"""Luo et al. 2019, the CNN entries of §5: Fig. 4 (BN and its parts) and Fig. 5 (γ² and ζ against the batch
size); Figs. 6 and 7 on the same CNN are in :mod:`bnlab.experiments.luo_fold_dropout`. Shared constants and helpers
are in :mod:`bnlab.experiments.luo_common`."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .base import Experiment, Outcome, Plan, RunSpec, register
from .common import finite_or_none, safe_panels, spearman, tail_mean
from .luo_common import TRAIN_SIZES, _fmt, _points


# ================================================================================================
# Fig. 4: CNN with SGD, BN, WN, WN + mean-only BN, WN + variance-only BN
# ================================================================================================

_FIG4_ARMS = {"vanilla SGD": "none", "BN": "bn", "WN": "wn", "WN + mean-only BN": "wn+mean_only_bn",
              "WN + variance-only BN": "wn+var_only_bn"}
_FIG4_PAPER = {"vanilla SGD": "large val − train gap", "BN": "smallest gap (best generalization)",
               "WN": "gap larger than BN's", "WN + mean-only BN": "gap below WN's",
               "WN + variance-only BN": "gap below WN's"}


SMOKE_TEST_FRACTION = 0.7  # digits with 70 % held out: 539 training images, so over-fitting shows in minutes
DIGITS_TRAIN = {0.2: 1438, SMOKE_TEST_FRACTION: 539}  # training-set sizes of bnlab's stratified digits split


def _cnn_base(preset: str, smoke_epochs: int) -> dict:
    """§5's CNN and recipe: SGD, momentum 0.9, lr × (1 − 10⁻⁴) every step, no weight decay, no augmentation.

    The paper gives neither the initial lr nor the length; ours: lr 0.01 at M = 64 (scaled ∝ M, Goyal
    et al., as §5 says), 100 epochs. Smoke: digits with 70 % held out, 1/4 width, lr 0.05 at M = 64.
    """
    if preset == "paper":
        return {"model": "luo_cnn", "data": "cifar10", "epochs": 100, "lr": 0.01, "momentum": 0.9,
                "schedule": "exp:0.9999", "seed": 0}
    return {"model": "luo_cnn", "model_options": {"width": 0.25}, "data": "digits",
            "data_options": {"test_fraction": SMOKE_TEST_FRACTION}, "epochs": smoke_epochs, "lr": 0.05,
            "momentum": 0.9, "schedule": "exp:0.9999", "seed": 0}


def _train_size(config: dict) -> int:
    if config["data"] == "digits":
        return DIGITS_TRAIN[(config.get("data_options") or {}).get("test_fraction", 0.2)]
    return TRAIN_SIZES[config["data"]]


def _fig4_plan(preset: str) -> Plan:
    base = {**_cnn_base(preset, 40), "batch_size": 64}
    seeds = (0,) if preset == "paper" else (0, 1)
    return Plan(runs=[RunSpec(label if seed == 0 else f"{label} (seed {seed})", {**base, "norm": norm, "seed": seed},
                              {"arm": label, "norm": norm, "seed": seed})
                      for label, norm in _FIG4_ARMS.items() for seed in seeds])


def generalization_gap(run) -> float | None:
    """Validation loss − training loss, each the mean of its last 3 recorded values (one seed is noisy)."""
    if run.status != "finished":
        return None
    val, train = tail_mean(run, "test_loss", 3), tail_mean(run, "epoch_train_loss", 3)
    return None if val is None or train is None else val - train


def fig4_verdict(gaps: dict[str, float | None], tiny: bool) -> tuple[str, str]:
    """``gaps``: arm -> generalization gap (mean over seeds)."""
    if tiny:
        return "inconclusive", "tiny run: no generalization gap develops in a few steps"
    if any(gaps.get(k) is None for k in _FIG4_ARMS):
        return "inconclusive", "a run did not finish"
    bn_best = all(gaps["BN"] <= v for v in gaps.values())
    mean_helps = gaps["WN + mean-only BN"] < gaps["WN"]
    var_helps = gaps["WN + variance-only BN"] < gaps["WN"]
    verdict = "held" if bn_best and mean_helps and var_helps else "not held"
    parts = ", ".join(f"{k} {v:.4f}" for k, v in gaps.items())
    return verdict, (f"validation − training loss: {parts}; BN {'has' if bn_best else 'does not have'} the smallest "
                     f"gap, mean-only {'helps' if mean_helps else 'does not help'} and variance-only "
                     f"{'helps' if var_helps else 'does not help'} relative to WN")


def _fig4_analyze(ctx) -> Outcome:
    shown = [r for r in ctx.runs if r.factors.get("seed", 0) == 0]
    specs = []
    for metric, title in (("epoch_train_loss", "(a) training loss"), ("test_loss", "(b) validation loss")):
        series = {r.label: r.series(metric) for r in shown}
        specs.append({"series": {k: v for k, v in series.items() if v[0]}, "xlabel": "step", "ylabel": metric,
                      "logy": True, "title": title + " (seed 0)"})
    fig = safe_panels(ctx.figure_path("train_val_loss"), specs, title="Luo Fig. 4: regularization of BN and its parts")
    per_seed: dict[str, list[float | None]] = {}
    for r in ctx.runs:
        per_seed.setdefault(r.factors.get("arm", r.label), []).append(generalization_gap(r))
    gaps = {arm: (None if any(g is None for g in v) else float(np.mean(v))) for arm, v in per_seed.items()}
    acc = {r.factors.get("arm", r.label): finite_or_none(r.final("test_accuracy")) for r in shown}
    table = [{"quantity": f"{arm}: val − train loss per seed (seed-0 test acc {_fmt(acc.get(arm))})",
              "ours": " / ".join(_fmt(g) for g in per_seed[arm]), "paper": _FIG4_PAPER.get(arm, "—")}
             for arm in per_seed]
    verdict, summary = fig4_verdict(gaps, ctx.tiny)
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="luo-fig4", paper="luo", target="Fig. 4",
    title="CNN train/validation loss: SGD, BN, WN, WN + mean-only BN, WN + variance-only BN",
    claim="BN's generalization gap (validation − training loss) is the smallest; adding mean-only or "
          "variance-only BN to WN each reduces WN's gap (the noise of μ_B and of σ_B both regularize).",
    smoke_changes="digits (8×8) with 70 % held out (539 training images, so over-fitting shows) instead of "
                  "CIFAR-10, luo_cnn at 1/4 width, 40 epochs at lr 0.05, two seeds (gaps averaged); the ordering of "
                  "the gaps is what is checked.",
    cost={"smoke": "≈40 s CPU (10 runs), ≈70 s wall on a busy 2-core machine",
          "paper": "5 runs × 100 epochs luo_cnn on CIFAR-10 (GPU, ~1 h)"},
    plan=_fig4_plan, analyze=_fig4_analyze))


# ================================================================================================
# Fig. 5: γ² and ζ against the batch size
# ================================================================================================

_FIG5_BATCHES = (16, 32, 64, 128, 256)


def _fig5_plan(preset: str) -> Plan:
    base = _cnn_base(preset, 60)
    n_train = _train_size(base)
    runs = []
    for M in _FIG5_BATCHES:
        spe = -(-n_train // M)
        every = max(1, base["epochs"] * spe // 20)
        if spe > 1 and every % spe == 0:
            every += 1  # else every probe lands on the epoch's last (partial) batch, whose M is not M
        config = {**base, "norm": "bn", "batch_size": M, "lr": base["lr"] * M / 64,
                  "probes": ["gamma", "bn_regularization"], "probe_every": every}
        runs.append(RunSpec(f"BN, M = {M}", config,
                            {"batch_size": M, "steps_per_epoch": spe, "partial_last_batch": n_train % M != 0}))
    return Plan(runs=runs)


def _last_per_layer(run, prefix: str, k: int = 1) -> dict[str, float]:
    """Per layer, the mean of the last ``k`` finite values of ``<prefix><layer>``.

    Values measured on an epoch's last, partial batch are skipped: the probe takes M from the batch it
    sees, and Theorem 1's ζ ∝ 1/M would then belong to another batch size.
    """
    spe = run.factors.get("steps_per_epoch")
    skip_epoch_end = bool(run.factors.get("partial_last_batch")) and spe
    out = {}
    for name in run.metric_names(prefix):
        steps, values = run.series(name)
        kept = [v for s, v in zip(steps, values)
                if finite_or_none(v) is not None and not (skip_epoch_end and s % spe == 0)]
        if kept:
            out[name[len(prefix):]] = float(np.mean(kept[-k:]))
    return out


def fig5_verdict(batches: Sequence[int], per_layer: dict[str, Sequence[float | None]],
                 tiny: bool) -> tuple[str, str, dict[str, float | None]]:
    """``per_layer[layer]``: final γ² at each batch size. Held when the median layer's Spearman correlation
    between M and γ² is ≥ 0.8 (γ² grows with M in most layers, as in the paper's five one-BN models)."""
    rhos = {}
    for layer, values in per_layer.items():
        pairs = [(m, g) for m, g in zip(batches, values) if g is not None]
        rhos[layer] = spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) == len(batches) else None
    if tiny:
        return "inconclusive", "tiny run: γ has barely moved from 1", rhos
    known = [r for r in rhos.values() if r is not None]
    if not rhos or len(known) < len(rhos):
        return "inconclusive", "a run did not finish or recorded no γ", rhos
    median = float(np.median(known))
    verdict = "held" if median >= 0.8 else ("not held" if median <= 0 else "inconclusive")
    parts = ", ".join(f"{k} {v:.2f}" for k, v in rhos.items())
    return verdict, (f"Spearman correlation of the final γ² with M ∈ {list(batches)} per BN layer: {parts} "
                     f"(median {median:.2f})"), rhos


def _fig5_analyze(ctx) -> Outcome:
    runs = sorted(ctx.runs, key=lambda r: r.factors.get("batch_size", 0))
    batches = [r.factors.get("batch_size") for r in runs]
    per_layer = [_last_per_layer(r, "probe/gamma/sq_mean/") for r in runs]
    zetas = [_last_per_layer(r, "probe/bn_regularization/zeta/", k=3) for r in runs]
    mean_sq = [float(np.mean(list(d.values()))) if d else None for d in per_layer]
    mean_zeta = [float(np.mean(list(d.values()))) if d else None for d in zetas]
    val = [finite_or_none(r.final("test_loss")) if r.status == "finished" else None for r in runs]
    layers = sorted({k for d in per_layer for k in d})
    # log₂ M on a linear axis: matplotlib labels the minor ticks of a short log axis unreadably
    x = [math.log2(m) if m else None for m in batches]
    gamma_series = {layer: _points(x, [d.get(layer) for d in per_layer]) for layer in layers}
    gamma_series["mean over layers"] = _points(x, mean_sq)
    zeta_series = {"ζ (Theorem 1, layer mean)": _points(x, mean_zeta)}
    first = next(((m, z) for m, z in zip(batches, mean_zeta) if z), None)
    if first:
        zeta_series["∝ 1/M"] = (x, [first[1] * first[0] / m for m in batches])
    fig = safe_panels(ctx.figure_path("gamma_vs_batch"), [
        {"series": gamma_series, "xlabel": "log₂ M", "ylabel": "mean γ²", "markers": True,
         "title": "(a) γ² per BN layer"},
        {"series": {"validation loss": _points(x, val)}, "xlabel": "log₂ M", "ylabel": "validation loss",
         "markers": True, "title": "(b) validation loss"},
        {"series": zeta_series, "xlabel": "log₂ M", "ylabel": "ζ", "logy": True, "markers": True,
         "title": "ζ from the data (Eq. 4)"},
    ], title="Luo Fig. 5: batch size, γ² and regularization strength")
    verdict, summary, rhos = fig5_verdict(batches, {layer: [d.get(layer) for d in per_layer] for layer in layers},
                                          ctx.tiny)
    table = [{"quantity": f"M = {m}: layer-mean γ² / ζ / validation loss",
              "ours": f"{_fmt(g)} / {_fmt(z)} / {_fmt(v)}",
              "paper": "γ² grows with M; validation loss grows with M"}
             for m, g, z, v in zip(batches, mean_sq, mean_zeta, val)]
    table += [{"quantity": f"Spearman(M, γ²), {layer}", "ours": _fmt(rho), "paper": "> 0 (γ increases with M)"}
              for layer, rho in rhos.items()]
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="luo-fig5", paper="luo", target="Fig. 5",
    title="γ² and validation loss against the batch size",
    claim="Larger batches weaken BN's regularization ζ ∝ 1/M, so the learned γ² grows with the batch size "
          "(and the validation loss with it).",
    smoke_changes="digits with 70 % held out, luo_cnn at 1/4 width, 60 epochs, lr 0.05·M/64; BN in every layer at once "
                  "(the paper "
                  "trains five models with BN in one layer each — bnlab.models has one norm spec for all layers).",
    cost={"smoke": "≈40 s CPU (5 runs), ≈90 s wall on a busy 2-core machine",
          "paper": "5 runs × 100 epochs luo_cnn on CIFAR-10 (GPU)"},
    plan=_fig5_plan, analyze=_fig5_analyze))
