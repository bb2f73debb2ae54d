"""The registry of data sources and `load`, the one entry point the training engine calls."""

from __future__ import annotations

import torch

from . import cifar, imagefolder, synthetic  # noqa: F401  (their @source decorators fill SOURCES)
from .base import COMMON_ARGUMENTS, SOURCES, DataSource

__all__ = ["COMMON_ARGUMENTS", "SOURCES", "load", "source_options"]


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
    return entry.target(device=device, seed=seed, data_dir=data_dir, verify=verify,
                        download=download, **options)
