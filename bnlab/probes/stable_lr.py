"""The largest learning rate that trains without diverging (Peng et al., Section 6 ablation, Table
6).

Not a step probe but a search over training runs: Peng et al. pick "the maximal learning rate from
the candidate set {0.0001, 0.001, 0.01, 0.1, 1} that ensures that training does not collapse".
:func:`max_stable_lr` runs a caller-supplied ``train_fn(lr) -> status`` (``bnlab.train`` provides
one); :func:`train_status` is a small self-contained trainer for models, losses and batches at hand.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bnlab.spec import check_choice

PENG_CANDIDATES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
DEFAULT_CANDIDATES = PENG_CANDIDATES
STRATEGIES = ("descending", "all")
STABLE_STATUSES = ("finished", "stable", "ok", "converged")
UNSTABLE_STATUSES = ("diverged", "failed", "collapsed", "unstable")


def is_stable(status: Any) -> bool:
    """Interpret what ``train_fn`` returned: a bool, a status string, or a mapping/object with
    ``status``."""
    if isinstance(status, bool):
        return status
    if isinstance(status, dict):
        status = status.get("status")
    elif hasattr(status, "status"):
        status = status.status
    if isinstance(status, str):
        key = status.strip().lower()
        if key in STABLE_STATUSES:
            return True
        if key in UNSTABLE_STATUSES:
            return False
    raise ValueError(
        f"cannot read a training status from {status!r}; return a bool, or one of "
        f"{', '.join(STABLE_STATUSES)} (stable) / {', '.join(UNSTABLE_STATUSES)} (not stable)"
    )


@dataclass
class StableLRResult:
    lr: float | None
    """The largest stable candidate, or None if every tried candidate diverged."""
    statuses: dict[float, bool] = field(default_factory=dict)
    """lr -> stable?, for every candidate that was trained."""

    def metrics(self) -> dict[str, float]:
        out = {"probe/max_stable_lr/lr": float("nan") if self.lr is None else float(self.lr)}
        for lr, ok in self.statuses.items():
            out[f"probe/max_stable_lr/stable/{lr:g}"] = 1.0 if ok else 0.0
        return out


def max_stable_lr(train_fn: Callable[[float], Any],
                  candidates: Iterable[float] = DEFAULT_CANDIDATES,
                  strategy: str = "descending") -> StableLRResult:
    """The largest candidate learning rate for which ``train_fn(lr)`` reports stable training.

    ``descending`` (default) tries candidates from the largest down and stops at the first stable
    one (diverging runs are usually cut short, so this is the cheap order); ``all`` trains every
    candidate and reports the largest stable one — use it when stability might not be monotone in
    lr.
    """
    lrs = sorted({float(c) for c in candidates}, reverse=True)
    if not lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise ValueError("candidates must be positive finite learning rates, got "
                         f"{list(candidates)!r}")
    check_choice("strategy", strategy, STRATEGIES, "strategies")
    result = StableLRResult(lr=None)
    for lr in lrs:
        ok = is_stable(train_fn(lr))
        result.statuses[lr] = ok
        if ok and result.lr is None:
            result.lr = lr
            if strategy == "descending":
                break
    return result


def train_status(model: nn.Module, loss_fn: Callable,
                 batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float, steps: int, *,
                 momentum: float = 0.0, weight_decay: float = 0.0, blowup: float = 1e3) -> str:
    """Train a *copy* of ``model`` with SGD for ``steps`` steps cycling over ``batches``.

    Returns ``"diverged"`` as soon as the loss is non-finite or exceeds ``blowup`` × the first loss,
    else ``"finished"``. The model passed in is not modified.
    """
    if not batches:
        raise ValueError("train_status needs at least one (inputs, targets) batch")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    net = copy.deepcopy(model)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    first = None
    for step in range(steps):
        x, y = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        value = float(loss.detach())
        if first is None:
            first = abs(value)
        if not math.isfinite(value) or abs(value) > blowup * max(first, 1e-12):
            return "diverged"
        loss.backward()
        opt.step()
    return "finished"


def max_stable_lr_for(model: nn.Module, loss_fn: Callable,
                      batches: Sequence[tuple[torch.Tensor, torch.Tensor]], steps: int,
                      candidates: Iterable[float] = DEFAULT_CANDIDATES,
                      strategy: str = "descending", **train_options) -> StableLRResult:
    """:func:`max_stable_lr` with :func:`train_status` as the trainer: each candidate starts from
    ``model``."""
    return max_stable_lr(lambda lr: train_status(model, loss_fn, batches, lr, steps,
                                                 **train_options),
                         candidates, strategy)
