"""What a probe will cost, said before it runs.

Each probe states its cost in words (``Probe.cost``); this module states it in numbers: the
train-mode forward+backward passes of the training batch one call takes (:func:`passes`). The
passes are priced on the user's own model: :func:`time_pass` times one forward+backward of the
model on the user's batch (inside a :class:`~bnlab.probes.state.Snapshot`, with
``torch.autograd.grad``: parameters, ``.grad``, buffers, optimizer and RNG states are left as they
were), and :func:`estimate` multiplies. A probe's share is its seconds per training step (per call
divided by ``every``) over the seconds of the training step itself, taken as one forward+backward:
the real step also runs the optimizer and loads data, so the share is, if anything, overstated.

:class:`bnlab.probes.Lab` and :class:`bnlab.doctor.Doctor` run this on the first batch and warn
(or, asked to, thin the cadence: :func:`thinned_every`) when a probe would take more than the
budget, before it dominates the run. A probe of one's own declares its passes with a ``passes``
attribute: a number, or a callable ``passes(model)``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bnlab.callbacks import LossFn

from .base import weight_layers
from .compiled import eager_module
from .state import preserved

#: A forward pass, in forward+backward passes: the backward pass costs about two forwards.
FORWARD = 1.0 / 3.0
#: A Hessian-vector product (double backward through plain-autograd BN), in forward+backward
#: passes: 2.96 and 4.15 in two runs on the CPU for ResNet-20 at batch 16 (a shared machine;
#: benchmarks/results/doctor.json, ``pricing.hvp_passes``, holds the latest). With 3, the hessian
#: probe's estimate was 0.94 of its measured call there.
HVP = 3.0
#: Default budget: a probe taking more than the training step itself dominates the run.
BUDGET = 1.0
ACTIONS = ("warn", "thin", "ignore")


class ProbeCostWarning(UserWarning):
    """A probe (or the doctor) would take more than its budget of the training time."""


def _heldout(probe: Any) -> float:
    return FORWARD if getattr(probe, "heldout", None) is not None else 0.0


def _weights_after_first(model: nn.Module) -> int:
    return max(len(weight_layers(model)) - 1, 0)


# Passes per call of bnlab's probes, from the ``cost`` each declares (probe, model) -> passes.
PASSES: dict[str, Callable[[Any, nn.Module], float]] = {
    "moments": lambda p, m: 1.0 + 2 * FORWARD,  # a simulated step (its gradient) + 2 forwards
    "histograms": lambda p, m: FORWARD,
    "gamma": lambda p, m: 0.0,
    "cbn_ratios": lambda p, m: FORWARD,
    "batch_noise": lambda p, m: FORWARD + _heldout(p),
    "bn_regularization": lambda p, m: FORWARD + _heldout(p),
    "effective_lr": lambda p, m: 0.0,
    "grad_stats": lambda p, m: 1.0,  # k passes on B/k samples each
    "ics": lambda p, m: 2.0 + _weights_after_first(m),
    "landscape": lambda p, m: 1.0 + float(getattr(p, "num", 8)),
    "hessian": lambda p, m: 1.0 + HVP * (getattr(p, "iters", 20) + getattr(p, "samples", 10)),
}


def passes(probe: Any, model: nn.Module) -> float | None:
    """Forward+backward passes of the training batch one call of ``probe`` takes: its own
    ``passes`` attribute (a number or ``passes(model)``), else bnlab's table (:data:`PASSES`) by
    its ``name``; ``None`` when unknown."""
    own = getattr(probe, "passes", None)
    if callable(own):
        return float(own(model))
    if own is not None:
        return float(own)
    rule = PASSES.get(getattr(probe, "name", ""))
    return None if rule is None else float(rule(probe, model))


@dataclass(frozen=True)
class Cost:
    """One probe's estimated cost: ``seconds`` per call (``passes`` × the pass's seconds) and
    ``share``, its seconds per training step over the step's own seconds."""

    probe: str
    every: int
    passes: float | None
    seconds: float | None
    share: float | None

    def line(self) -> str:
        if self.passes is None:
            return f"{self.probe}: cost not declared (no passes attribute)"
        return (f"{self.probe}: {self.passes:.3g} forward+backward passes ≈ {self.seconds:.3g} s "
                f"per call, every {self.every} steps ≈ {self.share:.2g}× the training step")

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "every": self.every, "passes": self.passes,
                "seconds": self.seconds, "share": self.share}


