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

import codecs
import hashlib
import io
import os
import pickle
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .base import ChecksumError, DataError, DataNotFoundError, DataSource, UnsafePickleError, as_int, source

try:  # numpy >= 2 moved the implementation; old pickles still name numpy.core.multiarray.
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
    from numpy._core.multiarray import scalar as _np_scalar
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct as _np_reconstruct
    from numpy.core.multiarray import scalar as _np_scalar


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


# ----------------------------------------------------------------------------- restricted unpickling

# (module, name) as the pickle spells it -> the object it may resolve to. Both spellings of numpy's
# core module are listed: the official files (Python 2, numpy 1) say numpy.core.multiarray, files
# written with numpy >= 2 say numpy._core.multiarray.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy.core.multiarray", "scalar"): _np_scalar,
    ("numpy._core.multiarray", "scalar"): _np_scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """A `pickle.Unpickler` whose ``find_class`` admits only the globals of the CIFAR format.

    Anything else — in particular every callable that could run code (``os.system``, ``eval``,
    ``subprocess.Popen``, ``builtins.getattr``...) — raises `UnsafePickleError` naming the global,
    before it is called. Persistent ids are refused too.
    """

    source = "<bytes>"

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = ", ".join(f"{m}.{n}" for m, n in _ALLOWED_GLOBALS)
            raise UnsafePickleError(
                f"refusing to unpickle {self.source}: it asks for the global {module}.{name}, which the "
                f"CIFAR format never uses (allowed: {allowed}). The file is not a CIFAR batch and may be "
                f"malicious; do not load it with the plain pickle module."
            ) from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"refusing to unpickle {self.source}: it uses persistent ids ({pid!r})")


def restricted_loads(data: bytes, *, source: str = "<bytes>"):
    """Unpickle ``data`` (Python-2 str → bytes) with `RestrictedUnpickler`; clear errors on failure."""
    unpickler = RestrictedUnpickler(io.BytesIO(data), encoding="bytes")
    unpickler.source = source
    try:
        return unpickler.load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated / garbage bytes raise many different types
        raise DataError(
            f"could not read {source}: not a valid pickle ({type(exc).__name__}: {exc}). The file is "
            f"corrupt or truncated."
        ) from exc


# ----------------------------------------------------------------------------- checksums and paths


