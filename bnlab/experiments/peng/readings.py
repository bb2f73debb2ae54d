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

from dataclasses import dataclass, replace

from bnlab.formatting import fmt

from ..rule_stats import arm_values
from ..verdicts import Design
from .common import ACT_TITLE, NON_RELU, TABLES, TABLE_SMOKE_SEEDS, percent
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
# the smoke's other readings: their rows and seeds (the CPU budget: 5 seeds where a verdict flips)
SIDE = {"eq7": (("①", "②"), TABLE_SMOKE_SEEDS),
        "eq7_head": (("①", "②"), TABLE_SMOKE_SEEDS[:3]),
        "he_literal": (("②",), TABLE_SMOKE_SEEDS[:2])}


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


def mechanism(runs_by_reading: dict[str, list]) -> str:
    """Per reading, per activation: the CBN (②) runs' smallest var/(var + β²), median over seeds."""
    parts = []
    for name, runs in runs_by_reading.items():
        cells = []
        for act in NON_RELU:
            shares = sorted(v for r in runs if r.factors.get("row") == "②"
                            and r.factors.get("activation") == act
                            and (v := var_share(r)) is not None)
            if shares:
                cells.append(f"{ACT_TITLE[act]} {fmt(shares[len(shares) // 2])}")
        if cells:
            parts.append(f"{READINGS[name].title}: {', '.join(cells)}")
    if not parts:
        return ""
    return ("; mechanism, CBN's smallest var_B/(var_B + β²) over its layers at the end (median "
            "over seeds; near 0 = β-swamped): " + "; ".join(parts))


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


def reading_report(runs, table: int, failed: float, tiny: bool, design: Design,
                   primary_verdict: str) -> tuple[list[dict], str]:
    """The other readings beside the primary one: per reading and activation, BN and CBN test
    accuracy (rows), each reading's verdict by the primary's rule (:func:`verdict.table_verdict`
    over the Sigmoid/Tanh/SELU it ran, the design's seeds set to its own), "reading-dependent"
    where a verdict differs from the primary's, and the mechanism (:func:`mechanism`)."""
    by_reading = runs_by_reading(runs, table)
    main = primary_reading(table)
    rows, texts, flips = [], [], []
    for name, members in by_reading.items():
        if name == main or not members:
            continue
        cells = cells_of(members, failed)
        acts = tuple(a for a in NON_RELU if cells.get(("②", a)))
        for act in acts:
            bn, cbn = cells.get(("①", act), []), cells[("②", act)]
            ref = cells_of([r for r in by_reading[main] if r.factors["activation"] == act],
                           failed)
            other = bn or ref.get(("①", act), [])
            rows.append({"quantity": f"reading · {READINGS[name].title} · {ACT_TITLE[act]} · "
                                     "① BN / ② CBN (%)",
                         "ours": f"{fmt([percent(v) for v in other], decimals=1)} / "
                                 f"{fmt([percent(v) for v in cbn], decimals=1)}"
                                 + ("" if bn else " (BN: the primary reading's)"),
                         "paper": "ResNet-20 of the paper (reading not stated)"})
        if not acts:
            continue
        if all(cells.get(("①", a)) for a in acts):
            seeds = min(len(cells[(row, a)]) for row in ("①", "②") for a in acts)
            verdict, text = table_verdict(cells, tiny, replace(design, n_seeds=max(seeds, 2)),
                                          table, None, acts)
            texts.append(f"{READINGS[name].title}: {verdict} ({text})")
            if verdict != primary_verdict:
                flips.append(READINGS[name].title)
        else:  # a CBN-only reading: against the primary reading's CBN on the same seeds
            ref = cells_of([r for r in by_reading[main] if r.factors["row"] == "②"], failed)
            texts.append(f"{READINGS[name].title}: CBN " + ", ".join(
                f"{ACT_TITLE[a]} {fmt(percent(_mean(cells[('②', a)])), decimals=1)} "
                f"(primary reading {fmt(percent(_mean(ref.get(('②', a), []))), decimals=1)})"
                for a in acts) + " %, reported")
    if not texts:
        return rows, ""
    summary = f"; {ARGUMENT}; other readings, same rule: " + "; ".join(texts)
    if flips:
        summary += (f"; reading-dependent: the verdict differs under {', '.join(flips)} (both "
                    "numbers above)")
    return rows, summary + mechanism(by_reading)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
