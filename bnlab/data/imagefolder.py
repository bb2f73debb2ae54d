"""ImageNet-style image folders (``root/train/<class>/*.JPEG``, ``root/val/<class>/...``) as a data
source.

The whole of ILSVRC2012 does not fit in memory as float tensors, so the splits are `FolderImages`:
lazily decoded images that the training engine indexes like a tensor (``shape``, ``device``,
slicing, ``index_select``) — each batch is decoded with PIL (optionally by worker threads; PIL
releases the GIL while decoding) or taken from an in-memory uint8 cache when the split is small,
then transformed with torch ops (`bnlab.data.image_transforms`):

* train: shorter side resized to ``resize_size``, the central ``resize_size`` square kept, then
  ``RandomResizedCrop(image_size)`` + horizontal flip per image (``augment=True``; without it the
  eval transform). The PyTorch ImageNet example crops from the whole image; here the crop comes from
  the central square (the two differ only at the long sides of non-square photos).
* val: ``Resize(resize_size)`` + ``CenterCrop(image_size)`` — the example's evaluation exactly.
* both: ``Normalize`` with the ImageNet mean and standard deviation.

Augmentation draws come from the split's own CPU ``torch.Generator`` seeded with the data seed, in
the order batches are requested (the same seed gives the same crops in an uninterrupted run; a run
resumed from a checkpoint draws fresh crops for the rest of its epoch).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from . import image_transforms as T
from bnlab.spec import Param, check_choice

from .base import (DataError, DataNotFoundError, DataSource, as_float, as_int, count, cpu_generator,
                   source)
from .cifar import resolve_data_dir
from .image_writer import ensure_generated

EXTENSIONS = (".jpeg", ".jpg", ".png")
SPLITS = ("train", "val")
CACHES = ("auto", "memory", "none")
AUTO_CACHE_BYTES = 1 << 30  # "auto" keeps a split in memory (as uint8) up to 1 GiB


def scan_split(root: Path, split: str,
               classes: list[str] | None = None) -> tuple[list[Path], list[int], list[str]]:
    """``(paths, labels, classes)`` of ``root/split/<class>/<image>``, classes and files in sorted
    order.

    ``classes`` (the training split's) fixes the label of each class folder; a folder of another
    name is an error. Raises `DataNotFoundError` for a missing split folder and `DataError` for a
    split without class folders, a class folder without images, or images lying directly in the
    split folder.
    """
    folder = root / split
    expected = f"{root}/{split}/<class>/<image>{{{','.join(EXTENSIONS)}}}"
    if not folder.is_dir():
        raise DataNotFoundError(f"image folder: no {split}/ folder in {root}; expected the layout "
                                f"{expected}")
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    names = [e.name for e in entries if e.is_dir()]
    loose = [e.name for e in entries if e.is_file() and e.name.lower().endswith(EXTENSIONS)]
    if loose and not names:
        raise DataError(f"image folder: {len(loose)} images lie directly in {folder} but there are "
                        f"no class folders; expected {expected} (ImageNet's validation images must "
                        "first be sorted into class folders, e.g. with the PyTorch ImageNet "
                        "example's valprep.sh)")
    if not names:
        raise DataError(f"image folder: {folder} has no class folders; expected {expected}")
    if classes is None:
        classes = names
    unknown = sorted(set(names) - set(classes))
    if unknown:
        raise DataError(f"image folder: {folder} has class folders not in train/: "
                        f"{', '.join(unknown[:5])}")
    index = {c: i for i, c in enumerate(classes)}
    paths, labels = [], []
    for name in names:
        files = sorted(e.path for e in os.scandir(folder / name)
                       if e.is_file() and e.name.lower().endswith(EXTENSIONS))
        if not files:
            raise DataError(f"image folder: class folder {folder / name} has no images "
                            f"(expected files ending in {', '.join(EXTENSIONS)})")
        paths += [Path(f) for f in files]
        labels += [index[name]] * len(files)
    return paths, labels, classes


def decode(path: Path, resize_size: int, crop_size: int) -> torch.Tensor:
    """One image file as uint8 ``(3, crop_size, crop_size)``: shorter side to ``resize_size``,
    centre crop.

    JPEGs are decoded at the smallest DCT scale that keeps both sides at least ``resize_size``
    (``Image.draft``), which is what makes streaming ImageNet affordable; grey and RGBA images
    become RGB.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.draft("RGB", (resize_size, resize_size))
            array = np.asarray(img.convert("RGB"), dtype=np.uint8)
    # a bomb: named, refused
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as err:
        raise DataError(f"image folder: cannot decode {path}: {err}") from None
    image = torch.from_numpy(array.copy()).permute(2, 0, 1)
    return T.to_uint8(T.center_crop(T.resize_shorter(image, resize_size), crop_size))


class FolderImages:
    """One split of an image folder, decoded on demand; indexes like a float tensor ``(n, 3, s,
    s)``.

    ``x[i]``, ``x[a:b]``, ``x[index_tensor]`` and ``x.index_select(0, index)`` return normalized
    float32 images on ``device``: from the uint8 cache if ``cache`` is true, else decoded from disk
    (by ``workers`` threads when > 0), then randomly cropped and flipped if ``augment``.
    """

    def __init__(self, paths: list[Path], *, image_size: int, resize_size: int, augment: bool,
                 crop_scale: tuple[float, float], generator: torch.Generator | None, device,
                 cache: bool, workers: int = 0):
        self.paths = list(paths)
        self.image_size, self.resize_size = int(image_size), int(resize_size)
        self.augment, self.crop_scale = bool(augment), tuple(crop_scale)
        # A training split keeps the resize_size square for the random crop; otherwise the eval
        # crop.
        self.stored_size = self.resize_size if self.augment else self.image_size
        self.generator = generator
        self.device = torch.device(device)
        self.workers = int(workers)
        self.dtype = torch.float32
        self._cache = self._decode(range(len(self.paths))) if cache else None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.paths), 3, self.image_size, self.image_size))

    @property
    def ndim(self) -> int:
        return 4

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return (f"FolderImages(n={len(self)}, size={self.image_size}, augment={self.augment}, "
                f"cached={self._cache is not None}, device={self.device})")

    def _decode(self, indices) -> torch.Tensor:
        indices = list(indices)
        one = lambda i: decode(self.paths[i], self.resize_size, self.stored_size)  # noqa: E731
        if self.workers > 0 and len(indices) > 1:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                images = list(pool.map(one, indices))
        else:
            images = [one(i) for i in indices]
        if not images:
            return torch.empty(0, 3, self.stored_size, self.stored_size, dtype=torch.uint8)
        return torch.stack(images)

    def batch(self, indices: torch.Tensor) -> torch.Tensor:
        """The transformed images at ``indices`` (a 1-d integer tensor), normalized, on
        ``device``."""
        indices = indices.reshape(-1).long().cpu()
        if len(indices) and (int(indices.min()) < -len(self) or int(indices.max()) >= len(self)):
            raise IndexError(f"index out of range for {len(self)} images")
        indices = indices % max(len(self), 1)
        raw = (self._cache.index_select(0, indices) if self._cache is not None
               else self._decode(indices.tolist()))
        if self.augment:
            if self.generator is None:
                raise ValueError("an augmented image split needs a torch.Generator")
            raw = T.random_resized_crop_flip(raw, self.image_size, self.generator,
                                             scale=self.crop_scale)
        return T.normalize(raw.to(self.device))

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, slice):
            return self.batch(torch.arange(len(self))[key])
        if isinstance(key, int):
            return self.batch(torch.tensor([key]))[0]
        if isinstance(key, (torch.Tensor, list, tuple)):
            return self.batch(torch.as_tensor(key))
        raise TypeError("FolderImages indices must be an int, a slice or an integer tensor, not "
                        f"{type(key).__name__}")

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if dim != 0:
            raise ValueError("FolderImages.index_select selects images (dim 0) only")
        return self.batch(index)

    def to(self, device) -> "FolderImages":
        """The same split producing batches on ``device`` (the cache, if any, is shared)."""
        other = object.__new__(FolderImages)
        other.__dict__.update(self.__dict__)
        other.device = torch.device(device)
        return other


