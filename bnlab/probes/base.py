"""The probe protocol: a measurement taken at some steps of a training loop, never changing the
loop.

A probe is a :class:`bnlab.callbacks.Callback` with one job. At steps ``step % every == 0`` its
``on_before_optimizer_step`` (gradients of the step present, optimizer not yet stepped) takes a
:class:`Snapshot` of all training state, calls :meth:`Probe.measure`, restores the state, and logs
each returned quantity as the metric ``probe/<name>/<quantity>[/<layer>]`` plus
``probe/<name>/seconds`` (its own wall time, snapshot and restore included). Two-phase probes
(``effective_lr``) finish in ``on_train_batch_end``.

Probes read the hooks' :class:`~bnlab.callbacks.Loop`: ``model``, ``loss_fn``, ``batch``
(``(x, y)``), ``step``, ``optimizer`` and/or ``lr``, and ``log(name, value)``. bnlab train, a plain
loop's :class:`bnlab.probes.Lab` and the Lightning adapter
(:class:`bnlab.integrations.lightning.BnlabCallback`) all provide it. Probes compute losses as
``loss_fn(model(x), y)`` (a regularization term the trainer adds is not included).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from bnlab.callbacks import Callback, Loop
from bnlab.norms import ChannelNorm, CompleteBatchNorm
from bnlab.spec import Registry

from .compiled import eager_module
from .state import Snapshot, preserved

WEIGHT_LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def is_bn_layer(module: nn.Module) -> bool:
    """BN-family layers: bnlab's ChannelNorm subclasses and torch's own nn.BatchNorm*d."""
    return isinstance(module, (ChannelNorm, nn.modules.batchnorm._BatchNorm))


def bn_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if is_bn_layer(m)]


def weight_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, WEIGHT_LAYER_TYPES)]


def select_layers(model: nn.Module, names: Iterable[str] | None,
                  default: list[tuple[str, nn.Module]], what: str) -> list[tuple[str, nn.Module]]:
    """``default`` unless ``names`` is given; unknown names are a ValueError that lists the valid
    ones."""
    if names is None:
        return default
    modules = dict(model.named_modules())
    chosen = []
    for name in names:
        if name not in modules:
            valid = ", ".join(n for n, _ in default) or "(none)"
            raise ValueError(f"no module named {name!r} in the model; {what} layers: {valid}")
        chosen.append((name, modules[name]))
    return chosen


def channels_first(x: torch.Tensor) -> torch.Tensor:
    """(N, C, *) -> (C, N·prod(*)): each row holds what BN pools for one channel."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def bn_affine(module: nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(γ, β) of a BN layer, ones/zeros when it has no affine parameters."""
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    c = like.shape[0]
    gamma = (weight.detach() if weight is not None
             else torch.ones(c, dtype=like.dtype, device=like.device))
    beta = (bias.detach() if bias is not None
            else torch.zeros(c, dtype=like.dtype, device=like.device))
    return gamma.to(like.dtype), beta.to(like.dtype)


def cbn_rho(module: nn.Module) -> float:
    return float(module.rho) if isinstance(module, CompleteBatchNorm) else 1.0


@dataclass
class ProbeContext:
    """What a probe sees of the training loop at one step (built from the hooks' :class:`Loop`)."""

    model: nn.Module
    loss_fn: Callable
    batch: tuple[torch.Tensor, torch.Tensor]
    step: int
    optimizer: torch.optim.Optimizer | None = None
    lr: float | None = None
    epoch: int | None = None
    snapshot: Snapshot | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_loop(cls, loop: Loop) -> ProbeContext:
        batch, loss_fn = loop.batch, loop.loss_fn
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError("probes need loop.batch = (inputs, targets), got "
                             f"{type(batch).__name__}")
        if loss_fn is None:
            raise ValueError("probes need loop.loss_fn (loss_fn(output, target)): pass loss_fn= to "
                             "the loop's adapter (Lab, BnlabCallback)")
        # a compiled model (torch.compile) is measured through its eager module:
        # bnlab.probes.compiled
        return cls(model=eager_module(loop.model), loss_fn=loss_fn, batch=(batch[0], batch[1]),
                   step=int(loop.step),
                   optimizer=loop.optimizer, lr=loop.lr)

    @property
    def x(self) -> torch.Tensor:
        return self.batch[0]

    @property
    def y(self) -> torch.Tensor:
        return self.batch[1]

    def require_snapshot(self) -> Snapshot:
        """The snapshot a probe that is not ``read_only`` runs inside (``Probe.__call__`` takes
        it)."""
        if self.snapshot is None:
            raise RuntimeError("this probe needs ctx.snapshot (a Snapshot), which is None: call "
                               "the probe itself, which takes one for every probe that is not "
                               "read_only")
        return self.snapshot

    def learning_rate(self, param: torch.Tensor | None = None) -> float:
        """The step size: of ``param``'s optimizer group if known, else the context's ``lr``."""
        if self.optimizer is not None:
            groups = self.optimizer.param_groups
            if param is not None:
                for group in groups:
                    if any(p is param for p in group["params"]):
                        return float(group["lr"])
            if self.lr is None:
                return float(groups[0]["lr"])
        if self.lr is None:
            raise ValueError("this probe needs the learning rate: pass an optimizer or lr")
        return float(self.lr)

    def loss(self, params: dict[str, torch.Tensor] | None = None, x: torch.Tensor | None = None,
             y: torch.Tensor | None = None) -> torch.Tensor:
        """``loss_fn(model(x), y)``, with ``params`` substituted by
        ``torch.func.functional_call``."""
        x = self.x if x is None else x
        y = self.y if y is None else y
        out = (self.model(x) if params is None
               else torch.func.functional_call(self.model, params, (x,)))
        return self.loss_fn(out, y)


