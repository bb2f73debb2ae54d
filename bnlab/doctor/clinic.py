"""Small networks on bnlab's ``digits`` data, healthy or with one planted cause per finding code:
the doctor's test bench (tests/test_doctor_clinic*.py) and the false-alarm measurement
(benchmarks/doctor_false_alarms.py).

A healthy network is a small MLP or CNN with BN (torch's ``nn.BatchNorm1d/2d`` or any bnlab layer by
spec), trained a few epochs with SGD (lr 0.05, momentum 0.9, weight decay 5e-4) or Adam at batch 64
from a seed, the last epoch at a tenth of the rate (as schedules end); :func:`planted` then breaks
one thing the way users break it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bnlab import data
from bnlab import norms as N

from bnlab.probes.base import is_bn_layer

from .examine import examine
from .findings import CODES


def norm_layer(norm: str, width: int, dims: int) -> nn.Module:
    if norm == "torch":
        return nn.BatchNorm1d(width) if dims == 1 else nn.BatchNorm2d(width)
    return N.create(norm, width)


def build(kind: str, norm: str, seed: int, activation: type[nn.Module] = nn.ReLU,
          width: int = 32) -> nn.Sequential:
    """``kind`` "mlp" (two hidden layers) or "cnn" (two conv layers) with ``norm`` ("torch" or a
    bnlab spec) after each hidden weight layer, weights drawn under ``torch.manual_seed(seed)``
    (restored after)."""
    if kind not in ("mlp", "cnn"):
        raise ValueError(f"kind must be 'mlp' or 'cnn', got {kind!r}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if kind == "mlp":
            return nn.Sequential(
                nn.Flatten(), nn.Linear(64, width, bias=False), norm_layer(norm, width, 1),
                activation(), nn.Linear(width, width, bias=False), norm_layer(norm, width, 1),
                activation(), nn.Linear(width, 10))
        return nn.Sequential(
            nn.Conv2d(1, width // 2, 3, padding=1, bias=False), norm_layer(norm, width // 2, 2),
            activation(), nn.Conv2d(width // 2, width, 3, padding=1, bias=False),
            norm_layer(norm, width, 2), activation(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(width, 10))


@dataclass
class Case:
    """A network ready for :func:`bnlab.doctor.examine`."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: list
    heldout: tuple
    accumulation_steps: int = 1
    extra: dict = field(default_factory=dict)

    def examine(self, **kwargs):
        return examine(self.model, nn.functional.cross_entropy, self.batches,
                       optimizer=self.optimizer, accumulation_steps=self.accumulation_steps,
                       **kwargs)


def train(model: nn.Module, optimizer, x, y, batch: int, epochs: int, seed: int,
          accumulation_steps: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    model.train()
    base = [group["lr"] for group in optimizer.param_groups]
    for epoch in range(epochs):
        # the last epoch at a tenth of the rate, as a schedule ends
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"] = lr * (0.1 if epoch == epochs - 1 and epochs > 1 else 1.0)
        # bnlab's layers that follow training's progress (CBN's AMAT, MBN's λ schedule)
        N.set_progress(model, lr=optimizer.param_groups[0]["lr"], epoch=epoch + 1, epochs=epochs)
        for i, (xb, yb) in enumerate(data.batches(x, y, batch, generator=generator,
                                                  drop_last=True)):
            loss = nn.functional.cross_entropy(model(xb), yb) / accumulation_steps
            loss.backward()
            if (i + 1) % accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    for group, lr in zip(optimizer.param_groups, base):
        group["lr"] = lr


def healthy(kind: str = "mlp", norm: str = "torch", seed: int = 0, batch: int = 64,
            epochs: int = 4, activation: type[nn.Module] = nn.ReLU, lr: float | None = None,
            momentum: float | None = None, optimizer: str = "sgd") -> Case:
    """A healthy network trained ``epochs`` on digits; batches for the doctor at ``batch``.
    ``optimizer`` "sgd" (lr 0.05, momentum 0.9, weight decay 5e-4) or "adam" (lr 1e-3);
    ``momentum`` overrides the BN layers' momentum."""
    ds = data.load("digits", device="cpu", seed=0)
    model = build(kind, norm, seed, activation)
    if momentum is not None:
        for m in model.modules():
            if hasattr(m, "momentum") and isinstance(getattr(m, "momentum"), float):
                m.momentum = momentum
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05 if lr is None else lr, momentum=0.9,
                              weight_decay=5e-4)
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3 if lr is None else lr)
    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    train(model, opt, ds.x_train, ds.y_train, batch, epochs, seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    batches = list(data.batches(ds.x_train, ds.y_train, batch, generator=generator,
                                drop_last=True))
    return Case(model, opt, batches, (ds.x_test, ds.y_test))


class Checkpointed(nn.Module):
    """Runs ``inner`` under activation checkpointing in training (torch.utils.checkpoint)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


def _bn_positions(model: nn.Module) -> list[int]:
    return [i for i, m in enumerate(model) if is_bn_layer(m)]


def _recollect(case: Case) -> None:
    N.recollect_running_stats(case.model, [x for x, _ in case.batches])


def planted(code: str, kind: str = "mlp", norm: str = "torch", seed: int = 0) -> Case:
    """A network with the one cause of ``code`` planted (see the module docstring)."""
    if code not in CODES:
        raise ValueError(f"unknown code {code!r}; the codes are {', '.join(CODES)}")
    if code == "stale-running-stats":
        # Keras's momentum=0.99 read as torch's: in torch 0.001-ish weights make the EMA lag;
        # here the statistics keep their start values after a short run
        return healthy(kind, norm, seed, momentum=0.001)
    if code == "small-batch":
        return healthy(kind, norm, seed, batch=2, epochs=1, lr=0.01)
    if code == "beta-swamping":
        case = healthy(kind, norm, seed, activation=nn.Tanh)
        with torch.no_grad():
            case.model[_bn_positions(case.model)[0]].bias.fill_(4.0)
        _recollect(case)  # only β is wrong: the statistics are those of the network as it is
        return case
    case = healthy(kind, norm, seed)
    if code == "sharpness":
        # plain SGD at a step past 2/λ_max of the trained network
        case.optimizer = torch.optim.SGD(case.model.parameters(), lr=2.0)
    elif code == "effective-lr":
        first = _bn_positions(case.model)[0] - 1
        with torch.no_grad():
            case.model[first].weight.mul_(300.0)
        _recollect(case)
    elif code == "micro-batch-statistics":
        case.accumulation_steps = 4
    elif code == "double-update":
        layers = list(copy.deepcopy(case.model))
        first = _bn_positions(case.model)[0]
        # the first weight layer, its norm and activation under activation checkpointing
        model = nn.Sequential(*layers[:first - 1],
                              Checkpointed(nn.Sequential(*layers[first - 1:first + 2])),
                              *layers[first + 2:])
        case.model = model
        case.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return case
