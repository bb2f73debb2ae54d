"""Readings of a paper that decide a verdict, and the check a conjunctive verdict rests on.

A paper often leaves open a choice that can move a verdict: a learning rate stated for a loss
summed where bnlab's is averaged (Santurkar et al., *How Does Batch Normalization Help
Optimization?*, App. A.1's DLN rate), which network a caption's "normal networks" are, how much
larger "significantly higher" is. An entry that judges more than one plausible reading judges each
by the same rule and combines them here (:func:`combine_readings`): the entry holds (or fails)
only where every reading gives that verdict; where they disagree it is inconclusive —
*reading-dependent* — and its summary gives each reading's verdict with its numbers.

An entry whose verdict is a conjunction of checks (:func:`verdicts.checks`) stores as its
structured verdict (:class:`~bnlab.experiments.verdict_data.Verdict`) the one check the verdict
rests on (:func:`deciding`): the first check against the claim when it is not held, the first
undecided one when it is inconclusive, else the weakest held one (largest p).
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

from .verdicts import COMPARE_RULE, Comparison
from .verdict_data import Verdict
from .verdicts import HELD, INCONCLUSIVE, NOT_HELD, ladder

#: The rule that combines readings, stated once for the summaries.
READINGS_RULE = ("each reading judged by the same rule; the entry holds or fails only where every "
                 "reading agrees, else it is reading-dependent (inconclusive)")


def agree(verdicts: Sequence[str]) -> bool:
    """Whether every reading gave the same verdict."""
    return len(set(verdicts)) == 1


def combine_readings(readings: Sequence[tuple[str, str, str]]) -> tuple[str, str]:
    """(verdict, summary) of an entry judged under several readings, each ``(name, verdict,
    text)``, the entry's primary reading first: the common verdict where all agree, else
    inconclusive (:func:`verdicts.ladder` with ``unusable``: the paper's text cannot decide
    between them). The summary gives every reading's verdict and text, led by the disagreement
    where there is one."""
    if not readings:
        return ladder(unusable=True), "no reading judged"
    verdicts = [v for _, v, _ in readings]
    verdict = ladder(verdicts[0], unusable=not agree(verdicts))
    parts = "; ".join(f"{name}: {v}: {text}" for name, v, text in readings)
    if agree(verdicts):
        return verdict, f"{parts} — the readings agree ({READINGS_RULE})"
    # what decided an inconclusive entry comes first: its first clause is the README's row
    split = ", ".join(f"{name} {v}" for name, v, _ in readings)
    return verdict, f"reading-dependent: the readings disagree ({split}); {parts} ({READINGS_RULE})"


def deciding(outcome: Mapping[Hashable, str], comparisons: Mapping[Hashable, Comparison]
             ) -> Hashable | None:
    """The key of the check a conjunctive verdict rests on (``outcome``: each check's verdict, as
    :func:`verdicts.checks` returns it): the first one against the claim, else the first
    undecided one, else the held one with the largest p. None without checks."""
    keys = [k for k in outcome if k in comparisons]
    found = ([k for k in keys if outcome[k] == NOT_HELD]
             or [k for k in keys if outcome[k] == INCONCLUSIVE])
    if found:
        return found[0]
    held = [k for k in keys if outcome[k] == HELD]
    if not held:
        return keys[0] if keys else None
    return max(held, key=lambda k: -1.0 if comparisons[k].p is None else comparisons[k].p)


def deciding_record(verdict: str, outcome: Mapping[Hashable, str],
                    comparisons: Mapping[Hashable, Comparison], names: Mapping[Hashable, str] |
                    Any, *, paper: float | str | None, rule: str = COMPARE_RULE,
                    unit: str = "") -> Verdict:
    """The structured verdict of a conjunctive entry: ``verdict`` (the entry's final one) with the
    comparison of :func:`deciding` (named ``names[key]``, or ``names(key)`` when callable). An
    entry without checks gets the verdict and the rule only (structured, no numbers)."""
    key = deciding(outcome, comparisons)
    if key is None:
        return Verdict(verdict, rule)
    name = names(key) if callable(names) else names[key]
    return Verdict.from_comparison(verdict, name, comparisons[key], paper=paper, rule=rule,
                                   unit=unit)
