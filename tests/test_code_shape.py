"""Modules under ~400 lines and functions under ~60, read with ``ast`` from the sources.

A module or function over the limit must be in the allow-list below, which may only shrink: the
test fails when a listed one is back under its limit (remove it) and when an unlisted one grows
past it. Lines are counted as written; lines over 100 characters (ruff's E501 at the project's line
length, counted here too so the limit holds without ruff) are refused, so packing code into long
lines cannot dodge the other limits.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bnlab"
MODULE_LINES = 400
FUNCTION_LINES = 60
LINE_CHARS = 100  # pyproject.toml: [tool.ruff] line-length

# Modules over the limit (path relative to bnlab/). May only shrink.
LONG_MODULES_ALLOWED: set[str] = set()  # now empty
# "path:function" (methods as Class.method), with their lengths when listed.
LONG_FUNCTIONS_ALLOWED: set[str] = set()  # now empty


def _long_functions(path: Path) -> dict[str, int]:
    out = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    length = child.end_lineno - first + 1
                    if length > FUNCTION_LINES:
                        out[name] = length
                walk(child, f"{name}.")

    walk(ast.parse(path.read_text(), str(path)), "")
    return out


def measure() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LINES:
            modules[rel] = lines
        functions.update({f"{rel}:{name}": n for name, n in _long_functions(path).items()})
    return modules, functions


def test_modules_under_400_lines():
    modules, _ = measure()
    assert not set(modules) - LONG_MODULES_ALLOWED, \
        f"modules over {MODULE_LINES} lines: split them " \
        f"{ {m: n for m, n in modules.items() if m not in LONG_MODULES_ALLOWED} }"
    fixed = sorted(LONG_MODULES_ALLOWED - set(modules))
    assert not fixed, f"now under {MODULE_LINES} lines: remove from LONG_MODULES_ALLOWED {fixed}"


def test_functions_under_60_lines():
    _, functions = measure()
    assert not set(functions) - LONG_FUNCTIONS_ALLOWED, f"functions over {FUNCTION_LINES} lines: " \
        f"{ {f: n for f, n in functions.items() if f not in LONG_FUNCTIONS_ALLOWED} }"
    assert not LONG_FUNCTIONS_ALLOWED - set(functions), \
        "now short: remove from LONG_FUNCTIONS_ALLOWED " \
        f"{sorted(LONG_FUNCTIONS_ALLOWED - set(functions))}"


def test_no_lines_over_100_characters():
    counts = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        n = sum(len(line) > LINE_CHARS for line in path.read_text().splitlines())
        if n:
            counts[path.relative_to(PACKAGE).as_posix()] = n
    assert not counts, f"lines over {LINE_CHARS} characters (wrap them): {counts}"


def test_line_limit_is_ruffs_line_length():
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    assert f"line-length = {LINE_CHARS}" in text and '"E501"' in text


def test_the_measure_sees_a_long_function(tmp_path):
    # the counter itself: a 61-line function is long, a 60-line one is not
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(f"def short():\n{body}\n\n\ndef long():\n{body}\n    y = 1\n")
    assert _long_functions(tmp_path / "m.py") == {"long": 61}
