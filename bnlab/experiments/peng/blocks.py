"""The residual form of Peng et al.'s ResNets as a reading, for the entries beyond Tables 1–4: Figs
2–3, 7, 8–9, 10, Table 6 (ResNet-20) and the ImageNet proxy of Table 5 / Fig. 6 (ResNet-20 standing
in for ResNet-18).

The paper writes every block as Eq. 7, x⁽ˡ⁺¹⁾ = 𝕀(SC)·x⁽ˡ⁾ + δ(y⁽ˡ⁾), the activation on the branch
before the shortcut sum; §6.1 says the settings are "the same as that in the original paper
proposing ResNet" (He et al.: the activation after the sum). The argument that makes He's block
the primary reading is the one of Tables 1–4 (:data:`.readings.ARGUMENT`): Eq. 7 is Fig. 1's
generic block, written the same way for vanilla BN in Eq. 13. These entries put no norm before the
classifier and keep bnlab's update order, as the primary reading of the tables does.

Each entry trains both block forms (run factor ``"reading"``: ``"he"``, ``"eq7"``), judges each by
its own rule (:func:`judged_by_block`: the entry's analysis on one reading's runs at a time) and
combines them by the catalogue's rule for readings
(:func:`bnlab.experiments.readings.combine_readings`): it holds or fails only where both agree,
else it is reading-dependent (inconclusive), both readings' numbers in the summary. Beside the
verdicts, the mechanism as measured per reading (:func:`first_losses`): the first training losses
of the CBN runs and how many diverged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Callable

from bnlab.formatting import finite_or_none, fmt

from ..base import Outcome, Plan, RunSpec
from ..readings import combine_readings
from .readings import READINGS

#: the block readings, the primary (He's block) first
BLOCK_READINGS = ("he", "eq7")
PRIMARY_BLOCK = BLOCK_READINGS[0]
BLOCK_ARGUMENT = ("primary reading He's block (§6.1: the settings are \"the same as that in the "
                  "original paper proposing ResNet\"; Eq. 7 is Fig. 1's generic block, written the "
                  "same way for vanilla BN in Eq. 13), Eq. 7's block (activation before the sum) "
                  "trained beside it")
FIRST_STEPS = 5  # the first losses: where a large one throws β far beyond its input's SD


def residual(reading: str) -> str:
    """The ``residual=`` model option of a block reading."""
    if reading not in BLOCK_READINGS:
        raise ValueError(f"unknown block reading {reading!r}; valid: {', '.join(BLOCK_READINGS)}")
    form = READINGS[reading].residual
    assert form is not None
    return form


def block_plan(runs_for: Callable[[str, str], list[RunSpec]]) -> Callable[[str], Plan]:
    """An entry's plan in both block forms: ``runs_for(preset, residual)`` gives one form's runs;
    each is tagged with its reading (factor ``"reading"``; the other reading's labels name it)."""
    def plan(preset: str) -> Plan:
        runs = []
        for name in BLOCK_READINGS:
            tag = "" if name == PRIMARY_BLOCK else f" · {READINGS[name].title}"
            runs += [RunSpec(s.label + tag, s.config, {**s.factors, "reading": name})
                     for s in runs_for(preset, residual(name))]
        return Plan(runs=runs)

    return plan


def block_of(factors: dict) -> str:
    """The block reading of a run (runs stored before the readings were recorded: Eq. 7's, the
    form these entries trained then)."""
    return factors.get("reading", "eq7")


class _OneReading:
    """An analysis context restricted to one reading's runs; the other reading's figures get its
    name in their file names."""

    def __init__(self, ctx, name: str, runs: list) -> None:
        self._ctx, self._name, self.runs = ctx, name, runs

    def __getattr__(self, key):
        return getattr(self._ctx, key)

    def figure_path(self, name: str):
        primary = self._name == PRIMARY_BLOCK
        return self._ctx.figure_path(name if primary else f"{name}_{self._name}")


def judged_by_block(analyze: Callable, cbn: Callable[[dict], bool] | None = None) -> Callable:
    """``analyze`` (an entry's analysis of one reading's runs, returning an :class:`Outcome` with
    its record) run per block reading and combined: the verdict by
    :func:`~bnlab.experiments.readings.combine_readings` (a reading without runs counts as not
    judged: inconclusive), the primary reading's table and its record (with the combined
    verdict), the other reading's rows beside them named by the reading, and per reading the first
    losses of the runs ``cbn`` selects (:func:`first_losses`)."""
    @functools.wraps(analyze)  # the entry's own module ranks it in the catalogue
    def wrapped(ctx) -> Outcome:
        groups: dict[str, list] = {name: [] for name in BLOCK_READINGS}
        for r in ctx.runs:
            groups.setdefault(block_of(r.factors), []).append(r)
        outcomes = {name: analyze(_OneReading(ctx, name, runs))
                    for name, runs in groups.items() if runs}
        judged = [(READINGS[n].title, o.verdict, o.summary) for n, o in outcomes.items()]
        missing = [READINGS[n].title for n in BLOCK_READINGS if n not in outcomes]
        verdict, text = combine_readings(
            judged + [(title, combine_readings([])[0], "not trained") for title in missing])
        main = outcomes.get(PRIMARY_BLOCK) or next(iter(outcomes.values()), None)
        rows = list(main.table) if main else []
        figures = list(main.figures) if main else []
        for name, o in outcomes.items():
            if o is not main:
                rows += [{**row, "quantity": f"{READINGS[name].title} · {row['quantity']}"}
                         for row in o.table]
                figures += o.figures
        record = replace(main.record, verdict=verdict) if main and main.record else None
        # the judgement first (the README's row is the summary's first clause), then why He's
        summary = f"{text}; {BLOCK_ARGUMENT}" + (first_losses(groups, cbn) if cbn else "")
        return Outcome(figures, rows, verdict, summary, record)

    return wrapped


def _first(run) -> float | None:
    """The mean of a run's first :data:`FIRST_STEPS` training losses (None if any is not finite)."""
    ys = [finite_or_none(y) for y in run.series("train_loss")[1][:FIRST_STEPS]]
    return sum(ys) / len(ys) if ys and all(y is not None for y in ys) else None  # type: ignore


def first_losses(groups: dict[str, list], selects: Callable[[dict], bool]) -> str:
    """Per reading, over the runs ``selects`` picks by their factors: the median of the mean loss
    of the first :data:`FIRST_STEPS` steps, its largest, and how many runs diverged — a large first
    loss throws CBN's β past its input's SD (Eq. 5's divisor var_B + β² is then β's)."""
    parts = []
    for name, runs in groups.items():
        picked = [r for r in runs if selects(r.factors)]
        if not picked:
            continue
        firsts = sorted(v for v in map(_first, picked) if v is not None)
        diverged = sum(r.status == "diverged" for r in picked)
        median = firsts[len(firsts) // 2] if firsts else math.nan
        parts.append(f"{READINGS[name].title}: median {fmt(median)}, largest "
                     f"{fmt(firsts[-1] if firsts else math.nan)}, {diverged} of {len(picked)} "
                     "diverged")
    if not parts:
        return ""
    return (f"; mechanism, the CBN runs' mean training loss over their first {FIRST_STEPS} steps "
            "(ln 10 ≈ 2.3 at chance): " + "; ".join(parts))
