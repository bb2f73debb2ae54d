"""The registry of data sources and `load`, the one entry point the training engine calls."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from . import cifar, imagefolder, synthetic
from .base import DataSource

# name -> loader(*, device, seed, data_dir, verify, download, **options) -> DataSource
SOURCES: dict[str, Callable[..., DataSource]] = {
    "cifar10": cifar.cifar10,
    "cifar100": cifar.cifar100,
    "digits": synthetic.digits,
    "imagefolder": imagefolder.imagefolder,
    "gaussian_regression": synthetic.gaussian_regression,
    "teacher_student": synthetic.teacher_student,
}

COMMON_ARGUMENTS = ("device", "seed", "data_dir", "verify", "download")


def source_options(name: str) -> dict[str, object]:
    """The source-specific options of ``name`` and their defaults (e.g. ``{"N": 512, ...}``)."""
    loader = SOURCES[_canonical(name)]
    return {
        p.name: p.default
        for p in inspect.signature(loader).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in COMMON_ARGUMENTS
    }


def _canonical(name) -> str:
    if not isinstance(name, str):
        raise ValueError(f"data source name must be a string, one of {', '.join(SOURCES)}; got {name!r}")
    key = name.strip().lower().replace("-", "_")
    if key not in SOURCES:
        raise ValueError(f"unknown data source {name!r}; valid choices: {', '.join(SOURCES)}")
    return key


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
    key = _canonical(name)
    valid = source_options(key)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        choices = ", ".join(f"{k} (default {v!r})" for k, v in valid.items()) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for data source {key!r}; valid options: {choices}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from None
    return SOURCES[key](device=device, seed=seed, data_dir=data_dir, verify=verify, download=download, **options)
