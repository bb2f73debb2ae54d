"""The verdict rule in one place: its constants assigned once (in ``rule_stats``), its texts stated
from them, and importable without a plotting library (the report, the README builder and
``bnlab experiments show`` read verdicts without drawing)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bnlab.experiments import common, rule_stats, verdicts

PACKAGE = Path(__file__).resolve().parents[1] / "bnlab"
CONSTANTS = ("ALPHA", "POWER", "MIN_SEEDS")


def _assignments(name: str) -> list[str]:
    """Modules under bnlab/ that assign ``name`` at module level."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(path.relative_to(PACKAGE).as_posix())
    return found


def test_the_rule_constants_are_assigned_once():
    for name in CONSTANTS:
        assert _assignments(name) == ["experiments/rule_stats.py"], name
    for module in (common, verdicts):
        assert (module.ALPHA, module.POWER, module.MIN_SEEDS) == \
            (rule_stats.ALPHA, rule_stats.POWER, rule_stats.MIN_SEEDS)


def test_the_rule_texts_state_the_constants():
    """Both texts quote the numbers the tests use (scipy's quantiles at those levels)."""
    from scipy import stats

    alpha, power = rule_stats.ALPHA, rule_stats.POWER
    assert f"α = {alpha:g}" in verdicts.RULE and f"≥ {rule_stats.MIN_SEEDS} seeds" in verdicts.RULE
    assert f"{100 * (1 - alpha):g} % CI" in verdicts.RULE
    assert f"(t_{1 - alpha / 2:g} + t_{power:g})" in verdicts.RULE
    assert common.RULE is rule_stats.COMPARE_RULE and f"power {power:g}" in common.RULE
    # the design's resolvable effect is (t_{1-α/2} + t_power)·SE at df = 2n − 2
    mde = rule_stats.design_mde(1.0, 3, 3)
    assert abs(mde - (stats.t.ppf(1 - alpha / 2, 4) + stats.t.ppf(power, 4)) * (2 / 3) ** 0.5) \
        < 1e-12


def test_importing_the_rule_imports_no_plotting():
    code = ("import sys; import bnlab.experiments.verdicts, bnlab.experiments.rule_stats, "
            "bnlab.experiments.resolution, bnlab.experiments.verdict_data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib' "
            "or m == 'bnlab.plots'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
