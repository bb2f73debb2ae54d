"""Luo et al. 2019, Fig. 6 (§5.1): fine-tuning with BN folded into the weights, which removes the
batch statistics' noise and so its regularization. The other CNN entries are in
:mod:`bnlab.experiments.luo.cnn` (Fig. 4) and :mod:`bnlab.experiments.luo.dropout` (Fig. 7); shared
constants and helpers in :mod:`bnlab.experiments.luo.common`."""

from __future__ import annotations

import copy
import tempfile

from torch import nn

from bnlab.callbacks import Callback, Loop
from bnlab.norms import fold
from bnlab.train.callbacks import trainer_of
import bnlab.train as bnlab_train  # looked up on use: a test can patch bnlab.train.run

from ..base import Experiment, Outcome, Plan, register, shrink
from .cnn import SMOKE_DATA, train_size
from bnlab.formatting import finite_or_none, fmt
from ..common import (CATALOGUE_PILOT, RULE, SETTLE_FRACTION, DesignSD, compare_arms,
                      safe_panels)
from ..verdicts import NOT_HELD, checks, combine, explain, ladder, settle
from ..resolution import family_resolution
from .common import (jsonable_copy, collected_series, train_collecting, unfinished_status,
                     window_mean)
from ..runner import TINY_STEPS


# ================================================================================================
# Fig. 6: fine-tuning with BN folded into the weights
# ================================================================================================

class KernelNorms(Callback):
    """Callback: ‖W‖ of every conv/linear kernel of ``fold(model)`` — for a BN model the effective
    kernel γ·W/σ of §5.1 (σ the moving average), for a folded model its own kernel."""

    def __init__(self, every: int) -> None:
        self.every = int(every)

    def on_train_batch_end(self, loop: Loop) -> None:
        if loop.step % self.every and loop.step not in (1, trainer_of(loop).total_steps):
            return
        for name, module in fold(loop.model).named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                loop.log(f"kernel_norm/{name}", float(module.weight.detach().norm()))


_FIG6 = {
    "paper": {"base": {"model": "luo_cnn", "data": "cifar10", "momentum": 0.9, "batch_size": 64,
                       "seed": 0},
              "pretrain": {"epochs": 100, "lr": 0.01, "schedule": "exp:0.9999"},
              "finetune": {"epochs": 20, "lr": 1e-3}},
    "smoke": {"base": {"model": "luo_cnn", "model_options": {"width": 0.25}, "data": "digits",
                       "data_options": dict(SMOKE_DATA), "momentum": 0.9, "batch_size": 64,
                       "seed": 0},
              "pretrain": {"epochs": 20, "lr": 0.05}, "finetune": {"epochs": 20, "lr": 0.03}},
}


FIG6_SEEDS = (0, 1, 2)


def fig6_data(preset: str, tiny: bool = False, seed: int = 0, runs_dir: str | None = None) -> dict:
    """Train BN; then fine-tune (a) the same BN model and (b) ``fold(model)`` (BN frozen into the
    kernels, w_sgd = γ w_bn/σ, §5.1) with plain SGD at a small lr; kernel norms and losses of both.
    One seed. With ``runs_dir`` every run is trained in that run store (resumed there, read back
    once ended): the pretraining as the plain run of its config, each fine-tuning under a model
    label naming its branch and the pretrained run it starts from; without, in a throw-away one."""
    if runs_dir is not None:
        return _fig6_seed(preset, tiny, seed, str(runs_dir))
    with tempfile.TemporaryDirectory(prefix="bnlab-fig6-") as tmp:
        return _fig6_seed(preset, tiny, seed, tmp)


