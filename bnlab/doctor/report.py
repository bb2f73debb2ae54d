"""The doctor's report: findings, the measured series behind them, and the context of the run.

``measurements`` keys (JSON-safe; each present when its check ran):

- ``"running_vs_population"`` (stale-running-stats): ``{layer: {"running_mean": [...],
  "population_mean": [...], "running_var": [...], "population_var": [...], "mean_shift_sd": float,
  "log_var_ratio": float, "distance_sd": float}}``, per channel and summarized
- ``"stat_modes"`` (stale-running-stats): ``{"running": {"loss": float, "accuracy": float},
  "population": {...}, "batch": {...}, "per_layer": {layer: {"loss_running": float,
  "loss_population_here": float}}}`` (accuracy only for class scores; per_layer only for the
  layers switched one at a time when the check warned)
- ``"noise_vs_batch"`` (small-batch): ``{layer: {"m": int, "xi_mu_power": float (E[ξ_μ²]),
  "xi_mu_theory": 1/m, "xi_sigma_mean": float, "xi_sigma_var": float, "xi_sigma_theory":
  2(m−1)/m²}}`` and ``"noise_vs_batch/_curve"``: ``{"batch": [...], "theory_xi_mu_var": [...]}``
  (Theorem 1's 1/m against batch size, for a plot with the measured points)
- ``"beta_share"`` (beta-swamping): ``{layer: {"share": float (median over channels),
  "share_min": float, "activation": str}}``
- ``"sharpness"``: ``[(step, lambda_max, threshold)]`` (threshold None without an optimizer)
- ``"effective_lr"``: ``{weight: [(step, lr/‖w‖²), ...]}`` (with an optimizer; examine: step 0),
  ``"effective_lr_factor"``: ``{weight: ‖w_ref‖²/‖w‖²}``, ``"relative_update"``: ``{weight:
  ‖Δw‖/‖w‖ of one optimizer step}`` (empty without an optimizer)
- ``"updates_per_forward"`` (double-update): ``{layer: float}``
- ``"remedies"``: the list :meth:`Report.try_remedies` returned, once it ran

``context``: ``model`` (class name), ``batch_size``, ``batches``, ``optimizer`` (class name or
None), ``lr``, ``momentum`` (SGD's momentum or Adam's betas), ``device``, ``steps`` (0 for
examine), ``accumulation_steps``, ``checks``, ``seconds``, ``seconds_by_check``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnlab.jsonsafe import jsonable

from . import html
from .findings import Finding
from .remedies import RemedyResults, try_remedies


def _json_safe(value: Any) -> Any:
    """The measurements and context as JSON: bnlab's one sanitizer, non-finite floats named (a
    reader sees ``"inf"``, not a silent null), a finding as its fields (:meth:`Finding.to_dict`)."""
    return jsonable(value, nonfinite="string", objects=True)


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
        return html.render(self, path)

    def try_remedies(self, model, loss_fn, batches, **kwargs) -> RemedyResults:
        """Apply each suggested remedy to a deep copy for a short run and report the measured
        effect (see :func:`bnlab.doctor.remedies.try_remedies`)."""
        return try_remedies(self, model, loss_fn, batches, **kwargs)
