"""CIFAR-10 and CIFAR-100 from the official "python version" files, read safely.

Format (https://www.cs.toronto.edu/~kriz/cifar.html): each batch file is a Python-2 pickle of a
dict with ``b"data"`` — a uint8 numpy array of shape ``(n, 3072)`` whose rows hold the red, green
and blue 32x32 planes in row-major order — and ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` /
``b"coarse_labels"`` (CIFAR-100), lists of ints. ``batches.meta`` / ``meta`` hold the class names.

Safety, in this order:

1. With ``verify=True`` the bytes are checked against the published MD5 *before* anything is
   unpickled: the archive's checksum when reading ``cifar-10-python.tar.gz`` /
   ``cifar-100-python.tar.gz``, every file's checksum when reading the extracted folder.
2. Whatever ``verify`` says, unpickling goes through `RestrictedUnpickler`, which resolves only the
   globals the format needs (numpy's array reconstructor, ``ndarray``, ``dtype``, numpy scalars and
   ``_codecs.encode``, which protocol-2 pickles written by Python 3 use for bytes) and refuses every
   other global — ``os.system``, ``subprocess.Popen``, ``builtins.eval``... — with
   `UnsafePickleError`. No builtins are admitted: the dicts, lists, ints and bytes of the format
   are built by pickle opcodes, not by globals.
3. The decoded dict is validated (uint8, 3072 columns, labels in range) before becoming tensors.

The archive is read member by member with `tarfile` without extracting it (no path-traversal risk).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import torch

from bnlab.spec import Param

from .base import DataError, DataNotFoundError, DataSource, as_int, count, source
from .cifar_download import download_cifar
from .cifar_fixture import write_cifar_like
from .cifar_layout import (
    DATA_ENV,
    DEFAULT_DATA_DIR,
    LAYOUTS,
    PUBLISHED_MD5,
    CifarLayout,
    check_md5,
    md5_of,
    resolve_data_dir,
)
from .safe_pickle import RestrictedUnpickler, restricted_loads

# Public names of the CIFAR loader, wherever they are defined (bnlab.data.cifar is the documented
# module).
__all__ = ["DATA_ENV", "DEFAULT_DATA_DIR", "LAYOUTS", "PUBLISHED_MD5", "CifarLayout",
           "RestrictedUnpickler", "cifar10", "cifar100", "download_cifar", "md5_of",
           "resolve_data_dir", "restricted_loads", "write_cifar_like"]


def _candidates(root: Path, layout: CifarLayout):
    """(kind, path) pairs to try, in order: extracted folder under root, root itself, archive."""
    yield "folder", root / layout.folder
    if root.name == layout.folder or (root / layout.train_files[0]).exists():
        yield "folder", root
    yield "archive", root / layout.archive
    if root.is_file():
        yield "archive", root


def _folder_complete(folder: Path, layout: CifarLayout) -> bool:
    return all((folder / f).is_file() for f in layout.train_files + layout.test_files)


def _not_found(layout: CifarLayout, root: Path, origin: str, looked: list[Path],
               extra: str = "") -> DataNotFoundError:
    where = "\n".join(f"  - {p.resolve()}" for p in looked)
    return DataNotFoundError(
        f"{layout.title} not found. Looked in {root.resolve()} (from {origin}) for:\n{where}\n"
        f"{extra}To obtain it, download {layout.url} (the 'python version', MD5 "
        f"{PUBLISHED_MD5[layout.archive]}) into {root.resolve()} — the .tar.gz can stay packed — "
        f"or pass --data-dir / set ${DATA_ENV} to where it is, or rerun with --download "
        "(download=True, needs network access)."
    )


# ----------------------------------------------------------------------------- reading


def _get(d: dict, key: bytes):
    # The official (Python 2) files decode to bytes keys; files written by Python 3 may use str.
    if key in d:
        return d[key]
    return d.get(key.decode())


def _decode_batch(obj, source: str, layout: CifarLayout) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(obj, dict):
        raise DataError(f"{source}: expected a pickled dict, got {type(obj).__name__}")
    data = _get(obj, b"data")
    labels = _get(obj, layout.label_key)
    if data is None or labels is None:
        keys = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in obj)
        raise DataError(
            f"{source}: missing key 'data' or '{layout.label_key.decode()}' (found keys: {keys}); "
            f"is this a {layout.title} file?"
        )
    if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2
            or data.shape[1] != 3072):
        desc = f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}"
        raise DataError(f"{source}: 'data' must be a uint8 array of shape (n, 3072), got {desc}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"{source}: labels are not integers") from None
    if labels.shape != (data.shape[0],):
        raise DataError(f"{source}: {labels.shape} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() >= layout.num_classes):
        raise DataError(
            f"{source}: labels must lie in [0, {layout.num_classes}), found [{labels.min()}, "
            f"{labels.max()}]"
        )
    return data, labels


def _decode_names(obj, source: str, layout: CifarLayout) -> list[str] | None:
    names = _get(obj, layout.label_names_key) if isinstance(obj, dict) else None
    if not isinstance(names, list) or len(names) != layout.num_classes:
        raise DataError(f"{source}: expected {layout.num_classes} "
                        f"'{layout.label_names_key.decode()}'")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


class _FolderReader:
    def __init__(self, folder: Path, layout: CifarLayout, verify: bool):
        self.folder, self.layout, self.verify = folder, layout, verify

    def has(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def describe(self, name: str) -> str:
        return str(self.folder / name)

    def read(self, name: str) -> bytes:
        path = self.folder / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataNotFoundError(
                f"{self.layout.title}: {path} is missing from the extracted folder {self.folder}. "
                f"Download {self.layout.url} again (or pass --download / download=True)."
            ) from None
        if self.verify:  # checked on the bytes in memory, so what is verified is what is unpickled
            check_md5(md5_of(data), f"{self.layout.folder}/{name}", str(path), self.layout)
        return data

    def close(self) -> None:
        pass


class _ArchiveReader:
    def __init__(self, archive: Path, layout: CifarLayout, verify: bool):
        self.archive, self.layout = archive, layout
        if verify:
            check_md5(md5_of(archive), layout.archive, str(archive), layout)
        try:
            self.tar = tarfile.open(archive, "r:gz")
            self.members = {m.name: m for m in self.tar.getmembers()}
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(
                f"{layout.title}: could not read the archive {archive} ({type(exc).__name__}: "
                f"{exc}). It is corrupt or truncated; delete it and download {layout.url} again "
                "(or pass --download)."
            ) from exc

    def has(self, name: str) -> bool:
        return f"{self.layout.folder}/{name}" in self.members

    def describe(self, name: str) -> str:
        return f"{self.archive}:{self.layout.folder}/{name}"

    def read(self, name: str) -> bytes:
        member_name = f"{self.layout.folder}/{name}"
        member = self.members.get(member_name)
        if member is None or not member.isfile():
            raise DataError(
                f"{self.layout.title}: the archive {self.archive} has no file {member_name}; it is "
                f"not the official release. Download {self.layout.url} again."
            )
        try:
            return self.tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(
                f"{self.layout.title}: could not read {member_name} from {self.archive} "
                f"({type(exc).__name__}: {exc}); the archive is corrupt — download "
                f"{self.layout.url} again."
            ) from exc

    def close(self) -> None:
        self.tar.close()


def _open(layout: CifarLayout, data_dir, verify: bool, download: bool):
    root, origin = resolve_data_dir(data_dir)
    looked: list[Path] = []
    incomplete: list[Path] = []
    for kind, path in _candidates(root, layout):
        looked.append(path)
        if kind == "folder" and path.is_dir():
            if _folder_complete(path, layout):
                return _FolderReader(path, layout, verify), path
            incomplete.append(path)
        elif kind == "archive" and path.is_file():
            return _ArchiveReader(path, layout, verify), path
    if download:
        archive = download_cifar(layout.name, root, verify=verify)
        return _ArchiveReader(archive, layout, verify), archive
    extra = ""
    if incomplete:
        missing = [f for f in layout.train_files + layout.test_files
                   if not (incomplete[0] / f).is_file()]
        extra = f"The folder {incomplete[0]} exists but lacks {', '.join(missing)}.\n"
    raise _not_found(layout, root, origin, looked, extra)


def _channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-channel mean and std (population) of uint8 images (n, 3, 32, 32), via histograms.

    A 256-bin histogram per channel gives exact sums without a float copy of the whole set
    (torch.bincount counts uint8 directly; numpy's would first widen every pixel to int64).
    """
    values = np.arange(256, dtype=np.float64)
    pixels = torch.from_numpy(images)
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = torch.bincount(pixels[:, c].reshape(-1), minlength=256).double().numpy()
        total = counts.sum()
        mean = (counts * values).sum() / total
        var = (counts * (values - mean) ** 2).sum() / total
        means.append(mean)
        stds.append(np.sqrt(var) if var > 0 else 1.0)
    return np.array(means), np.array(stds)


