"""Splits by responsibility, not by size: a name another bnlab module imports is part
of that module's interface, so it is public. No bnlab module imports an underscore-private name
(``_x``; dunders aside) from another bnlab module; privates of torch/numpy are outside this rule."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def private_imports(source: str, where: str = "<string>") -> list[str]:
    """``where:line: module -> name`` for every ``from <bnlab module> import _name`` in ``source``
    (relative imports are bnlab's own; so are absolute ones under ``bnlab``), at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] != "bnlab":
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{where}:{node.lineno}: {'.' * node.level}{module} -> {alias.name}")
    return found


def bnlab_private_imports(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / "bnlab").rglob("*.py")):
        found += private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return found


def test_no_bnlab_module_imports_a_private_name_of_another():
    assert bnlab_private_imports() == []


def test_the_check_sees_relative_absolute_nested_and_grouped_imports():
    source = ("from .common import (PUBLIC,\n    _grouped, helper)\n"
              "from bnlab.train.record import _helper as prim\n"
              "from ..verdicts import __all__, settle\n"
              "from torch.nn.modules.batchnorm import _BatchNorm\n"
              "import bnlab.norms\n"
              "def f():\n    from . import _nested\n")
    assert [f.split(": ", 1)[1] for f in private_imports(source)] == [
        ".common -> _grouped", "bnlab.train.record -> _helper", ". -> _nested"]
