"""The doctor's findings: seven codes other tools can rely on, and the record of one finding.

A :class:`Finding` is what one check concluded about the network: the code (one of :data:`CODES`),
``"warn"`` or ``"info"``, the layers it concerns (names from ``model.named_modules()``), the number
measured and the threshold it was compared with, why that threshold (with its measured false-alarm
rate on healthy networks), the paper it comes from and the remedy, naming the bnlab function or
layer that applies it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

CODES = (
    "stale-running-stats",
    "small-batch",
    "beta-swamping",
    "sharpness",
    "effective-lr",
    "micro-batch-statistics",
    "double-update",
)
"""The seven finding codes, in this order (the order of the docs page)."""

SEVERITIES = ("warn", "info")


@dataclass(frozen=True)
class Finding:
    """One conclusion of the doctor.

    ``value`` is the number the check measured and ``threshold`` the one it compared it with, so
    ``value / threshold`` says how far past (or short of) the line the network is.
    """

    code: str
    severity: str
    layers: tuple[str, ...]
    value: float
    threshold: float
    why: str
    paper: str
    remedy: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(
                f"unknown finding code {self.code!r}; the codes are {', '.join(CODES)}"
            )
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"unknown severity {self.severity!r}; choose one of {', '.join(SEVERITIES)}"
            )
        object.__setattr__(self, "layers", tuple(str(name) for name in self.layers))
        object.__setattr__(self, "value", float(self.value))
        object.__setattr__(self, "threshold", float(self.threshold))

    @property
    def ratio(self) -> float:
        """How far the measurement is from the line, max(value/threshold, threshold/value) (a
        finding may warn above or below its threshold); 0 when either is zero or not finite.
        Orders findings of the same severity."""
        v, t = abs(self.value), abs(self.threshold)
        if not (math.isfinite(v) and math.isfinite(t)) or v == 0.0 or t == 0.0:
            return 0.0
        return max(v / t, t / v)

    def to_dict(self) -> dict:
        """JSON-safe dict of the fields (``layers`` as a list; non-finite floats as strings)."""
        out = asdict(self)
        out["layers"] = list(self.layers)
        for key in ("value", "threshold"):
            v = out[key]
            if v != v or v in (float("inf"), float("-inf")):
                out[key] = str(v)
        return out

    def line(self) -> str:
        """One terminal line: severity, code, layers, value against threshold, remedy."""
        more = len(self.layers) - 3
        where = ", ".join(self.layers[:3]) + (f" (+{more})" if more > 0 else "")
        where = f" [{where}]" if where else ""
        text = f"{self.severity.upper():4s} {self.code}{where}: "
        text += f"{self.value:.4g} vs {self.threshold:.4g}"
        if self.detail:
            text += f" - {self.detail}"
        if self.severity == "warn" and self.remedy:
            text += f" -> {self.remedy}"
        return text
