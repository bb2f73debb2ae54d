"""Arora, Li & Lyu App. D: the verdicts of D.1–D.3 on the collected per-arm values (the entries,
their runs and figures are in ``entries.py``) and the per-arm helpers they share."""

from __future__ import annotations

import math
from typing import Any

from bnlab.formatting import fmt, mean_std

from ..common import RULE, compare_arms
from ..verdicts import explain, ladder

# D.1: "we fix the learning rate for scale-variant ones to 0.1"
SCALE_VARIANT_LR = 0.1
TAIL_EPOCHS = 5                           # Figs 1–3 (left): "the average ... of the last 5 epochs"
NUM_CLASSES = 10


def seed_values(value) -> list[float | None]:
    """The per-seed values of an arm: a list as collected, or one number (a single run) as a
    list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def arm_mean(value) -> float | None:
    """An arm's value: the mean over its seeds, None if every seed diverged (a partly diverged arm
    counts as diverged too: the paper's "very large or NaN")."""
    values = seed_values(value)
    if not values or any(v is None for v in values):
        return None
    return mean_std(values)[0]


def d3_verdict(acc: dict[tuple[str, str], dict[float, float | None]],
               tiny: bool = False) -> tuple[str, str]:
    """D.3: SGD's test accuracy stays above 75 % at every lr (unified and separate), PSGD's falls as
    the lr grows past 0.1. ``acc[(setting, mode)][lr]`` = average test accuracy of the last epochs
    (None: diverged). held if both; not held if SGD drops below 75 % (or diverges) somewhere or PSGD
    does not fall (its accuracy at the largest lr is not 0.05 below the one at 0.1) in some mode;
    otherwise inconclusive.

    Primary, pre-declared (a check on the arm means, :func:`verdicts.ladder`): SGD ≥ 75 % at every
    lr and PSGD's accuracy at the largest lr ≥ 0.05 below its accuracy at 0.1, in both modes."""
    lines, sgd_low, psgd_flat = [], [], []
    for mode in ("unified", "separate"):
        sgd = {lr: arm_mean(v) for lr, v in acc.get(("SGD", mode), {}).items()}
        psgd = {lr: arm_mean(v) for lr, v in acc.get(("PSGD", mode), {}).items()}
        lrs = sorted(set(sgd) & set(psgd))
        if not lrs or 0.1 not in lrs:
            return ladder(unusable=True), f"missing {mode} runs" + (" (tiny runs)" if tiny else "")
        lines.append(f"{mode}: " + ", ".join(
            f"lr {lr:g} {fmt(sgd[lr], decimals=3)}/{fmt(psgd[lr], decimals=3)}" for lr in lrs))
        sgd_low += [f"{mode} lr {lr:g}" for lr in lrs if sgd[lr] is None or sgd[lr] < 0.75]
        top = psgd[lrs[-1]]
        if psgd[0.1] is not None and top is not None and top > psgd[0.1] - 0.05:
            psgd_flat.append(mode)
    summary = "average test accuracy of the last epochs, SGD/PSGD — " + "; ".join(lines)
    verdict = ladder(True, unusable=tiny, against=bool(sgd_low or psgd_flat))
    reasons = (["SGD below 75 % at " + ", ".join(sgd_low)] if sgd_low else []) + (
        ["PSGD's accuracy does not fall at large lr (" + ", ".join(psgd_flat) + ")"]
        if psgd_flat else [])
    return verdict, summary + explain(
        verdict, held="; SGD stays above 75 % at every lr while PSGD falls",
        not_held="; " + reasons[0] if reasons else "", inconclusive=" (tiny runs)")


# Thresholds on the average training loss of the last epochs, as fractions of the loss at chance
# ln(10) = 2.303: "converges" below 10 % (0.23), "stuck" above 20 % (0.46; the paper's stuck PSGD
# runs sit near chance) or not finished.
CONVERGED = 0.1 * math.log(NUM_CLASSES)
STUCK = 0.2 * math.log(NUM_CLASSES)


def _is_stuck(value) -> bool:
    value = arm_mean(value)
    return value is None or value >= STUCK


