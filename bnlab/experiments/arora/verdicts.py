"""Arora, Li & Lyu App. D: the per-arm helpers shared by the verdicts and the D.3 verdict (split
from ``entries.py`` to keep modules under 400 lines)."""

from __future__ import annotations

from bnlab.formatting import mean_std
from ..verdicts import explain, ladder


def _seeds(value) -> list[float | None]:
    """The per-seed values of an arm: a list as collected, or one number (a single run) as a
    list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _arm(value) -> float | None:
    """An arm's value: the mean over its seeds, None if every seed diverged (a partly diverged arm
    counts as diverged too: the paper's "very large or NaN")."""
    values = _seeds(value)
    if not values or any(v is None for v in values):
        return None
    return mean_std(values)[0]


def d3_verdict(acc: dict[tuple[str, str], dict[float, float | None]], tiny: bool = False) -> tuple[str, str]:
    """D.3: SGD's test accuracy stays above 75 % at every lr (unified and separate), PSGD's falls as
    the lr grows past 0.1. ``acc[(setting, mode)][lr]`` = average test accuracy of the last epochs
    (None: diverged). held if both; not held if SGD drops below 75 % (or diverges) somewhere or PSGD
    does not fall (its accuracy at the largest lr is not 0.05 below the one at 0.1) in some mode;
    otherwise inconclusive.

    Primary, pre-declared (a check on the arm means, :func:`verdicts.ladder`): SGD ≥ 75 % at every
    lr and PSGD's accuracy at the largest lr ≥ 0.05 below its accuracy at 0.1, in both modes."""
    lines, sgd_low, psgd_flat = [], [], []
    for mode in ("unified", "separate"):
        sgd = {lr: _arm(v) for lr, v in acc.get(("SGD", mode), {}).items()}
        psgd = {lr: _arm(v) for lr, v in acc.get(("PSGD", mode), {}).items()}
        lrs = sorted(set(sgd) & set(psgd))
        if not lrs or 0.1 not in lrs:
            return ladder(unusable=True), f"missing {mode} runs" + (" (tiny runs)" if tiny else "")
        lines.append(f"{mode}: " + ", ".join(
            f"lr {lr:g} {'—' if sgd[lr] is None else f'{sgd[lr]:.3f}'}/{'—' if psgd[lr] is None else f'{psgd[lr]:.3f}'}"
            for lr in lrs))
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
