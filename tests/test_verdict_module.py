"""The verdict rule in one module (``verdicts``): its constants assigned there once, its texts
stated from them, the modules beside it (its level-free statistics, what it reads from the runs,
how its numbers are written) free of any level of their own, and all of it importable without a
plotting library (the report, the README builder and ``bnlab experiments show`` read verdicts
without drawing)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bnlab.experiments import common, significance, verdicts

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
        assert _assignments(name) == ["experiments/verdicts.py"], name
    assert (common.ALPHA, common.POWER, common.MIN_SEEDS) == \
        (verdicts.ALPHA, verdicts.POWER, verdicts.MIN_SEEDS)
    # both texts, and the rule's numbers, are assigned in verdicts alone
    for name in ("RULE", "COMPARE_RULE"):
        assert _assignments(name) == ["experiments/verdicts.py"], name


def test_the_modules_beside_the_rule_hold_no_level_of_their_own():
    """significance, run_facts and verdict_text take α and power as arguments: no 0.05, 0.8 or
    0.975 literal in them, and no default level in significance's signatures."""
    for name in ("significance", "run_facts", "verdict_text"):
        tree = ast.parse((PACKAGE / "experiments" / f"{name}.py").read_text())
        literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                    and isinstance(node.value, float)}
        assert not literals & {0.05, 0.8, 0.975, 0.95}, (name, literals)
    assert significance.resolvable.__kwdefaults__ is None


def test_the_rule_texts_state_the_constants():
    """Both texts quote the numbers the tests use (scipy's quantiles at those levels)."""
    from scipy import stats

    alpha, power = verdicts.ALPHA, verdicts.POWER
    assert f"α = {alpha:g}" in verdicts.RULE and f"≥ {verdicts.MIN_SEEDS} seeds" in verdicts.RULE
    assert f"{100 * (1 - alpha):g} % CI" in verdicts.RULE
    assert f"(t_{1 - alpha / 2:g} + t_{power:g})" in verdicts.RULE
    assert common.RULE is verdicts.COMPARE_RULE and f"power {power:g}" in common.RULE
    # the design's resolvable effect is (t_{1-α/2} + t_power)·SE at df = 2n − 2
    mde = verdicts.design_mde(1.0, 3, 3)
    assert abs(mde - (stats.t.ppf(1 - alpha / 2, 4) + stats.t.ppf(power, 4)) * (2 / 3) ** 0.5) \
        < 1e-12


def test_importing_the_rule_imports_no_plotting():
    code = ("import sys; import bnlab.experiments.verdicts, "
            "bnlab.experiments.resolution, bnlab.experiments.verdict_data, "
            "bnlab.experiments.significance, bnlab.experiments.run_facts, "
            "bnlab.experiments.verdict_text; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib' "
            "or m == 'bnlab.plots'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
