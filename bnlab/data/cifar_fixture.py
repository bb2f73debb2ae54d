"""Tiny files in the exact CIFAR "python version" layout, for tests and demos (no download)."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .cifar_layout import layout_of


def _fixture_files(layout, n_per_file: int, seed: int) -> dict[str, bytes]:
    """The pickled batch and meta files of a look-alike release, keyed by path relative to the data
    dir."""
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    for split, names in (("training", layout.train_files), ("testing", layout.test_files)):
        for i, fname in enumerate(names, start=1):
            data = rng.integers(0, 256, size=(n_per_file, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, layout.num_classes, size=n_per_file)]
            record = {
                b"batch_label": f"{split} batch {i} of {len(names)}".encode(),
                b"data": data,
                b"filenames": [f"image_{split}_{i}_{j}.png".encode() for j in range(n_per_file)],
            }
            if layout.name == "cifar100":
                record[b"fine_labels"] = labels
                record[b"coarse_labels"] = [v // 5 for v in labels]
            else:
                record[b"labels"] = labels
            files[f"{layout.folder}/{fname}"] = pickle.dumps(record, protocol=2)
    names_list = [f"class_{c}".encode() for c in range(layout.num_classes)]
    if layout.name == "cifar100":
        meta = {b"fine_label_names": names_list,
                b"coarse_label_names": [f"super_{c}".encode() for c in range(20)]}
    else:
        meta = {b"num_cases_per_batch": n_per_file, b"label_names": names_list, b"num_vis": 3072}
    files[f"{layout.folder}/{layout.meta_file}"] = pickle.dumps(meta, protocol=2)
    return files


def write_cifar_like(
    directory,
    name: str = "cifar10",
    *,
    n_per_file: int = 4,
    seed: int = 0,
    archive: bool = False,
    folder: bool = True,
) -> dict[str, Path]:
    """Write a tiny dataset in the exact CIFAR "python version" layout, for tests and demos.

    Creates ``<directory>/cifar-10-batches-py/`` (or ``cifar-100-python/``) with every batch file
    and the meta file — Python-2-compatible protocol-2 pickles of dicts with bytes keys, ``b"data"``
    uint8 ``(n_per_file, 3072)`` and list-of-int labels — and, with ``archive=True``, the matching
    ``.tar.gz``. Pixel values and labels come from ``numpy.random.default_rng(seed)``. Returns the
    paths written (keyed by their path relative to ``directory``). Such files do not match the
    published checksums: load them with ``verify=False``.
    """
    layout = layout_of(name)
    directory = Path(directory)
    files = _fixture_files(layout, n_per_file, seed)
    written: dict[str, Path] = {}
    if folder:
        for rel, payload in files.items():
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload)
            written[rel] = path
    if archive:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / layout.archive
        with tarfile.open(path, "w:gz") as tar:
            for rel, payload in files.items():
                info = tarfile.TarInfo(rel)
                info.size = len(payload)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(payload))
        written[layout.archive] = path
    return written
