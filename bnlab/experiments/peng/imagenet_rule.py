"""The verdicts on Peng et al.'s ImageNet entries (``peng-table5``, ``peng-fig6``; the runs and
the analysis in ``imagenet.py``): the paper's Table 5, the rule per (network, activation) cell and
the structured verdicts (:class:`~bnlab.experiments.verdict_data.Verdict`)."""

from __future__ import annotations

from bnlab.data.image_writer import GENERATED

from ..common import CATALOGUE_PILOT, RULE, DesignSD, compare_arms
from ..verdicts import COMPARE_RULE
from ..verdict_data import Verdict
from ..verdicts import RULE as JUDGED_RULE
from ..verdicts import (NOT_HELD, conjunction, explain, family, ladder,
                        short_of_effect)
from .common import ACT_TITLE, ACTIVATIONS, NON_RELU
from .verdict import conjunction_record

ARCHS = ("resnet18", "resnet50", "efficientnet_b0")
ARCH_TITLE = {"resnet18": "ResNet-18", "resnet50": "ResNet-50",
              "efficientnet_b0": "EfficientNet-B0"}

# Table 5, top-1 test accuracy (%), columns Sigmoid, Tanh, ReLU, SELU, Swish; one run per cell.
PAPER_TABLE5: dict[str, dict[str, tuple[float, ...]]] = {
    "resnet18": {"BN": (52.03, 64.45, 70.02, 65.46, 70.81),
                 "CBN": (70.15, 70.12, 70.43, 71.10, 71.39)},
    "resnet50": {"BN": (44.38, 69.35, 76.02, 69.68, 76.21),
                 "CBN": (72.82, 73.93, 76.38, 74.69, 76.75)},
    "efficientnet_b0": {"BN": (55.04, 67.95, 73.71, 69.51, 74.61),
                        "CBN": (70.36, 71.47, 74.05, 72.57, 75.08)},
}
# The "Imp." row as printed (checked against CBN − BN in the tests).
PRINTED_IMPROVEMENTS = {"resnet18": (18.12, 5.67, 0.41, 5.64, 0.58),
                        "resnet50": (28.44, 4.58, 0.36, 5.01, 0.54),
                        "efficientnet_b0": (15.32, 3.52, 0.34, 3.06, 0.47)}


def paper_gain(arch: str, activation: str) -> float:
    """CBN − BN of Table 5 in points for one cell."""
    i = ACTIVATIONS.index(activation)
    return PAPER_TABLE5[arch]["CBN"][i] - PAPER_TABLE5[arch]["BN"][i]



def _cell_text(arch: str, act: str) -> str:
    return f"{ARCH_TITLE[arch]}/{ACT_TITLE[act]}"


def cell_comparisons(cells: dict, archs: list[str], design_sd: float | None = None,
                     n_test: int | None = None) -> dict:
    """CBN − BN per (network, activation) cell by ``compare_arms`` (Welch, α = 0.05, ≥ 3 seeds),
    its resolvable effect from ``design_sd`` when given, its SE floored at the binomial SE on
    ``n_test`` validation images when given (accuracies)."""
    return {(arch, act): compare_arms(cells.get((arch, "BN", act), []),
                                      cells.get((arch, "CBN", act), []), design_sd=design_sd,
                                      n_test=n_test)
            for arch in archs for act in ACTIVATIONS}


# Validation images a top-1 accuracy is counted on: the generated gratings folder's (10 classes ×
# 30) in smoke, ILSVRC2012's 50,000 in paper. The binomial floor on the SE (rule 3).
VAL_IMAGES = {"smoke": GENERATED["classes"] * GENERATED["val_per_class"], "paper": 50_000}


# Design SD of one seed's top-1 (fraction): the root-mean-square over the five activations of the
# pooled per-arm SD of CBN − BN in the pilot (0.20, 0.35, 0.18, 0.37, 0.029; diverged seeds count
# as chance, 10 %), so the cells' resolvable effect is fixed before the runs.
TABLE5_DESIGN_SD = DesignSD(0.26, CATALOGUE_PILOT + ", RMS over the 5 activations")


