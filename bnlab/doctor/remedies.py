"""``report.try_remedies(model, loss_fn, batches)``: each suggested remedy applied to a deep copy
for a short run, with its measured effect. The original model, its optimizer and torch's RNG are
not touched (the copies train with fresh optimizers of the same class and hyper-parameters; the RNG
is restored afterwards).

What is measured, per warned code (``before``/``after`` are ``{"loss", "accuracy"}`` in eval mode
on ``heldout`` when given, else on the batches):

- stale-running-stats: eval before and after :func:`bnlab.norms.recollect_running_stats` over
  the batches.
- double-update: the named layers' updates per training forward as is and after
  ``bnlab.norms.convert(model, "bn")`` (bnlab's layers update once under checkpointing), and the
  recollection's eval effect.
- small-batch: ``steps`` more training steps at the user's batch size for the model as it is and
  for the model with every BN replaced by ``mbn`` (the ideal batch the finding chose, at its final
  λ); for each, eval (running statistics) and train mode (batch statistics at the user's batch
  size) on the same data, and their loss gap.
- beta-swamping: ``steps`` steps as is, and with the swamped layers' |β| clipped to |γ| (running
  statistics recollected): the training loss reached.
- sharpness: ``steps`` steps at the optimizer's learning rate and at one just inside the
  threshold (0.9·threshold/λ_max × lr): the training loss reached (and whether it diverged).
- effective-lr: collapsed weights rescaled to their init norm (the function is unchanged: they
  are scale-invariant; running statistics recollected) or, exploded, the learning rate of those
  weights lowered to bring the step angle to the threshold; ``steps`` steps each, loss reached.
- micro-batch-statistics: the cosine between the gradient accumulated over k micro-batches and
  the gradient of the same samples as one batch (1 = accumulation changes nothing), before and
  with :func:`bnlab.norms.accumulate`'s full-batch step (where it exists and the layers allow it).
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from bnlab import norms as N
from bnlab.probes.base import is_bn_layer

from .context import (MIN_SAMPLES, Checkup, as_trained, collect_batches, model_device,
                      tracking_layers)
from .checks_double import UpdateCounter
from .state import kept


@dataclass
class RemedyResults:
    """One entry per remedy tried: ``code``, ``remedy``, ``before``, ``after`` and ``effect``."""

    results: list[dict] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.results:
            return "no remedies to try (no warnings)"
        return "\n".join(f"{r['code']}: {r['effect']}" for r in self.results)

    def to_dict(self) -> dict:
        return {"results": self.results}


def _optimizer_like(optimizer, params, lr_scale: float = 1.0):
    """A fresh optimizer of ``optimizer``'s class with its first group's hyper-parameters (those
    its constructor takes: a scheduler's ``initial_lr`` is not one), the rate scaled."""
    if optimizer is None:
        return torch.optim.SGD(params, lr=0.01 * lr_scale)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    group = {k: v for k, v in optimizer.param_groups[0].items()
             if k != "params" and k in accepted}
    group["lr"] = float(optimizer.param_groups[0]["lr"]) * lr_scale
    return type(optimizer)(params, **group)


def _train(checkup: Checkup, model: nn.Module, steps: int, optimizer=None) -> list[float]:
    optimizer = optimizer or _optimizer_like(checkup.optimizer, model.parameters())
    as_trained(model)
    losses = []
    for x, y in itertools.islice(itertools.cycle(checkup.batches), steps):
        optimizer.zero_grad()
        loss = checkup.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _tail(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail)


def _recollect(checkup: Checkup, model: nn.Module) -> nn.Module:
    if tracking_layers(model):
        N.recollect_running_stats(model, [x for x, _ in checkup.batches])
    return model


def _replace_norms(model: nn.Module, spec: str) -> nn.Module:
    """Every BN-family layer of ``model`` (torch's and bnlab's) replaced by ``create(spec, C)``,
    affine parameters and running statistics copied."""
    for _, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not is_bn_layer(child) or is_bn_layer(parent):
                continue
            new = N.create(spec, child.num_features)
            state = {k: v for k, v in child.state_dict().items()
                     if k in new.state_dict() and new.state_dict()[k].shape == v.shape}
            new.load_state_dict(state, strict=False)
            new.to(next(iter(child.state_dict().values())).device).train(child.training)
            setattr(parent, name, new)
    return model


def _eval(checkup: Checkup, model: nn.Module, heldout) -> dict[str, float]:
    if heldout is None:
        return checkup.evaluate(model)
    twin = Checkup(model, checkup.loss_fn, [heldout], None)
    return twin.evaluate()


def _recollect_effect(checkup, finding, heldout) -> dict:
    model = copy.deepcopy(checkup.model)
    before = _eval(checkup, model, heldout)
    after = _eval(checkup, _recollect(checkup, model), heldout)
    return {"code": finding.code, "remedy": "bnlab.norms.recollect_running_stats",
            "before": before, "after": after,
            "effect": f"eval {_loss(before)} -> {_loss(after)} after recollect_running_stats"}


def _double_update_effect(checkup, finding, heldout) -> dict:
    """Updates per training forward of the named layers, as is and after
    ``bnlab.norms.convert(model, 'bn')``, over one forward and backward of the first batch; and
    the eval effect of recollecting the statistics."""
    counts = {}
    x, y = checkup.batches[0]
    for label, model in (("as is", copy.deepcopy(checkup.model)),
                         ("bn", N.convert(copy.deepcopy(checkup.model), "bn"))):
        as_trained(model)
        with UpdateCounter(model) as counter:
            checkup.loss_fn(model(x), y).backward()
        per = counter.per_forward()
        counts[label] = max((per.get(n, 0.0) for n in finding.layers), default=0.0)
    entry = _recollect_effect(checkup, finding, heldout)
    entry["before"]["updates_per_forward"] = counts["as is"]
    entry["after"]["updates_per_forward"] = counts["bn"]
    entry["remedy"] = "bnlab.norms.convert(model, 'bn'), then recollect_running_stats"
    entry["effect"] = (f"updates per forward {counts['as is']:g} as is, {counts['bn']:g} after "
                       f"convert(model, 'bn'); {entry['effect']}")
    return entry


def _loss(result: dict) -> str:
    text = f"loss {result['loss']:.4g}"
    if "accuracy" in result:
        text += f", accuracy {result['accuracy']:.3f}"
    return text


@torch.no_grad()
def _batch_mode(checkup: Checkup, model: nn.Module, heldout) -> dict[str, float]:
    """Loss/accuracy in train mode (each batch's statistics) on ``heldout`` cut into batches of the
    user's size (or on the batches), on a copy: what the network computes while it trains."""
    twin = copy.deepcopy(model)
    if heldout is None:
        return checkup.evaluate(twin, train=True)
    b = checkup.batch_size
    x, y = heldout
    chunks = [(x[i:i + b], y[i:i + b]) for i in range(0, len(x) - b + 1, b)]
    return Checkup(twin, checkup.loss_fn, chunks).evaluate(train=True)


def _small_batch_effect(checkup, finding, heldout, steps) -> dict:
    spec = finding.remedy.split("create('")[1].split("')")[0] if "create('" in finding.remedy \
        else "mbn"
    out = {}
    for label, build in (("as is", lambda m: m), (spec, lambda m: _replace_norms(m, spec))):
        model = build(copy.deepcopy(checkup.model))
        N.set_progress(model, epoch=2, epochs=2)  # MBN at its final λ (no-op for other layers)
        _train(checkup, model, steps)
        ev, tr = _eval(checkup, model, heldout), _batch_mode(checkup, model, heldout)
        out[label] = {**ev, "train_mode": tr, "gap": ev["loss"] - tr["loss"]}
    base, fixed = out["as is"], out[spec]
    return {"code": finding.code, "remedy": spec, "before": base, "after": fixed,
            "effect": (f"after {steps} more steps at batch {checkup.batch_size}: eval "
                       f"{_loss(base)} (train mode {_loss(base['train_mode'])}) as is; eval "
                       f"{_loss(fixed)} (train mode {_loss(fixed['train_mode'])}) with {spec}")}


def _compare_runs(checkup, finding, steps, remedy, fixed_model, fixed_opt=None) -> dict:
    base = _train(checkup, copy.deepcopy(checkup.model), steps)
    after = _train(checkup, fixed_model, steps, fixed_opt)
    before_loss, after_loss = _tail(base), _tail(after)
    return {"code": finding.code, "remedy": remedy,
            "before": {"train_loss": before_loss, "diverged": not math.isfinite(before_loss)},
            "after": {"train_loss": after_loss, "diverged": not math.isfinite(after_loss)},
            "effect": (f"training loss after {steps} steps {before_loss:.4g} as is, "
                       f"{after_loss:.4g} with {remedy}")}


def _beta_effect(checkup, finding, steps) -> dict:
    model = copy.deepcopy(checkup.model)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name in finding.layers:
            layer = modules[name]
            bound = layer.weight.detach().abs()
            layer.bias.copy_(torch.maximum(torch.minimum(layer.bias, bound), -bound))
    return _compare_runs(checkup, finding, steps, "|β| clipped to |γ|", _recollect(checkup, model))


def _sharpness_effect(checkup, finding, steps) -> dict:
    scale = 0.9 * finding.threshold / finding.value
    model = copy.deepcopy(checkup.model)
    opt = _optimizer_like(checkup.optimizer, model.parameters(), lr_scale=scale)
    return _compare_runs(checkup, finding, steps, f"learning rate ×{scale:.3g}", model, opt)


def _effective_lr_effect(checkup, finding, steps) -> dict:
    model = copy.deepcopy(checkup.model)
    params = dict(model.named_parameters())
    if finding.value < finding.threshold:  # collapsed: rescale to the init norm
        with torch.no_grad():
            for name in finding.layers:
                w = params[name]
                w.mul_(math.sqrt(2.0 * w.shape[0]) / w.norm().clamp_min(1e-30))
        return _compare_runs(checkup, finding, steps, "weights rescaled to their init norm",
                             _recollect(checkup, model))
    slow = [params[n] for n in finding.layers]
    rest = [p for n, p in params.items() if n not in finding.layers]
    scale = min(finding.threshold / finding.value, 1.0) * 0.5
    base = _optimizer_like(checkup.optimizer, rest)
    base.add_param_group({"params": slow, "lr": base.param_groups[0]["lr"] * scale})
    return _compare_runs(checkup, finding, steps, f"their learning rate ×{scale:.3g}", model, base)


def _flat_grad(model: nn.Module) -> torch.Tensor:
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    return torch.cat(grads).double()


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-30))


