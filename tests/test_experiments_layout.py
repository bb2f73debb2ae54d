"""The catalogue's layout: one package per paper, the catalogue order declared in
``base.ENTRY_MODULES`` (not taken from import order), no star imports or re-export shims, one
verdict ladder (``experiments.verdicts``) and one number formatter (``bnlab.formatting.fmt``)."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import torch

from bnlab.experiments import base
from bnlab.experiments.common import compare_arms
from bnlab.experiments.verdicts import combine, decide
from bnlab.formatting import fmt

EXPERIMENTS = Path(base.__file__).parent

# The catalogue as `bnlab experiments list` showed it before the packages (commit 1ed2165): the
# order users, the report and the docs' tables know (each of Peng's Figs 4–5 split into
# its ResNet-20 and VGG-16 entries, next to each other).
ORDER_BEFORE = [
    "santurkar-fig2", "santurkar-fig6", "santurkar-fig7", "santurkar-fig8", "santurkar-fig9",
    "santurkar-fig10", "santurkar-fig11", "santurkar-fig14", "luo-fig2", "luo-fig3", "luo-fig4",
    "luo-fig5", "luo-fig6", "luo-fig7", "luo-table2", "peng-table1", "peng-table2", "peng-table3",
    "peng-table4", "peng-fig4", "peng-fig4-vgg", "peng-fig5", "peng-fig5-vgg", "peng-table6",
    "peng-fig7", "peng-fig2", "peng-fig8",
    "peng-fig10", "peng-table5", "peng-fig6", "arora-d1", "arora-d2", "arora-d3", "mbn-batch-size",
    "peng-eq14", "peng-thm1", "arora-rates", "mbn-theorems",
]


def _order_after_importing(first: str) -> list[str]:
    code = (f"import importlib; importlib.import_module('bnlab.experiments.{first}'); "
            "from bnlab.experiments.base import load_catalogue; print(','.join(load_catalogue()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().split(",")


def test_catalogue_order_is_declared_not_imported():
    assert list(base.load_catalogue()) == ORDER_BEFORE
    # A caller that imports a late entry module first used to move its entries to the front.
    assert _order_after_importing("mbn.theorems") == ORDER_BEFORE
    assert _order_after_importing("peng.figures") == ORDER_BEFORE
    modules = {e.analyze.__module__.removeprefix("bnlab.experiments.")
               for e in base.load_catalogue().values()}
    assert modules == set(base.ENTRY_MODULES)


def test_one_package_per_paper_without_star_imports_or_shims():
    packages = {p.name for p in EXPERIMENTS.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(base.PAPERS)
    for path in EXPERIMENTS.rglob("*.py"):
        tree = ast.parse(path.read_text())
        stars = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.names[0].name == "*"]
        assert not stars, f"{path}: star import at {stars}"
        assert "noqa: F401" not in path.read_text(), f"{path}: a re-export kept alive by noqa"
    # a paper's __init__ is its docstring: nothing re-exported from the modules
    for paper in base.PAPERS:
        tree = ast.parse((EXPERIMENTS / paper / "__init__.py").read_text())
        assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], paper


def test_fmt_matches_python_formatting_and_marks_missing_values():
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(50, generator=g,
                          dtype=torch.float64) * 10 ** torch.randint(-6, 6, (50,), generator=g)):
        value = float(x)
        assert fmt(value) == format(value, ".3g") and fmt(value, 5) == format(value, ".5g")
    assert fmt(None) == fmt(math.nan) == "—" and fmt(math.inf) == "∞" and fmt(3) == "3"


def test_verdict_ladder_follows_welchs_decision():
    g = torch.Generator().manual_seed(1)

    def seeds(mean: float, n: int = 5) -> list[float]:
        return (mean + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)).tolist()

    lower, higher = compare_arms(seeds(1.0), seeds(0.5)), compare_arms(seeds(0.5), seeds(1.0))
    assert (lower.decision, higher.decision) == ("lower", "higher")  # the Welch rule's own reading
    assert decide(lower, "lower") == decide(higher, "higher") == "held"
    assert decide(higher, "lower") == decide(lower, "higher") == "not held"
    assert decide(compare_arms([1.0], [0.5]), "lower") == "inconclusive"  # too few seeds
    assert combine(["held", "held"]) == "held" \
        and combine(["held", "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", "not held", "held"]) == "not held" \
        and combine([]) == "inconclusive"
