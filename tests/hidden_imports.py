"""Run Python code in a fresh interpreter where some installed packages cannot be imported.

This simulates an install without them (``pip install bnlab``, without the ``lab`` extra). The
finder that replaces ``sys.meta_path`` answers "not found" for the hidden top-level packages and
asks the usual finders for everything else, so ``import scipy`` raises ModuleNotFoundError *and*
``importlib.util.find_spec("scipy")`` returns None — what torch expects of an absent optional
package (a finder that raises instead breaks ``import torch``, which probes for scipy and
scikit-learn).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The lab extra's import names (pyproject.toml) with typer's own dependencies, and scikit-learn.
LAB_PACKAGES = ("PIL", "click", "matplotlib", "rich", "scipy", "sklearn", "tqdm", "typer", "yaml")

_PRELUDE = '''
import importlib.abc
import sys

HIDDEN = frozenset({hidden!r})


class _Hide(importlib.abc.MetaPathFinder):
    def __init__(self, finders):
        self.finders = finders

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        return None


assert not [m for m in sys.modules if m.partition(".")[0] in HIDDEN], "imported at start-up"
sys.meta_path[:] = [_Hide(list(sys.meta_path))]
'''


def run_without(hidden: tuple[str, ...], code: str,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter (one torch thread) in which ``hidden`` cannot be
    imported."""
    script = _PRELUDE.format(hidden=tuple(sorted(hidden))) + textwrap.dedent(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)