def time_pass(model: nn.Module, loss_fn: LossFn, batch: Sequence[torch.Tensor],
              optimizer: torch.optim.Optimizer | None = None, repeats: int = 2) -> float:
    """Seconds of one train-mode forward+backward of ``model`` on ``batch`` (the fastest of
    ``repeats``; the first also warms the allocator). Leaves every state as it was."""
    model = eager_module(model)
    x, y = batch[0], batch[1]
    params = [p for p in model.parameters() if p.requires_grad]
    best = math.inf
    with preserved(model, optimizer) as snap, torch.enable_grad():
        for _ in range(max(1, repeats)):
            snap.reset_forward_state()
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            if params and loss.requires_grad:
                torch.autograd.grad(loss, params, allow_unused=True)
            if x.device.type == "cuda":
                torch.cuda.synchronize(x.device)
            best = min(best, time.perf_counter() - start)
    return best


def estimate(probes: Iterable[Any], model: nn.Module, pass_seconds: float,
             step_seconds: float | None = None) -> list[Cost]:
    """The :class:`Cost` of each probe (any object with ``name``/``every``; probes of unknown cost
    get ``passes=None``), a pass priced at ``pass_seconds`` and the training step at
    ``step_seconds`` (default: one pass)."""
    step = pass_seconds if step_seconds is None else step_seconds
    out = []
    for probe in probes:
        name = str(getattr(probe, "name", type(probe).__name__))
        every = int(getattr(probe, "every", 1))
        n = passes(probe, model)
        if n is None:
            out.append(Cost(name, every, None, None, None))
            continue
        seconds = n * pass_seconds
        out.append(Cost(name, every, n, seconds, seconds / every / step if step > 0 else 0.0))
    return out


def thinned_every(cost: Cost, budget: float) -> int:
    """The smallest cadence at which ``cost`` stays within ``budget`` of the training step."""
    if cost.share is None or cost.share <= budget or budget <= 0:
        return cost.every
    return max(cost.every, math.ceil(cost.every * cost.share / budget))


def check_action(on_cost: str, budget: float) -> None:
    if on_cost not in ACTIONS:
        raise ValueError(f"on_cost must be one of {', '.join(ACTIONS)}, got {on_cost!r}")
    if not budget > 0:
        raise ValueError(f"cost_budget must be positive (a fraction of the step), got {budget!r}")


def enforce(costs: list[Cost], probes: Sequence[Any], budget: float, on_cost: str,
            owner: str = "Lab", advice: str | None = None) -> list[Cost]:
    """Warn about (``on_cost="warn"``) or thin (``"thin"``: raise ``every``) each probe over
    ``budget``; returns the costs over budget (as estimated before any thinning). ``advice``
    replaces the warning's hint on what to pass ``owner``."""
    over = [c for c in costs if c.share is not None and c.share > budget]
    if not over or on_cost == "ignore":
        return over
    by_cost = {id(c): p for c, p in zip(costs, probes)}
    lines = []
    for cost in over:
        every = thinned_every(cost, budget)
        if on_cost == "thin":
            by_cost[id(cost)].every = every
            lines.append(f"{cost.line()}; now every {every} steps")
        else:
            lines.append(f"{cost.line()}; every {every} steps keeps it within {budget:g}×")
    if advice is None:
        advice = ("" if on_cost == "thin" else
                  f"{owner}(on_cost='thin') raises the cadence; cost_budget= sets the budget")
    advice = f" ({advice})" if advice else ""
    warnings.warn(f"{owner}: probes over the budget of {budget:g}× the training step{advice}: "
                  + "; ".join(lines), ProbeCostWarning, stacklevel=3)
    return over
