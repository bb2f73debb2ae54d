"""Analysis helpers shared by the catalogue entries (plots and tables from stored runs); the
verdict rule's comparisons (:mod:`verdicts`) re-exported here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnlab.formatting import finite_or_none
from bnlab.plots import panels
from .run_facts import arm_values
from .significance import fewest_seeds
from .verdicts import (
    ALPHA, COMPARE_RULE as RULE, MIN_SEEDS, POWER, Comparison, DesignSD, compare_arms, design_mde)

# The rule is defined in :mod:`verdicts` (with its constants, once); the entries that import these
# names from here get the same objects, and ``RULE`` here is the text of :func:`compare_arms`' rule.
__all__ = [
    "ALPHA", "CATALOGUE_PILOT", "MIN_SEEDS", "POWER", "RULE", "SETTLE_FRACTION", "Comparison",
    "DesignSD", "compare_arms", "design_mde", "fewest_seeds", "final_table", "grouped_finals",
    "mean_curve", "mean_over_run", "mean_series", "recipe_config", "safe_panels", "seed_means",
    "smooth", "spearman", "tail_mean", "training_curves", "value_at_fraction",
]


def training_curves(ctx, path: Path, *, title: str,
                    metrics=("train_loss", "train_accuracy", "test_accuracy"),
                    logy_loss: bool = False) -> Path:
    """One panel per metric, one curve per run label."""
    specs = []
    for metric in metrics:
        series = {r.label: r.series(metric) for r in ctx.runs}
        series = {k: v for k, v in series.items() if v[0]}
        specs.append({"series": series, "xlabel": "step", "ylabel": metric, "title": metric,
                      "logy": logy_loss and metric.endswith("loss")})
    return panels(path, specs, title=title)


def final_table(ctx, *, paper: dict[str, str] | None = None,
                metrics=("train_loss", "train_accuracy", "test_accuracy")) -> list[dict]:
    rows = []
    for r in ctx.runs:
        row = {"run": r.label, "status": r.status}
        for m in metrics:
            row[m] = r.final(m)
        if paper is not None:
            row["paper"] = paper.get(r.label, "—")
        rows.append(row)
    return rows


def tail_mean(run, metric: str, k: int = 3) -> float | None:
    """Mean of the last ``k`` finite values of a run's metric series (None if it has none)."""
    values = [v for v in (finite_or_none(v) for v in run.series(metric)[1]) if v is not None]
    return sum(values[-k:]) / len(values[-k:]) if values else None


