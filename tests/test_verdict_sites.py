"""One place turns evidence into a verdict: ``bnlab.experiments.verdicts``.

An AST scan of every module under bnlab/experiments/ other than verdicts.py fails on a verdict
literal ("held", "not held", "inconclusive") outside a docstring, and on the names HELD / NOT_HELD /
INCONCLUSIVE used anywhere but in a comparison — so the hand-written ladder ("tiny runs →
inconclusive → not held → held", 144 sites in 20 modules before) cannot come back. Then the
ladder's API against outside references: scipy's one-sample t-test for :func:`against_bound`,
Holm's step-down for :func:`family`/:func:`checks`, Python's ``format`` for ``formatting.fmt``."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from bnlab.experiments.common import compare_arms
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
    ladder,
    settle,
    tally,
)
from bnlab.experiments.verdicts import holm
from bnlab.formatting import fmt

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
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        values = (0.3 + 0.2 * torch.randn(5, generator=gen, dtype=torch.float64)).tolist()
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


BASE, CONTRARY = [0.0, 1.0, 2.0, 0.5], [2.7, 4.2, 3.2, 2.2]  # Welch p = 0.011


def test_family_and_checks_use_holm_for_against_only():
    # a family of 5: one comparison against the claim at raw p ≈ 0.011, not significant after Holm
    against = compare_arms(BASE, CONTRARY)  # higher, where "lower" is claimed
    nulls = {k: compare_arms([0.0, 1.0, 2.0], [0.1, 1.1, 1.9]) for k in range(4)}
    assert 0.01 < against.p < 0.05 / 5 * 1.1 and against.decision == "higher"
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


def test_peng_fig7_needs_a_holm_significant_contrary_comparison():
    """A decision the rule changes on purpose: one of Fig. 7's six comparisons against the claim at
    raw p = 0.011, the others null. The old ladder said "not held" (any raw p < 0.05 over six
    checks); with Holm over the family it is "inconclusive" (0.011 × 6 > 0.05)."""
    from bnlab.experiments.peng import components as PCo

    null = [2.0, 2.3, 1.8, 2.1]
    sq = {
        act: {
            "no normalization": null,
            "mean removal": [2.1, 1.9, 2.2, 2.0],
            "ℓ2 normalization": [2.05, 2.2, 1.9, 2.15],
            "CBN": null,
        }
        for act in ("sigmoid", "tanh", "relu")
    }
    sq["relu"] = {
        **sq["relu"],
        "no normalization": BASE,
        "mean removal": BASE,
        "ℓ2 normalization": CONTRARY,
    }
    assert PCo.fig7_verdict(sq)[0] == INCONCLUSIVE
    # significant after Holm as well (a large contrary effect): "not held", as before
    sq["relu"]["ℓ2 normalization"] = [v + 10 for v in BASE]
    sq["relu"]["no normalization"] = [v + 0.01 * i for i, v in enumerate(BASE)]
    assert PCo.fig7_verdict(sq)[0] == NOT_HELD


def test_fmt_options_match_python_format():
    gen = torch.Generator().manual_seed(2)
    for mean, sd in (10 * torch.randn(20, 2, generator=gen, dtype=torch.float64)).tolist():
        sd = abs(sd)
        assert fmt(mean, std=sd, n=3, decimals=2) == f"{mean:.2f} ± {sd:.2f} (n=3)"
        assert fmt(mean, 4, std=sd) == f"{mean:.4g} ± {sd:.2g}"
        values = (mean + (1 + sd) * torch.randn(4, generator=gen, dtype=torch.float64)).tolist()
        m, s = float(np.mean(values)), float(np.std(values, ddof=1))
        assert fmt(values, 4) == f"{m:.4g} ± {s:.2g} (n=4)"
    assert fmt(None, std=1.0, n=3) == "—" and fmt([]) == "—"
    assert (
        fmt([0.5, None, None]) == "diverged / not finished (2/3 seeds)"
        and fmt([None]) == "diverged / not finished"
    )
    assert fmt([0.25]) == "0.25" and fmt(math.inf, decimals=2) == "∞"
