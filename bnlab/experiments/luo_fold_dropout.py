"""Luo et al. 2019, the CNN entries of §5 after Figs. 4 and 5 (:mod:`bnlab.experiments.luo_cnn`): Fig. 6
(fine-tuning with BN folded into the weights) and Fig. 7 (dropout after BN / WN at large batch). Shared constants
and helpers are in :mod:`bnlab.experiments.luo_common`."""

from __future__ import annotations

import copy
import tempfile

import numpy as np
from torch import nn

from bnlab.norms import fold
import bnlab.train as bnlab_train  # looked up on use: a test can patch bnlab.train.run

from .base import Experiment, Outcome, Plan, RunSpec, register, shrink
from .common import finite_or_none, safe_panels
from .luo_cnn import SMOKE_TEST_FRACTION, _cnn_base, _train_size
from .luo_common import _clean, _fmt, _series, train_collecting
from .runner import TINY_STEPS


# ================================================================================================
# Fig. 6: fine-tuning with BN folded into the weights
# ================================================================================================

class KernelNorms:
    """Callback: ‖W‖ of every conv/linear kernel of ``fold(model)`` — for a BN model the effective kernel
    γ·W/σ of §5.1 (σ the moving average), for a folded model its own kernel."""

    def __init__(self, every: int) -> None:
        self.every = int(every)

    def after_step(self, ctx) -> None:
        if ctx.step % self.every and ctx.step not in (1, ctx.total_steps):
            return
        for name, module in fold(ctx.model).named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                ctx.log(f"kernel_norm/{name}", float(module.weight.detach().norm()))


_FIG6 = {
    "paper": {"base": {"model": "luo_cnn", "data": "cifar10", "momentum": 0.9, "batch_size": 64, "seed": 0},
              "pretrain": {"epochs": 100, "lr": 0.01, "schedule": "exp:0.9999"},
              "finetune": {"epochs": 20, "lr": 1e-3}},
    "smoke": {"base": {"model": "luo_cnn", "model_options": {"width": 0.25}, "data": "digits",
                       "data_options": {"test_fraction": SMOKE_TEST_FRACTION}, "momentum": 0.9, "batch_size": 64,
                       "seed": 0},
              "pretrain": {"epochs": 20, "lr": 0.05}, "finetune": {"epochs": 20, "lr": 0.03}},
}


