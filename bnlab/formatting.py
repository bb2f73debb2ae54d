"""Numbers as text: the one formatter of tables, summaries and command output.

:func:`fmt` prints every number the lab shows a person (the catalogue's tables and verdict
summaries, the report's tables, ``bnlab runs``, ``bnlab train``'s summary line, ``bnlab theory``'s
tables), so a missing value, a diverged run or an arm's seeds read the same everywhere.
:func:`mean_std` is the per-seed summary it prints for a list of values. Needs nothing beyond the
standard library; a numpy scalar or a 0-d array/tensor is read through its ``item()``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MISSING = "—"  # None and NaN: no value (a metric not logged, a failed run, NaN of a diverged one)


def finite_or_none(value: Any) -> float | None:
    """``float(value)`` if it is a finite number, else None (missing metrics, NaN/inf of diverged
    runs)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def mean_std(values) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation with n−1) of finite values; std is None for fewer than
    2."""
    vals = [v for v in (finite_or_none(v) for v in values) if v is not None]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def fmt(x: Any, digits: int = 3, *, std: float | None = None, n: int | None = None,
        decimals: int | None = None) -> str:
    """``x`` as table text: a float to ``digits`` significant digits (``decimals``: that many
    digits after the point instead), "—" for a missing value (None or NaN), "∞"/"-∞" for ±∞ (a
    diverged run's sharpness or loss); a bool as ``True``/``False`` and an int as written (unless
    ``decimals`` asks for a fixed point); anything else (a string, a name) as ``str``. ``std`` /
    ``n`` append " ± std" (2 significant digits, or ``decimals``) and " (n=…)". A list or tuple is
    an arm's per-seed values: their mean ± std (n=…) by :func:`mean_std`, "diverged / not finished"
    (with how many seeds) when a seed's value is None, "—" when empty."""
    if isinstance(x, (list, tuple)):
        return _per_seed(x, digits, decimals)
    if getattr(x, "ndim", None) == 0 and hasattr(x, "item"):  # numpy / torch 0-d values
        x = x.item()
    if x is None or (isinstance(x, numbers.Real) and math.isnan(x)):
        return MISSING
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return str(x)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if decimals is not None:
        text = f"{x:.{decimals}f}"
    else:
        text = str(int(x)) if isinstance(x, numbers.Integral) else f"{x:.{digits}g}"
    if std is not None:
        text += f" ± {std:.{decimals}f}" if decimals is not None else f" ± {std:.2g}"
    return text + (f" (n={n})" if n is not None else "")


def _per_seed(values: list | tuple, digits: int, decimals: int | None) -> str:
    """An arm's per-seed values as ``mean ± std (n=…)``; see :func:`fmt`."""
    if not values:
        return MISSING
    if any(v is None for v in values):
        missing = sum(v is None for v in values)
        count = f" ({missing}/{len(values)} seeds)" if len(values) > 1 else ""
        return "diverged / not finished" + count
    mean, sd = mean_std(values)
    return fmt(mean, digits, std=sd, n=len(values) if len(values) > 1 else None, decimals=decimals)
