"""The callback protocol of ``bnlab.train`` (Lightning-style hooks with no-op defaults).

Subclass :class:`Callback` and override the hooks you need::

    class PrintLoss(Callback):
        def on_log(self, trainer, step, metrics):
            print(step, metrics["train_loss"])

    train.run(config, callbacks=[PrintLoss()])

Every hook receives the trainer, which exposes at least ``config``, ``run_id``, ``model``,
``optimizer`` and ``step`` (steps taken so far). The order of calls over a run::

    on_train_start -> (on_step_end [on_log] [on_probe...] [on_epoch_end]) * steps -> on_train_end

``on_log`` fires every ``log_every`` steps (and at step 1) with the logged scalar metrics
(``train_loss``, ``train_accuracy``); ``on_probe`` fires once per probe that measured at a step,
with its values; ``on_train_end`` receives the final status (``finished``, ``diverged``,
``failed`` or ``interrupted``).

State: ``state_dict()`` is saved in every checkpoint under the callback's ``name`` (default: the
class name; two callbacks of one name get ``name#2``, ...) and handed back to
``load_state_dict`` on resume, so a callback that counts something resumes where it was.

Identity: a callback that changes what the run computes (it edits weights, gradients or the
learning rate) sets ``changes_training = True``; its name and ``state_dict()`` at construction
then enter the run id, so the same config with and without it are two runs. Loggers and probes
leave it False and never change the id.

Duck-typed callbacks of the earlier protocol (any of ``on_start``, ``after_backward``,
``after_step``, ``on_end`` taking a :class:`StepContext`) keep working: the probes of
``bnlab.probes`` use ``after_backward``, the one hook that sees the gradients before the update.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch


class Callback:
    """Base class: every hook is a no-op; override what you need (see the module docstring)."""

    #: True if the callback changes what the run computes; it then enters the run id.
    changes_training: bool = False

    @property
    def name(self) -> str:
        """Key of this callback's state in checkpoints (override with a class attribute)."""
        return type(self).__name__

    def on_train_start(self, trainer: Any) -> None:
        """Before the first step (after a resume: before the first step still to take)."""

    def on_step_end(self, trainer: Any, step: int, metrics: dict[str, Any]) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds ``loss``, a 0-d tensor on the
        device (reading it forces a host sync; only do so when you need it), and ``lr``."""

    def on_log(self, trainer: Any, step: int, metrics: dict[str, float]) -> None:
        """Every ``log_every`` steps (and step 1): the scalar metrics just recorded."""

    def on_probe(self, trainer: Any, step: int, name: str, values: dict[str, float]) -> None:
        """A probe ``name`` measured at ``step``: ``{metric name: value}`` as recorded."""

    def on_epoch_end(self, trainer: Any, epoch: int) -> None:
        """After the last step of epoch ``epoch`` (1-based), its means and evaluation recorded."""

    def on_train_end(self, trainer: Any, status: str) -> None:
        """Once, at the end: ``finished``, ``diverged``, ``failed`` or ``interrupted``."""

    def state_dict(self) -> dict[str, Any]:
        """What to save in a checkpoint (tensors and primitive containers only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class StepContext:
    """What a duck-typed (earlier protocol) callback sees; refreshed before every hook call.

    ``model``, ``optimizer``, ``loss_fn`` (``loss_fn(output, target)``, the mean training loss),
    ``batch`` (``(xb, yb)`` of the current step), ``step`` (1-based number of the step in progress;
    the resumed step count in ``on_start``), ``epoch`` (1-based), ``lr`` (current rate of the
    scale-variant group), ``loss`` (this step's loss tensor), ``config``, ``run_id``, ``data``,
    ``scale_invariant`` (``{name: granularity}``), ``total_steps``; ``log(name, value)`` records a
    metric for this run at ``step``.
    """

    def __init__(self, trainer: Any):
        self._trainer = trainer
        self.model = trainer.model
        self.optimizer = trainer.optimizer
        self.loss_fn = trainer.loss_fn
        self.config = trainer.config
        self.run_id = trainer.run_id
        self.data = trainer.data
        self.scale_invariant = trainer.scale_invariant
        self.total_steps = trainer.total_steps
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.loss: torch.Tensor | None = None
        self.step = trainer.step
        self.epoch = 1
        self.lr = trainer.config.lr

    def log(self, name: str, value: Any) -> None:
        self._trainer.log(name, value, self.step)


LEGACY_HOOKS = ("on_start", "after_backward", "after_step", "on_end")


def callback_names(callbacks: Sequence[Any]) -> list[str]:
    """The checkpoint key of each callback: its ``name`` (or class name), ``#k`` on repeats."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for cb in callbacks:
        base = getattr(cb, "name", None)
        base = base if isinstance(base, str) and base else type(cb).__name__
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return keys


def identity_of(callbacks: Iterable[Any]) -> list[dict[str, Any]]:
    """The part of the run id contributed by callbacks that change training (in order)."""
    out = []
    for cb in callbacks:
        if getattr(cb, "changes_training", False):
            state = cb.state_dict() if hasattr(cb, "state_dict") else {}
            out.append({"callback": f"{type(cb).__module__}.{type(cb).__qualname__}", "state": repr(state)})
    return out


class CallbackList:
    """Dispatches hooks to the callbacks that define them, hook lists built once (no per-step
    ``getattr`` walk); probe metrics logged at a step are grouped by probe for ``on_probe``."""

    def __init__(self, callbacks: Sequence[Any]):
        self.callbacks = list(callbacks)
        self.keys = callback_names(self.callbacks)
        self._hooks: dict[str, list[Any]] = {}
        for hook in (*LEGACY_HOOKS, "on_train_start", "on_step_end", "on_log", "on_probe",
                     "on_epoch_end", "on_train_end"):
            self._hooks[hook] = [
                getattr(cb, hook) for cb in self.callbacks if callable(getattr(cb, hook, None))
            ]

    def has(self, hook: str) -> bool:
        return bool(self._hooks[hook])

    def call(self, hook: str, *args: Any) -> None:
        for method in self._hooks[hook]:
            method(*args)

    def state_dict(self) -> dict[str, Any]:
        return {
            key: cb.state_dict()
            for key, cb in zip(self.keys, self.callbacks)
            if callable(getattr(cb, "state_dict", None))
        }

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for key, cb in zip(self.keys, self.callbacks):
            if key in states and callable(getattr(cb, "load_state_dict", None)):
                cb.load_state_dict(states[key])

    def emit_probes(self, trainer: Any, step: int, rows: Iterable[tuple[int, str, float]]) -> None:
        """``on_probe`` for each probe among ``rows`` (metric names ``probe/<name>/...``)."""
        if not self._hooks["on_probe"]:
            return
        grouped: dict[str, dict[str, float]] = {}
        for row_step, metric, value in rows:
            if row_step == step and metric.startswith("probe/"):
                probe = metric.split("/", 2)[1]
                grouped.setdefault(probe, {})[metric] = value
        for probe, values in grouped.items():
            self.call("on_probe", trainer, step, probe, values)
