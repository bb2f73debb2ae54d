"""The verdict on Peng et al.'s Tables 1–4 (CBN vs BN over five activations) by the catalogue's rule
(:mod:`bnlab.experiments.verdicts`).

Primary comparison, declared before the runs: CBN (②) − BN (①) in test accuracy, each seed's value
the mean over Sigmoid, Tanh and SELU (the activations where the paper reports CBN's large gains;
§6.2). The paper's effect on that quantity is the mean of its three printed gains (Table 1: +6.1
points, Table 2: +6.2, Table 3: +9.5, Table 4: +7.8). Secondary, judged with Holm's correction over
the five activations: CBN is not significantly worse with any activation (the claim says "every
activation"). Reported only: whether the mean gain over Sigmoid/Tanh/SELU exceeds that over
ReLU/Swish.

A diverged run counts as chance accuracy (0.1, ten classes) for its arm — a CBN that does not train
is a failure of CBN, not a missing value.
"""

from __future__ import annotations

import math

from ..common import compare_arms
from .common import (
    ACT_TITLE,
    ACTIVATIONS,
    NON_RELU,
    PAPER_TABLES,
    PAPER_TRIALS,
    RELU_LIKE,
    TABLE_SMOKE_SEEDS,
)
from ..rule_stats import holm
from ..verdicts import NOT_HELD, Design, explain, family, judge, ladder, settle

CHANCE = (
    0.1  # ten classes (digits; CIFAR-10). CIFAR-100's paper preset uses 0.01 (see failure_value)
)
DIGITS = 1797
# Design SD of one seed's test accuracy for one activation in the smoke preset (noisy digits, 40
# epochs, width ½), stated before the runs: 3 points. Why: the binomial floor on 359 test images at
# 85 % is 1.9 points, the split and the noise change with the seed, and issue 19's 40-epoch re-run
# on clean digits found 0.2–1.6 points. The observed SD is reported beside it.
SMOKE_SD = 0.03
# The paper preset: the paper's own trial SDs are 0.04–0.56 points; we take 1 point (issue 19's
# 40-epoch, 5-seed re-run on digits: 0.2–1.6 points).
PAPER_SD = 0.01


def paper_gain(table: int, act: str) -> float:
    """The paper's gain of ② over ① (points) for one activation of Table ``table``."""
    i = ACTIVATIONS.index(act)
    return PAPER_TABLES[table]["②"][i][0] - PAPER_TABLES[table]["①"][i][0]


def table_design(table: int, preset: str = "smoke") -> Design:
    """The pre-declared primary comparison of ``peng-table<table>`` in ``preset``."""
    effect = sum(paper_gain(table, a) for a in NON_RELU) / len(NON_RELU) / 100
    if preset == "paper":
        return Design(
            "CBN − BN test accuracy, mean over Sigmoid/Tanh/SELU",
            effect,
            PAPER_SD / math.sqrt(3),
            PAPER_TRIALS,
            "assumed 1 point per activation (issue 19 re-run: 0.2–1.6)",
            n_test=10_000,
        )
    n_test = round(DIGITS * (0.5 if table in (3, 4) else 0.2))
    return Design(
        "CBN − BN test accuracy, mean over Sigmoid/Tanh/SELU",
        effect,
        SMOKE_SD / math.sqrt(3),
        len(TABLE_SMOKE_SEEDS),
        f"3 points per activation, assumed before the runs (binomial floor at 85 %: "
        f"{100 * math.sqrt(0.85 * 0.15 / n_test):.1f} on {n_test} test images)",
        n_test=n_test,
    )


def _per_seed_mean(cells, row: str) -> list[float]:
    """Seed i's mean over Sigmoid/Tanh/SELU of one row (seeds of different activations are
    independent runs, so the i-th values form one draw of the three-activation mean)."""
    lists = [cells.get((row, a)) or [] for a in NON_RELU]
    n = min(len(v) for v in lists)
    return [sum(v[i] for v in lists) / len(lists) for i in range(n)]


def table_verdict(
    cells: dict[tuple[str, str], list[float]],
    tiny: bool = False,
    design: Design | None = None,
    table: int = 1,
) -> tuple[str, str]:
    """The verdict on Tables 1–4's claim from final test accuracies (fractions, diverged runs
    already at chance) per (row, activation): the primary comparison of :func:`table_design` judged
    by :func:`verdict.judge`; "not held" as well when CBN is Holm-significantly worse with some
    activation."""
    design = design or table_design(table)
    for act in ACTIVATIONS:
        if not cells.get(("①", act)) or not cells.get(("②", act)):
            return ladder(unusable=True), f"no finished ① and ② runs for {ACT_TITLE[act]}" + (
                " (tiny runs)" if tiny else ""
            )
    primary = judge(_per_seed_mean(cells, "①"), _per_seed_mean(cells, "②"), design)
    comps = {
        a: compare_arms(cells[("①", a)], cells[("②", a)], n_test=design.n_test) for a in ACTIVATIONS
    }
    adjusted = holm({a: c.p for a, c in comps.items()})
    gains = {a: comps[a].diff for a in ACTIVATIONS}
    trio = sum(gains[a] for a in NON_RELU) / len(NON_RELU)
    relu_like = sum(gains[a] for a in RELU_LIKE) / len(RELU_LIKE)
    summary = (
        primary.text(design, 100, " pt")
        + "; per activation (reported, Holm-adjusted p): "
        + "; ".join(
            f"{ACT_TITLE[a]} {100 * gains[a]:+.1f} (p_Holm={adjusted[a]:.2g})"
            if adjusted[a] is not None
            else f"{ACT_TITLE[a]} {comps[a].text(100)}"
            for a in ACTIVATIONS
        )
        + f"; mean gain over Sigmoid/Tanh/SELU {100 * trio:+.1f}, over ReLU/Swish "
          f"{100 * relu_like:+.1f}"
    )
    worse = [ACT_TITLE[a] for a, v in family(comps, "higher", design.alpha).items()
             if v == NOT_HELD]
    verdict = ladder(primary.verdict, unusable=tiny, against=bool(worse))
    return verdict, summary + explain(
        verdict,
        inconclusive=" (tiny runs: a few steps each)" if tiny
        else "; neither a gain nor the paper's effect can be excluded at this resolution",
        not_held="; CBN significantly worse (Holm) with " + ", ".join(worse) if worse
        else "; the data reject a gain of the paper's size (or show a loss)",
        held="; CBN better on the primary comparison and nowhere significantly worse",
    )


def settled_table_verdict(
    cells, mid_cells, tiny: bool = False, design: Design | None = None, table: int = 1
) -> tuple[str, str]:
    """:func:`table_verdict` at the end of training and again halfway through the final
    learning-rate phase (``mid_cells``; :func:`verdict.settle_fraction`): a verdict that changed
    within the phase is inconclusive."""
    return settle(
        table_verdict(cells, tiny, design, table), table_verdict(mid_cells, tiny, design, table)
    )
