"""The experiment catalogue: one declarative entry per figure/table of the five papers.

    bnlab experiments list
    bnlab reproduce santurkar-fig9 --preset smoke
    bnlab report

Entries live in one module per paper (``santurkar.py``, ``luo.py``, ``peng.py``, ``arora.py``,
``mbn.py``) and register themselves in :data:`CATALOGUE` when imported.
"""

from __future__ import annotations

from .base import (CATALOGUE, PAPER_MODULES, PAPERS, PRESETS, Experiment, Outcome, Plan, RunSpec, check_preset, get,
                   load_catalogue, register, shrink)
from .runner import reproduce


__all__ = ["CATALOGUE", "PAPER_MODULES", "PAPERS", "PRESETS", "Experiment", "Outcome", "Plan", "RunSpec",
           "check_preset", "get", "load_catalogue", "register", "reproduce", "shrink"]
