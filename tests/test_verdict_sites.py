"""One place turns evidence into a verdict (issue 20 item 2): ``bnlab.experiments.verdicts``.

An AST scan of every module under bnlab/experiments/ other than verdicts.py fails on a verdict
literal ("held", "not held", "inconclusive") outside a docstring, and on the names HELD / NOT_HELD /
INCONCLUSIVE used anywhere but in a comparison — so the hand-written ladder ("tiny runs →
inconclusive → not held → held", 144 sites in 20 modules before) cannot come back. Then the
ladder's API against outside references: scipy's one-sample t-test for :func:`against_bound`,
Holm's step-down for :func:`family`/:func:`checks`, Python's ``format`` for ``common.fmt``."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bnlab.experiments.common import compare_arms, fmt
from bnlab.experiments.verdicts import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    against_bound,
    check,
    checks,
    conjunction,
    decide,
    explain,
    family,
    holm,
    ladder,
    settle,
    tally,
)

EXPERIMENTS = Path(__file__).resolve().parent.parent / "bnlab" / "experiments"
LITERALS = {HELD, NOT_HELD, INCONCLUSIVE}
NAMES = {"HELD", "NOT_HELD", "INCONCLUSIVE"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def verdict_sites(source: str) -> list[tuple[int, str]]:
    """(line, what) for every place in ``source`` that writes a verdict itself: a verdict literal
    outside a docstring, or a verdict name used other than in a comparison."""
    tree = ast.parse(source)
    docs, sites = _docstrings(tree), []
    compared = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                compared.add(id(operand))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in LITERALS and id(node) not in docs:
            sites.append((node.lineno, repr(node.value)))
        name = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else None
        )
        if name in NAMES and id(node) not in compared:
            sites.append((node.lineno, name))
    return sites


def test_the_scan_finds_a_hand_written_ladder():
    old = '''
def verdict(c, tiny):
    """held when ... ("held")"""
    if tiny:
        return "inconclusive", "tiny"
    return ("held" if c else "not held"), "x"
'''
    assert [what for _, what in verdict_sites(old)] == ["'inconclusive'", "'held'", "'not held'"]
    assert [
        what for _, what in verdict_sites("from v import HELD\ndef f():\n    return HELD, ''\n")
    ] == ["HELD"]
    assert verdict_sites("def f(v):\n    return [k for k in v if k == NOT_HELD]\n") == []


def test_no_experiment_module_writes_a_verdict_itself():
    modules = sorted(p for p in EXPERIMENTS.rglob("*.py") if p != EXPERIMENTS / "verdicts.py")
    assert len(modules) > 20
    found = {str(p.relative_to(EXPERIMENTS)): verdict_sites(p.read_text()) for p in modules}
    assert {k: v for k, v in found.items() if v} == {}


def test_ladder_order():
    # unusable beats everything, then a contradicting secondary, then the primary outcome
    assert ladder(HELD, unusable=True, against=True) == INCONCLUSIVE
    assert ladder(HELD, against=True) == NOT_HELD
    assert [ladder(v) for v in (HELD, NOT_HELD, INCONCLUSIVE)] == [HELD, NOT_HELD, INCONCLUSIVE]
    assert (ladder(True), ladder(False), ladder(None), ladder()) == (
        HELD,
        NOT_HELD,
        INCONCLUSIVE,
        INCONCLUSIVE,
    )
    assert (check(True), check(False), check(None)) == (HELD, NOT_HELD, INCONCLUSIVE)
    with pytest.raises(ValueError, match="one of"):
        ladder("maybe")
    assert (
        explain(NOT_HELD, held="a", not_held="b") == "b" and explain(INCONCLUSIVE, held="a") == ""
    )
    with pytest.raises(ValueError, match="one of"):
        explain("yes")
    assert (
        tally([HELD, HELD, NOT_HELD, INCONCLUSIVE]) == "2 of 4 checks held, 1 against, 1 undecided"
    )
    assert settle((HELD, "x"), (HELD, "y"))[0] == HELD
    assert settle((NOT_HELD, "x"), (HELD, "y"))[0] == INCONCLUSIVE


def test_against_bound_is_scipys_one_sample_t_test():
    gen = np.random.default_rng(0)
    for _ in range(20):
        values = list(gen.normal(0.3, 0.2, 5))
        verdict, comp = against_bound(values, 0.5, "lower")
        ref = stats.ttest_1samp(values, 0.5)
        assert comp.p == pytest.approx(ref.pvalue, rel=1e-9)
        expected = (HELD if ref.statistic < 0 else NOT_HELD) if ref.pvalue < 0.05 else INCONCLUSIVE
        assert verdict == expected
    assert against_bound([0.7, 0.71, 0.69], 0.5, "lower")[0] == NOT_HELD
    assert against_bound([0.7, 0.71, 0.69], 0.5, "higher")[0] == HELD
    assert against_bound([0.7, 0.71], 0.5, "higher")[0] == INCONCLUSIVE  # too few seeds
    # a floor on the SE (measurement resolution) keeps agreeing seeds from p ≈ 0
    assert against_bound([0.501, 0.501, 0.501], 0.5, "higher", se_floor=0.01)[0] == INCONCLUSIVE


def test_family_and_checks_use_holm_for_against_only():
    # a family of 5: one comparison against the claim at raw p ≈ 0.02, not significant after Holm
    gen = np.random.default_rng(1)
    base = list(gen.normal(0, 1, 4))
    against = compare_arms(base, [v + 2.2 for v in base[::-1]])  # higher, where "lower" is claimed
    nulls = {k: compare_arms([0.0, 1.0, 2.0], [0.1, 1.1, 1.9]) for k in range(4)}
    assert 0.01 < against.p < 0.05 and against.decision == "higher"
    comps = {**nulls, "x": against}
    assert decide(against, "lower") == NOT_HELD  # alone: against the claim
    adjusted = holm({k: c.p for k, c in comps.items()})
    assert adjusted["x"] >= 0.05
    assert family(comps, "lower")["x"] == INCONCLUSIVE == checks(comps, "lower")["x"]
    assert conjunction(comps, "lower") == INCONCLUSIVE
    # every comparison significant as claimed: held without a correction (intersection–union test)
    lower = {k: compare_arms([1.0, 1.1, 0.9], [0.5, 0.6, 0.4 + 0.01 * k]) for k in range(3)}
    assert conjunction(lower, "lower") == HELD and conjunction(lower, "higher") == NOT_HELD
    assert checks(lower, {0: "lower", 1: "higher", 2: "lower"}) == {0: HELD, 1: NOT_HELD, 2: HELD}
    assert conjunction({}, "lower") == INCONCLUSIVE
    with pytest.raises(ValueError, match="lower"):
        decide(against, "less")


def test_fmt_options_match_python_format():
    gen = np.random.default_rng(2)
    for mean, sd in gen.normal(0, 10, (20, 2)):
        sd = abs(sd)
        assert fmt(mean, std=sd, n=3, decimals=2) == f"{mean:.2f} ± {sd:.2f} (n=3)"
        assert fmt(mean, 4, std=sd) == f"{mean:.4g} ± {sd:.2g}"
        values = list(gen.normal(mean, 1 + sd, 4))
        m, s = float(np.mean(values)), float(np.std(values, ddof=1))
        assert fmt(values, 4) == f"{m:.4g} ± {s:.2g} (n=4)"
    assert fmt(None, std=1.0, n=3) == "—" and fmt([]) == "—"
    assert (
        fmt([0.5, None, None]) == "diverged / not finished (2/3 seeds)"
        and fmt([None]) == "diverged / not finished"
    )
    assert fmt([0.25]) == "0.25" and fmt(math.inf, decimals=2) == "∞"
