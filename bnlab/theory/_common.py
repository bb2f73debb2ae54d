"""Small helpers shared by the theory modules (no paper-specific content).

Everything here is plain numpy/scipy; results of the theory modules are plain dicts of floats and
numpy arrays so that the experiment catalogue can store and plot them without conversion code.
"""

from __future__ import annotations

import math

import numpy as np


def check_positive(name: str, value: float, *, strict: bool = True) -> float:
    """Reject non-finite, negative (or zero, when ``strict``) numbers with a clear message."""
    value = float(value)
    if not math.isfinite(value) or value < 0 or (strict and value == 0):
        raise ValueError(f"{name} must be a {'positive' if strict else 'non-negative'} finite "
                         f"number; got {value!r}")
    return value


def check_int(name: str, value: int, *, minimum: int) -> int:
    if int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights for E[f(u)], u ~ N(0, 1): sum(w * f(x)) (probabilists' Hermite rule)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / math.sqrt(2.0 * math.pi)


def ks_distance(sample: np.ndarray, cdf) -> float:
    """Kolmogorov–Smirnov distance sup |F_n - F| between a sample and a continuous CDF."""
    x = np.sort(np.asarray(sample, dtype=np.float64).ravel())
    n = x.size
    f = cdf(x)
    upper = np.arange(1, n + 1) / n - f
    lower = f - np.arange(0, n) / n
    return float(max(upper.max(), lower.max()))


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of log y against log x (for rate claims such as T^{-1/2})."""
    x = np.log(np.asarray(x, dtype=np.float64))
    y = np.log(np.asarray(y, dtype=np.float64))
    return float(np.polyfit(x, y, 1)[0])