def named_params(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters())


def loss_and_grads(ctx: ProbeContext, wrt: list[str], params: dict[str, torch.Tensor] | None = None,
                   x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                   reset: bool = True) -> tuple[float, list[torch.Tensor]]:
    """One train-mode forward/backward: the loss and its gradient with respect to the named
    parameters.

    ``params`` (name -> tensor) replaces the model's values; the gradient is taken with
    ``torch.autograd.grad`` so ``.grad`` is never touched. With ``reset`` the buffers and RNGs are
    rewound first, so every pass of a probe sees the same running statistics and layer noise.
    """
    if reset and ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state()
    current = named_params(ctx.model)
    leaves = {}
    for name, p in current.items():
        value = p if params is None or name not in params else params[name]
        leaves[name] = value.detach().requires_grad_(p.requires_grad)
    with torch.enable_grad():
        loss = ctx.loss(leaves, x, y)
        grads = torch.autograd.grad(loss, [leaves[n] for n in wrt], allow_unused=True)
    return float(loss.detach()), [torch.zeros_like(leaves[n]) if g is None else g
                                  for n, g in zip(wrt, grads)]


def flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = a.norm(), b.norm()
    if float(na) == 0.0 or float(nb) == 0.0:
        return float("nan")
    return float(torch.dot(a, b) / (na * nb))


class capture_inputs:
    """Context manager recording the first input (or output) of each named module during
    forwards."""

    def __init__(self, modules: list[tuple[str, nn.Module]], outputs: bool = False) -> None:
        self.modules = modules
        self.outputs = outputs
        self.values: dict[str, torch.Tensor] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> capture_inputs:
        for name, module in self.modules:
            def hook(mod, inputs, output, name=name):
                value = output if self.outputs else inputs[0]
                if torch.is_tensor(value):
                    self.values[name] = value.detach()
            self._handles.append(module.register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class Probe(Callback):
    """Base class. Subclasses set ``name``, ``cost`` and implement :meth:`measure` (and maybe
    :meth:`finish`).

    ``measure`` runs inside a :class:`Snapshot` (``ctx.snapshot``) that is restored afterwards, and
    returns ``{quantity: value}``; quantities may carry a layer suffix (``"l2/features.3"``).
    """

    name: ClassVar[str] = "probe"
    summary: ClassVar[str] = ""  # one line: what it measures, and the paper
    cost: ClassVar[str] = ""
    # Probes that only read parameters/gradients skip the snapshot (and its copying cost).
    read_only: ClassVar[bool] = False

    def __init__(self, every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.every = every
        # Set by a two-phase probe's ``measure`` to what ``finish`` needs after the optimizer step.
        self._carry: Any = None
        self._pending: tuple[int, float] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(every={self.every})"

    def due(self, step: int) -> bool:
        return int(step) % self.every == 0

    # -- to implement ------------------------------------------------------------------------------
    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        raise NotImplementedError

    def finish(self, ctx: ProbeContext) -> dict[str, float]:
        """Second phase, after ``optimizer.step()``, for probes whose ``measure`` set
        ``self._carry``."""
        return {}

    # -- running -----------------------------------------------------------------------------------
    def run_after_backward(self, ctx: ProbeContext) -> dict[str, float]:
        """Measure at this step (if due) and return the metrics to log, full names."""
        if not self.due(ctx.step):
            return {}
        start = time.perf_counter()
        self._carry = None
        self._pending = None
        if self.read_only:
            values = self.measure(ctx)
        else:
            with preserved(ctx.model, ctx.optimizer) as snap:
                ctx.snapshot = snap
                try:
                    values = self.measure(ctx)
                finally:
                    ctx.snapshot = None
        seconds = time.perf_counter() - start
        metrics = {f"probe/{self.name}/{k}": float(v) for k, v in values.items()}
        if self._carry is not None:
            self._pending = (int(ctx.step), seconds)
        else:
            metrics[f"probe/{self.name}/seconds"] = seconds
        return metrics

    def run_after_step(self, ctx: ProbeContext) -> dict[str, float]:
        if self._pending is None or self._pending[0] != int(ctx.step):
            return {}
        start = time.perf_counter()
        values = self.finish(ctx)
        seconds = self._pending[1] + time.perf_counter() - start
        self._pending = None
        self._carry = None
        metrics = {f"probe/{self.name}/{k}": float(v) for k, v in values.items()}
        metrics[f"probe/{self.name}/seconds"] = seconds
        return metrics

    # -- the callback protocol (bnlab.callbacks) ---------------------------------------------------
    def on_train_start(self, loop: Loop) -> None:
        self._pending = None

    def on_before_optimizer_step(self, loop: Loop) -> None:
        if not self.due(int(loop.step)):
            return
        for name, value in self.run_after_backward(ProbeContext.from_loop(loop)).items():
            loop.log(name, value)

    def on_train_batch_end(self, loop: Loop) -> None:
        if self._pending is None:
            return
        for name, value in self.run_after_step(ProbeContext.from_loop(loop)).items():
            loop.log(name, value)

    def on_train_end(self, loop: Loop, status: str) -> None:
        self._pending = None


# Every step probe, registered next to its class with ``@PROBES.register()`` (its ``name``; options
# and their types from ``__init__``'s signature). ``bnlab train --probe "grad_stats(per_layer=no)"``
# and :func:`bnlab.probes.create` both resolve through it.
PROBES: Registry[type[Probe]] = Registry("probe", names_label="probes", key_label="option")
