"""The readings of Peng et al.'s ResNet-20 that the paper's text leaves open, for Tables 1 and 3
(and Figs 4–5, drawn from the same runs).

Three choices decide whether CBN + Sigmoid trains at all at the paper's lr 0.1:

* **The residual form.** Eq. 7 writes every block as x⁽ˡ⁺¹⁾ = 𝕀(SC)·x⁽ˡ⁾ + δ(y⁽ˡ⁾), the activation
  on the branch before the shortcut sum (``residual="peng"``); §6.1 says the CIFAR settings are
  "the same as that in the original paper proposing ResNet" (He et al.: the activation after the
  sum, ``residual="he"``).
* **A norm in front of the classifier.** Fig. 1(c) puts a CBN in front of each block's linear layer;
  one in front of the classifier is neither drawn nor excluded (``head_norm``).
* **Algorithm 1's order.** bnlab folds the batch into μ_A, σ²_A before normalizing; Algorithm 1 read
  literally normalizes with the values of the previous steps (``cbn(order=literal)``).

The primary reading, argued from the text before the runs: He's block without a norm before the
classifier, bnlab's order (:data:`ARGUMENT`). Eq. 7 is the generic block of Fig. 1, written once for
plain networks (𝕀(SC) = 0) and residual ones; Eq. 13 writes vanilla BN's block the same way, which
§6.1's "same as the original ResNet" contradicts for BN, so Eq. 7 reads as a schematic, not as a
change to He's architecture the experiments section never mentions. The paper calls the change it
makes "inserting a CBN in each block"; the classifier is no block, and He's ResNet has no norm
before it. The other readings are trained beside the primary one and reported with their verdicts
and their measured mechanism: var_B/(var_B + β²) of CBN's layers (the cbn_ratios probe), the
share of Eq. 5's divisor the batch still contributes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bnlab.formatting import finite_or_none, fmt

from ..run_facts import arm_values
from ..verdicts import Design
from .common import ACT_TITLE, NON_RELU, TABLES, percent
from .verdict import table_verdict


@dataclass(frozen=True)
class Reading:
    residual: str | None  # None: VGG (no shortcut, the two forms coincide)
    head_norm: bool
    order: str
    title: str


READINGS = {
    "he": Reading("he", False, "fold_first", "He's block (activation after the sum)"),
    "eq7": Reading("peng", False, "fold_first", "Eq. 7's block (activation before the sum)"),
    "eq7_head": Reading("peng", True, "fold_first",
                        "Eq. 7's block + the norm in front of the classifier"),
    "he_literal": Reading("he", False, "literal",
                          "He's block, CBN in Algorithm 1's literal order"),
    "plain": Reading(None, False, "fold_first", "VGG-16 (no shortcut)"),
}
# per table, the reading its verdict is judged under (the VGG tables have no residual form)
PRIMARY = {1: "he", 2: "plain", 3: "he", 4: "plain"}
ARGUMENT = ("primary reading He's block (§6.1: the CIFAR settings are \"the same as that in the "
            "original paper proposing ResNet\"; Eq. 7 is Fig. 1's generic block, written the same "
            "way for vanilla BN in Eq. 13) with no norm before the classifier (the paper inserts "
            "\"a CBN in each block\"; the classifier is no block) and bnlab's update order")
# the smoke's other readings and their rows, on the primary activations with their seeds
# (common.smoke_seeds); Algorithm 1's order changes CBN only: its BN row is the primary reading's
SIDE = {"eq7": ("①", "②"), "eq7_head": ("①", "②"), "he_literal": ("②",)}


def reading_of(factors: dict) -> str:
    """The reading of a table run from its factors (runs stored before readings were recorded:
    from their residual form)."""
    if "reading" in factors:
        return factors["reading"]
    return {"he": "he", "peng": "eq7"}.get(factors.get("residual"), "plain")


def primary_reading(table: int | None) -> str:
    return PRIMARY.get(table, "plain") if table is not None else "plain"


def is_main(factors: dict, table: int | None) -> bool:
    """A run of the compared rows under the table's primary reading at the paper's lr."""
    table = factors.get("table", table)
    return (factors.get("lr_reading", "paper") != "half"
            and reading_of(factors) == primary_reading(table))


def var_share(run) -> float | None:
    """The smallest over the norm layers of var_B/(var_B + β²) (median over channels) at the run's
    last cbn_ratios reading: near 0, β swamps the batch and the layer no longer normalizes it."""
    values = []
    for name in run.metric_names("probe/cbn_ratios/var_share_q50/"):
        # Table 1's smoke probes every 48 steps, the last (partial, 30-image) batch of every 4th
        # epoch: kept, an order of magnitude is what this reads
        ys = [y for y in run.series(name, partial_batches=True)[1] if y is not None]
        if ys:
            values.append(ys[-1])
    return min(values) if values else None


FIRST_STEPS = 5  # the first losses: a large one throws β far past its input's SD


def first_loss(run) -> float | None:
    """The mean of a run's first :data:`FIRST_STEPS` training losses (None if one is not
    finite): the steps whose large gradients on β start the swamping."""
    ys = [finite_or_none(y) for y in run.series("train_loss")[1][:FIRST_STEPS]]
    kept = [y for y in ys if y is not None]
    return sum(kept) / len(kept) if kept and len(kept) == len(ys) else None


def _median(values) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def beta_over_sd(share: float | None) -> float | None:
    """|β|/SD of a layer's input from its share var_B/(var_B + β²) (the same median channel)."""
    if share is None or share <= 0:
        return None
    return math.sqrt(max(1 / share - 1, 0.0))


