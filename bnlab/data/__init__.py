"""Data sources for bnlab: the papers' synthetic tasks, scikit-learn's digits and CIFAR-10/100.

Everything is a `DataSource` of tensors on the training device::

    from bnlab import data
    ds = data.load("digits", device="cpu", seed=0)            # x (n, 1, 8, 8), y int64
    gen = torch.Generator().manual_seed(0)
    for xb, yb in data.batches(ds.x_train, ds.y_train, 128, generator=gen):
        ...
    cifar = data.load("cifar10", data_dir="~/data")           # verified, restricted unpickling
    for xb, yb in data.batches(cifar.x_train, cifar.y_train, 128, generator=gen,
                               augment=data.cifar_augment):
        ...
"""

from .base import ChecksumError, DataError, DataNotFoundError, DataSource, UnsafePickleError
from .batching import batches, cifar_augment, crop_flip_draws, num_batches, resolve_batch_size
from .cifar import RestrictedUnpickler, download_cifar, write_cifar_like
from .sources import SOURCES, load, source_options

__all__ = [
    "SOURCES",
    "ChecksumError",
    "DataError",
    "DataNotFoundError",
    "DataSource",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "batches",
    "cifar_augment",
    "crop_flip_draws",
    "download_cifar",
    "load",
    "num_batches",
    "resolve_batch_size",
    "source_options",
    "write_cifar_like",
]
