"""bnlab train's side of the callback protocol (:mod:`bnlab.callbacks`): the :class:`TrainLoop` its
hooks receive, and the part of the run id that callbacks contribute.

    class PrintLoss(Callback):
        def on_log(self, loop, step, metrics):
            if "train_loss" in metrics:
                print(step, metrics["train_loss"])

    train.run(config, callbacks=[PrintLoss()])

``on_log`` fires every ``log_every`` steps (and at step 1) with the scalar metrics recorded there
(``train_loss``, ``train_accuracy``, epoch means, ``lr``, evaluations) and every probe value
``probe/<name>/...``, read back in step order at the next check (no host sync per step).

State: ``state_dict()`` is saved in every checkpoint under the callback's ``name`` (default: the
class name; two callbacks of one name get ``name#2``, ...) and handed back to
``load_state_dict`` on resume, so a callback that counts something resumes where it was.

Identity: a callback that changes what the run computes sets ``changes_training = True``; its
class and ``state_dict()`` at construction then enter the run id, so the same config with and
without it are two runs. Loggers and probes leave it False and never change the id.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from bnlab.callbacks import Batch, Callback, CallbackList, Loop, LossFn
from bnlab.data import DataSource
from bnlab.train.config import TrainConfig

__all__ = ["Callback", "RunTrainer", "TrainLoop", "identity_of", "trainer_of"]


class RunTrainer(Protocol):
    """What callbacks of a bnlab train run may read of its :class:`~bnlab.train.engine.Trainer`."""

    config: TrainConfig
    run_id: str
    data: DataSource
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    loss_fn: LossFn
    step: int  # steps taken
    total_steps: int
    scale_invariant: dict[str, str]

    def log(self, name: str, value: Any, step: int, divisor: float = 1.0) -> None: ...


class TrainLoop:
    """The :class:`~bnlab.callbacks.Loop` of a :class:`~bnlab.train.engine.Trainer`: ``model``,
    ``optimizer`` and ``loss_fn`` are the trainer's own (read through, never copied); the trainer
    sets ``step``, ``batch``, ``loss`` and ``lr`` (the scale-variant group's rate) at each step.
    ``trainer`` gives callbacks written for bnlab train the rest: ``config``, ``run_id``, ``data``,
    ``total_steps``, ``scale_invariant``."""

    def __init__(self, trainer: RunTrainer, hooks: CallbackList) -> None:
        self.trainer, self.hooks = trainer, hooks
        self.step = trainer.step
        self.batch: Batch | None = None
        self.loss: torch.Tensor | None = None
        self.lr: float | None = None

    @property
    def model(self) -> nn.Module:
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.trainer.optimizer

    @property
    def loss_fn(self) -> LossFn | None:
        return self.trainer.loss_fn

    def log(self, name: str, value: float | torch.Tensor) -> None:
        """Record ``value`` at ``step`` in the run (a device tensor is read at the next check)."""
        self.trainer.log(name, value, self.step)

    def start(self) -> None:
        """``on_train_start``, with ``step`` the steps taken (0, or where a resume starts)."""
        self.step = self.trainer.step
        self.hooks.call("on_train_start", self)

    def end(self, status: str) -> None:
        """``on_train_end`` with the run's final ``status``; ``step`` is the steps taken."""
        self.step = self.trainer.step
        self.hooks.call("on_train_end", self, status)


def trainer_of(loop: Loop) -> RunTrainer:
    """The bnlab :class:`~bnlab.train.engine.Trainer` behind ``loop``; TypeError under another loop
    (for callbacks that need a bnlab train run: its config, run id, data)."""
    if not isinstance(loop, TrainLoop):
        raise TypeError("this callback needs a bnlab train run (bnlab.train.run), "
                        f"not {type(loop).__name__}")
    return loop.trainer


def identity_of(callbacks: Iterable[Callback]) -> list[dict[str, Any]]:
    """The part of the run id contributed by callbacks that change training (in order)."""
    return [{"callback": f"{type(cb).__module__}.{type(cb).__qualname__}",
             "state": repr(cb.state_dict())}
            for cb in callbacks if cb.changes_training]
