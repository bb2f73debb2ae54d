"""The doctor watching a training loop: what only shows over time.

    doc = bnlab.doctor.Doctor(model, loss_fn, optimizer)
    for step, (x, y) in enumerate(loader, start=1):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        doc.after_backward((x, y), step)     # after every backward (each micro-batch)
        optimizer.step()
        doc.after_step((x, y), step)         # after every optimizer step
    print(doc.report())

The same object is a :class:`bnlab.callbacks.Callback`: ``bnlab train --doctor`` and the Lightning
adapter (``BnlabCallback([doc])``, :mod:`bnlab.integrations.lightning`) run it, and
``Lab(model, loss_fn, [doc])`` too. Without a model (``Doctor()``) it watches the loop's.

Every ``every`` steps (16 by default) the watcher reads, with no extra pass: the forward+backward
passes the optimizer step took (gradient accumulation: micro-batch-statistics); the running
statistics' updates per training forward (``checks_double.UpdateCounter``: activation
checkpointing, double-update); ‖w‖² and the turn ‖Δw‖/‖w‖ of each scale-invariant weight across
the optimizer step (effective-lr drift, Arora, Li & Lyu); each BN layer's running statistics
against the batch statistics of the forward they normalize (stale-running-stats: the lag after a
learning-rate drop). The top Hessian eigenvalue (sharpness against the optimizer's threshold) is
measured at a cadence priced on the model (:mod:`bnlab.doctor.cost`). Measurements leave the
training bitwise as it would be without the doctor (snapshots and read-only hooks).

:meth:`Doctor.report` returns a :class:`~bnlab.doctor.Report`: the findings of these series
(:mod:`bnlab.doctor.timeline`) and, unless ``examine=False``, those of
:func:`bnlab.doctor.examine` on the last batches seen (at most one finding per code: the more
severe). Series added to ``measurements``: ``effective_lr`` {weight: [(step, η/‖w‖²)]},
``weight_norm_sq`` {weight: [(step, ‖w‖²)]}, ``turn`` {weight: [(step, ‖Δw‖/‖w‖)]},
``running_lag`` {layer: [(step, mean shift in batch SDs)]}, ``running_lag_detail`` {layer:
[(step, mean shift, ½|log var ratio|, m)]}, ``lr`` [(step, lr)] at each change, ``sharpness``
[(step, λ_max, threshold)], ``forwards_per_step`` [(step, passes)], ``updates_per_forward``
{layer: updates per training forward}.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from bnlab.callbacks import Batch, Callback, Loop, LossFn
from bnlab.probes import cost as probe_cost
from bnlab.probes.compiled import eager_module
from bnlab.probes.state import preserved

from . import checks_effective_lr, checks_sharpness, cost, timeline
from .context import Checkup, model_device, tracking_layers
from .examine import MAX_BATCHES, MIN_SAMPLES, examine as examine_model
from .findings import Finding
from .report import Report
from .window import WatchWindow

EVERY = 16  # default cadence of the watched steps
SHARPNESS_ITERS = 8


class Doctor(Callback):
    """Watch a training loop and report what went wrong over time (see the module docstring).

    ``every``: watch one step in ``every``; ``sharpness_every``: the sharpness cadence (``None``:
    priced on the model to take at most ``sharpness_budget`` of the training time; ``0``: never);
    ``keep_samples``: the last batches kept for :meth:`report`'s checkup hold at least this many
    samples (the checkup's own default, ``examine.MIN_SAMPLES``); ``lr``: the learning
    rate when no optimizer is given.
    """

    name = "doctor"

    def __init__(self, model: nn.Module | None = None, loss_fn: LossFn | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *, every: int = EVERY,
                 sharpness_every: int | None = None, sharpness_iters: int = SHARPNESS_ITERS,
                 sharpness_budget: float = cost.SHARPNESS_BUDGET,
                 keep_samples: int = MIN_SAMPLES,
                 lr: float | None = None) -> None:
        for label, value, low in (("every", every, 1), ("sharpness_iters", sharpness_iters, 1),
                                  ("keep_samples", keep_samples, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
        if sharpness_every is not None and (not isinstance(sharpness_every, int)
                                            or sharpness_every < 0):
            raise ValueError("sharpness_every must be None (priced on the model), 0 (never) or a "
                             f"positive integer, got {sharpness_every!r}")
        self.model = None if model is None else eager_module(model)
        self.loss_fn, self.optimizer, self.lr = loss_fn, optimizer, lr
        self.every, self.sharpness_iters = every, sharpness_iters
        self.sharpness_every = sharpness_every
        self._auto_sharpness = sharpness_every is None
        self.sharpness_budget = float(sharpness_budget)
        self.batches: collections.deque = collections.deque()
        self.keep_samples = keep_samples
        self.series: dict[str, Any] = {
            "effective_lr": {}, "weight_norm_sq": {}, "turn": {}, "running_lag": {},
            "running_lag_detail": {}, "lr": [], "sharpness": [], "forwards_per_step": []}
        self.costs: dict[str, Any] = {}
        self.steps = 0  # optimizer steps seen
        self.last_step: int | None = None
        self.started = time.perf_counter()
        self.window = WatchWindow(self.series)
        self._weights: list[tuple[str, nn.Parameter]] | None = None
        self._passes = 0  # backward passes since the last optimizer step
        self._pending: int | None = None  # the step between its backward and its update
        self._stash: dict[str, Any] | None = None
        if self.model is not None:
            self.window.arm(self.model)

    # -- the plain loop ----------------------------------------------------------------------------
    def after_backward(self, batch: Batch, step: int, *, lr: float | None = None,
                       loss: torch.Tensor | None = None) -> None:
        """After each ``loss.backward()`` (each micro-batch when accumulating); gradients present,
        the optimizer not yet stepped."""
        self._check_batch(batch)
        self._backward(batch)
        self._before_update(int(step), lr)

    def after_step(self, batch: Batch, step: int, *, lr: float | None = None) -> None:
        """After each ``optimizer.step()``."""
        self._after_update(int(step))

    # -- the callback protocol (bnlab train, Lightning's adapter, Lab) ----------------------------
    def on_train_start(self, loop: Loop) -> None:
        self._bind(loop)
        self.window.arm(self.model)

    def on_after_backward(self, loop: Loop) -> None:
        self._bind(loop)
        if loop.batch is not None:
            self._backward(loop.batch)

    def on_before_optimizer_step(self, loop: Loop) -> None:
        self._bind(loop)
        self._before_update(int(loop.step), loop.lr, loop.optimizer)

    def on_train_batch_end(self, loop: Loop) -> None:
        self._after_update(int(loop.step))

    def on_train_end(self, loop: Loop, status: str) -> None:
        self.window.disarm()

    def _bind(self, loop: Loop) -> None:
        if self.model is None:
            self.model = eager_module(loop.model)
        if self.loss_fn is None:
            self.loss_fn = loop.loss_fn
        if self.optimizer is None and loop.optimizer is not None:
            self.optimizer = loop.optimizer

    @staticmethod
    def _check_batch(batch: Batch) -> None:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError("batch must be an (inputs, targets) pair")

    # -- events ------------------------------------------------------------------------------------
    def _backward(self, batch: Batch) -> None:
        self._passes += 1
        self.batches.append((batch[0].detach(), batch[1].detach()))
        kept = sum(int(x.shape[0]) for x, _ in self.batches)
        while len(self.batches) > 1 and (kept - int(self.batches[0][0].shape[0])
                                         >= self.keep_samples or len(self.batches) > MAX_BATCHES):
            kept -= int(self.batches.popleft()[0].shape[0])
        if self._weights is None and self.model is not None:
            self._first_batch(batch)

    def _first_batch(self, batch: Batch) -> None:
        """Once: the scale-invariant weights, and the price of a pass (the sharpness cadence)."""
        model = self.model
        assert model is not None
        first = (batch[0].detach(), batch[1].detach())
        checkup = Checkup(model, self.loss_fn or _no_loss, [first], self.optimizer)
        with self._quiet():
            names = checks_effective_lr.invariant_weights(checkup)
        params = dict(model.named_parameters())
        self._weights = [(n, params[n]) for n in names]
        if self.sharpness_every == 0 or self.loss_fn is None:
            self.sharpness_every = 0
            return
        with self._quiet():
            seconds = probe_cost.time_pass(model, self.loss_fn, first, self.optimizer)
        every = (cost.sharpness_every(seconds, self.sharpness_iters, self.every,
                                      self.sharpness_budget)
                 if self._auto_sharpness or self.sharpness_every is None else self.sharpness_every)
        self.sharpness_every = every
        probe = cost.SharpnessCost(self.sharpness_iters, every)
        estimate = probe_cost.estimate([probe], model, seconds)
        self.costs = {"pass_seconds": seconds, "sharpness_cost": estimate[0].to_dict()}
        if not self._auto_sharpness:
            probe_cost.enforce(
                estimate, [probe], self.sharpness_budget, "warn", owner="Doctor",
                advice="Doctor(sharpness_every=None) prices the cadence on the model")

    def _due(self, step: int) -> bool:
        return step % self.every == 0

    def _before_update(self, step: int, lr: float | None,
                       optimizer: torch.optim.Optimizer | None = None) -> None:
        if self.model is None:
            return
        self._pending = step
        rate = self._rate(lr, optimizer)
        lrs = self.series["lr"]
        if rate is not None and (not lrs or lrs[-1][1] != rate):
            lrs.append((step, rate))
        # with accumulation this runs once per micro-batch: the weights are the same in each
        if self._due(step) and self._weights and (self._stash is None
                                                   or self._stash["step"] != step):
            self._stash = self._read_weights(step)
        sharpness = self.series["sharpness"]
        if (self.sharpness_every and step % self.sharpness_every == 0 and self.batches
                and (not sharpness or sharpness[-1][0] != step)):
            self.measure_sharpness(step, rate)

    def _after_update(self, step: int) -> None:
        if self._pending is None:  # Lightning: a micro-batch's end, before the optimizer step
            return
        self.steps += 1
        self.last_step = self._pending
        if self._due(self._pending):
            self.series["forwards_per_step"].append((self._pending, self._passes))
        self._passes, self._pending = 0, None
        if self._stash is not None:
            self._record_turns(self._stash)
            self._stash = None
        self.window.close(step)
        if self._due(step + 1):
            self.window.arm(self.model)
        else:
            self.window.stop_counting()

    # -- measurements ------------------------------------------------------------------------
    def _rate(self, lr: float | None, optimizer: torch.optim.Optimizer | None) -> float | None:
        opt = self.optimizer or optimizer
        if opt is not None and opt.param_groups:
            return float(opt.param_groups[0]["lr"])
        return lr if lr is not None else self.lr

    def _group_rates(self) -> dict[int, float]:
        rates: dict[int, float] = {}
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    rates[id(p)] = float(group["lr"])
        return rates

    def _read_weights(self, step: int) -> dict[str, Any]:
        assert self._weights is not None
        with torch.no_grad():
            before = [w.detach().clone() for _, w in self._weights]
            squares = torch.stack([b.double().pow(2).sum().cpu() for b in before]).tolist()
        rates = self._group_rates()
        default = self._rate(None, None)
        for (name, w), sq in zip(self._weights, squares):
            self.series["weight_norm_sq"].setdefault(name, []).append((step, sq))
            rate = rates.get(id(w), default)
            if rate is not None and sq > 0:
                self.series["effective_lr"].setdefault(name, []).append((step, rate / sq))
        return {"step": step, "before": before, "squares": squares}

    def _record_turns(self, stash: dict[str, Any]) -> None:
        assert self._weights is not None
        with torch.no_grad():
            moved = torch.stack([(w.detach().double() - b.double()).norm().cpu()
                                 for (_, w), b in zip(self._weights, stash["before"])]).tolist()
        for (name, _), d, sq in zip(self._weights, moved, stash["squares"]):
            if sq > 0:
                self.series["turn"].setdefault(name, []).append((stash["step"], d / sq**0.5))

    def measure_sharpness(self, step: int, rate: float | None) -> None:
        """Append ``(step, λ_max, threshold)`` to the ``sharpness`` series: the top Hessian
        eigenvalue of the train-mode loss on the last batch (``checks_sharpness``: preconditioned
        for Adam-type optimizers) against the optimizer's stability threshold; state rewound."""
        model = self.model
        if self.loss_fn is None or model is None:
            return
        batch = self.batches[-1]
        checkup = Checkup(model, self.loss_fn, [batch], self.optimizer,
                          hessian_iters=self.sharpness_iters)
        with self._quiet(), preserved(model, self.optimizer) as snap:
            if self.optimizer is not None:
                threshold, _, pre = checks_sharpness.threshold_for(self.optimizer)
                top, used = checks_sharpness.sharpness(checkup, snap, pre)
                if pre and not used:
                    threshold = 2 / rate if rate else float("inf")
            else:
                top, _ = checks_sharpness.sharpness(checkup, snap, False)
                threshold = 2 / rate if rate else float("nan")
        self.series["sharpness"].append((step, top, threshold))

    @contextmanager
    def _quiet(self) -> Iterator[None]:
        """The doctor's own passes are not the loop's: the update counter does not see them."""
        counter = self.window.counter
        saved = None if counter is None else (counter.forwards, dict(counter.updates))
        try:
            yield
        finally:
            if counter is not None and saved is not None:
                counter.forwards, counter.updates = saved[0], saved[1]

    # -- the report ----------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        """The findings of the watched series alone (no checkup)."""
        if self.model is None:
            return []
        layers = [n for n, _ in tracking_layers(self.model)]
        batch = int(self.batches[-1][0].shape[0]) if self.batches else None
        momentum = {n: getattr(m, "momentum", None) for n, m in tracking_layers(self.model)}
        wd = (self.optimizer.param_groups[0].get("weight_decay", 0.0)
              if self.optimizer is not None else None)
        counter = self.window.counter
        found = [
            timeline.micro_batches([k for _, k in self.series["forwards_per_step"]], batch,
                                   layers),
            timeline.double_updates(counter.per_forward() if counter else {},
                                    counter.forwards if counter else 0),
            timeline.effective_lr_drift(self.series["weight_norm_sq"], self.series["turn"], wd),
            timeline.lagging_statistics(self.series["running_lag_detail"], self.series["lr"],
                                        momentum),
            timeline.sharpness_trend(self.series["sharpness"], self.optimizer),
        ]
        return [f for f in found if f is not None]

    def report(self, *, examine: bool = True) -> Report:
        """The :class:`~bnlab.doctor.Report` of the run so far: the watched series' findings and,
        with ``examine``, :func:`bnlab.doctor.examine` on the last batches seen (the checkup
        leaves the model, optimizer and RNG as they are)."""
        watched = self.findings()
        base = Report()
        if examine and self.model is not None and self.batches and self.loss_fn is not None:
            k = max([p for _, p in self.series["forwards_per_step"]] or [1])
            base = examine_model(self.model, self.loss_fn, list(self.batches),
                                 optimizer=self.optimizer, accumulation_steps=k)
        return Report(merge(watched, base.findings), self._measurements(base.measurements),
                      self._context(base.context))

    def _measurements(self, examined: dict[str, Any]) -> dict[str, Any]:
        out = dict(examined)
        for key, value in self.series.items():
            if value:
                out[key] = value
        if examined.get("sharpness") and self.last_step is not None:
            end = examined["sharpness"][-1]  # the checkup's, of the model as training left it
            out["sharpness"] = [*self.series["sharpness"], (self.last_step, end[1], end[2])]
        counter = self.window.counter
        if counter is not None and counter.forwards:
            out["updates_per_forward"] = counter.per_forward()
        return out

    def _context(self, examined: dict[str, Any]) -> dict[str, Any]:
        out = dict(examined)
        model = self.model
        opt = self.optimizer
        out.update({
            "model": type(model).__name__ if model is not None else None,
            "batch_size": int(self.batches[-1][0].shape[0]) if self.batches else None,
            "optimizer": type(opt).__name__ if opt is not None else None,
            "lr": self._rate(None, None),
            "device": str(model_device(model)) if model is not None else None,
            "steps": self.steps, "last_step": self.last_step, "watched_every": self.every,
            "sharpness_every": self.sharpness_every,
            "watch_seconds": time.perf_counter() - self.started, **self.costs})
        return out


def merge(watched: list[Finding], examined: list[Finding]) -> list[Finding]:
    """One finding per code: the more severe (warn before info, then the larger value/threshold);
    on a tie the watcher's (its evidence spans the run)."""
    best: dict[str, Finding] = {}
    for finding in [*watched, *examined]:
        held = best.get(finding.code)
        if held is None or _rank(finding) < _rank(held):
            best[finding.code] = finding
    return list(best.values())


def _rank(finding: Finding) -> tuple:
    return (0 if finding.severity == "warn" else 1, -finding.ratio)


def _no_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    raise ValueError("the doctor needs loss_fn(output, target): pass loss_fn= to Doctor")