def fig6_data(preset: str, tiny: bool = False) -> dict:
    """Train BN; then fine-tune (a) the same BN model and (b) ``fold(model)`` (BN frozen into the kernels,
    w_sgd = γ w_bn/σ, §5.1) with plain SGD at a small lr; kernel norms and losses of both."""
    s = _FIG6[preset]
    pre_cfg = {**s["base"], **s["pretrain"], "norm": "bn"}
    pre_cfg = shrink(pre_cfg, TINY_STEPS) if tiny else pre_cfg
    spe = -(-_train_size(s["base"]) // s["base"]["batch_size"])
    with tempfile.TemporaryDirectory(prefix="bnlab-fig6-") as tmp:
        try:
            record = bnlab_train.run({**pre_cfg, "runs_dir": tmp}, progress=False)
        except Exception as err:  # noqa: BLE001 — reported in the entry, never fatal to the sweep
            return {"pretrain": {"status": "failed", "metrics": {}, "error": f"{type(err).__name__}: {err}"},
                    "branches": {}}
        if record.status != "finished":
            return {"pretrain": {"status": record.status, "metrics": _clean(record.metrics)}, "branches": {}}
        bn_model = bnlab_train.load_model(record.id, tmp)
    folded = fold(bn_model)
    branches = {}
    for key, model, norm in (("bn", bn_model, "bn"), ("frozen", folded, "none")):
        config = {**s["base"], **s["finetune"], "model": f"luo_cnn[{key}, fine-tune]", "norm": norm,
                  "eval_every": spe}
        branches[key] = train_collecting(config, callbacks=[KernelNorms(spe)], tiny=tiny,
                                         model_factory=lambda shape, n, m=model: copy.deepcopy(m))
    return {"pretrain": {"status": record.status, "metrics": _clean(record.metrics)}, "branches": branches,
            "steps_per_epoch": spe}


def _fig6_plan(preset: str) -> Plan:
    def compute(tiny: bool = False) -> dict:
        return fig6_data(preset, tiny)

    return Plan(compute={"fig6": compute})


def fig6_verdict(data: dict, tiny: bool) -> tuple[str, str]:
    frozen = (data.get("branches") or {}).get("frozen") or {}
    bn = (data.get("branches") or {}).get("bn") or {}
    start_val = finite_or_none(((data.get("pretrain") or {}).get("metrics") or {}).get("test_loss"))
    if tiny:
        return "inconclusive", "tiny run: a few fine-tuning steps"
    norms = {k[len("kernel_norm/"):]: _series(frozen, k)[1]
             for k in (frozen.get("series") or {}) if k.startswith("kernel_norm/")}
    train = [v for v in _series(frozen, "epoch_train_loss")[1] if v is not None]
    val = [v for v in _series(frozen, "test_loss")[1] if v is not None]
    bn_val = [v for v in _series(bn, "test_loss")[1] if v is not None]
    if not norms or len(train) < 2 or len(val) < 2 or start_val is None:
        return "inconclusive", "the fine-tuning runs recorded too little"
    grown = [k for k, v in norms.items() if v and v[-1] is not None and v[0] is not None and v[-1] > v[0]]
    norms_up = len(grown) == len(norms)
    train_down = train[-1] < train[0]
    val_end = float(np.mean(val[-3:]))
    val_up = val_end > start_val
    verdict = "held" if norms_up and train_down and val_up else "not held"
    bn_end = float(np.mean(bn_val[-3:])) if bn_val else None
    return verdict, (
        f"BN frozen into the kernels: {len(grown)}/{len(norms)} kernel norms grew, training loss "
        f"{train[0]:.4f} → {train[-1]:.4f}, validation loss {start_val:.4f} → {val_end:.4f} "
        f"({'up' if val_up else 'down'}; fine-tuning with BN ends at {_fmt(bn_end, 4)})")


def _fig6_analyze(ctx) -> Outcome:
    data = ctx.data.get("fig6") or {}
    branches = data.get("branches") or {}
    spe = data.get("steps_per_epoch") or 1
    names = {"bn": "with BN (effective kernel γW/σ)", "frozen": "BN frozen, vanilla SGD"}
    layers = sorted({k for b in branches.values() for k in (b.get("series") or {})
                     if k.startswith("kernel_norm/features")})
    specs = []
    for layer in layers[:4]:
        series = {names[k]: _scale_steps(_series(b, layer), spe) for k, b in branches.items()}
        specs.append({"series": series, "xlabel": "fine-tuning epoch", "ylabel": "‖W‖",
                      "title": layer[len("kernel_norm/"):]})
    for metric, title in (("epoch_train_loss", "training loss"), ("test_loss", "validation loss")):
        series = {names[k]: _scale_steps(_series(b, metric), spe) for k, b in branches.items()}
        specs.append({"series": series, "xlabel": "fine-tuning epoch", "ylabel": metric, "title": title})
    if not specs:
        specs = [{"series": {}, "title": "no fine-tuning data"}]
    fig = safe_panels(ctx.figure_path("finetune_frozen_bn"), specs,
                      title="Luo Fig. 6: fine-tuning with BN frozen into the weights")
    verdict, summary = fig6_verdict(data, ctx.tiny)
    table = [{"quantity": "verdict details", "ours": summary,
              "paper": "frozen fine-tuning: kernel norms of every layer grow, training loss falls, "
                       "validation loss rises"}]
    for key, b in branches.items():
        m = b.get("metrics") or {}
        table.append({"quantity": f"{names[key]}: final train / validation loss",
                      "ours": f"{_fmt(finite_or_none(m.get('train_loss')), 4)} / "
                              f"{_fmt(finite_or_none(m.get('test_loss')), 4)}",
                      "paper": "BN: stable" if key == "bn" else "lower train, higher validation than BN"})
    growth = {key: kernel_growth(b) for key, b in branches.items()}
    if growth.get("bn") and growth.get("frozen"):
        common = sorted(set(growth["bn"]) & set(growth["frozen"]))
        more = [k for k in common if growth["frozen"][k] > growth["bn"][k]]
        table.append({"quantity": "layers whose kernel grows more frozen than with BN (effective kernel)",
                      "ours": f"{len(more)}/{len(common)}",
                      "paper": "kernel norms increase when freezing BN, 'compared to the results of BN'"})
    return Outcome([fig], table, verdict, summary)


def kernel_growth(branch: dict) -> dict[str, float]:
    """Per layer: last minus first recorded kernel norm of a fine-tuning branch."""
    out = {}
    for name in (branch.get("series") or {}):
        if name.startswith("kernel_norm/"):
            values = [v for v in _series(branch, name)[1] if finite_or_none(v) is not None]
            if len(values) >= 2:
                out[name[len("kernel_norm/"):]] = values[-1] - values[0]
    return out


def _scale_steps(series: tuple[list, list], spe: int) -> tuple[list, list]:
    return [s / spe for s in series[0]], series[1]


register(Experiment(
    id="luo-fig6", paper="luo", target="Fig. 6",
    title="Fine-tuning with BN frozen into the weights vs with BN",
    claim="Removing BN's batch-statistics noise (kernels initialised to γW/σ, then plain SGD) releases its "
          "regularization: kernel norms grow in every layer, training loss falls and validation loss rises.",
    smoke_changes="digits with 70 % held out (539 training images, so over-fitting shows quickly), luo_cnn at 1/4 "
                  "width, 20 epochs of BN training, then 20 fine-tuning epochs at lr 0.03 (paper 1e-3 on CIFAR-10). "
                  "Computed in one step (bnlab.train configs cannot start from another run's folded weights).",
    cost={"smoke": "≈15 s CPU (3 runs)", "paper": "100 + 2 × 20 epochs luo_cnn on CIFAR-10 (GPU)"},
    plan=_fig6_plan, analyze=_fig6_analyze))


# ================================================================================================
# Fig. 7: dropout after BN / WN at large batch
# ================================================================================================

_FIG7_PAPER = {
    "BN, M = 64": "top-1 ≈ 0.80",
    "BN, M = 256": "higher validation loss, top-1 < 0.80",
    "WN, M = 256": "top-1 0.73",
    "BN + dropout 0.125, M = 256": "validation loss suppressed, top-1 up 'by a great margin'",
    "WN + dropout 0.25, M = 256": "top-1 0.80 (from 0.73), on par with BN M = 64",
}
# (label, norm, batch size, dropout after each normalized block)
_FIG7_ARMS = [("BN, M = 64", "bn", 64, 0.0), ("BN, M = 256", "bn", 256, 0.0), ("WN, M = 256", "wn", 256, 0.0),
              ("BN + dropout 0.125, M = 256", "bn", 256, 0.125), ("WN + dropout 0.25, M = 256", "wn", 256, 0.25)]
# which arm each dropout arm is compared with
_FIG7_PAIRS = {"BN + dropout 0.125, M = 256": "BN, M = 256", "WN + dropout 0.25, M = 256": "WN, M = 256"}


def _fig7_plan(preset: str) -> Plan:
    base = _cnn_base(preset, 60)
    runs = []
    for label, norm, M, p in _FIG7_ARMS:
        config = {**base, "norm": norm, "batch_size": M, "lr": base["lr"] * M / 64}
        if p:
            config["model_options"] = {**(base.get("model_options") or {}), "dropout": p}
        runs.append(RunSpec(label, config, {"norm": norm, "batch_size": M, "dropout": p}))
    return Plan(runs=runs)


def fig7_summary(results: dict[str, tuple[float | None, float | None]], tiny: bool) -> tuple[str, str]:
    """Verdict and summary: does dropout after each BN/WN block lower the validation loss at M = 256?"""
    small, large = results.get("BN, M = 64", (None, None)), results.get("BN, M = 256", (None, None))
    parts, helped = [], []
    if None not in (*small, *large):
        worse = large[0] > small[0] and large[1] <= small[1]
        parts.append(f"BN validation loss / top-1 at M = 64: {small[0]:.3f} / {small[1]:.3f}, at M = 256: "
                     f"{large[0]:.3f} / {large[1]:.3f} ({'worse' if worse else 'not worse'} at the large batch)")
    for arm, reference in _FIG7_PAIRS.items():
        with_drop, without = results.get(arm, (None, None)), results.get(reference, (None, None))
        if None in (with_drop[0], without[0]):
            continue
        helped.append(with_drop[0] < without[0])
        parts.append(f"{arm}: validation loss {with_drop[0]:.3f} vs {without[0]:.3f} without dropout")
    if tiny or len(helped) < len(_FIG7_PAIRS):
        return "inconclusive", "; ".join(parts) or "runs missing" + (" (tiny run)" if tiny else "")
    return ("held" if all(helped) else "not held"), "; ".join(parts)


def _fig7_analyze(ctx) -> Outcome:
    specs = []
    for metric, title in (("test_loss", "(a) validation loss"), ("test_accuracy", "(b) validation top-1")):
        series = {r.label: r.series(metric) for r in ctx.runs}
        specs.append({"series": {k: v for k, v in series.items() if v[0]}, "xlabel": "step", "ylabel": metric,
                      "logy": metric == "test_loss", "title": title})
    fig = safe_panels(ctx.figure_path("dropout_large_batch"), specs, title="Luo Fig. 7")
    results = {r.label: ((finite_or_none(r.final("test_loss")), finite_or_none(r.final("test_accuracy")))
                         if r.status == "finished" else (None, None)) for r in ctx.runs}
    table = [{"quantity": f"{label}: validation loss / top-1", "ours": f"{_fmt(v[0])} / {_fmt(v[1])}",
              "paper": _FIG7_PAPER.get(label, "—")} for label, v in results.items()]
    verdict, summary = fig7_summary(results, ctx.tiny)
    return Outcome([fig], table, verdict, summary)


register(Experiment(
    id="luo-fig7", paper="luo", target="Fig. 7",
    title="Dropout after BN / WN at large batch",
    claim="At M = 256 BN generalizes worse than at M = 64; dropout after each BN (0.125) or WN (0.25) layer "
          "compensates (WN top-1 0.73 → 0.80, on par with BN at M = 64).",
    smoke_changes="digits with 70 % held out, luo_cnn at 1/4 width, 60 epochs, lr 0.05·M/64; dropout (model option "
                  "`dropout`) follows each normalized block's activation.",
    cost={"smoke": "≈25 s CPU (5 runs)", "paper": "5 runs × 100 epochs luo_cnn on CIFAR-10 (GPU)"},
    plan=_fig7_plan, analyze=_fig7_analyze))
