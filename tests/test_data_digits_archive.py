"""The digits shipped in bnlab/data/digits.npz are scikit-learn's, checked on every load."""

from __future__ import annotations

import numpy as np
import pytest

from bnlab.data import ChecksumError
from bnlab.data.digits_archive import DIGITS_FILE, load_digits_arrays


def test_shipped_digits_equal_scikit_learns_exactly():
    datasets = pytest.importorskip("sklearn.datasets")
    bunch = datasets.load_digits()
    images, target = load_digits_arrays()
    assert images.dtype == target.dtype == np.uint8
    assert images.shape == (1797, 8, 8) and target.shape == (1797,)
    np.testing.assert_array_equal(images.astype(np.float64), bunch.images)
    np.testing.assert_array_equal(images.reshape(1797, 64).astype(np.float64), bunch.data)
    np.testing.assert_array_equal(target.astype(np.int64), bunch.target)


def test_a_changed_file_is_refused_before_it_is_parsed(tmp_path):
    raw = bytearray(DIGITS_FILE.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the compressed images
    changed = tmp_path / "digits.npz"
    changed.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="sha256 .* corrupt or was replaced; reinstall bnlab"):
        load_digits_arrays(changed)
