"""The registry of data sources and `load`, the one entry point the training engine calls."""

from __future__ import annotations

from collections.abc import Callable

import torch

from bnlab.spec import Registry, params_from_signature

from . import cifar, imagefolder, synthetic
from .base import DataSource

COMMON_ARGUMENTS = ("device", "seed", "data_dir", "verify", "download")


def _spelling(name: str) -> str:
    return name.strip().lower().replace("-", "_")


# name -> loader(*, device, seed, data_dir, verify, download, **options) -> DataSource; the options are
# typed bnlab.spec Params read from the loader's signature (types from the defaults).
SOURCES: Registry[Callable[..., DataSource]] = Registry("data source", names_label="choices", key_label="option",
                                                        normalize=_spelling)
for _name, _loader in (
    ("cifar10", cifar.cifar10),
    ("cifar100", cifar.cifar100),
    ("digits", synthetic.digits),
    ("imagefolder", imagefolder.imagefolder),
    ("gaussian_regression", synthetic.gaussian_regression),
    ("teacher_student", synthetic.teacher_student),
):
    SOURCES.add(_name, _loader, params_from_signature(_loader, skip=COMMON_ARGUMENTS))


def source_options(name: str) -> dict[str, object]:
    """The source-specific options of ``name`` and their defaults (e.g. ``{"N": 512, ...}``)."""
    return {k: p.default for k, p in SOURCES.entry(name).params.items()}


def load(
    name: str,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    data_dir=None,
    verify: bool = True,
    download: bool = False,
    **options,
) -> DataSource:
    """Load the data source ``name`` (see `SOURCES`) onto ``device``.

    ``seed`` seeds every random draw (synthetic data, the digits split) through a CPU
    ``torch.Generator``. ``data_dir``/``verify``/``download`` concern the CIFAR files and are
    ignored by the other sources. ``options`` are source-specific (`source_options` lists them);
    an unknown name or option raises ``ValueError`` naming the valid choices. Names are
    case-insensitive and ``-`` may stand for ``_`` (``teacher-student``).
    """
    entry, options = SOURCES.resolve(name, options, defaults=False)
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from None
    return entry.target(device=device, seed=seed, data_dir=data_dir, verify=verify, download=download, **options)