def find_root(data_dir, folder: str) -> Path:
    """``<data dir>/<folder>`` (or the data dir itself) holding ``train/``; the error lists what was
    searched."""
    base, origin = resolve_data_dir(data_dir)
    candidates = [base / folder, base]
    for root in candidates:
        if (root / "train").is_dir():
            return root
    looked = "\n".join(f"  - {(c / 'train').resolve()}" for c in candidates)
    raise DataNotFoundError(
        f"image folder {folder!r} not found. Looked in {base.resolve()} (from {origin}) "
        f"for:\n{looked}\nExpected the layout <root>/train/<class>/<image> and "
        "<root>/val/<class>/<image> (ImageNet: the ILSVRC2012 training and validation images, the "
        "latter sorted into class folders); pass --data-dir / set $BNLAB_DATA to the folder above "
        "it, and data option folder=<name>.")


@source("imagefolder", {
    "folder": Param("imagenet", str, help="the folder under data_dir"),
    "image_size": count(224, 1, "side of the crops"),
    "resize_size": count(256, 1, "side before cropping"),
    "augment": Param(True, bool, help="random resized crop + flip of the training split"),
    "crop_scale_min": Param(0.08, float, positive=True, help="smallest crop area share, in (0, 1]"),
    "cache": Param("auto", str, choices=CACHES, help="hold splits in memory (auto: up to 1 GiB)"),
    "workers": count(0, 0, "decoding threads"),
    "max_per_class": count(None, 1, "first k images per class"),
    "generate": Param(False, bool, help="write the generated look-alike first if absent")})
