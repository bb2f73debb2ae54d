"""The findings that only show over time, from the series :class:`bnlab.doctor.Doctor` records.

Each function takes the watcher's series and returns a :class:`Finding` or ``None``; the
thresholds and papers are those of the checkup's checks (``checks_*``), so a finding reads the same
whether :func:`bnlab.doctor.examine` or the watcher found it.

- :func:`micro_batches`: optimizer steps that each took more than one forward+backward (gradient
  accumulation): BN normalized micro-batches (``checks_accumulation``).
- :func:`double_updates`: running statistics updated more than once per training forward
  (activation checkpointing), from ``checks_double.UpdateCounter``'s counts over the watched steps.
- :func:`effective_lr_drift`: η/‖w‖² of a scale-invariant weight moved by more than
  :data:`DRIFT` between the first and the last watched step for reasons other than the
  learning-rate schedule (the ratio ‖w_first‖²/‖w_last‖²; Arora, Li & Lyu, Lemma 2.4), or one step
  turning a weight by more than ``checks_effective_lr.ANGLE`` rad (the median of the last watched
  steps).
- :func:`lagging_statistics`: after the last learning-rate drop (or over the last third of the
  run without one), the running statistics stay more than ``checks_stale.LAYER_DISTANCE`` batch
  SDs (plus the batch's own sampling noise, 2/√m) from the statistics of the batches they
  normalize: the EMA is too slow for the network it averages.
- :func:`sharpness_trend`: the top Hessian eigenvalue at or above the optimizer's stability
  threshold in the majority of the last watched measurements.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from . import checks_accumulation, checks_double, checks_effective_lr, checks_sharpness
from . import checks_stale
from .findings import Finding

DRIFT = 10.0
"""η/‖w‖² changing by this factor, not by the schedule, within a run warns (an order of magnitude:
auto rate-tuning slows a healthy run's weights by less; Arora, Li & Lyu, Theorem 2.5)."""
WHY_DRIFT = ("an order of magnitude change of a weight's effective step that the learning-rate "
             "schedule did not ask for: its norm grew (no weight decay) or shrank (too much)")
LAST = 3  # the last watched measurements a verdict on a trend is read from
LR_DROP = 2.0  # a learning rate falling by this factor at one step is a drop


def micro_batches(forwards: Sequence[int], batch_size: int | None,
                  layers: Sequence[str]) -> Finding | None:
    """forwards+backwards per optimizer step (one entry per watched step)."""
    if not forwards or not layers:
        return None
    k = int(statistics.median(forwards))
    if k <= 1:
        return None
    b = batch_size or 0
    return Finding(
        "micro-batch-statistics", "warn", tuple(layers), float(b), float(k * b),
        checks_accumulation.WHY, checks_accumulation.PAPER, checks_accumulation.remedy(k),
        f"{k} forward+backward passes of {b} samples per optimizer step over "
        f"{len(forwards)} watched steps: BN normalizes micro-batches of {b}, the optimizer steps "
        f"on {k * b}")


def double_updates(per_forward: Mapping[str, float], forwards: int) -> Finding | None:
    found = checks_double.finding(dict(per_forward), forwards) if forwards else None
    if found is None:
        return None
    worst = found.layers[0]
    return dataclasses.replace(found, detail=(
        f"{worst} updated its running statistics {found.value:g}× per training forward over the "
        f"{forwards} forwards of the watched steps"))


def _ratio(first: float, last: float) -> float:
    if first <= 0 or last <= 0:
        return math.inf
    return max(first / last, last / first)


def effective_lr_drift(norms: Mapping[str, Sequence[tuple[int, float]]],
                       turns: Mapping[str, Sequence[tuple[int, float]]],
                       weight_decay: float | None) -> Finding | None:
    """``norms``: {weight: [(step, ‖w‖²)]}; ``turns``: {weight: [(step, ‖Δw‖/‖w‖)]}."""
    drift = {n: _ratio(s[0][1], s[-1][1]) for n, s in norms.items() if len(s) >= 2}
    turned = {n: statistics.median(v for _, v in s[-LAST:]) for n, s in turns.items() if s}
    drifting = [n for n, r in drift.items() if r > DRIFT]
    spinning = [n for n, a in turned.items() if a > checks_effective_lr.ANGLE]
    if not drifting and not spinning:
        return None
    decay = ("" if weight_decay is None else
             f"; weight decay {weight_decay:g}" + (" (none: ‖w‖ only grows)" if not weight_decay
                                                   else ""))
    if spinning and not drifting:
        worst = max(spinning, key=lambda n: turned[n])
        return Finding(
            "effective-lr", "warn", tuple(spinning), turned[worst], checks_effective_lr.ANGLE,
            checks_effective_lr.WHY_ANGLE, checks_effective_lr.PAPER,
            "exploded: lower the learning rate of these weights (a parameter group) or let ‖w‖ "
            "grow (less weight decay); bnlab.probes.max_stable_lr measures the stable range",
            f"each of the last steps turned {worst} by {turned[worst]:.3g} rad (median){decay}")
    worst = max(drifting, key=lambda n: drift[n])
    series = norms[worst]
    grew = series[-1][1] > series[0][1]
    remedy = ("collapsed: ‖w‖ grew; train with weight decay (it holds ‖w‖ in equilibrium) or "
              "rescale these weights to their init norm (scale-invariant: the function is "
              "unchanged); bnlab.norms.ScaleInvariantBN makes the invariance exact" if grew else
              "exploded: ‖w‖ shrank; lower the weight decay or the learning rate of these "
              "weights (a parameter group)")
    return Finding(
        "effective-lr", "warn", tuple(sorted(drifting, key=lambda n: -drift[n])), drift[worst],
        DRIFT, WHY_DRIFT, checks_effective_lr.PAPER, remedy,
        f"‖{worst}‖² went from {series[0][1]:.3g} (step {series[0][0]}) to {series[-1][1]:.3g} "
        f"(step {series[-1][0]}): η/‖w‖² {'fell' if grew else 'rose'} {drift[worst]:.3g}× beyond "
        f"the schedule{decay}")


def last_drop(lr: Sequence[tuple[int, float]]) -> tuple[int, float, float] | None:
    """(step, lr before, lr after) of the last learning-rate drop by :data:`LR_DROP` or more."""
    found = None
    for (_, before), (step, after) in zip(lr, lr[1:]):
        if after > 0 and before / after >= LR_DROP:
            found = (step, before, after)
    return found


def lagging_statistics(lag: Mapping[str, Sequence[tuple[int, float, float, float]]],
                       lr: Sequence[tuple[int, float]],
                       momentum: Mapping[str, float | None]) -> Finding | None:
    """``lag``: {layer: [(step, mean shift in batch SDs, ½|log var ratio|, m)]}, the running
    statistics against the batch they normalized; ``lr``: [(step, lr)] at each change."""
    drop = last_drop(lr)
    late: dict[str, float] = {}
    for name, points in lag.items():
        window = [p for p in points if drop is None or p[0] > drop[0]]
        if drop is None:
            window = window[len(window) * 2 // 3:]
        window = window[-LAST:]
        if len(window) < min(LAST, 2):
            continue
        excess = [max(p[1], p[2]) - 2.0 / math.sqrt(max(p[3], 1.0)) for p in window]
        late[name] = statistics.median(excess)
    stale = [n for n, v in late.items() if v > checks_stale.LAYER_DISTANCE]
    if not stale:
        return None
    worst = max(stale, key=lambda n: late[n])
    alpha = momentum.get(worst)
    horizon = ("momentum None: a cumulative average over all of training" if alpha is None else
               f"momentum {alpha:g} forgets in ~{3 / alpha:.0f} steps" if alpha > 0 else
               "momentum 0: never updated")
    when = (f"{lag[worst][-1][0] - drop[0]} steps after the learning rate dropped "
            f"{drop[1]:g} → {drop[2]:g} at step {drop[0]}" if drop else "over the last watched "
            "steps")
    return Finding(
        "stale-running-stats", "warn", tuple(sorted(stale, key=lambda n: -late[n])), late[worst],
        checks_stale.LAYER_DISTANCE,
        "running statistics half a batch SD (beyond the batch's own noise) from every batch they "
        "normalize cannot be the population statistics of the network being trained",
        checks_stale.PAPER,
        "bnlab.norms.recollect_running_stats(model, batches) after training (or before each "
        "evaluation); a larger torch momentum (the new batch's weight: Keras's 0.99 is torch's "
        "0.01)",
        f"{when}, {worst}'s running statistics are still {late[worst]:.3g} batch SDs beyond the "
        f"batch's noise from the batches it normalizes ({horizon})")


def sharpness_trend(points: Sequence[tuple[int, float, float | None]],
                    optimizer=None) -> Finding | None:
    """``points``: [(step, λ_max, threshold)] of the watched steps."""
    rated = [(s, v, t) for s, v, t in points if t is not None and math.isfinite(t)]
    if not rated:
        return None
    last = rated[-LAST:]
    over = [p for p in last if p[1] >= p[2]]
    if 2 * len(over) <= len(last):
        return None
    step, top, threshold = over[-1]
    what = checks_sharpness.threshold_for(optimizer)[1] if optimizer is not None else "2/η"
    return Finding(
        "sharpness", "warn", (), top, threshold, checks_sharpness.WHY, checks_sharpness.PAPER,
        "lower the learning rate below 2/λ_max (bnlab.probes.max_stable_lr finds the largest "
        "stable one), or warm it up",
        f"λ_max at or above {what} in {len(over)} of the last {len(last)} watched measurements "
        f"(step {step}: {top:.4g} vs {threshold:.4g})")