def _psgd_stuck_above_sgd(sgd, psgd) -> str:
    """One PSGD arm at a large lr against SGD's: "stuck" (mean ≥ 0.2·ln 10 or diverged, and above
    SGD by the rule, or diverged), "trains" (not stuck), or "unresolved" (stuck-level loss, but not
    above SGD by the rule)."""
    if not _is_stuck(psgd):
        return "trains"
    if arm_mean(psgd) is None:
        return "stuck"
    higher = compare_arms(seed_values(sgd), seed_values(psgd)).decision == "higher"
    return "stuck" if higher else "unresolved"


def smallest_failing_lr(sgd: dict, psgd: dict) -> float | None:
    """The smallest lr_si from which PSGD fails at every larger lr as well (stuck ≥ 0.2·ln 10 or
    diverged, and above SGD by :data:`common.RULE`); None if PSGD is not stuck at the largest lr."""
    lrs = sorted(set(sgd) & set(psgd))
    smallest = None
    for lr in reversed(lrs):
        if _psgd_stuck_above_sgd(sgd[lr], psgd[lr]) != "stuck":
            break
        smallest = lr
    return smallest


def d1_verdict(loss: dict[str, dict[float, Any]], tiny: bool = False) -> tuple[str, str]:
    """D.1: SGD converges at every scale-invariant lr; projected SGD "got stuck" for the larger lrs
    (App. D.1 gives no threshold, so the entry reports the smallest lr_si from which PSGD fails at
    every larger one).

    ``loss[setting][lr]`` = average training loss of the last epochs, per seed (a list) or one
    number; None = diverged (a failure of the arm). Primary, pre-declared: held if SGD's mean is ≤
    0.1·ln 10 at every lr and PSGD fails (≥ 0.2·ln 10 or diverged, above SGD by :data:`common.RULE`)
    from some lr_si > 0.1 up to the largest; not held if SGD is stuck at some lr, PSGD trains (<
    0.2·ln 10) at the largest lr, or PSGD fails at an lr_si ≤ 0.1 (where the projection changes
    nothing the paper reports); otherwise inconclusive.
    """
    sgd, psgd = loss.get("SGD", {}), loss.get("PSGD", {})
    lrs = sorted(set(sgd) & set(psgd))
    if not lrs:
        return ladder(unusable=True), "no SGD/PSGD runs" + (" (tiny runs)" if tiny else "")
    smallest = smallest_failing_lr(sgd, psgd)
    summary = "average training loss of the last epochs, SGD vs PSGD: " + ", ".join(
        f"lr_si {lr:g}: {fmt(seed_values(sgd[lr]), 4)} vs {fmt(seed_values(psgd[lr]), 4)}"
        for lr in lrs) + \
        "; smallest lr_si from which PSGD fails at every larger lr: " + \
        (f"{smallest:g}" if smallest is not None else "none") + _between_lines(psgd, lrs)
    stuck_sgd = [f"{lr:g}" for lr in lrs if _is_stuck(sgd[lr])]
    top = _psgd_stuck_above_sgd(sgd[lrs[-1]], psgd[lrs[-1]])
    early = smallest is not None and smallest <= SCALE_VARIANT_LR
    against = ("; SGD does not train at lr_si " + ", ".join(stuck_sgd) if stuck_sgd else
               f"; PSGD is not stuck even at lr_si {lrs[-1]:g}" if top == "trains" else
               f"; PSGD fails already at lr_si {smallest:g} ≤ {SCALE_VARIANT_LR}" if early else "")
    supports = (not against and smallest is not None
                and all(arm_mean(sgd[lr]) <= CONVERGED for lr in lrs))
    verdict = ladder(True if supports else None, unusable=tiny, against=bool(against))
    return verdict, summary + explain(
        verdict, not_held=against,
        held=f"; SGD converges at every lr, PSGD is stuck from lr_si {smallest:g} up ({RULE})"
        if supports else "",
        inconclusive=" (tiny runs)" if tiny else f"; PSGD at the largest lr_si {top}, SGD slow (> "
        f"{CONVERGED:.2f}) at " + ", ".join(f"{lr:g}" for lr in lrs
                                             if (arm_mean(sgd[lr]) or 0) > CONVERGED))