def table5_verdict(cells: dict[tuple[str, str, str], list[float]], tiny: bool = False,
                   design_sd: DesignSD = TABLE5_DESIGN_SD,
                   n_test: int | None = VAL_IMAGES["smoke"]) -> tuple[str, str]:
    """Verdict on Table 5 from final top-1 accuracies (fractions) per (arch, arm, activation), one
    per seed.

    Claim: CBN's top-1 accuracy is higher than BN's with every activation in every network, by
    several points with Sigmoid, Tanh and SELU (paper: +3.1 to +28.4) and by less than a point with
    ReLU and Swish. Rule (:data:`RULE`) per (network, activation) cell: `compare_arms` (CBN − BN;
    Welch, α = 0.05, ≥ 3 seeds per arm, the SE floored at the binomial SE on ``n_test`` validation
    images, the resolvable effect from ``design_sd``, :data:`TABLE5_DESIGN_SD`, stated in advance).
    "not held": some cell against the claim after Holm's correction over the cells — CBN
    significantly lower (:func:`verdicts.family`), or the 95 % CI short of the paper's gain
    (:func:`verdicts.short_of_effect`: the data reject a gain of the paper's size). "held": every
    Sigmoid/Tanh/SELU cell significantly higher and no cell against the claim (a ReLU/Swish cell
    may be below resolution). Otherwise — a Sigmoid/Tanh/SELU cell not significantly higher, too
    few seeds, or tiny runs — "inconclusive", naming the effect the design could resolve. Primary,
    pre-declared: CBN − BN top-1 in every Sigmoid/Tanh/SELU cell, higher (a conjunction).

    Without a design SD, a cell with no detectable difference counted against the claim when
    the minimum detectable effect computed from *these seeds' own scatter* was below the paper's
    gain (a "precise null"): three seeds that happened to agree, with no floor on the SE, were
    enough.
    """
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    if not archs:
        return ladder(unusable=True), "no finished runs" + (" (tiny runs)" if tiny else "")
    lines, against, unresolved = [], [], []
    comps = cell_comparisons(cells, archs, design_sd.of(), n_test)
    lower = family(comps, "higher")
    short = short_of_effect(comps, {key: paper_gain(*key) / 100 for key in comps})
    for arch in archs:
        for act in ACTIVATIONS:
            comp = comps[(arch, act)]
            gain = paper_gain(arch, act)
            lines.append(f"{_cell_text(arch, act)} {comp.text(100)} [paper {gain:+.2f}]")
            if lower[(arch, act)] == NOT_HELD or short[(arch, act)]:
                against.append(_cell_text(arch, act)
                               + (" (lower)" if lower[(arch, act)] == NOT_HELD
                                  else f" (95 % CI short of {gain:+.2f})"))
            elif comp.decision != "higher" and (act in NON_RELU
                                                or comp.decision == "too few seeds"):
                unresolved.append(f"{_cell_text(arch, act)} (resolvable ≥ "
                                  + (f"{100 * comp.mde:.2g}" if comp.mde is not None else "—")
                                  + f" vs paper {gain:+.2f} points)")
    floor = f", SE floored on {n_test} validation images" if n_test else ""
    summary = ("top-1 gain of CBN over BN, points: " + "; ".join(lines) + f". Rule: {JUDGED_RULE}; "
               f"resolvable effects at the {design_sd.text(100, ' points')}{floor}.")
    verdict = ladder(True if not unresolved else None, unusable=tiny, against=bool(against))
    return verdict, summary + explain(
        verdict, not_held=" Against the claim (Holm over the cells): " + ", ".join(against) + ".",
        inconclusive=" (tiny runs: a few steps each)" if tiny
        else " Not resolved: " + ", ".join(unresolved) + ".",
        held=" CBN is significantly better with Sigmoid, Tanh and SELU and nowhere worse.")


# Design SD of one seed's mean training loss (nats): the root-mean-square over the five activations
# of the pooled per-arm SD of CBN − BN in the pilot (0.22, 0.68, 0.32, 0.38, 0.15; diverged seeds
# count as ln 10).
FIG6_DESIGN_SD = DesignSD(0.39, CATALOGUE_PILOT + ", RMS over the 5 activations")


