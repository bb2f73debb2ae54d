"""Training progress (learning rate, epoch) for the layers that need it: CBN's AMAT and MBN's λ
schedule.

Complete BN's moving weight is η = max(1 − ω·lr, 0) (Peng et al., Algorithm 1), so it needs the
current learning rate; Momentum BN's λ(t) follows the epoch t of T (Yong et al. 2020, §3.3).
:func:`set_progress` tells them by hand; :func:`track` does it for every training forward pass, read
from the optimizer.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch.nn as nn
from torch.optim import Optimizer

from ..variants.base import ChannelNorm
from ..engine.fused import lazily_disabled


def set_progress(model: nn.Module, *, lr: float | None = None, epoch: int | None = None,
                 epochs: int | None = None) -> None:
    """Tell every layer that needs it (CBN's AMAT, MBN's λ schedule) the learning rate and epoch
    (1-based)."""
    for module in _progress_layers(model):
        module.set_progress(lr=lr, epoch=epoch, epochs=epochs)


class _ProgressLayer(Protocol):
    def set_progress(self, *, lr: float | None = None, epoch: int | None = None,
                     epochs: int | None = None) -> None: ...


def _progress_layers(model: nn.Module) -> list[_ProgressLayer]:
    return [cast(_ProgressLayer, m) for m in model.modules()
            if isinstance(m, ChannelNorm) and hasattr(m, "set_progress")]


class ProgressTracker:
    """Handle returned by :func:`track`: current ``epoch`` (1-based), ``epoch_end()``, ``remove()``.

    ``state_dict()`` / ``load_state_dict()`` carry the epoch and step count through a checkpoint.
    """

    def __init__(self, model: nn.Module, optimizer: Optimizer, epochs: int,
                 steps_per_epoch: int | None, group: int, start_epoch: int) -> None:
        _check_positive("epochs", epochs)
        _check_positive("start_epoch", start_epoch)
        if steps_per_epoch is not None:
            _check_positive("steps_per_epoch", steps_per_epoch)
        if not 0 <= group < len(optimizer.param_groups):
            raise ValueError(f"group={group} but the optimizer has {len(optimizer.param_groups)} "
                             "param group(s)")
        self.model, self.optimizer, self.epochs = model, optimizer, int(epochs)
        self.steps_per_epoch, self.group = steps_per_epoch, group
        self.start_epoch, self.steps, self._epochs_ended = int(start_epoch), 0, 0
        self._hooks = [model.register_forward_pre_hook(self._before_forward),
                       optimizer.register_step_post_hook(self._after_step)]

    @property
    def epoch(self) -> int:
        if self.steps_per_epoch is not None:
            return self.start_epoch + self.steps // self.steps_per_epoch
        return self.start_epoch + self._epochs_ended

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[self.group]["lr"])

    def epoch_end(self) -> None:
        """Call once at the end of every epoch (not needed, and refused, with
        ``steps_per_epoch``)."""
        if self.steps_per_epoch is not None:
            raise RuntimeError("this tracker counts epochs from steps_per_epoch; do not also call "
                               "epoch_end()")
        self._epochs_ended += 1

    def remove(self) -> None:
        """Detach the hooks: the layers keep the progress they were last told."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def state_dict(self) -> dict:
        return {"steps": self.steps, "epochs_ended": self._epochs_ended}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self._epochs_ended = int(state["steps"]), int(state["epochs_ended"])

    # torch.compiler.disable on the first call: importing bnlab.norms skips torch._dynamo
    @lazily_disabled
    def _before_forward(self, module: nn.Module, args) -> None:
        # Kept out of torch.compile: traced, the hook's Python counters become guards and every
        # epoch (every step with steps_per_epoch) recompiles; eager, it only writes the layers'
        # progress tensors, which the compiled graph reads as inputs. Read at the moment the layers
        # use it, so a scheduler that steps per batch or per epoch, and Lightning's closure (forward
        # inside optimizer.step), all give the lr of the current update.
        if module.training:
            set_progress(module, lr=self.lr, epoch=self.epoch, epochs=self.epochs)

    def _after_step(self, optimizer: Optimizer, args, kwargs) -> None:
        self.steps += 1


def track(model: nn.Module, optimizer: Optimizer, epochs: int, *,
          steps_per_epoch: int | None = None, group: int = 0,
          start_epoch: int = 1) -> ProgressTracker:
    """Keep every progress-dependent layer of ``model`` told the learning rate and epoch,
    automatically.

    Before each training-mode forward pass of ``model``, the layers get ``lr`` =
    ``optimizer.param_groups[group]["lr"]``, the current epoch (1-based) and ``epochs``. The epoch
    advances with ``handle.epoch_end()`` — or, given ``steps_per_epoch``, every that many
    ``optimizer.step()`` calls. Returns the handle; ``handle.remove()`` undoes the hooks.

    >>> tracker = bnlab.norms.track(model, optimizer, epochs=90)
    >>> for epoch in range(90):
    ...     for x, y in loader:
    ...         optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    ...     scheduler.step(); tracker.epoch_end()
    """
    return ProgressTracker(model, optimizer, epochs, steps_per_epoch, group, start_epoch)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
