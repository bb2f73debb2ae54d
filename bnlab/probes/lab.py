"""The probe registry (``create``) and :class:`Lab`, which runs probes from a plain PyTorch loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from bnlab.callbacks import Batch, Callback, CallbackList, LossFn

# Importing a probe's module registers it; this order is the order of available() and describe().
from . import activations, histograms  # noqa: F401 (register)
from . import gamma, cbn_ratios, batch_noise, bn_regularization  # noqa: F401 (register)
from . import effective_lr, gradients, hessian, ics, landscape  # noqa: F401 (register)
from . import cost
from .base import PROBES, Probe

SEARCHES = ("max_stable_lr",)


def available() -> list[str]:
    """Names accepted by :func:`create` (and ``bnlab train --probe``)."""
    return PROBES.names()


def describe() -> list[tuple[str, str, str]]:
    """(name, what it measures, cost) for every step probe."""
    return [(name, cls.summary, cls.cost) for name, cls in PROBES.items()]


def create(name: str, every: int = 1, **options: Any) -> Probe:
    """Build the step probe ``name`` to run every ``every`` steps; ``options`` go to its
    constructor.

    ``name`` may be a whole spec, ``"landscape(num=6, every=50)"`` (its ``every`` wins over the
    argument); options are typed and checked by the probe's registered parameters
    (:mod:`bnlab.spec`).

    >>> create("landscape", every=50, num=6)
    """
    if name in SEARCHES:
        raise ValueError(
            f"{name} is a search over training runs, not a step probe: call "
            "bnlab.probes.max_stable_lr(train_fn) or max_stable_lr_for(model, loss_fn, batches, "
            f"steps); valid probes: {', '.join(PROBES)}"
        )
    if isinstance(name, str) and "(" in name:
        entry, from_spec = PROBES.lookup(name, defaults=False)
        options = {**options, **from_spec}
    else:
        entry = PROBES.entry(name)
    _, kwargs = PROBES.resolve(entry.name, {"every": every, **options}, defaults=False)
    return entry.target(**kwargs)


Recorder = Callable[[int, str, float], Any]


class Lab:
    """Run probes (any :class:`bnlab.callbacks.Callback`) from a plain PyTorch training loop.

    >>> lab = Lab(model, loss_fn, probes=["landscape", create("ics", every=10)], optimizer=opt)
    >>> for step, (x, y) in enumerate(batches):
    ...     opt.zero_grad(); loss_fn(model(x), y).backward()
    ...     lab.after_backward((x, y), step)      # gradients present, before the update
    ...     opt.step()
    ...     lab.after_step((x, y), step)          # only two-phase probes (effective_lr) need it
    >>> lab.records  # [(step, "probe/landscape/beta_smoothness", 3.1), ...]

    The Lab is the hooks' :class:`~bnlab.callbacks.Loop`: ``after_backward`` calls
    ``on_after_backward`` and ``on_before_optimizer_step``, ``after_step`` calls
    ``on_train_batch_end`` (the first call of either ``on_train_start``), with ``step`` as given;
    the metrics a call recorded then go to ``on_log``. ``recorder`` receives every metric too: a
    callable ``recorder(step, name, value)`` or an object with ``log_metrics(run_id, step, {name:
    value})`` (e.g. :class:`bnlab.store.Store`, with ``run_id``). ``lr`` is needed only without an
    optimizer. Probes given by name run every step (``every=1``).

    Before the first call, the Lab says what the probes will cost (:mod:`bnlab.probes.cost`): it
    times one forward+backward of the model on the first batch (state left as it was) and
    multiplies by each probe's declared passes; a probe whose share of the training step would
    exceed ``cost_budget`` (default 1: the step itself) is reported in one
    :class:`~bnlab.probes.cost.ProbeCostWarning` (``on_cost="warn"``), or its ``every`` is raised
    to fit the budget (``on_cost="thin"``); ``on_cost="ignore"`` skips the estimate.
    ``lab.costs`` holds the estimates.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, probes: Iterable[Callback | str] = (), *,
                 optimizer: torch.optim.Optimizer | None = None, recorder: Any = None,
                 run_id: str | None = None, lr: float | None = None,
                 cost_budget: float = cost.BUDGET, on_cost: str = "warn") -> None:
        cost.check_action(on_cost, cost_budget)
        self.cost_budget, self.on_cost = float(cost_budget), on_cost
        self.costs: list[cost.Cost] = []
        self.model = model
        self.loss_fn: LossFn | None = loss_fn
        self.optimizer = optimizer
        self.lr = lr
        self.probes: list[Callback] = [create(p) if isinstance(p, str) else p for p in probes]
        for p in self.probes:
            if not isinstance(p, Callback):
                raise ValueError(f"probes must be probe names ({', '.join(PROBES)}) or "
                                 f"bnlab.callbacks.Callback objects (Probes among them), got {p!r}")
        self.callbacks = CallbackList(self.probes)
        if recorder is not None and not callable(recorder) and not hasattr(recorder, "log_metrics"):
            raise ValueError("recorder must be callable(step, name, value) or have "
                             "log_metrics(run_id, step, dict)")
        if (recorder is not None and hasattr(recorder, "log_metrics") and not callable(recorder)
                and run_id is None):
            run_id = getattr(recorder, "run_id", None)
            if run_id is None:
                raise ValueError("a recorder with log_metrics(run_id, step, values) needs run_id=")
        self.recorder = recorder
        self.run_id = run_id
        self.records: list[tuple[int, str, float]] = []
        # the Loop's per-step fields, set by after_backward/after_step
        self.step = 0
        self.batch: Batch | None = None
        self.loss: torch.Tensor | None = None
        self._started = False
        self._metrics: dict[str, float] = {}

    def log(self, name: str, value: float | torch.Tensor) -> None:
        """Record a metric at the current step (the :class:`~bnlab.callbacks.Loop` method)."""
        self._metrics[name] = float(value)

    def _run(self, hooks: tuple[str, ...], batch: Batch, step: int, lr: float | None,
             loss: torch.Tensor | None) -> dict[str, float]:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError("batch must be an (inputs, targets) pair")
        self.step, self.batch = int(step), (batch[0], batch[1])
        if loss is not None:
            self.loss = loss
        saved_lr, self.lr = self.lr, self.lr if lr is None else lr
        self._metrics = {}
        try:
            if not self._started:
                self._started = True
                self._estimate_costs()
                self.callbacks.call("on_train_start", self)
            for hook in hooks:
                self.callbacks.call(hook, self)
        finally:
            self.lr = saved_lr
        metrics, self._metrics = self._metrics, {}
        self._record(step, metrics)
        if metrics:
            self.callbacks.call("on_log", self, self.step, metrics)
        return metrics

    def _estimate_costs(self) -> None:
        """:attr:`costs` on the first batch, then warn or thin (see the class docstring)."""
        if self.on_cost == "ignore" or self.loss_fn is None or self.batch is None:
            return
        if not any(cost.passes(p, self.model) for p in self.probes):
            self.costs = cost.estimate(self.probes, self.model, 0.0)
            return
        seconds = cost.time_pass(self.model, self.loss_fn, self.batch, self.optimizer)
        self.costs = cost.estimate(self.probes, self.model, seconds)
        cost.enforce(self.costs, self.probes, self.cost_budget, self.on_cost)

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        for name, value in metrics.items():
            self.records.append((int(step), name, value))
        if self.recorder is None:
            return
        if hasattr(self.recorder, "log_metrics"):
            self.recorder.log_metrics(self.run_id, int(step), metrics)
        else:
            for name, value in metrics.items():
                self.recorder(int(step), name, value)

    def after_backward(self, batch: Batch, step: int, *, lr: float | None = None,
                       loss: torch.Tensor | None = None) -> dict[str, float]:
        """Run the probes due at ``step``; returns (and records) the metrics they produced.
        ``loss`` (optional): this step's loss, what ``loop.loss`` shows the callbacks."""
        return self._run(("on_after_backward", "on_before_optimizer_step"), batch, step, lr, loss)

    def after_step(self, batch: Batch, step: int, *, lr: float | None = None) -> dict[str, float]:
        """Finish two-phase probes after ``optimizer.step()`` (``on_train_batch_end``)."""
        return self._run(("on_train_batch_end",), batch, step, lr, None)

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) pairs of one metric, e.g.
        ``lab.series("probe/landscape/beta_smoothness")``."""
        return [(s, v) for s, n, v in self.records if n == name]
