"""Where the CIFAR releases live and what they must hash to: layouts, published MD5s, the data
dir."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .base import ChecksumError

# Published MD5 checksums, keyed by the path relative to the data directory. Source: torchvision's
# torchvision/datasets/cifar.py (CIFAR10.tgz_md5 / train_list / test_list / meta and the CIFAR100
# equivalents), which match the checksums listed beside the downloads. Tests monkeypatch this table.
PUBLISHED_MD5 = {
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
    "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
    "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
    "cifar-100-python/train": "16019d7e3df5f24257cddd939b257f8d",
    "cifar-100-python/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "cifar-100-python/meta": "7973b15100ade9c7d40fb424638fde48",
}


@dataclass(frozen=True)
class CifarLayout:
    """Where each part of one CIFAR release lives and what its keys are called."""

    name: str
    title: str
    archive: str
    url: str
    folder: str
    train_files: tuple
    test_files: tuple
    meta_file: str
    label_key: bytes
    label_names_key: bytes
    num_classes: int


LAYOUTS = {
    "cifar10": CifarLayout(
        name="cifar10",
        title="CIFAR-10",
        archive="cifar-10-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        label_key=b"labels",
        label_names_key=b"label_names",
        num_classes=10,
    ),
    "cifar100": CifarLayout(
        name="cifar100",
        title="CIFAR-100",
        archive="cifar-100-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        label_key=b"fine_labels",
        label_names_key=b"fine_label_names",
        num_classes=100,
    ),
}

DATA_ENV = "BNLAB_DATA"
DEFAULT_DATA_DIR = "data"


def layout_of(name: str) -> CifarLayout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown CIFAR variant {name!r}; valid: {', '.join(LAYOUTS)}") from None


def md5_of(data: bytes | str | os.PathLike) -> str:
    """The MD5 hex digest of bytes, or of a file read in 1 MiB chunks."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return hashlib.md5(data).hexdigest()
    digest = hashlib.md5()
    with open(data, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(actual: str, key: str, where: str, layout: CifarLayout) -> None:
    expected = PUBLISHED_MD5.get(key)
    if expected is None:  # pragma: no cover - the table covers every file the loader reads
        raise ChecksumError(f"no published checksum is known for {key}; load it with verify=False")
    if actual != expected:
        raise ChecksumError(
            f"{layout.title}: checksum mismatch for {where}: MD5 {actual}, expected the published "
            f"{expected}. The file is corrupt, truncated or not the official release. Delete it "
            f"and download {layout.url} again (or pass --download / download=True). If you made "
            "this file yourself, load it with --no-verify (verify=False); the restricted unpickler "
            "still guards it."
        )


def resolve_data_dir(data_dir=None) -> tuple[Path, str]:
    """The directory to search and where that choice came from: argument, ``$BNLAB_DATA``, or
    ./data."""
    if data_dir is not None:
        return Path(data_dir).expanduser(), "the data_dir argument (--data-dir)"
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser(), f"${DATA_ENV}"
    return (Path(DEFAULT_DATA_DIR),
            f"the default ./{DEFAULT_DATA_DIR} (neither --data-dir nor ${DATA_ENV} set)")
