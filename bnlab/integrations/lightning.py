"""bnlab callbacks and probes on a PyTorch Lightning ``Trainer``: one Lightning ``Callback``.

    from bnlab import probes
    from bnlab.integrations.lightning import BnlabCallback

    bnlab_cb = BnlabCallback([probes.create("landscape", every=50), probes.create("ics", every=50)],
                             loss_fn=torch.nn.functional.cross_entropy)
    L.Trainer(max_steps=1000, callbacks=[bnlab_cb]).fit(module, loader)
    bnlab_cb.records  # [(step, "probe/landscape/beta_smoothness", 3.1), ...]

Each Lightning hook calls the bnlab hook of the same name (:mod:`bnlab.callbacks`) with one
:class:`LightningLoop`: ``model`` is the LightningModule (probes call ``model(x)``, its
``forward``), ``optimizer`` the one being stepped, ``batch`` the ``(inputs, targets)`` of
``on_train_batch_start``, ``loss`` what ``on_before_backward`` received, ``step`` the 1-based number
of the optimizer step in progress (``trainer.global_step + 1``; ``global_step`` in
``on_train_start``/``on_train_end``), ``loss_fn`` the one given here (else the module's own
``loss_fn`` attribute). ``log(name, value)`` appends ``(step, name, value)`` to :attr:`records`
and sends it to every logger of the trainer (``logger.log_metrics({name: value}, step)``); the
step's metrics reach ``on_log`` after ``on_train_batch_end``.

The probes measure in ``on_before_optimizer_step`` (after gradient accumulation, before gradient
clipping and the update) and restore every piece of state they touch, so a Lightning run with
probes ends with the same weights, bitwise, as the run without them
(tests/test_lightning_adapter.py).
An exception ends the bnlab callbacks with status ``interrupted`` (KeyboardInterrupt) or
``failed``; ``state_dict`` holds the wrapped callbacks' states, by name, in Lightning checkpoints.

The doctor (:class:`bnlab.doctor.Doctor`) is a bnlab callback too, given alone or in the list:
``doc = Doctor(); L.Trainer(callbacks=[BnlabCallback(doc, loss_fn=...)]).fit(...)``, then
``doc.report()``. Under ``accumulate_grad_batches=k`` Lightning calls ``on_after_backward`` for
each micro-batch and ``on_before_optimizer_step`` once per step: the doctor counts k passes per
optimizer step from them (tests/test_doctor_watch_lightning.py).

:class:`StochasticWeightAveraging` is Lightning's SWA callback for models with bnlab layers: its
extra epoch recomputes every layer's statistics (:mod:`bnlab.norms.tools.population`), where
Lightning's own finds BatchNorm by ``isinstance(m, _BatchNorm)`` and leaves bnlab's with the last
network's.

Importing this module needs no manual step beside a CPU torch whose torchvision wheel does not
match it (Lightning's torchmetrics imports torchvision): :func:`~bnlab.models.vision_compat.
prepare_torchvision` runs first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from bnlab.callbacks import Batch, Callback, CallbackList, LossFn
from bnlab.models.vision_compat import prepare_torchvision
from bnlab.norms.tools.ecosystem import is_batch_norm
from bnlab.norms.tools.population import StatisticsPass
from bnlab.probes import create

prepare_torchvision()  # before Lightning: torchmetrics imports torchvision at its top
import lightning.pytorch as pl  # noqa: E402

__all__ = ["BnlabCallback", "LightningLoop", "StochasticWeightAveraging"]


class LightningLoop:
    """The :class:`bnlab.callbacks.Loop` of a Lightning run (see the module docstring)."""

    def __init__(self, owner: BnlabCallback, trainer: pl.Trainer,
                 module: pl.LightningModule) -> None:
        self.owner, self.trainer, self.module = owner, trainer, module
        self.step = trainer.global_step
        self.batch: Batch | None = None
        self.loss: torch.Tensor | None = None
        self.lr: float | None = None  # the optimizer's groups hold the rates
        self.stepped: torch.optim.Optimizer | None = None  # from on_before_optimizer_step
        self.logged: dict[str, float] = {}  # this step's metrics, for on_log at the batch's end

    @property
    def model(self) -> nn.Module:
        return self.module

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        if self.stepped is not None:
            return self.stepped
        optimizers = self.trainer.optimizers
        return optimizers[0] if len(optimizers) == 1 else None

    @property
    def loss_fn(self) -> LossFn | None:
        if self.owner.loss_fn is not None:
            return self.owner.loss_fn
        own = getattr(self.module, "loss_fn", None)
        return own if callable(own) else None

    def log(self, name: str, value: float | torch.Tensor) -> None:
        number = float(value)
        self.owner.records.append((self.step, name, number))
        self.logged[name] = number
        for logger in self.trainer.loggers:
            logger.log_metrics({name: number}, step=self.step)


class BnlabCallback(pl.Callback):
    """Runs bnlab callbacks (probes among them: names or objects) inside a Lightning ``Trainer``."""

    def __init__(self, callbacks: Iterable[Callback | str] | Callback,
                 loss_fn: LossFn | None = None) -> None:
        if isinstance(callbacks, Callback):  # one callback (a Doctor) given alone
            callbacks = [callbacks]
        self.callbacks = CallbackList([create(c) if isinstance(c, str) else c for c in callbacks])
        self.loss_fn = loss_fn
        self.records: list[tuple[int, str, float]] = []
        self._loop: LightningLoop | None = None

    def _loop_for(self, trainer: pl.Trainer, module: pl.LightningModule) -> LightningLoop:
        loop = self._loop
        if loop is None or loop.trainer is not trainer or loop.module is not module:
            loop = self._loop = LightningLoop(self, trainer, module)
        return loop

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = self._loop_for(trainer, pl_module)
        loop.step = trainer.global_step
        self.callbacks.call("on_train_start", loop)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        loop = self._loop_for(trainer, pl_module)
        loop.step, loop.batch, loop.loss, loop.stepped = trainer.global_step + 1, batch, None, None

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: torch.Tensor) -> None:
        loop = self._loop_for(trainer, pl_module)
        loop.loss = loss
        self.callbacks.call("on_before_backward", loop)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.callbacks.call("on_after_backward", self._loop_for(trainer, pl_module))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        loop = self._loop_for(trainer, pl_module)
        loop.stepped = optimizer
        self.callbacks.call("on_before_optimizer_step", loop)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loop = self._loop_for(trainer, pl_module)
        if loop.loss is not None:
            loop.loss = loop.loss.detach()
        self.callbacks.call("on_train_batch_end", loop)
        if loop.logged:
            logged, loop.logged = loop.logged, {}
            self.callbacks.call("on_log", loop, loop.step, logged)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.callbacks.call("on_train_epoch_end", self._loop_for(trainer, pl_module),
                            trainer.current_epoch + 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer, pl_module, "finished")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt)
        self._end(trainer, pl_module, "interrupted" if interrupted else "failed")

    def _end(self, trainer: pl.Trainer, module: pl.LightningModule, status: str) -> None:
        loop = self._loop_for(trainer, module)
        loop.step = trainer.global_step
        self.callbacks.call("on_train_end", loop, status)

    def state_dict(self) -> dict[str, Any]:
        return self.callbacks.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.callbacks.load_state_dict(state_dict)


class StochasticWeightAveraging(pl.callbacks.StochasticWeightAveraging):
    """``lightning.pytorch.callbacks.StochasticWeightAveraging`` that recomputes the statistics of
    every normalization layer in its extra epoch, bnlab's included (same arguments).

    Lightning's callback adds one epoch after the averaging in which the averaged weights run over
    the training data without backward, and resets only torch's ``_BatchNorm`` layers for it.
    Here that epoch is also a :class:`bnlab.norms.tools.population.StatisticsPass` over bnlab's
    layers: at its end their buffers hold the batch averages that :func:`bnlab.norms.update_bn`
    computes from the same batches (mbn's and cbn's moving statistics too); torch's layers get
    Lightning's own treatment.

    One difference from Lightning's own (2.6.6): the model ends with the averaged weights the
    statistics were computed with. Lightning's extra epoch skips backward but still steps the
    optimizer with gradients left from the last training step, so its final weights moved after
    the statistics were taken (measured: up to 2e-3 on a small conv net,
    tests/test_ecosystem_swa.py); here they are put back when the epoch ends.
    """

    _statistics: StatisticsPass | None = None
    _averaged: list[torch.Tensor] | None = None

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: pl.LightningModule) -> bool:
        return any(is_batch_norm(m) for m in pl_module.modules())

    def reset_batch_norm_and_save_state(self, pl_module: pl.LightningModule) -> None:
        super().reset_batch_norm_and_save_state(pl_module)
        self._statistics = StatisticsPass(pl_module, torch_layers=False).start()
        self._averaged = [p.detach().clone() for p in pl_module.parameters()]
        self._module = pl_module

    def reset_momenta(self) -> None:
        # the averaged weights first: cbn's written statistics read β (Eq. 9's second moment)
        if self._averaged is not None:
            with torch.no_grad():
                for p, averaged in zip(self._module.parameters(), self._averaged):
                    p.copy_(averaged)
            self._averaged = None
        if self._statistics is not None:
            self._statistics.finish()
            self._statistics = None
        super().reset_momenta()
