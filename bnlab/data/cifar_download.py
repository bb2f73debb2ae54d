"""Opt-in download of the official CIFAR archives, verified before it takes the real name."""

from __future__ import annotations

import os
import tempfile
import urllib.request
from pathlib import Path

from .base import DataError
from .cifar_layout import check_md5, layout_of, md5_of, resolve_data_dir


def download_cifar(name: str, data_dir=None, *, verify: bool = True, timeout: float = 60.0) -> Path:
    """Fetch the official archive of ``name`` ("cifar10"/"cifar100") into ``data_dir``; return its
    path.

    Opt-in only (``download=True`` / ``--download``); never called by the tests. The file is written
    to a temporary name, checked against the published MD5 (unless ``verify=False``) and then
    renamed into place, so an interrupted download never leaves a half file under the real name.
    """
    layout = layout_of(name)
    root, _ = resolve_data_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / layout.archive
    fd, tmp_name = tempfile.mkstemp(prefix=layout.archive + ".", suffix=".part", dir=root)
    try:
        with os.fdopen(fd, "wb") as out:
            _fetch(layout.url, out, timeout)
        if verify:
            check_md5(md5_of(tmp_name), layout.archive, f"the download of {layout.url}", layout)
        os.replace(tmp_name, target)
    except OSError as exc:
        raise DataError(f"{layout.title}: downloading {layout.url} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _fetch(url: str, out, timeout: float) -> None:
    # A separate function so a test can replace the network with a local copy.
    with urllib.request.urlopen(url, timeout=timeout) as response:  # fixed https URL
        while chunk := response.read(1 << 20):
            out.write(chunk)