def md5_of(data: bytes | str | os.PathLike) -> str:
    """The MD5 hex digest of bytes, or of a file read in 1 MiB chunks."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return hashlib.md5(data).hexdigest()
    digest = hashlib.md5()
    with open(data, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_md5(actual: str, key: str, where: str, layout: CifarLayout) -> None:
    expected = PUBLISHED_MD5.get(key)
    if expected is None:  # pragma: no cover - the table covers every file the loader reads
        raise ChecksumError(f"no published checksum is known for {key}; load it with verify=False")
    if actual != expected:
        raise ChecksumError(
            f"{layout.title}: checksum mismatch for {where}: MD5 {actual}, expected the published "
            f"{expected}. The file is corrupt, truncated or not the official release. Delete it and "
            f"download {layout.url} again (or pass --download / download=True). If you made this file "
            f"yourself, load it with --no-verify (verify=False); the restricted unpickler still guards it."
        )


def resolve_data_dir(data_dir=None) -> tuple[Path, str]:
    """The directory to search and where that choice came from: argument, ``$BNLAB_DATA``, or ./data."""
    if data_dir is not None:
        return Path(data_dir).expanduser(), "the data_dir argument (--data-dir)"
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser(), f"${DATA_ENV}"
    return Path(DEFAULT_DATA_DIR), f"the default ./{DEFAULT_DATA_DIR} (neither --data-dir nor ${DATA_ENV} set)"


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


def _not_found(layout: CifarLayout, root: Path, origin: str, looked: list[Path], extra: str = "") -> DataNotFoundError:
    where = "\n".join(f"  - {p.resolve()}" for p in looked)
    return DataNotFoundError(
        f"{layout.title} not found. Looked in {root.resolve()} (from {origin}) for:\n{where}\n"
        f"{extra}To obtain it, download {layout.url} (the 'python version', MD5 "
        f"{PUBLISHED_MD5[layout.archive]}) into {root.resolve()} — the .tar.gz can stay packed — or pass "
        f"--data-dir / set ${DATA_ENV} to where it is, or rerun with --download (download=True, needs "
        f"network access)."
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
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
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
            f"{source}: labels must lie in [0, {layout.num_classes}), found [{labels.min()}, {labels.max()}]"
        )
    return data, labels


def _decode_names(obj, source: str, layout: CifarLayout) -> list[str] | None:
    names = _get(obj, layout.label_names_key) if isinstance(obj, dict) else None
    if not isinstance(names, list) or len(names) != layout.num_classes:
        raise DataError(f"{source}: expected {layout.num_classes} '{layout.label_names_key.decode()}'")
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
                f"{self.layout.title}: {path} is missing from the extracted folder {self.folder}. Download "
                f"{self.layout.url} again (or pass --download / download=True)."
            ) from None
        if self.verify:  # checked on the bytes in memory, so what is verified is what is unpickled
            _check_md5(md5_of(data), f"{self.layout.folder}/{name}", str(path), self.layout)
        return data

    def close(self) -> None:
        pass


class _ArchiveReader:
    def __init__(self, archive: Path, layout: CifarLayout, verify: bool):
        self.archive, self.layout = archive, layout
        if verify:
            _check_md5(md5_of(archive), layout.archive, str(archive), layout)
        try:
            self.tar = tarfile.open(archive, "r:gz")
            self.members = {m.name: m for m in self.tar.getmembers()}
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(
                f"{layout.title}: could not read the archive {archive} ({type(exc).__name__}: {exc}). It is "
                f"corrupt or truncated; delete it and download {layout.url} again (or pass --download)."
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
                f"{self.layout.title}: the archive {self.archive} has no file {member_name}; it is not the "
                f"official release. Download {self.layout.url} again."
            )
        try:
            return self.tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(
                f"{self.layout.title}: could not read {member_name} from {self.archive} "
                f"({type(exc).__name__}: {exc}); the archive is corrupt — download {self.layout.url} again."
            ) from exc

    def close(self) -> None:
        self.tar.close()


def download_cifar(name: str, data_dir=None, *, verify: bool = True, timeout: float = 60.0) -> Path:
    """Fetch the official archive of ``name`` ("cifar10"/"cifar100") into ``data_dir``; return its path.

    Opt-in only (``download=True`` / ``--download``); never called by the tests. The file is written
    to a temporary name, checked against the published MD5 (unless ``verify=False``) and then
    renamed into place, so an interrupted download never leaves a half file under the real name.
    """
    layout = _layout(name)
    root, _ = resolve_data_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / layout.archive
    fd, tmp_name = tempfile.mkstemp(prefix=layout.archive + ".", suffix=".part", dir=root)
    try:
        with os.fdopen(fd, "wb") as out:
            _fetch(layout.url, out, timeout)
        if verify:
            _check_md5(md5_of(tmp_name), layout.archive, f"the download of {layout.url}", layout)
        os.replace(tmp_name, target)
    except OSError as exc:
        raise DataError(f"{layout.title}: downloading {layout.url} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _fetch(url: str, out, timeout: float) -> None:
    # A separate function so a test can replace the network with a local copy.
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - fixed https URL
        while chunk := response.read(1 << 20):
            out.write(chunk)


def _layout(name: str) -> CifarLayout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown CIFAR variant {name!r}; valid: {', '.join(LAYOUTS)}") from None


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
        missing = [f for f in layout.train_files + layout.test_files if not (incomplete[0] / f).is_file()]
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


def _load(
    layout: CifarLayout, *, device, data_dir, verify: bool, download: bool, n_train, n_test, normalize
) -> DataSource:
    if not isinstance(normalize, bool):
        raise ValueError(f"option normalize must be true or false, got {normalize!r}")
    n_train = None if n_train is None else as_int("n_train", n_train, minimum=1)
    n_test = None if n_test is None else as_int("n_test", n_test, minimum=0)
    reader, path = _open(layout, data_dir, bool(verify), bool(download))
    try:
        splits = {}
        for split, files in (("train", layout.train_files), ("test", layout.test_files)):
            parts = []
            for f in files:
                source = reader.describe(f)
                raw = reader.read(f)
                parts.append(_decode_batch(restricted_loads(raw, source=source), source, layout))
            splits[split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        classes = None
        if reader.has(layout.meta_file):
            source = reader.describe(layout.meta_file)
            classes = _decode_names(restricted_loads(reader.read(layout.meta_file), source=source), source, layout)
    finally:
        reader.close()

    x_train_u8, y_train = splits["train"]
    x_test_u8, y_test = splits["test"]
    x_train_u8 = x_train_u8.reshape(-1, 3, 32, 32)
    x_test_u8 = x_test_u8.reshape(-1, 3, 32, 32)
    if normalize:
        # Statistics of the full training set (before any n_train cut), so the constants do not
        # depend on how much of the data a run uses.
        mean, std = _channel_stats(x_train_u8)
    else:
        mean, std = np.zeros(3), np.full(3, 255.0)
    if n_train is not None:
        if n_train > len(y_train):
            raise ValueError(f"option n_train={n_train} exceeds the {len(y_train)} training images")
        x_train_u8, y_train = x_train_u8[:n_train], y_train[:n_train]
    if n_test is not None:
        if n_test > len(y_test):
            raise ValueError(f"option n_test={n_test} exceeds the {len(y_test)} test images")
        x_test_u8, y_test = x_test_u8[:n_test], y_test[:n_test]

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


@source("cifar10")
def cifar10(
    *, device="cpu", seed=0, data_dir=None, verify=True, download=False, n_train=None, n_test=None, normalize=True
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
    return _load(LAYOUTS["cifar10"], device=device, data_dir=data_dir, verify=verify, download=download,
                 n_train=n_train, n_test=n_test, normalize=normalize)


@source("cifar100")
def cifar100(
    *, device="cpu", seed=0, data_dir=None, verify=True, download=False, n_train=None, n_test=None, normalize=True
) -> DataSource:
    """CIFAR-100 (50000 train / 10000 test) with the 100 *fine* labels; otherwise as `cifar10`.

    Looks for ``cifar-100-python/`` or ``cifar-100-python.tar.gz``.
    """
    return _load(LAYOUTS["cifar100"], device=device, data_dir=data_dir, verify=verify, download=download,
                 n_train=n_train, n_test=n_test, normalize=normalize)


# ----------------------------------------------------------------------------- writing look-alikes


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
    layout = _layout(name)
    directory = Path(directory)
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
        meta = {b"fine_label_names": names_list, b"coarse_label_names": [f"super_{c}".encode() for c in range(20)]}
    else:
        meta = {b"num_cases_per_batch": n_per_file, b"label_names": names_list, b"num_vis": 3072}
    files[f"{layout.folder}/{layout.meta_file}"] = pickle.dumps(meta, protocol=2)

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
