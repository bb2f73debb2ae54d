"""Divergence as data: what counts as a diverged run, found from values read at the engine's checks.

A run diverged when, at some step, its loss is not finite, or exceeds ``divergence_factor`` times
the loss of its first step (``TrainConfig.divergence_factor``, default 1e6; ``None`` disables this
rule), or when a parameter or a floating buffer (BN running statistics included) is not finite.
The engine reads the losses of the steps since its last check in one transfer and hands them here,
so the first offending step is known exactly even though the check runs every ``check_every`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

# relative threshold against a first loss of ~0 (a perfectly fitted start) would flag any loss
LOSS_FLOOR = 1e-12


class Divergence(Exception):
    """The run diverged at ``step`` with loss ``loss``; ``reason`` says which rule fired."""

    def __init__(self, step: int, loss: float, reason: str):
        super().__init__(reason)
        self.step, self.loss, self.reason = step, loss, reason


def scan_losses(losses: Sequence[float], first_step: int, start_loss: float | None,
                factor: float | None) -> None:
    """Raise :class:`Divergence` at the first of ``losses`` (of steps ``first_step``, ...) that is
    non-finite or above ``factor`` × ``start_loss``."""
    limit = (factor * max(abs(start_loss), LOSS_FLOOR) if factor and start_loss is not None
             else math.inf)
    for offset, value in enumerate(losses):
        step = first_step + offset
        if not math.isfinite(value):
            raise Divergence(step, value, f"non-finite loss {value} at step {step}")
        if value > limit:
            raise Divergence(
                step, value,
                f"loss {value:.4g} at step {step} exceeds divergence_factor {factor:g} x the first "
                f"loss {start_loss:.4g}",
            )


def state_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors whose finiteness is checked: every parameter and floating buffer, by name."""
    named = [*model.named_parameters(),
             *((n, b) for n, b in model.named_buffers() if b.is_floating_point())]
    return [(name, t) for name, t in named if t.numel()]


def check_state(named: Sequence[tuple[str, torch.Tensor]], step: int, loss: float) -> None:
    """Raise :class:`Divergence` if any of ``named`` holds a non-finite value (one host read)."""
    if not named:
        return
    # one multi-tensor kernel for the max-norms (NaN and inf propagate), one read
    peaks = torch.stack([p.float() for p in torch._foreach_norm([t.detach() for _, t in named],
                                                                math.inf)])
    finite = torch.isfinite(peaks).tolist()
    if not all(finite):
        bad = [name for (name, _), ok in zip(named, finite) if not ok]
        raise Divergence(step, loss, f"non-finite parameters/buffers after step {step}: "
                                     f"{', '.join(bad[:5])}")
