"""Finished means healthy: the checks a run passes before it is stored ``finished``.

Divergence (:mod:`bnlab.train.divergence`) watches the training losses and the finiteness of every
parameter and buffer. That misses two ways a run can end broken yet look done: a *negative*
running variance (finite, so not caught, yet every eval-mode output is then NaN or garbage), and
a final evaluation that blew up while the last training losses looked fine (one step at a huge
learning rate). So, at every check a variance buffer below zero is a divergence, and at the end
the final evaluation must be finite and within the same stated bound as the training losses:
``divergence_factor`` (default 1e6) times the first step's loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from bnlab.norms import ChannelNorm
from bnlab.train.divergence import LOSS_FLOOR, Divergence

# buffers holding a variance or a standard deviation (BN's running_var, CBN's amat_var, ...)
_VARIANCE_NAMES = ("var", "std")


def variance_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Floating buffers that are variances by name (``running_var``, ``amat_var``, ...), less those
    a module lists in ``signed_buffers``: buffers named like a variance that hold a signed part of
    one (Complete BN's ``running_var`` is σ²_A − (off + β)², negative whenever β grew while the
    moving second moment σ²_A still remembers the smaller one; its eval divisor stays positive)."""
    found = []
    for prefix, module in model.named_modules():
        signed = module.signed_buffers if isinstance(module, ChannelNorm) else ()
        for name, b in module.named_buffers(recurse=False):
            if name in signed or not (b.is_floating_point() and b.numel()):
                continue
            if name.endswith(_VARIANCE_NAMES):
                found.append((f"{prefix}.{name}" if prefix else name, b))
    return found


def check_variances(named: Sequence[tuple[str, torch.Tensor]], step: int, loss: float) -> None:
    """Raise :class:`Divergence` if a variance buffer holds a negative value (one host read)."""
    if not named:
        return
    lowest = torch.stack([b.detach().min().float() for _, b in named]).tolist()
    bad = [f"{name} (min {low:.3g})" for (name, _), low in zip(named, lowest) if low < 0]
    if bad:
        raise Divergence(
            step, loss, f"negative variance buffers after step {step}: {', '.join(bad[:5])}"
        )


def check_final(
    final_eval: Mapping[str, float],
    step: int,
    loss: float,
    start_loss: float | None,
    factor: float | None,
) -> None:
    """Raise :class:`Divergence` if the final evaluation's loss is not finite or exceeds
    ``factor`` x the first training loss (the bound the training losses are held to)."""
    test_loss = final_eval.get("test_loss")
    if test_loss is None:
        return
    if not math.isfinite(test_loss):
        raise Divergence(step, loss, f"non-finite final test loss {test_loss} after step {step}")
    if factor and start_loss is not None and test_loss > factor * max(abs(start_loss), LOSS_FLOOR):
        raise Divergence(
            step,
            loss,
            f"final test loss {test_loss:.4g} exceeds divergence_factor {factor:g} "
            f"x the first loss {start_loss:.4g}",
        )
