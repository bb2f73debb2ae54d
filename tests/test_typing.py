"""mypy is clean on the public API (bnlab.norms, bnlab.probes, bnlab.train), as configured in
pyproject.toml.

The package ships ``py.typed`` (PEP 561), so users' type checkers read these annotations: a wrong
one is a bug they see. ``[tool.mypy]`` names the packages; this test runs mypy on them in a
subprocess (a fresh cache in a temporary directory, so a stale cache cannot hide an error) and
asserts zero errors.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_API = ["bnlab.norms", "bnlab.probes", "bnlab.train"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (it comes with the test extra: "
                                       "pip install -e '.[test]')")


def run_mypy(root: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """mypy with the [tool.mypy] settings of ``root``'s pyproject.toml, on the tree at ``root``."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"),
         "--cache-dir", str(cache_dir), "--show-error-codes"],
        cwd=root, capture_output=True, text=True, timeout=600)


def test_config_checks_the_public_api_without_blanket_exemptions():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(config["packages"]) == PUBLIC_API
    assert not config.get("ignore_errors") and not config.get("disable_error_code")
    assert not config.get("overrides"), "per-module exemptions would hide errors in the public API"


def test_mypy_reports_no_errors_on_the_public_api(tmp_path):
    result = run_mypy(ROOT, tmp_path / "mypy_cache")
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert result.returncode == 0 and not errors, \
        f"mypy found {len(errors)} error(s):\n" + "\n".join(errors[:40])
    # it really checked the packages: every module of them counts as a source file
    modules = sum(len(list((ROOT / p.replace(".", "/")).rglob("*.py"))) for p in PUBLIC_API)
    checked = int(output.split("no issues found in ")[1].split()[0])
    assert checked >= modules, output