def _accumulation_effect(checkup, finding) -> dict:
    """Cosine of the accumulated gradient (each micro-batch normalized by itself) with the gradient
    of the same samples as one batch; then the same with bnlab.norms.accumulate's full-batch step
    (torch's BN layers converted to bnlab's ``bn`` first), when it exists and the layers allow it.
    Losses are weighted by micro-batch size, so a mean loss gives the full batch's mean."""
    k = checkup.accumulation_steps
    micro = checkup.batches[:k]
    loss_fn = checkup.loss_fn
    whole = (torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro]))
    model = as_trained(copy.deepcopy(checkup.model))
    model.zero_grad()
    (loss_fn(model(whole[0]), whole[1]) * len(whole[0])).backward()
    reference = _flat_grad(model)
    model.zero_grad()
    for x, y in micro:
        (loss_fn(model(x), y) * x.shape[0]).backward()
    before = _cosine(_flat_grad(model), reference)
    after, how = None, "bnlab.norms.accumulate is not available"
    if hasattr(N, "accumulate") and len(micro) == k:
        model = as_trained(N.convert(copy.deepcopy(checkup.model), "bn"))
        model.zero_grad()
        (loss_fn(model(whole[0]), whole[1]) * len(whole[0])).backward()
        reference = _flat_grad(model)
        model.zero_grad()
        try:
            with N.accumulate(model, steps=k, normalize="full") as acc:
                acc.step([x for x, _ in micro],
                         lambda out, i: loss_fn(out, micro[i][1]) * micro[i][0].shape[0])
            after, how = _cosine(_flat_grad(model), reference), "bnlab.norms.accumulate (full)"
        except (ValueError, RuntimeError) as err:  # a layer that refuses the full-batch step
            how = f"bnlab.norms.accumulate refused: {err}"
    effect = (f"cos(accumulated gradient, one-batch gradient) = {before:.4f} over {len(micro)} "
              f"micro-batches of {checkup.batch_size}")
    effect += f"; {after:.6f} with {how}" if after is not None else f"; {how}"
    return {"code": finding.code, "remedy": how, "before": {"gradient_cosine": before},
            "after": {"gradient_cosine": after}, "effect": effect}


