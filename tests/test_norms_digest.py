"""Every layer computes the bits it computed when the digest was stored.

``benchmarks/norms_digest.py`` hashes, for every catalogue layer, the specs whose options pick other
computations and every CPU route of a float32 training step, the outputs, input/γ/β gradients and
buffers of 3 training steps and an eval step. A change that only reorganizes the code must leave
every hash as stored in ``benchmarks/results/norms_digest.json``; another torch version may round
differently, so the comparison runs only under the torch that made the file.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "benchmarks" / "results" / "norms_digest.json"


def _script():
    spec = importlib.util.spec_from_file_location("norms_digest", ROOT / "benchmarks" /
                                                  "norms_digest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_layer_is_bit_identical_to_the_stored_digest():
    stored = json.loads(STORED.read_text())
    if stored["torch"] != torch.__version__:
        pytest.skip(f"digest stored under torch {stored['torch']}, running {torch.__version__}")
    threads = torch.get_num_threads()
    try:
        fresh = _script().digest()
    finally:
        torch.set_num_threads(threads)
    assert fresh.keys() == stored["layers"].keys()
    old = stored["layers"]
    differ = {case: sorted(k for k in fresh[case] if fresh[case][k] != old[case].get(k))
              for case in fresh if fresh[case] != old[case]}
    assert not differ, f"cases whose numbers changed: {differ}"


def test_the_digest_sees_a_one_ulp_change():
    """The hash is of raw bytes: the smallest change to one output value changes it."""
    script = _script()
    t = torch.linspace(-1, 1, 12)
    nudged = t.clone()
    nudged[5] = torch.nextafter(nudged[5], torch.tensor(2.0))
    assert script._hash(t) != script._hash(nudged) and script._hash(t) == script._hash(t.clone())
