"""The experiment catalogue: one declarative entry per figure/table of the five papers.

    bnlab experiments list
    bnlab reproduce santurkar-fig9 --preset smoke
    bnlab report

Entries live in one module per paper (``santurkar.py``, ``luo.py``, ``peng.py``, ``arora.py``,
``mbn.py``) and register themselves in :data:`CATALOGUE` when imported.
"""

from __future__ import annotations

import importlib

from .base import CATALOGUE, PAPERS, PRESETS, Experiment, Outcome, Plan, RunSpec, check_preset, get, register, shrink

PAPER_MODULES = ["santurkar", "luo", "peng", "peng_imagenet", "arora", "mbn"]


def load_catalogue() -> dict[str, Experiment]:
    """Import every paper's module (each registers its entries once) and return the catalogue."""
    for name in PAPER_MODULES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    return CATALOGUE


def reproduce(*args, **kwargs):
    from .runner import reproduce as _reproduce

    return _reproduce(*args, **kwargs)


__all__ = ["CATALOGUE", "PAPERS", "PRESETS", "Experiment", "Outcome", "Plan", "RunSpec", "check_preset", "get",
           "load_catalogue", "register", "reproduce", "shrink"]