def try_remedies(report, model: nn.Module, loss_fn, batches, *, steps: int = 30,
                 heldout: tuple | None = None, optimizer=None) -> RemedyResults:
    """Apply the remedy of each warning in ``report`` to a deep copy of ``model``, train or
    re-evaluate it briefly (``steps`` optimizer steps on ``batches``) and measure the effect.
    ``heldout``: an ``(inputs, targets)`` pair for the eval measurements (default: the batches).
    ``optimizer``: the user's, copied by class and hyper-parameters for the short runs (default:
    the one :func:`~bnlab.doctor.examine` was given; without any, SGD lr 0.01). The results are
    also stored in ``report.measurements["remedies"]``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if optimizer is None:
        optimizer = getattr(report, "_optimizer", None)
    device = model_device(model)
    results = RemedyResults()
    with kept(model, optimizer):
        data = collect_batches(batches, device, None, MIN_SAMPLES)
        checkup = Checkup(model, loss_fn, data, optimizer,
                          int(report.context.get("accumulation_steps", 1)))
        held = None if heldout is None else (heldout[0].to(device), heldout[1].to(device))
        for finding in report.warnings:
            code = finding.code
            if code == "stale-running-stats":
                entry = _recollect_effect(checkup, finding, held)
            elif code == "double-update":
                entry = _double_update_effect(checkup, finding, held)
            elif code == "small-batch":
                entry = _small_batch_effect(checkup, finding, held, steps)
            elif code == "beta-swamping":
                entry = _beta_effect(checkup, finding, steps)
            elif code == "sharpness":
                entry = _sharpness_effect(checkup, finding, steps)
            elif code == "effective-lr":
                entry = _effective_lr_effect(checkup, finding, steps)
            else:
                entry = _accumulation_effect(checkup, finding)
            results.results.append(entry)
    report.measurements["remedies"] = results.results
    return results
