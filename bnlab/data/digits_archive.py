"""The 8×8 handwritten digits shipped inside bnlab (``digits.npz``), read with numpy alone.

The file is scikit-learn's copy of the test set of the UCI "Optical Recognition of Handwritten
Digits" data (E. Alpaydin, C. Kaynak, 1998): 1797 images of 8×8 integer pixels in 0..16, 10 classes,
stored as ``images`` (1797, 8, 8) and ``target`` (1797,), both uint8, under the BSD-3-Clause notice
in ``DIGITS_LICENSE.txt``. ``scripts/make_digits.py`` wrote it once from
``sklearn.datasets.load_digits()``; tests/test_data_digits_archive.py checks it still equals that.
Shipping these 45 KB spares a light install scikit-learn and its dependencies (docs: data).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

from .base import ChecksumError

DIGITS_FILE = Path(__file__).with_name("digits.npz")
DIGITS_SHA256 = "90574a6a6809a1388966adb3a7dacb1f49041e0f50f93c3727b53a6769d19a4e"
_ARRAYS = ("images", "target")


def load_digits_arrays(path: Path = DIGITS_FILE) -> tuple[np.ndarray, np.ndarray]:
    """``(images, target)``: uint8 arrays of shapes (1797, 8, 8) and (1797,), after a sha256 check.

    The bytes are hashed and parsed from one read (no pickles: ``allow_pickle=False``), so what is
    checked is what is loaded.
    """
    raw = Path(path).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != DIGITS_SHA256:
        raise ChecksumError(f"{path} has sha256 {digest}, not the shipped file's {DIGITS_SHA256}: "
                            "it is corrupt or was replaced; reinstall bnlab")
    with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
        return archive["images"], archive["target"]


def save_digits_arrays(path: Path, images: np.ndarray, target: np.ndarray) -> str:
    """Write ``digits.npz`` (an ``np.load``-able zip with fixed timestamps); returns its sha256."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, array in zip(_ARRAYS, (images, target)):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array, dtype=np.uint8),
                                      allow_pickle=False)
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(entry, buffer.getvalue(), compress_type=zipfile.ZIP_DEFLATED,
                             compresslevel=9)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
