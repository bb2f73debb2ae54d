"""ruff is clean on the repository, with the rules of ``[tool.ruff]`` in pyproject.toml:
pyflakes (unused imports and names, undefined names), pycodestyle's default errors, and no ``noqa``
comment that silences nothing (RUF100)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("bnlab", "tests", "benchmarks", "examples", "scripts", "docs")


def _ruff() -> list[str]:
    """ruff from this interpreter's environment (the ``test`` extra installs it), else from PATH."""
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: pip install -e '.[test]' (it is in the test extra)")


def test_ruff_is_clean():
    result = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", *CHECKED], cwd=ROOT,
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, \
        f"ruff check {' '.join(CHECKED)}:\n{result.stdout}{result.stderr}"


def test_ruff_reads_the_projects_rules():
    # the check above is only as strict as its configuration: a file with an unused import, an
    # ambiguous name and a noqa that silences nothing must fail it (so a lost [tool.ruff] table
    # cannot pass silently)
    bad = "import os\n\nl = 1\nx = 2  # noqa: F401\n"
    result = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise",
                             "--stdin-filename", "bnlab/_lint_probe.py", "-"],
                            cwd=ROOT, input=bad, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    for code in ("F401", "E741", "RUF100"):
        assert code in result.stdout, (code, result.stdout)
