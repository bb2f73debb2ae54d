"""Write bnlab/data/digits.npz from scikit-learn's bundled digits (run once; needs scikit-learn).

    python scripts/make_digits.py            # writes the file and prints its sha256

The sha256 it prints goes into ``DIGITS_SHA256`` in bnlab/data/digits_archive.py, which checks
the shipped file on every load. The arrays are stored as uint8 (pixels are integers in 0..16).
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from bnlab.data.digits_archive import DIGITS_FILE, save_digits_arrays


def main() -> None:
    bunch = load_digits()
    images = np.asarray(bunch.images)
    target = np.asarray(bunch.target)
    # uint8 must hold every value exactly, or the shipped copy would differ from scikit-learn's.
    assert images.min() >= 0 and images.max() <= 16 and np.array_equal(images, np.round(images))
    assert target.min() >= 0 and target.max() <= 9
    print(save_digits_arrays(DIGITS_FILE, images.astype(np.uint8), target.astype(np.uint8)))


if __name__ == "__main__":
    main()
