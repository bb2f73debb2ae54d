"""The experiment catalogue: one declarative entry per figure/table of the five papers.

    bnlab experiments list
    bnlab reproduce santurkar-fig9 --preset smoke
    bnlab report

Entries live in one package per paper (``santurkar/``, ``luo/``, ``peng/``, ``arora/``, ``mbn/``);
each entry module registers its entries in :data:`CATALOGUE` when imported, and
:func:`load_catalogue` imports them in the order :data:`ENTRY_MODULES` declares. Shared helpers:
``common`` (analysis and plots), ``run_facts`` (what the verdict rule reads from the runs),
``verdicts`` (the verdict rule: its constants, texts and ladder), ``significance`` (the level-free
statistics it is made of), ``verdict_text`` (how its numbers are written), ``verdict_data`` (a
verdict as data), ``outcomes`` (an entry's outcome stored with its runs), ``runner`` and
``parallel`` (execution).
"""

from __future__ import annotations

from .base import (CATALOGUE, ENTRY_MODULES, PAPERS, PRESETS, Experiment, Outcome, Plan, RunSpec,
                   check_preset, get, load_catalogue, register, shrink)
from .runner import reproduce


__all__ = ["CATALOGUE", "ENTRY_MODULES", "PAPERS", "PRESETS", "Experiment", "Outcome", "Plan",
           "RunSpec", "check_preset", "get", "load_catalogue", "register", "reproduce", "shrink"]
