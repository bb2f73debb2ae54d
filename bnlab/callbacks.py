"""The one callback protocol of bnlab: Lightning-shaped hooks, one typed view of the training loop.

Every training loop bnlab drives or attaches to calls the same hooks: ``bnlab train``
(:class:`bnlab.train.engine.Trainer`), a plain PyTorch loop (:class:`bnlab.probes.Lab`) and a
PyTorch Lightning ``Trainer`` (:class:`bnlab.integrations.lightning.BnlabCallback`). Every probe of
:mod:`bnlab.probes` is a :class:`Callback`. Subclass it and override what you need::

    class GradNorm(Callback):
        def on_before_optimizer_step(self, loop):
            grads = [p.grad.flatten() for p in loop.model.parameters()]
            loop.log("grad_norm", torch.cat(grads).norm())

The hooks are named after Lightning's (``lightning.pytorch.Callback``), in the order of one step::

    on_train_start
      (on_before_backward -> on_after_backward -> on_before_optimizer_step -> on_train_batch_end
       [on_train_epoch_end]) * steps
    on_train_end

``on_log`` fires with the metrics recorded at a step once they are read back (bnlab train reads
device values every few steps, never per step). Where Lightning passes ``(trainer, pl_module)``,
every hook here receives one :class:`Loop`: the model, the optimizer, the loss function, the step
number, the batch, the loss and ``log(name, value)``. ``state_dict``/``load_state_dict`` save and
restore a callback's state in checkpoints (bnlab train keys it by :attr:`Callback.name`; Lightning
by the adapter's ``state_key``).

This module imports torch only: ``bnlab.train``, ``bnlab.probes`` and the integrations import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

#: ``(inputs, targets)`` of one step (a tuple or a list, as a DataLoader yields it).
Batch = Sequence[torch.Tensor]
#: ``loss_fn(output, target)``: the mean training loss (a probe's passes use it).
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: The hooks, in the order of a run (see the module docstring).
HOOKS = ("on_train_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
         "on_train_batch_end", "on_train_epoch_end", "on_log", "on_train_end")
#: Hooks of the earlier protocol (a ``StepContext`` argument), removed: the error names these.
REMOVED_HOOKS = {"on_start": "on_train_start", "after_backward": "on_before_optimizer_step",
                 "after_step": "on_train_batch_end", "on_end": "on_train_end",
                 "on_step_end": "on_train_batch_end", "on_epoch_end": "on_train_epoch_end",
                 "on_probe": "on_log"}


class Loop(Protocol):
    """What every hook receives: the training loop as it stands at the call.

    ``step`` is the 1-based number of the step in progress from ``on_before_backward`` to
    ``on_train_batch_end``, and the number of steps taken in ``on_train_start``/``on_train_end``.
    ``batch`` (``(inputs, targets)``) and ``loss`` (this step's training loss; a 0-d tensor on the
    device, reading it forces a host sync) are ``None`` before the first step. ``optimizer`` is
    ``None`` for a plain loop that gave none; ``lr`` is the loop's own learning rate where it
    has one outside the optimizer (else ``None``: read the optimizer's groups). ``loss_fn`` is
    ``None`` where the loop computes its loss itself and none was given (probes need it).
    ``log(name, value)`` records a metric at ``step`` (a number or a 0-d tensor).
    """

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...

    @property
    def loss_fn(self) -> LossFn | None: ...

    @property
    def step(self) -> int: ...

    @property
    def batch(self) -> Batch | None: ...

    @property
    def loss(self) -> torch.Tensor | None: ...

    @property
    def lr(self) -> float | None: ...

    def log(self, name: str, value: float | torch.Tensor) -> None: ...


def _user_defined(method: Any) -> bool:
    """A callable not from bnlab itself (bnlab's Doctor and Lab keep plain-loop methods named
    after_backward/after_step with other signatures)."""
    module = str(getattr(method, "__module__", "") or "")
    return callable(method) and not module.startswith("bnlab.")


class Callback:
    """Base class: every hook is a no-op; override what you need (see the module docstring)."""

    #: True if the callback changes what the run computes (it edits weights, gradients or the
    #: learning rate): its class and ``state_dict()`` at construction then enter the run id.
    changes_training: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Callback:
        # a removed hook would never be called and the run would report `finished`: refuse the
        # subclass at construction (in __new__, so a subclass's own __init__ cannot skip it)
        old = [h for h in REMOVED_HOOKS if _user_defined(getattr(cls, h, None))]
        if old:
            renames = "; ".join(f"{h} -> {REMOVED_HOOKS[h]}" for h in old)
            raise TypeError(
                f"{cls.__name__} defines {', '.join(old)}, which bnlab no longer calls (the "
                f"StepContext protocol is gone): rename {renames}; each hook now receives one "
                "Loop (bnlab.callbacks.HOOKS lists them)")
        return super().__new__(cls)

    @property
    def name(self) -> str:
        """Key of this callback's state in checkpoints (override with a class attribute)."""
        return type(self).__name__

    def on_train_start(self, loop: Loop) -> None:
        """Before the first step (after a resume: before the first step still to take)."""

    def on_before_backward(self, loop: Loop) -> None:
        """The forward pass is done: ``loop.loss`` is about to be backpropagated."""

    def on_after_backward(self, loop: Loop) -> None:
        """The gradients of the step are in ``.grad``."""

    def on_before_optimizer_step(self, loop: Loop) -> None:
        """Right before ``optimizer.step()`` (under Lightning: after gradient accumulation, before
        clipping). The probes measure here: gradients present, parameters not yet updated."""

    def on_train_batch_end(self, loop: Loop) -> None:
        """After the optimizer step of ``loop.step``."""

    def on_train_epoch_end(self, loop: Loop, epoch: int) -> None:
        """After the last step of epoch ``epoch`` (1-based)."""

    def on_log(self, loop: Loop, step: int, metrics: dict[str, float]) -> None:
        """The metrics recorded at ``step`` (probe values ``probe/<name>/...`` included)."""

    def on_train_end(self, loop: Loop, status: str) -> None:
        """Once, at the end: ``finished``, ``diverged``, ``failed`` or ``interrupted``."""

    def state_dict(self) -> dict[str, Any]:
        """What to save in a checkpoint (tensors and primitive containers only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def check_callbacks(callbacks: Iterable[Any]) -> list[Callback]:
    """``callbacks`` as a list, or a TypeError naming the first that is not a :class:`Callback`
    (and, for an object of the removed protocol, the hooks that replace its methods)."""
    out = list(callbacks)
    for cb in out:
        if isinstance(cb, Callback):
            continue
        old = [h for h in REMOVED_HOOKS if callable(getattr(cb, h, None))]
        hint = "; ".join(f"{h}(ctx) -> {REMOVED_HOOKS[h]}(loop)" for h in old)
        raise TypeError(f"callbacks must subclass bnlab.callbacks.Callback, got {type(cb).__name__}"
                        + (f" (the StepContext protocol is gone: {hint})" if hint else ""))
    return out


def callback_names(callbacks: Sequence[Callback]) -> list[str]:
    """The checkpoint key of each callback: its ``name``, ``#k`` on repeats."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for cb in callbacks:
        base = cb.name if isinstance(cb.name, str) and cb.name else type(cb).__name__
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return keys


class CallbackList:
    """Dispatches each hook to the callbacks that override it; the lists are built once, so a
    hook nobody overrides costs one empty loop per call (``has`` lets a loop skip its arguments)."""

    def __init__(self, callbacks: Iterable[Any]):
        self.callbacks = check_callbacks(callbacks)
        self.keys = callback_names(self.callbacks)
        self._hooks: dict[str, list[Callable[..., None]]] = {
            hook: [getattr(cb, hook) for cb in self.callbacks
                   if getattr(type(cb), hook) is not getattr(Callback, hook)]
            for hook in HOOKS
        }

    def has(self, hook: str) -> bool:
        return bool(self._hooks[hook])

    def call(self, hook: str, *args: Any) -> None:
        for method in self._hooks[hook]:
            method(*args)

    def state_dict(self) -> dict[str, Any]:
        return {key: cb.state_dict() for key, cb in zip(self.keys, self.callbacks)}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for key, cb in zip(self.keys, self.callbacks):
            if key in states:
                cb.load_state_dict(states[key])
