"""Snapshot and restore of everything a training step depends on, so that a probe cannot perturb
training.

A probe runs extra forward/backward passes and sometimes a trial optimizer step. Each of those
mutates state the training run depends on: BN running statistics and ``num_batches_tracked`` (every
train-mode forward), the moving statistics of MBN/CBN (``train_mean``, ``amat_mean``, ...), the
private generators of stochastic layers (``noisy_bn``), torch's global RNG (dropout), the
optimizer's state (momentum buffers, Adam moments, step counts), parameters and ``.grad``, and the
train/eval flags. :class:`Snapshot` records all of it by value and :meth:`Snapshot.restore` writes
it back *into the same tensor objects* (``copy_``), so references held elsewhere (the optimizer
holds the parameters, a trainer may hold buffers) stay valid and the next training step is bitwise
identical to a run without probes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bnlab.norms import StochasticLayer

_MISSING = object()


def _clone(value):
    if torch.is_tensor(value):
        return value.detach().clone()
    return copy.deepcopy(value)


def _write_back(container: dict, key, saved) -> None:
    """Put ``saved`` into ``container[key]``, in place when the current value is a compatible
    tensor."""
    current = container.get(key, _MISSING)
    if (
        torch.is_tensor(saved)
        and torch.is_tensor(current)
        and current.shape == saved.shape
        and current.dtype == saved.dtype
        and current.device == saved.device
    ):
        current.copy_(saved)
    else:
        container[key] = _clone(saved)


def optimizer_parameters(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [p for group in optimizer.param_groups for p in group["params"]]


class Snapshot:
    """Everything of ``model`` (and ``optimizer``) that a forward, backward or optimizer step can
    change.

    ``reset_forward_state()`` rewinds only what a *forward pass* changes (buffers, layer generators,
    global RNG), so that each of a probe's passes sees exactly the state the first one saw: the same
    running statistics and the same layer noise. ``restore()`` rewinds everything.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        params: dict[int, torch.Tensor] = {}
        for p in list(model.parameters()) + optimizer_parameters(optimizer):
            params.setdefault(id(p), p)
        self.params = [
            (p, p.detach().clone(), p.grad, None if p.grad is None else p.grad.detach().clone())
            for p in params.values()
        ]
        self.buffers = [
            (module, name, tensor, tensor.detach().clone())
            for module in model.modules()
            for name, tensor in module._buffers.items()
            if tensor is not None
        ]
        self.modes = [(module, module.training) for module in model.modules()]
        self.generators = []
        for module in model.modules():
            if isinstance(module, StochasticLayer):
                gen = getattr(module, "_generator", None)
                self.generators.append((module, gen, None if gen is None else gen.get_state()))
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.optimizer_state = None
        self.optimizer_groups = None
        if optimizer is not None:
            self.optimizer_state = {
                p: {k: _clone(v) for k, v in state.items()} for p, state in optimizer.state.items()
            }
            self.optimizer_groups = [
                {k: _clone(v) for k, v in group.items() if k != "params"}
                for group in optimizer.param_groups
            ]

    # -- partial rewinds --------------------------------------------------------------------------
    @torch.no_grad()
    def reset_buffers(self) -> None:
        for module, name, tensor, saved in self.buffers:
            if module._buffers.get(name) is not tensor:
                module._buffers[name] = tensor
            tensor.copy_(saved)

    def reset_rng(self) -> None:
        for module, gen, state in self.generators:
            # A layer whose generator did not exist yet creates it lazily from its seed; putting
            # None back makes the next forward recreate exactly the same stream.
            module._generator = gen
            if gen is not None:
                gen.set_state(state)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)

    def reset_forward_state(self, rng: bool = True) -> None:
        """Rewind what a forward pass changes: buffers and (unless ``rng=False``) every RNG."""
        self.reset_buffers()
        if rng:
            self.reset_rng()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for p, saved, _, _ in self.params:
            p.copy_(saved)

    # -- full rewind -------------------------------------------------------------------------------
    @torch.no_grad()
    def restore(self) -> None:
        self.reset_parameters()
        for p, _, grad, saved_grad in self.params:
            if grad is None or saved_grad is None:  # both None together: p had no gradient
                p.grad = None
            else:
                if grad.shape == saved_grad.shape:
                    grad.copy_(saved_grad)
                    p.grad = grad
                else:
                    p.grad = saved_grad
        self.reset_buffers()
        self.reset_rng()
        for module, training in self.modes:
            module.training = training
        if self.optimizer is not None:
            self._restore_optimizer()

    def _restore_optimizer(self) -> None:
        optimizer = self.optimizer
        saved_state, saved_groups = self.optimizer_state, self.optimizer_groups
        if optimizer is None or saved_state is None or saved_groups is None:
            return  # no optimizer was snapshotted
        for p in list(optimizer.state.keys()):
            if p not in saved_state:
                del optimizer.state[p]
        for p, saved in saved_state.items():
            state = optimizer.state[p]
            for key in list(state.keys()):
                if key not in saved:
                    del state[key]
            for key, value in saved.items():
                _write_back(state, key, value)
        for group, saved in zip(optimizer.param_groups, saved_groups):
            for key in list(group.keys()):
                if key != "params" and key not in saved:
                    del group[key]
            for key, value in saved.items():
                _write_back(group, key, value)


@contextmanager
def preserved(model: nn.Module,
              optimizer: torch.optim.Optimizer | None = None) -> Iterator[Snapshot]:
    """``with preserved(model, opt) as snap: ...`` -- whatever happens inside is undone on exit."""
    snap = Snapshot(model, optimizer)
    try:
        yield snap
    finally:
        snap.restore()


def simulated_step(snap: Snapshot, lr: float | None = None) -> dict[int, torch.Tensor]:
    """The parameters after this step's update, W' (Santurkar Definition 2.1), by id(parameter).

    Runs the real optimizer's ``step()`` on the real parameters inside the snapshot and reads the
    result, then rewinds parameters and optimizer state: whatever the optimizer is (SGD with
    momentum and weight decay, Adam, ...), W' is exactly what the training step will produce. The
    class method is called, not the instance attribute, so an LR scheduler's step-counting wrapper
    does not see the trial step. Without an optimizer, plain SGD ``W − lr·∇W`` with ``lr`` is used.
    A projection the trainer applies *after* ``optimizer.step()`` (projected SGD) is not part of W'.
    """
    optimizer = snap.optimizer
    if optimizer is None:
        if lr is None:
            raise ValueError("simulating the update needs an optimizer or a learning rate")
        return {
            id(p): (p.detach() - lr * p.grad).clone() if p.grad is not None else p.detach().clone()
            for p, _, _, _ in snap.params
        }
    with torch.no_grad():
        type(optimizer).step(optimizer)
    updated = {id(p): p.detach().clone() for p, _, _, _ in snap.params}
    snap.reset_parameters()
    snap._restore_optimizer()
    return updated
