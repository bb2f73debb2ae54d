"""Learning-rate schedules, as pure functions of the training position.

A schedule maps (completed steps, current 0-based epoch) to a factor multiplying every base
learning rate. Being a pure function of counters, it needs no state of its own in a checkpoint:
restoring the step and epoch counters restores the schedule.

Forms (strings, as on the command line):

* ``constant`` -- factor 1.
* ``step:60,100`` -- divide by 10 at the start of epochs 60 and 100 (0-based epoch index), as in
  Peng et al. (ResNet on CIFAR: lr 0.1, ÷10 after 60 and 100 of 120 epochs). ``step:60,100:0.2``
  uses factor 0.2 instead of 0.1.
* ``exp:0.9999`` -- continuous exponential decay, factor ``gamma**t`` after ``t`` steps. Luo et al.
  (Sec. 5) "continuously decay the learning rate by a factor of 1e-4 each step"; we read that as
  multiplying by ``1 - 1e-4`` every step, i.e. ``exp:0.9999``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bnlab.spec import split_tagged

SCHEDULE_KINDS = {"constant": "constant", "step": "step:E1,E2[,...][:factor]",
                  "exp": "exp:<gamma per step, in (0, 1]>"}
SCHEDULE_FORMS = " | ".join(SCHEDULE_KINDS.values())


@dataclass(frozen=True)
class Schedule:
    kind: str
    milestones: tuple[int, ...] = ()
    factor: float = 0.1
    gamma: float = 1.0

    def __call__(self, step: int, epoch: int) -> float:
        """Learning-rate factor for the step taken after ``step`` completed steps, in ``epoch``."""
        if self.kind == "step":
            return self.factor ** sum(1 for m in self.milestones if epoch >= m)
        if self.kind == "exp":
            return self.gamma**step
        return 1.0


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule string (its one parser); ``ValueError`` naming the valid forms."""
    kind, rest = split_tagged(text.strip().lower() if isinstance(text, str) else text, "schedule",
                              SCHEDULE_KINDS)
    bad = ValueError(f"bad schedule {text!r}; valid forms: {SCHEDULE_FORMS}")
    if kind == "step":
        epochs_part, _, factor_part = rest.partition(":")
        try:
            milestones = tuple(int(e) for e in epochs_part.split(","))
            factor = float(factor_part) if factor_part else 0.1
        except ValueError:
            raise bad from None
        if any(m <= 0 for m in milestones) or list(milestones) != sorted(set(milestones)):
            raise ValueError(
                f"bad schedule {text!r}: step milestones must be increasing positive epochs"
            )
        if not (0 < factor < 1):
            raise ValueError(f"bad schedule {text!r}: step factor must be in (0, 1)")
        return Schedule("step", milestones=milestones, factor=factor)
    if kind == "exp":
        try:
            gamma = float(rest)
        except ValueError:
            raise bad from None
        if not (math.isfinite(gamma) and 0 < gamma <= 1):
            raise ValueError(f"bad schedule {text!r}: exp gamma must be in (0, 1]")
        return Schedule("exp", gamma=gamma)
    return Schedule("constant")