def spearman(xs, ys) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 2 points or a
    constant side."""
    from scipy import stats

    if len(xs) < 2 or len(xs) != len(ys):
        return None
    rx, ry = stats.rankdata(xs), stats.rankdata(ys)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


# ---- appended for the Peng / Arora entries ----------------------------------------------------

def grouped_finals(ctx, keys: tuple[str, ...], metric: str, *,
                   failure_value: float) -> dict[tuple, list[float]]:
    """Final ``metric`` of every run grouped by the values of the factors ``keys`` (e.g. ("row",
    "activation")).

    A diverged run, or a finished one without a finite final value, enters its group as
    ``failure_value`` (chance accuracy, ...): a failure of that arm, never missing data
    (:func:`run_facts.arm_values`). Crashed or interrupted runs are left out; a group
    whose runs all crashed is present with an empty list, so callers can tell "no runs" from "no
    usable runs".
    """
    groups: dict[tuple, list[float]] = {}
    for r in ctx.runs:
        key = tuple(r.factors.get(k) for k in keys)
        values = groups.setdefault(key, [])
        values.extend(arm_values([r], lambda run: run.final(metric), failure_value)[0])
    return groups


def smooth(xs, ys, points: int = 60) -> tuple[list, list]:
    """Block means of a long (x, y) series down to about ``points`` points (non-finite values
    skipped)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if finite_or_none(y) is not None]
    if len(pairs) <= points:
        return [p[0] for p in pairs], [p[1] for p in pairs]
    size = -(-len(pairs) // points)
    out_x, out_y = [], []
    for i in range(0, len(pairs), size):
        block = pairs[i:i + size]
        out_x.append(block[-1][0])
        out_y.append(sum(p[1] for p in block) / len(block))
    return out_x, out_y


def safe_panels(path, specs: list[dict], **kwargs):
    """``plots.panels`` with log axes switched off where a panel has no positive finite value to
    show (matplotlib refuses a log axis without one: empty series of tiny runs, diverged runs)."""
    fixed = []
    for spec in specs:
        spec = dict(spec)
        for axis, index in (("logy", 1), ("logx", 0)):
            if spec.get(axis):
                values = [finite_or_none(v) for xy in (spec.get("series") or {}).values()
                          for v in xy[index]]
                if not any(v is not None and v > 0 for v in values):
                    spec[axis] = False
        fixed.append(spec)
    return panels(path, fixed, **kwargs)


# The pilot of the conjunctive and family entries' design SDs: the smoke catalogue run of
# 2026-11-26, re-analysed with each comparison's pooled per-arm SD recorded (docs: experiments).
CATALOGUE_PILOT = "pilot: the smoke catalogue run of 2026-11-26, 3 seeds/arm"


def seed_means(lists) -> list[float]:
    """Per seed, the mean of the lists' i-th values (each list one panel's or activation's per-seed
    values, in seed order), for the seeds every list has: the per-seed value of a primary averaged
    over panels. Different panels' runs of one seed are separate runs, so the i-th means are one
    draw each."""
    lists = [list(v) for v in lists]
    n = min((len(v) for v in lists), default=0)
    return [sum(v[i] for v in lists) / len(lists) for i in range(n)]


def mean_curve(runs, metric: str) -> tuple[list, list]:
    """(steps, mean over ``runs`` of ``metric`` at each step): :func:`mean_series` of the runs'
    series."""
    return mean_series([r.series(metric) for r in runs])


def mean_series(series) -> tuple[list, list]:
    """(steps, mean of the (steps, values) ``series`` at each step), over the steps every series
    recorded (seeds of one arm share their logging steps; a run that stopped early shortens the
    curve). Non-finite values are skipped in the mean; a step where every value is non-finite is
    left out."""
    series = [(list(s), list(v)) for s, v in series if s]
    if not series:
        return [], []
    length = min(len(s) for s, _ in series)
    steps, means = [], []
    for i in range(length):
        values = [v for v in (finite_or_none(vals[i]) for _, vals in series) if v is not None]
        if values:
            steps.append(series[0][0][i])
            means.append(sum(values) / len(values))
    return steps, means


def value_at_fraction(curve: tuple[list, list], fraction: float) -> float | None:
    """The value of a (steps, values) curve at the first step ≥ ``fraction`` of its last step (None
    if empty)."""
    steps, values = curve
    if not steps:
        return None
    target = steps[-1] * fraction
    return next(v for s, v in zip(steps, values) if s >= target)


# where ``verdicts.settle`` reads a verdict a second time (schedules without steps)
SETTLE_FRACTION = 2 / 3


def recipe_config(ctx) -> dict | None:
    """The config of the first run an entry plans for ``ctx``'s preset: the recipe its runs share
    (schedule, data, test split), read by analyses that need it; None for an empty plan."""
    runs = ctx.experiment.plan(ctx.preset).runs
    return runs[0].config if runs else None


def mean_over_run(run, metric: str = "train_loss", fraction: float = 1.0) -> float | None:
    """Mean of a finished run's finite ``metric`` values logged up to ``fraction`` of its last step:
    for the training loss, the area under the curve over its length (lower = faster convergence).
    None for a run that did not finish or logged nothing. ``fraction`` < 1 reads the same measure
    earlier in training, for ``verdicts.settle``."""
    if run is None or run.status != "finished":
        return None
    steps, values = run.series(metric)
    if not steps:
        return None
    limit = steps[-1] * fraction
    kept = [v for s, v in zip(steps, values) if s <= limit and finite_or_none(v) is not None]
    return sum(kept) / len(kept) if kept else None