def _between_lines(psgd: dict, lrs) -> str:
    """Name the PSGD arms whose mean lies between the converged and the stuck line: neither, so they
    count as "not stuck" for the smallest failing lr, and the reader should see them."""
    between = [(lr, arm_mean(psgd[lr])) for lr in lrs
               if arm_mean(psgd[lr]) is not None and CONVERGED < arm_mean(psgd[lr]) < STUCK]
    if not between:
        return ""
    return (f" (PSGD between the converged ≤ {CONVERGED:.2f} and stuck ≥ {STUCK:.2f} lines, "
            "neither: " + ", ".join(f"lr_si {lr:g} {v:.3g}" for lr, v in between) + ")")


# The settling rule of D.2: an arm's loss is "still falling" when its mean over seeds of the last
# TAIL_EPOCHS epochs is more than SETTLE_DROP below the mean of the TAIL_EPOCHS epochs before them
# (≈ 2 % an epoch). A loss above the thresholds counts as a failure to converge (or as "stuck") only
# once it has settled.
SETTLE_DROP = 0.1


def still_falling(last, earlier) -> bool:
    """The settling rule on one arm: ``last`` and ``earlier`` are its per-seed means of the last
    TAIL_EPOCHS epochs and of the TAIL_EPOCHS before them. A diverged arm is not falling; an arm
    without the earlier window (too few epochs) cannot be shown to have settled, so it counts as
    falling."""
    now, before = arm_mean(last), arm_mean(earlier) if earlier is not None else None
    if now is None:
        return False
    return before is None or now < (1 - SETTLE_DROP) * before


def d2_verdict(loss: dict[str, dict[float, Any]], earlier: dict[str, dict[float, Any]],
               tiny: bool = False) -> tuple[str, str]:
    """D.2: with one lr for all parameters SGD with BN converges at every lr, PSGD and SGD without
    BN fail at large ones. ``loss[setting][lr]``: per-seed average training loss of the last
    TAIL_EPOCHS epochs (None = diverged), ``earlier[setting][lr]``: of the TAIL_EPOCHS before
    (:func:`still_falling`). held if SGD converges (≤ 0.1·ln 10) at every lr and both others are
    stuck (≥ 0.2·ln 10, settled) or diverge at the largest; not held if SGD is stuck and settled, or
    diverges, at some lr, or the others train at the largest lr; otherwise inconclusive — in
    particular while an unconverged arm is still falling. Primary, pre-declared: these thresholds on
    the arm means (a check, :func:`verdicts.ladder`)."""
    sgd = loss.get("SGD", {})
    others = ("PSGD", "SGD, BN removed")
    lrs = sorted(set(sgd).intersection(*[set(loss.get(k, {})) for k in others]))
    if not lrs:
        return ladder(unusable=True), "missing settings" + (" (tiny runs)" if tiny else "")
    summary = "average training loss of the last epochs (SGD / PSGD / no BN): " + ", ".join(
        f"lr {lr:g}: " + " / ".join(fmt(seed_values(loss[k][lr]), 4) for k in ("SGD",) + others)
        for lr in lrs)
    if tiny:
        return ladder(unusable=True), summary + " (tiny runs)"
    top = lrs[-1]

    def falling(setting: str, lr: float) -> bool:
        return still_falling(loss[setting][lr], earlier.get(setting, {}).get(lr))

    failing = [lr for lr in lrs if _is_stuck(sgd[lr]) and not falling("SGD", lr)]
    unsettled = [f"SGD at lr {lr:g}" for lr in lrs if arm_mean(sgd[lr]) is not None
                 and arm_mean(sgd[lr]) > CONVERGED
                 and falling("SGD", lr)] + [f"{k} at lr {top:g}" for k in others if falling(k, top)]
    if unsettled:
        summary += (f"; still falling (last {TAIL_EPOCHS} epochs more than {SETTLE_DROP:.0%} below "
                    f"the {TAIL_EPOCHS} before): " + ", ".join(unsettled))
    trains = any(not _is_stuck(loss[k][top]) for k in others)
    against = ("; SGD with BN does not converge at lr " + ", ".join(f"{lr:g}" for lr in failing)
               if failing else
               "; PSGD or SGD without BN still trains at the largest lr" if trains else "")
    supports = not against and not unsettled and all(arm_mean(sgd[lr]) <= CONVERGED for lr in lrs)
    verdict = ladder(True if supports else None, against=bool(against))
    return verdict, summary + explain(verdict, not_held=against,
                                      held="; only SGD with BN converges at every lr")
