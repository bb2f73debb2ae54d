"""What the doctor's own measurements cost, and the cadence that keeps them within budget.

The watcher's routine work at a watched step (every ``every`` steps, 16 by default) reads weights
and batch statistics: no extra pass. Its one expensive measurement is the sharpness (the top
Hessian eigenvalue by Lanczos): one double-backward graph and ``iters`` Hessian-vector products,
about ``1 + HVP·iters`` forward+backward passes of the batch (:data:`bnlab.probes.cost.HVP`).
Priced on the user's model by timing one forward+backward on the first batch
(:func:`bnlab.probes.cost.time_pass`), it is run every :func:`sharpness_every` steps: the smallest
multiple of ``every`` at which it takes at most ``budget`` of the training time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bnlab.probes import cost as probe_cost

#: The share of the training step the doctor's sharpness measurement may take by default.
SHARPNESS_BUDGET = 0.03


@dataclass
class SharpnessCost:
    """The sharpness measurement as a probe for :mod:`bnlab.probes.cost` (name, every, passes)."""

    iters: int
    every: int
    name: str = "doctor sharpness"

    @property
    def passes(self) -> float:
        return 1.0 + probe_cost.HVP * self.iters


def sharpness_every(pass_seconds: float, iters: int, every: int,
                    budget: float = SHARPNESS_BUDGET, step_seconds: float | None = None) -> int:
    """The sharpness cadence: a multiple of ``every`` keeping its share within ``budget``."""
    step = pass_seconds if step_seconds is None else step_seconds
    if step <= 0 or pass_seconds <= 0:
        return every
    share_each_step = SharpnessCost(iters, 1).passes * pass_seconds / step
    needed = share_each_step / budget
    return max(every, every * math.ceil(needed / every))