def _fig6_seed(preset: str, tiny: bool, seed: int, runs_dir: str) -> dict:
    s = _FIG6[preset]
    base = {**s["base"], "seed": seed}
    pre_cfg = {**base, **s["pretrain"], "norm": "bn"}
    pre_cfg = shrink(pre_cfg, TINY_STEPS) if tiny else pre_cfg
    spe = -(-train_size(s["base"]) // s["base"]["batch_size"])
    try:
        record = bnlab_train.run({**pre_cfg, "runs_dir": runs_dir}, progress=False)
    except Exception as err:  # reported in the entry, never fatal to the sweep
        return {"pretrain": {"status": "failed", "metrics": {},
                             "error": f"{type(err).__name__}: {err}"},
                "branches": {}}
    if record.status != "finished":
        return {"pretrain": {"status": record.status, "metrics": jsonable_copy(record.metrics)},
                "branches": {}}
    bn_model = bnlab_train.load_model(record.id, runs_dir)
    folded = fold(bn_model)
    branches = {}
    for key, model, norm in (("bn", bn_model, "bn"), ("frozen", folded, "none")):
        config = {**base, **s["finetune"], "model": f"luo_cnn[{key}, fine-tune of {record.id}]",
                  "norm": norm, "eval_every": spe}
        branches[key] = train_collecting(config, callbacks=[KernelNorms(spe)], tiny=tiny,
                                         model_factory=lambda shape, n, m=model: copy.deepcopy(m),
                                         runs_dir=runs_dir)
    return {"pretrain": {"status": record.status, "metrics": jsonable_copy(record.metrics)},
            "branches": branches, "steps_per_epoch": spe}


def _fig6_plan(preset: str) -> Plan:
    def compute(tiny: bool = False, runs_dir: str | None = None) -> dict:
        per_seed = {str(seed): fig6_data(preset, tiny, seed, runs_dir) for seed in FIG6_SEEDS}
        return {"seeds": per_seed,
                "steps_per_epoch": next(iter(per_seed.values())).get("steps_per_epoch", 1)}

    return Plan(compute={"fig6": compute})


def fig6_changes(seed_data: dict, fraction: float = 1.0) -> dict | None:
    """One seed's changes over frozen fine-tuning up to ``fraction`` of it: per layer the
    kernel-norm growth, the training-loss change and the validation-loss change from the pretrained
    model's (ends: means of the last 3 records). None when the seed recorded too little."""
    frozen = (seed_data.get("branches") or {}).get("frozen") or {}
    start_val = finite_or_none(((seed_data.get("pretrain") or {}).get("metrics")
                                or {}).get("test_loss"))
    train_steps, train = collected_series(frozen, "epoch_train_loss")
    first_train = next((v for v in train if finite_or_none(v) is not None), None)
    val_end = window_mean(*collected_series(frozen, "test_loss"), fraction)
    train_end = window_mean(train_steps, train, fraction)
    norms = {}
    for name in (frozen.get("series") or {}):
        if name.startswith("kernel_norm/"):
            steps, values = collected_series(frozen, name)
            kept = [v for s, v in zip(steps, values) if s <= steps[-1] * fraction
                    and finite_or_none(v) is not None]
            if len(kept) >= 2:
                norms[name[len("kernel_norm/"):]] = kept[-1] - kept[0]
    if None in (start_val, first_train, val_end, train_end) or not norms:
        return None
    return {"norms": norms, "train": train_end - first_train, "val": val_end - start_val}


# Design SDs of one seed's change, per quantity: the root-mean-square of the pilot's
# pooled SDs (against 0) at the end and at 2/3 of fine-tuning; the kernel norm pools its 6 layers.
FIG6_DESIGN_SD = DesignSD({"kernel-norm growth": 0.0012, "training-loss change": 7.5e-05,
                           "validation-loss change": 0.0031},
                          CATALOGUE_PILOT)


def fig6_verdict(changes: list[dict], tiny: bool = False, *,
                 design_sd: DesignSD = FIG6_DESIGN_SD) -> tuple[str, str]:
    """Fig. 6's claim from per-seed changes over frozen fine-tuning (:func:`fig6_changes`).

    Rule: :data:`common.RULE` (Welch's t against 0, α = 0.05, ≥ 3 seeds) on each change. Held: every
    layer's kernel norm grows, the training loss falls and the validation loss rises, each
    significantly; not held: one of them significantly the other way; otherwise inconclusive, with
    the validation-loss rise the seeds resolve (power 0.8). Primary, pre-declared: the conjunction
    of these changes (the claim names all three), each against 0 (:func:`verdicts.checks`: "the
    other way" Holm-corrected over them). Resolutions are stated at ``design_sd``.
    """
    if tiny:
        return ladder(unusable=True), "tiny run: a few fine-tuning steps"
    if len(changes) < 1:
        return ladder(unusable=True), "the fine-tuning runs recorded too little"
    n = len(changes)
    layers = sorted(set.intersection(*(set(c["norms"]) for c in changes)))
    norm_tests = {k: compare_arms([0.0] * n, [c["norms"][k] for c in changes],
                                  design_sd=design_sd.of("kernel-norm growth")) for k in layers}
    train = compare_arms([0.0] * n, [c["train"] for c in changes],
                         design_sd=design_sd.of("training-loss change"))
    val = compare_arms([0.0] * n, [c["val"] for c in changes],
                       design_sd=design_sd.of("validation-loss change"))
    grown = [k for k, c in norm_tests.items() if c.decision == "higher"]
    summary = (f"BN frozen into the kernels ({n} seeds): {len(grown)}/{len(layers)} kernel norms "
               f"grew significantly; training-loss change {train.text()}; validation-loss change "
               f"from the pretrained model {val.text()}")
    few = train.decision == "too few seeds"
    comps = {**norm_tests, "training loss rose": train, "validation loss fell": val}
    outcome = checks(comps, {**{k: "higher" for k in norm_tests}, "training loss rose": "lower",
                             "validation loss fell": "higher"})
    wrong = [k for k, v in outcome.items() if v == NOT_HELD]
    verdict = ladder(combine(list(outcome.values())), unusable=few)
    return verdict, summary + explain(
        verdict, not_held=f" — significantly the other way: {', '.join(wrong)} ({RULE})",
        held=f" — every change significant as claimed ({RULE})",
        inconclusive=f" — fewer than 3 seeds ({RULE})" if few else
        f" — not all resolved; {n} seeds at the design SD resolve a validation-loss rise ≥ "
        f"{fmt(val.mde)} ({RULE})") + f"; resolution from the {design_sd.text()}"


def _fig6_analyze(ctx) -> Outcome:
    data = ctx.data.get("fig6") or {}
    seeds = data.get("seeds") or {}
    first = next(iter(seeds.values()), {})
    branches = first.get("branches") or {}
    spe = data.get("steps_per_epoch") or 1
    names = {"bn": "with BN (effective kernel γW/σ)", "frozen": "BN frozen, vanilla SGD"}
    layers = sorted({k for b in branches.values() for k in (b.get("series") or {})
                     if k.startswith("kernel_norm/features")})
    specs = []
    for layer in layers[:4]:
        series = {names[k]: _scale_steps(collected_series(b, layer), spe)
                  for k, b in branches.items()}
        specs.append({"series": series, "xlabel": "fine-tuning epoch", "ylabel": "‖W‖",
                      "title": layer[len("kernel_norm/"):] + " (seed 0)"})
    for metric, title in (("epoch_train_loss", "training loss"), ("test_loss", "validation loss")):
        series = {f"{names[k]}, seed {seed}": _scale_steps(collected_series(b, metric), spe)
                  for seed, d in seeds.items() for k, b in (d.get("branches") or {}).items()}
        specs.append({"series": series, "xlabel": "fine-tuning epoch", "ylabel": metric,
                      "title": title})
    if not specs:
        specs = [{"series": {}, "title": "no fine-tuning data"}]
    fig = safe_panels(ctx.figure_path("finetune_frozen_bn"), specs,
                      title="Luo Fig. 6: fine-tuning with BN frozen into the weights")
    end = [c for c in (fig6_changes(d) for d in seeds.values()) if c is not None]
    mid = [c for c in (fig6_changes(d, SETTLE_FRACTION) for d in seeds.values()) if c is not None]
    verdict, summary = settle(fig6_verdict(end, ctx.tiny), fig6_verdict(mid, ctx.tiny))
    gone = {s: unfinished_status(d, "pretrain", "frozen") for s, d in seeds.items()
            if fig6_changes(d) is None}
    if gone:  # left out, not given a failure value: say how many and why
        summary += f"; {len(gone)} of {len(seeds)} seeds left out: " + ", ".join(
            f"seed {s} {why}" for s, why in gone.items())
    table = [{"quantity": "frozen branch per seed: validation-loss change (2/3 of fine-tuning) / "
                          "training-loss change",
              "ours": "; ".join(f"{e['val']:+.4f} ({m['val']:+.4f}) / {e['train']:+.4f}"
                                for e, m in zip(end, mid)) or "—",
              "paper": "frozen fine-tuning: kernel norms of every layer grow, training loss falls, "
                       "validation loss rises"}]
    for key in ("bn", "frozen"):
        finals = [((d.get("branches") or {}).get(key) or {}).get("metrics") or {}
                  for d in seeds.values()]
        table.append({"quantity": f"{names[key]}: final train / validation loss per seed",
                      "ours": "; ".join(f"{fmt(finite_or_none(m.get('train_loss')), 4)} / "
                                        f"{fmt(finite_or_none(m.get('test_loss')), 4)}"
                                        for m in finals),
                      "paper": "BN: stable" if key == "bn"
                      else "lower train, higher validation than BN"})
    for seed, d in seeds.items():
        growth = {key: kernel_growth(b) for key, b in (d.get("branches") or {}).items()}
        if growth.get("bn") and growth.get("frozen"):
            common = sorted(set(growth["bn"]) & set(growth["frozen"]))
            more = [k for k in common if growth["frozen"][k] > growth["bn"][k]]
            table.append({"quantity": f"seed {seed}: layers whose kernel grows more frozen than "
                                      "with BN (effective kernel)",
                          "ours": f"{len(more)}/{len(common)}",
                          "paper": "kernel norms increase when freezing BN, 'compared to the "
                                   "results of BN'"})
    return Outcome([fig], table, verdict, summary)


def kernel_growth(branch: dict) -> dict[str, float]:
    """Per layer: last minus first recorded kernel norm of a fine-tuning branch."""
    out = {}
    for name in (branch.get("series") or {}):
        if name.startswith("kernel_norm/"):
            values = [v for v in collected_series(branch, name)[1] if finite_or_none(v) is not None]
            if len(values) >= 2:
                out[name[len("kernel_norm/"):]] = values[-1] - values[0]
    return out


def _scale_steps(series: tuple[list, list], spe: int) -> tuple[list, list]:
    return [s / spe for s in series[0]], series[1]


register(Experiment(
    id="luo-fig6", paper="luo", target="Fig. 6",
    title="Fine-tuning with BN frozen into the weights vs with BN",
    claim="Removing BN's batch-statistics noise (kernels initialised to γW/σ, then plain SGD) "
          "releases its regularization: kernel norms grow in every layer, training loss falls and "
          "validation loss rises.",
    smoke_changes="digits with 70 % held out (539 training images, so over-fitting shows quickly), "
                  "luo_cnn at 1/4 width, 20 epochs of BN training, then 20 fine-tuning epochs at "
                  "lr 0.03 (paper 1e-3 on CIFAR-10), 3 seeds (the paper: one run); each change "
                  "tested against 0 by Welch's t (α = 0.05), repeated at 2/3 of fine-tuning to "
                  "check it has settled. The fine-tuning runs are computed beside the sweep (a "
                  "bnlab.train config cannot start from another run's folded weights), trained "
                  "in the run store like every run.",
    cost={"smoke": "≈25 s wall (3 × 3 runs)",
          "paper": "3 × (100 + 2 × 20) epochs luo_cnn on CIFAR-10 (GPU)"},
    plan=_fig6_plan, analyze=_fig6_analyze,
    resolution=family_resolution(
        "direction only: with BN frozen into the kernels, kernel norms grow, training loss falls "
        "and validation loss rises (Fig. 6)", FIG6_DESIGN_SD, 3)))