def mechanism(runs_by_reading: dict[str, list]) -> str:
    """Per reading, per activation, medians over seeds: CBN's (②) smallest var/(var + β²) over its
    layers at the end, |β|/SD there, and the first losses of CBN and BN (:func:`first_loss`)."""
    parts = []
    for name, runs in runs_by_reading.items():
        cells = []
        for act in NON_RELU:
            of = {row: [r for r in runs if r.factors.get("row") == row
                        and r.factors.get("activation") == act] for row in ("①", "②")}
            share = _median(map(var_share, of["②"]))
            firsts = {row: _median(map(first_loss, rs)) for row, rs in of.items()}
            if share is None and firsts["②"] is None:
                continue
            diverged = sum(r.status == "diverged" for r in of["②"])
            cells.append(f"{ACT_TITLE[act]} share {fmt(share)} (|β|/SD {fmt(beta_over_sd(share))}"
                         f"), first losses CBN {fmt(firsts['②'])} / BN {fmt(firsts['①'])}"
                         + (f", CBN diverged {diverged} of {len(of['②'])}" if diverged else ""))
        if cells:
            parts.append(f"{READINGS[name].title}: {', '.join(cells)}")
    if not parts:
        return ""
    return ("; mechanism as measured (medians over seeds): CBN's smallest var_B/(var_B + β²) over "
            "its layers at the end (near 0: β swamps the batch, Eq. 5's divisor is β²'s) with "
            "|β|/SD of that layer's input, and the mean training loss over the first "
            f"{FIRST_STEPS} steps (ln 10 ≈ 2.3 at chance): " + "; ".join(parts))


def side_readings(table: int) -> tuple[str, ...]:
    """The readings trained beside the primary one (ResNet tables only)."""
    return tuple(SIDE) if TABLES[table]["model"] == "resnet20" else ()


def runs_by_reading(runs, table: int | None) -> dict[str, list]:
    """The compared-row runs at the paper's lr, by reading (the primary one first)."""
    out: dict[str, list] = {primary_reading(table): []}
    for r in runs:
        if r.factors.get("row") in ("①", "②") and r.factors.get("lr_reading", "paper") != "half":
            out.setdefault(reading_of(r.factors), []).append(r)
    return out


def cells_of(runs, failed: float) -> dict[tuple[str, str], list[float]]:
    """Per (row, activation): final test accuracies, a diverged run at ``failed`` (chance)."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        key = (r.factors["row"], r.factors["activation"])
        cells.setdefault(key, []).extend(
            arm_values([r], lambda run: run.final("test_accuracy"), failed)[0])
    return cells


def reading_report(runs, table: int, failed: float, tiny: bool,
                   design: Design) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """The other readings beside the primary one: per reading and activation, BN and CBN test
    accuracy (rows), and each reading judged by the primary's rule (:func:`verdict.table_verdict`
    over the Sigmoid/Tanh/SELU it ran, the design's seeds set to its own) as ``(title, verdict,
    text)`` for :func:`bnlab.experiments.readings.combine_readings`. A reading that changes CBN
    alone (Algorithm 1's order: BN has no such order) is judged against the primary reading's BN
    runs, the same networks and seeds."""
    by_reading = runs_by_reading(runs, table)
    main = primary_reading(table)
    ref = cells_of(by_reading[main], failed)
    rows: list[dict] = []
    judged = []
    for name, members in by_reading.items():
        if name == main or not members:
            continue
        own = cells_of(members, failed)
        acts = tuple(a for a in NON_RELU if own.get(("②", a)))
        cells = {**own, **{("①", a): ref.get(("①", a), []) for a in acts
                           if not own.get(("①", a))}}
        for act in acts:
            rows.append({"quantity": f"reading · {READINGS[name].title} · {ACT_TITLE[act]} · "
                                     "① BN / ② CBN (%)",
                         "ours": f"{fmt([percent(v) for v in cells[('①', act)]], decimals=1)} / "
                                 f"{fmt([percent(v) for v in cells[('②', act)]], decimals=1)}"
                                 + ("" if own.get(("①", act)) else " (BN: the primary reading's)"),
                         "paper": "ResNet-20 of the paper (reading not stated)"})
        if not acts or not all(cells.get(("①", a)) for a in acts):
            continue
        seeds = min(len(cells[(row, a)]) for row in ("①", "②") for a in acts)
        verdict, text = table_verdict(cells, tiny, replace(design, n_seeds=max(seeds, 2)),
                                      table, None, acts)
        shared = "" if all(own.get(("①", a)) for a in acts) else " (BN: the primary reading's)"
        judged.append((READINGS[name].title + shared, verdict, text))
    return rows, judged
