"""Analysis helpers shared by the catalogue entries (plots and tables from stored runs)."""

from __future__ import annotations

from pathlib import Path

from bnlab.report.plots import panels


def training_curves(ctx, path: Path, *, title: str, metrics=("train_loss", "train_accuracy", "test_accuracy"),
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


# ---- appended for the Luo / Momentum-BN entries -----------------------------------------------

def finite_or_none(value) -> float | None:
    """``float(value)`` if it is a finite number, else None (missing metrics, NaN/inf of diverged runs)."""
    import math

    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def tail_mean(run, metric: str, k: int = 3) -> float | None:
    """Mean of the last ``k`` finite values of a run's metric series (None if it has none)."""
    values = [v for v in (finite_or_none(v) for v in run.series(metric)[1]) if v is not None]
    return sum(values[-k:]) / len(values[-k:]) if values else None


def spearman(xs, ys) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 2 points or a constant side."""
    import numpy as np
    from scipy import stats

    if len(xs) < 2 or len(xs) != len(ys):
        return None
    rx, ry = stats.rankdata(xs), stats.rankdata(ys)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


# ---- appended for the Peng / Arora entries ----------------------------------------------------

def grouped_finals(ctx, keys: tuple[str, ...], metric: str) -> dict[tuple, list[float]]:
    """Final ``metric`` of every run grouped by the values of the factors ``keys`` (e.g. ("row", "activation")).

    Runs without a finite final value (failed, diverged to NaN, missing) are left out of their group; a
    group whose runs all lack the value is present with an empty list, so callers can tell "no runs"
    from "no usable runs".
    """
    groups: dict[tuple, list[float]] = {}
    for r in ctx.runs:
        key = tuple(r.factors.get(k) for k in keys)
        values = groups.setdefault(key, [])
        value = finite_or_none(r.final(metric))
        if value is not None and r.status == "finished":
            values.append(value)
    return groups


def mean_std(values) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation with n−1) of finite values; std is None for fewer than 2."""
    import math

    vals = [v for v in (finite_or_none(v) for v in values) if v is not None]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def smooth(xs, ys, points: int = 60) -> tuple[list, list]:
    """Block means of a long (x, y) series down to about ``points`` points (non-finite values skipped)."""
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
    """``plots.panels`` with log axes switched off where a panel has no positive finite value to show
    (matplotlib refuses a log axis without one: empty series of tiny runs, diverged runs)."""
    fixed = []
    for spec in specs:
        spec = dict(spec)
        for axis, index in (("logy", 1), ("logx", 0)):
            if spec.get(axis):
                values = [finite_or_none(v) for xy in (spec.get("series") or {}).values() for v in xy[index]]
                if not any(v is not None and v > 0 for v in values):
                    spec[axis] = False
        fixed.append(spec)
    return panels(path, fixed, **kwargs)
