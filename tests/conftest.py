"""Suite-wide fixtures."""

import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test with one intra-op thread.

    The suite's models are tiny: torch's thread pool costs more than it saves on them, and on a busy
    2-core machine (CI, or several jobs at once) two threads made small conv nets ~20× slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def br():
    """docs/build_readme.py as a module (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("build_readme",
                                                  REPO / "docs" / "build_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
