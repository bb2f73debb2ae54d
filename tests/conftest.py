"""Suite-wide fixtures."""

import pytest
import torch


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
