"""The doctor's report: findings, the measured series behind them, and the context of the run.

``measurements`` keys (JSON-safe; each present when its check ran):

- ``"running_vs_population"``: ``{layer: {"running_mean": [...], "population_mean": [...],
  "running_var": [...], "population_var": [...], "mean_shift_sd": float, "log_var_ratio": float}}``
- ``"stat_modes"``: ``{"running": {"loss": float, "accuracy": float}, "population": {...},
  "batch": {...}, "per_layer": {layer: {"loss_running": float, "loss_population": float}}}``
- ``"noise_vs_batch"``: ``{layer: {"m": int, "xi_mu_var": float, "xi_mu_theory": float,
  "xi_sigma_var": float, "xi_sigma_theory": float}}`` and ``"noise_vs_batch/_curve"``:
  ``{"batch": [...], "theory_xi_mu_var": [...]}``
- ``"beta_share"``: ``{layer: {"share": float, "activation": str}}``
- ``"effective_lr"``: ``{layer: [(step, value), ...]}`` (examine: step 0 only)
- ``"relative_update"``: ``{layer: float}`` (when an optimizer was given)
- ``"sharpness"``: ``[(step, lambda_max, threshold)]``
- ``"updates_per_forward"``: ``{layer: float}``

``context``: ``model`` (class name), ``batch_size``, ``batches``, ``optimizer`` (class name or
None), ``lr``, ``momentum``, ``device``, ``steps``, ``accumulation_steps``, ``seconds``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .findings import Finding


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Finding):
        return value.to_dict()
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    try:  # tensors, numpy scalars
        import torch

        if torch.is_tensor(value):
            return _json_safe(value.detach().cpu().tolist())
    except ImportError:  # pragma: no cover
        pass
    if hasattr(value, "item"):
        return _json_safe(value.item())
    return str(value)


def _order(finding: Finding) -> tuple:
    return (0 if finding.severity == "warn" else 1, -finding.ratio)


@dataclass
class Report:
    """What the doctor found. ``findings`` is kept sorted: warn before info, then by
    ``value / threshold`` (largest first)."""

    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.findings = sorted(self.findings, key=_order)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)
        self.findings.sort(key=_order)

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warn"]

    def codes(self, severity: str | None = None) -> list[str]:
        """The codes found (optionally only those of one severity), most severe first."""
        return [f.code for f in self.findings if severity is None or f.severity == severity]

    def __str__(self) -> str:
        lines = [f.line() for f in self.findings]
        if not self.warnings:
            lines.append("no warnings")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "measurements": _json_safe(self.measurements),
            "context": _json_safe(self.context),
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def to_html(self, path: str | Path) -> Path:
        from . import html

        return html.render(self, path)

    def try_remedies(self, model, loss_fn, batches, **kwargs):
        """Apply each suggested remedy to a deep copy for a short run and report the measured
        effect (see :func:`bnlab.doctor.remedies.try_remedies`)."""
        from .remedies import try_remedies

        return try_remedies(self, model, loss_fn, batches, **kwargs)