def _read_splits(reader, layout: CifarLayout
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str] | None]:
    """Every batch file decoded (restricted unpickling, then validation): uint8 images (n, 3,
    32, 32) and int64 labels per split, and the class names when the meta file is there."""
    splits = {}
    for split, files in (("train", layout.train_files), ("test", layout.test_files)):
        parts = []
        for f in files:
            source = reader.describe(f)
            parts.append(_decode_batch(restricted_loads(reader.read(f), source=source), source,
                                       layout))
        images = np.concatenate([p[0] for p in parts]).reshape(-1, 3, 32, 32)
        splits[split] = (images, np.concatenate([p[1] for p in parts]))
    classes = None
    if reader.has(layout.meta_file):
        source = reader.describe(layout.meta_file)
        classes = _decode_names(restricted_loads(reader.read(layout.meta_file), source=source),
                                source, layout)
    return splits, classes


def _first(images: np.ndarray, labels: np.ndarray, n: int | None, option: str, split: str):
    """The first ``n`` images of a split (all when ``n`` is None)."""
    if n is None:
        return images, labels
    if n > len(labels):
        raise ValueError(f"option {option}={n} exceeds the {len(labels)} {split} images")
    return images[:n], labels[:n]


def _load(
    layout: CifarLayout, *, device, data_dir, verify: bool, download: bool, n_train, n_test,
    normalize
) -> DataSource:
    if not isinstance(normalize, bool):
        raise ValueError(f"option normalize must be true or false, got {normalize!r}")
    n_train = None if n_train is None else as_int("n_train", n_train, minimum=1)
    n_test = None if n_test is None else as_int("n_test", n_test, minimum=0)
    reader, path = _open(layout, data_dir, bool(verify), bool(download))
    try:
        splits, classes = _read_splits(reader, layout)
    finally:
        reader.close()

    x_train_u8, y_train = splits["train"]
    x_test_u8, y_test = splits["test"]
    if normalize:
        # Statistics of the full training set (before any n_train cut), so the constants do not
        # depend on how much of the data a run uses.
        mean, std = _channel_stats(x_train_u8)
    else:
        mean, std = np.zeros(3), np.full(3, 255.0)
    x_train_u8, y_train = _first(x_train_u8, y_train, n_train, "n_train", "training")
    x_test_u8, y_test = _first(x_test_u8, y_test, n_test, "n_test", "test")

    device = torch.device(device)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    def to_float(u8: np.ndarray) -> torch.Tensor:
        # Move the uint8 array first (4x less to copy), then convert and normalize in place.
        x = torch.from_numpy(np.ascontiguousarray(u8)).to(device).float()
        return x.sub_(mean_t).div_(std_t)

    has_test = len(y_test) > 0
    return DataSource(
        name=layout.name,
        x_train=to_float(x_train_u8),
        y_train=torch.from_numpy(y_train).to(device),
        x_test=to_float(x_test_u8) if has_test else None,
        y_test=torch.from_numpy(y_test).to(device) if has_test else None,
        task="classification",
        input_shape=(3, 32, 32),
        num_outputs=layout.num_classes,
        meta={
            "mean": tuple(float(m) for m in mean),
            "std": tuple(float(s) for s in std),
            "normalize": normalize,
            "classes": classes,
            "path": str(path),
            "verified": bool(verify),
        },
    )


