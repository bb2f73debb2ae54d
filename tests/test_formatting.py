"""The one number formatter (not four formatters with two conventions for a missing value, as
this): :func:`bnlab.formatting.fmt` against Python's ``format`` and the ``statistics`` module, and
its sites — no other formatter is defined in the package, and ``bnlab theory``'s table prints
missing values the one way."""

from __future__ import annotations

import ast
import math
import statistics
from pathlib import Path

import numpy as np
import torch

from bnlab.formatting import fmt, mean_std

PACKAGE = Path(__file__).resolve().parents[1] / "bnlab"


def test_scalars_missing_infinite_bool_int_and_float_at_given_digits():
    assert fmt(None) == fmt(math.nan) == fmt(np.float32("nan")) \
        == fmt(torch.tensor(math.nan)) == "—"
    assert fmt(math.inf) == fmt(np.float64("inf")) == "∞" and fmt(-math.inf) == "-∞"
    assert fmt(True) == "True" and fmt(False) == "False" and fmt(np.bool_(True)) == "True"
    # ints as written, at any size (the entries' old formatter printed 12345 as "1.23e+04")
    assert fmt(3) == "3" and fmt(12345) == "12345" and fmt(np.int64(-7)) == "-7"
    assert fmt(12345, decimals=1) == "12345.0"
    assert fmt("lp_bn(p=2)") == "lp_bn(p=2)"
    gen = torch.Generator().manual_seed(3)
    scales = 10.0 ** torch.randint(-7, 8, (40,), generator=gen)
    for x in (torch.randn(40, generator=gen, dtype=torch.float64) * scales).tolist():
        for digits in (3, 4, 6):
            assert fmt(x, digits) == format(x, f".{digits}g")
        assert fmt(x, decimals=2) == format(x, ".2f")
        assert fmt(np.float32(x), 4) == format(float(np.float32(x)), ".4g")
        assert fmt(torch.tensor(x, dtype=torch.float64), 4) == format(x, ".4g")


def test_list_of_per_seed_values_is_mean_std_n():
    gen = torch.Generator().manual_seed(4)
    for n in (2, 3, 5, 10):
        values = (torch.rand(n, generator=gen, dtype=torch.float64) * 100).tolist()
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        assert fmt(values, 4) == f"{mean:.4g} ± {sd:.2g} (n={n})"
        assert fmt(tuple(values), decimals=1) == f"{mean:.1f} ± {sd:.1f} (n={n})"
        got_mean, got_sd = mean_std(values)
        assert math.isclose(got_mean, mean, rel_tol=1e-12) \
            and math.isclose(got_sd, sd, rel_tol=1e-12)
    # a non-finite seed value is left out of the mean but counted in n; a missing one (None) is a
    # seed that did not finish
    assert fmt([1.0, math.nan, 3.0]) == f"2 ± {math.sqrt(2):.2g} (n=3)"
    assert fmt([0.5, None, None]) == "diverged / not finished (2/3 seeds)"
    assert fmt([]) == fmt([math.nan]) == "—" and fmt([0.25]) == "0.25"


def test_one_formatter_in_the_package():
    """``grep "def fmt\\|def _fmt" bnlab`` shows one definition: the report, the CLI and the
    entries call :func:`bnlab.formatting.fmt`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name in ("fmt", "_fmt"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert [where.partition(":")[0] for where in found] == ["bnlab/formatting.py"], found


def test_theory_table_prints_missing_values_the_one_way(capsys):
    from bnlab.cli.theory_common import _table

    _table([{"a": math.nan, "b": None, "c": True, "d": 12, "e": 1 / 3}])
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["a", "b", "c", "d", "e"]
    assert row.split() == ["—", "—", "True", "12", format(1 / 3, ".6g")]