def fig6_verdict(cells: dict[tuple[str, str, str], list[float]], tiny: bool = False,
                 design_sd: DesignSD = FIG6_DESIGN_SD) -> tuple[str, str]:
    """Verdict on Fig. 6 from each run's mean training loss per (arch, arm, activation), one per
    seed.

    Claim (§6.2): CBN's training loss converges faster than BN's, consistently (every network, every
    activation). Rule per cell: `compare_arms` on the mean training loss (CBN − BN; Welch, α =
    0.05). "not held": CBN's mean loss significantly higher in some cell; "held": significantly
    lower in every cell; otherwise (a cell without a significant difference — the mde is stated —,
    too few seeds or tiny runs) "inconclusive". Fig. 6 prints curves only, so there is no paper
    effect size to compare the mde with. Primary, pre-declared: CBN − BN mean training loss in every
    cell, lower (:func:`verdicts.conjunction`: "significantly higher" judged with Holm's correction
    over the cells). Resolvable effects at ``design_sd`` (:data:`FIG6_DESIGN_SD`).
    """
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    if not archs:
        return ladder(unusable=True), "no finished runs" + (" (tiny runs)" if tiny else "")
    lines, higher, unresolved = [], [], []
    comps = cell_comparisons(cells, archs, design_sd.of())
    holm_outcome = family(comps, "lower")
    for arch in archs:
        for act in ACTIVATIONS:
            comp = comps[(arch, act)]
            lines.append(f"{_cell_text(arch, act)} {comp.text()}")
            if holm_outcome[(arch, act)] == NOT_HELD:
                higher.append(_cell_text(arch, act))
            elif comp.decision != "lower":
                unresolved.append(_cell_text(arch, act)
                                  + (f" (resolvable ≥ {comp.mde:.2g})" if comp.mde is not None
                                     else " (too few seeds)"))
    summary = ("mean training loss of CBN minus BN over the run: " + "; ".join(lines)
               + f". Rule: {RULE}; resolvable effects at the {design_sd.text()}.")
    verdict = ladder(conjunction(comps, "lower"), unusable=tiny)
    return verdict, summary + explain(
        verdict, not_held=" CBN converges slower (Holm) in: " + ", ".join(higher) + ".",
        inconclusive=" (tiny runs: a few steps each)" if tiny
        else " Not resolved: " + ", ".join(unresolved) + ".",
        held=" CBN's training loss is significantly lower in every cell.")


def table5_record(verdict: str, cells: dict[tuple[str, str, str], list[float]],
                  design_sd: DesignSD = TABLE5_DESIGN_SD,
                  n_test: int | None = VAL_IMAGES["smoke"]) -> Verdict:
    """The structured verdict of Table 5: CBN − BN top-1 (points) in the cell the verdict rests on
    (:func:`table5_verdict`'s checks: against where lower or short of the paper's gain, Holm;
    held where a Sigmoid/Tanh/SELU cell is significantly higher), the paper's gain beside it."""
    archs = sorted({a for a, _, _ in cells}, key=ARCHS.index)
    comps = cell_comparisons(cells, archs, design_sd.of(), n_test)
    lower = family(comps, "higher")
    short = short_of_effect(comps, {key: paper_gain(*key) / 100 for key in comps})
    against = {k for k in comps if lower[k] == NOT_HELD or short[k]}
    outcome = {k: ladder(c.decision == "higher" or None, against=k in against)
               for k, c in comps.items() if k[1] in NON_RELU or k in against}
    return conjunction_record(verdict, comps, "higher",
                              lambda k: f"CBN − BN top-1, {_cell_text(*k)}",
                              paper={k: paper_gain(*k) / 100 for k in comps}, scale=100,
                              unit=" pt", outcome=outcome)


def fig6_record(verdict: str, cells: dict[tuple[str, str, str], list[float]],
                design_sd: DesignSD = FIG6_DESIGN_SD) -> Verdict:
    """The structured verdict of Fig. 6: CBN − BN mean training loss in the cell the verdict
    rests on (:func:`fig6_verdict`'s conjunction over every cell)."""
    archs = sorted({a for a, _, _ in cells if a in ARCHS}, key=ARCHS.index)
    if not archs:
        return Verdict(verdict, COMPARE_RULE)
    return conjunction_record(verdict, cell_comparisons(cells, archs, design_sd.of()), "lower",
                              lambda k: f"CBN − BN mean training loss, {_cell_text(*k)}",
                              paper="lower (direction only)")