CIFAR_OPTIONS = {"n_train": count(None, 0, "keep the first n training images (none: all)"),
                 "n_test": count(None, 0, "keep the first n test images (none: all)"),
                 "normalize": Param(True, bool, help="per-channel standardization (false: [0, 1])")}


@source("cifar10", CIFAR_OPTIONS)
def cifar10(
    *, device="cpu", seed=0, data_dir=None, verify=True, download=False, n_train=None, n_test=None,
    normalize=True
) -> DataSource:
    """CIFAR-10 (50000 train / 10000 test, 10 classes) as float32 ``(n, 3, 32, 32)``, int64 labels.

    Looks in ``data_dir``, else ``$BNLAB_DATA``, else ``./data`` for the extracted folder
    ``cifar-10-batches-py/`` or the archive ``cifar-10-python.tar.gz`` (``data_dir`` may also be the
    folder or archive itself). ``normalize=True`` subtracts the per-channel mean and divides by the
    per-channel standard deviation of the training images (0–255 scale; values in
    ``meta["mean"]``/``meta["std"]``); ``normalize=False`` only scales to [0, 1].
    ``n_train``/``n_test`` keep the first images of each split (for quick runs). ``seed`` is unused
    (loading involves no randomness). See the module docstring for verification and safety.
    """
    return _load(LAYOUTS["cifar10"], device=device, data_dir=data_dir, verify=verify,
                 download=download, n_train=n_train, n_test=n_test, normalize=normalize)


@source("cifar100", CIFAR_OPTIONS)
def cifar100(
    *, device="cpu", seed=0, data_dir=None, verify=True, download=False, n_train=None, n_test=None,
    normalize=True
) -> DataSource:
    """CIFAR-100 (50000 train / 10000 test) with the 100 *fine* labels; otherwise as `cifar10`.

    Looks for ``cifar-100-python/`` or ``cifar-100-python.tar.gz``.
    """
    return _load(LAYOUTS["cifar100"], device=device, data_dir=data_dir, verify=verify,
                 download=download, n_train=n_train, n_test=n_test, normalize=normalize)