def imagefolder(*, device="cpu", seed=0, data_dir=None, verify=True, download=False,
                folder="imagenet", image_size=224, resize_size=256, augment=True,
                crop_scale_min=0.08, cache="auto", workers=0, max_per_class=None,
                generate=False) -> DataSource:
    """An ImageNet-style image folder: ``<data_dir>/<folder>/{train,val}/<class>/<image>``.

    Peng et al. train ResNet-18/50 and EfficientNet-B0 on ILSVRC2012 with the PyTorch ImageNet
    example's data pipeline; this source reproduces it (see the module docstring) at ``image_size``
    (224) from ``resize_size`` (256). Options: ``augment`` (random resized crop + flip of the
    training split), ``crop_scale_min`` (smallest crop area share, 0.08 as in torchvision),
    ``cache`` (``auto``: hold a split as uint8 in memory when it takes at most 1 GiB; ``memory``;
    ``none``: decode every batch), ``workers`` (decoding threads; 0 = in the caller's thread),
    ``max_per_class`` (the first k images of each class, sorted by name), ``generate`` (write the
    generated look-alike of `bnlab.data.image_writer` into the folder first if it is absent — the
    smoke presets' data). ``seed`` seeds the augmentation. ``verify``/``download`` do not apply
    (there is no published checksum or download for a local folder).
    """
    image_size, resize_size, scale_min = _checked_sizes(image_size, resize_size, crop_scale_min)
    cache = check_choice("cache", cache, CACHES, "caches")
    workers = as_int("workers", workers, minimum=0)
    if generate not in (True, False) or augment not in (True, False):
        raise ValueError("options augment and generate must be true or false")
    if generate:
        ensure_generated(resolve_data_dir(data_dir)[0] / folder)
    root = find_root(data_dir, str(folder))
    train_paths, train_labels, classes = scan_split(root, "train")
    val_paths, val_labels, _ = scan_split(root, "val", classes)
    if max_per_class is not None:
        k = as_int("max_per_class", max_per_class, minimum=1)
        train_paths, train_labels = _first_per_class(train_paths, train_labels, k)
        val_paths, val_labels = _first_per_class(val_paths, val_labels, k)

    def split(paths, do_augment):
        stored = resize_size if do_augment else image_size
        keep = cache == "memory" or (cache == "auto"
                                     and len(paths) * 3 * stored * stored <= AUTO_CACHE_BYTES)
        return FolderImages(paths, image_size=image_size, resize_size=resize_size,
                            augment=do_augment, crop_scale=(scale_min, 1.0),
                            generator=cpu_generator(seed) if do_augment else None, device=device,
                            cache=keep, workers=workers)

    y_train = torch.tensor(train_labels, dtype=torch.int64, device=device)
    y_val = torch.tensor(val_labels, dtype=torch.int64, device=device)
    return DataSource(name="imagefolder", x_train=split(train_paths, augment), y_train=y_train,
                      x_test=split(val_paths, False), y_test=y_val, task="classification",
                      input_shape=(3, image_size, image_size), num_outputs=len(classes),
                      meta={"classes": classes, "root": str(root)})


def _checked_sizes(image_size, resize_size, crop_scale_min) -> tuple[int, int, float]:
    """The size options as numbers, checked: (image_size, resize_size, crop_scale_min)."""
    image_size = as_int("image_size", image_size, minimum=1)
    resize_size = as_int("resize_size", resize_size, minimum=1)
    if resize_size < image_size:
        raise ValueError(f"option resize_size ({resize_size}) must be >= image_size ({image_size})")
    scale_min = as_float("crop_scale_min", crop_scale_min, strictly_positive=True)
    if scale_min > 1:
        raise ValueError(f"option crop_scale_min must be in (0, 1], got {scale_min}")
    return image_size, resize_size, scale_min


def _first_per_class(paths: list[Path], labels: list[int], k: int) -> tuple[list[Path], list[int]]:
    counts: dict[int, int] = {}
    kept_paths, kept_labels = [], []
    for path, label in zip(paths, labels):
        if counts.get(label, 0) < k:
            counts[label] = counts.get(label, 0) + 1
            kept_paths.append(path)
            kept_labels.append(label)
    return kept_paths, kept_labels
