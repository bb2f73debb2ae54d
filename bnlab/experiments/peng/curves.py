"""Peng, Yu & Yu — Re-thinking the effectiveness of batch normalization and beyond (Complete BN):
Figs 4–5, the training-loss curves of BN (①) and CBN (②) behind Tables 1–4.

Each figure has ResNet-20 and VGG-16 panels; each network's panels are one entry, sharing its runs
with that network's table (:mod:`.tables`, one runs dir): ``peng-fig4`` (ResNet-20, Table 1's
runs), ``peng-fig4-vgg`` (VGG-16, Table 2's), ``peng-fig5`` (ResNet-20, Table 3's),
``peng-fig5-vgg`` (VGG-16, Table 4's). They train nothing of their own. The claim is judged on each
seed's mean training loss over the run (the area under the curve: lower is faster).
"""

from __future__ import annotations

import math

from bnlab.formatting import fmt

from ..base import Experiment, Outcome, Plan, RunSpec, register
from ..readings import combine_readings
from ..verdict_data import Verdict
from ..common import compare_arms, mean_over_run, seed_means
from ..verdicts import holm
from ..run_facts import arm_values
from ..verdicts import RULE as JUDGED_RULE
from ..verdicts import NOT_HELD, Design, explain, family, judge, ladder, settle
from ..resolution import design_resolution
from .common import ACT_TITLE, NON_RELU, ROW_NAMES, TABLE_SMOKE_SEEDS, TABLES, status_note
from .readings import ARGUMENT, READINGS, primary_reading, runs_by_reading
from .tables import (COMPARED, curve_panels, main_arm_runs, phase_reading,
                     reading_runs, settling)
from .verdict import chance, primary_activations

# entry id -> (figure, table): each network's panels of Fig. 4 (CIFAR-10) and Fig. 5 (CIFAR-100)
PANELS = {"peng-fig4": (4, 1), "peng-fig4-vgg": (4, 2),
          "peng-fig5": (5, 3), "peng-fig5-vgg": (5, 4)}


# One entry per network: both networks in one entry would train both tables' compared
# runs, 20–22 min on 2 cores alone, over the catalogue's 15-minute smoke budget, and a
# single verdict would hide which network decided it. Per network an entry costs what its
# table's compared runs cost (5 seeds kept on the primary arms;
# docs/readme/experiments-peng-arora.md).
def _fig_plan(table: int):
    def plan(preset: str) -> Plan:
        # the table's compared runs, shared with it in one runs dir
        return Plan(runs=[RunSpec(f"Table {table} · {r.label}", r.config,
                                  {**r.factors, "table": table})
                          for r in reading_runs(table, preset)])

    return plan


# Figs 4–5 print curves, not numbers: the paper's effect is a direction (CBN lower). Design SD of
# one seed's mean training loss over the run, mean over the Sigmoid/Tanh/SELU panels of both tables:
# 0.1 (the smoke's BN + Sigmoid runs sit near ln 10 ≈ 2.3 for a seed-dependent 5–9 of 15 epochs).
FIG_DESIGN = Design("CBN − BN mean training loss over the run, mean over the panels of the "
                    "table's primary activations (ResNet-20: Sigmoid/Tanh/SELU; VGG-16 in smoke: "
                    "Tanh/SELU)",
                    -1.0, 0.1, len(TABLE_SMOKE_SEEDS),
                    "kept from the 15-epoch smoke (BN + Sigmoid at chance 5–9 of 15 epochs); "
                    "the 40-epoch runs' observed SD is reported beside it",
                    se_floor=1e-3, magnitude_known=False)


def loss_curve_verdict(losses: dict[tuple[int, str], dict[str, list[float]]], tiny: bool = False,
                       design: Design = FIG_DESIGN,
                       primary: dict[int, tuple[str, ...]] | None = None) -> tuple[str, str]:
    """Figs 4–5: CBN's training loss lies below BN's for every activation (one network's panels
    per entry; the function takes any number of tables).

    ``losses[(table, activation)]["①" | "②"]`` = per-seed mean training loss over the run (a
    diverged run at its failure value). Primary (:data:`FIG_DESIGN`, judged by ``verdict.judge``):
    the per-seed mean over the panels of each table's primary activations (``primary[table]``,
    :func:`verdict.primary_activations`; Sigmoid/Tanh/SELU where not given). Secondary, judged
    with Holm's correction over all panels: CBN's loss is nowhere significantly higher ("not held"
    if it is).
    """
    if not losses:
        return ladder(unusable=True), "no runs" + (" (tiny runs)" if tiny else "")
    comps = {key: compare_arms(d.get("①", []), d.get("②", []), se_floor=design.se_floor)
             for key, d in losses.items()}
    adjusted = holm({key: c.p for key, c in comps.items()})
    trio = [d for (t, a), d in sorted(losses.items()) if a in (primary or {}).get(t, NON_RELU)]

    primary = judge(*(seed_means(d.get(row, []) for d in trio) for row in COMPARED), design)
    summary = primary.text(design) + "; per panel, CBN − BN (reported): " + "; ".join(
        f"T{t} {ACT_TITLE.get(a, a)} {c.diff:+.3g}"
        + (f" (p_Holm={adjusted[(t, a)]:.2g})" if adjusted[(t, a)] is not None
           else " (too few seeds)")
        for (t, a), c in sorted(comps.items()) if c.diff is not None)
    against = family(comps, "lower", design.alpha)
    higher = [f"T{t} {ACT_TITLE.get(a, a)}" for (t, a), v in sorted(against.items())
              if v == NOT_HELD]
    verdict = ladder(primary.verdict, unusable=tiny, against=bool(higher))
    return verdict, summary + explain(
        verdict, inconclusive=" (tiny runs)" if tiny else "",
        not_held="; CBN's loss is significantly higher (Holm) in " + ", ".join(higher)
        if higher else "")


def _mean_losses(runs, fraction: float,
                 preset: str = "smoke") -> dict[tuple[int, str], dict[str, list[float]]]:
    """``[(table, activation)][row]`` = per-seed mean training loss over the first ``fraction`` of
    each run; a diverged run counts as ln(classes), the loss of a chance-level classifier of its
    task (ln 10; ln 100 for the paper preset's CIFAR-100): failure, not missing data."""
    losses: dict[tuple[int, str], dict[str, list[float]]] = {}
    for r in runs:
        table = r.factors["table"]
        entry = losses.setdefault((table, r.factors["activation"]),
                                  {}).setdefault(r.factors["row"], [])
        entry.extend(arm_values([r], lambda run: mean_over_run(run, "train_loss", fraction),
                                -math.log(chance(table, preset)))[0])
    return losses


def reading_losses(runs, fraction: float, preset: str,
                   table: int) -> dict[str, dict[tuple[int, str], dict[str, list[float]]]]:
    """:func:`_mean_losses` per reading (the primary first); a reading that changes CBN alone
    (Algorithm 1's order) gets the primary reading's BN (①) values, the same networks and seeds."""
    by_reading = runs_by_reading(runs, table)
    main = primary_reading(table)
    ref = _mean_losses(by_reading[main], fraction, preset)
    out = {}
    for name, members in by_reading.items():
        losses = _mean_losses(members, fraction, preset)
        for key, d in losses.items():
            if "①" not in d and key in ref and name != main:
                d["①"] = ref[key].get("①", [])
        out[name] = losses
    return out


def loss_curve_record(verdict: str, losses, primary: dict[int, tuple[str, ...]],
                      design: Design = FIG_DESIGN) -> Verdict:
    """The structured verdict of Figs 4–5: ``verdict`` with :func:`loss_curve_verdict`'s primary
    comparison on ``losses`` (end of training)."""
    trio = [d for (t, a), d in sorted(losses.items()) if a in primary.get(t, NON_RELU)]
    if not trio:
        return Verdict(verdict, JUDGED_RULE)
    judged = judge(*(seed_means(d.get(row, []) for d in trio) for row in COMPARED), design)
    return Verdict.from_judgement(verdict, judged, design, rule=JUDGED_RULE)


def _fig_analyze(fig: int, table: int):
    def analyze(ctx) -> Outcome:
        reading = phase_reading(ctx)
        losses = reading_losses(ctx.runs, 1.0, ctx.preset, table)
        early = reading_losses(ctx.runs, reading, ctx.preset, table)
        main = primary_reading(table)
        network = TABLES[table]["model"]
        fig_loss = curve_panels(ctx, ctx.figure_path("training_loss"), "train_loss",
                                f"Peng Fig. {fig}, {NETWORK_TITLE[network]}: training loss, BN (①) "
                                f"vs CBN (②), mean over seeds ({ctx.preset})", table)
        rows = [{"quantity": ("" if name == main else f"reading · {READINGS[name].title} · ")
                 + f"mean training loss over the run · Table {t} ({TABLES[t]['what']}) · "
                   f"{ACT_TITLE[a]} · {row} {ROW_NAMES[row]}",
                 "ours": fmt(d.get(row, []), decimals=3),
                 "paper": "CBN below BN in every panel (curves only)"}
                for name, by_panel in losses.items()
                for (t, a), d in sorted(by_panel.items()) for row in COMPARED]
        primary = {table: primary_activations(table, ctx.preset)}
        judged = [(READINGS[name].title, *settle(
            loss_curve_verdict(losses[name], ctx.tiny, primary=primary),
            loss_curve_verdict(early.get(name, {}), ctx.tiny, primary=primary),
            f"{reading:.0%} of training (the mean loss up to there)")) for name in losses]
        verdict, summary = judged[0][1:]
        if len(judged) > 1:  # every reading must agree (the catalogue's rule for readings)
            verdict, summary = combine_readings(judged)
            summary = f"{ARGUMENT}; {summary}"
        summary += settling(main_arm_runs(ctx, table), "train_loss", scale=1.0,
                            fraction=reading)
        return Outcome([fig_loss], rows, verdict, summary + status_note(ctx),
                       loss_curve_record(verdict, losses[main], primary))

    return analyze


NETWORK_TITLE = {"resnet20": "ResNet-20", "vgg16": "VGG-16"}
# the table's compared runs alone in an empty runs dir, 2 workers × 1 thread, idle AVX512 cores
# (`bnlab reproduce all` of 2026-11-28: 5:18 with 10 of 38 runs stored, 8:20, 5:26, 7:24)
# (ResNet-20: the 113 runs of every reading at ≈ 35 s each with one thread, 2026-12-06)
SMOKE_MINUTES = {1: "≈ 33", 2: "≈ 8.5", 3: "≈ 33", 4: "≈ 7.5"}
SMOKE_ARMS = {"resnet20": "5 seeds with Sigmoid/Tanh/SELU, 2 with ReLU/Swish, in He's block (the "
                          "primary reading); the table's other readings (Eq. 7's block, with and "
                          "without a norm before the classifier; Algorithm 1's literal order, CBN "
                          "only) with 5 seeds on Sigmoid/Tanh/SELU, judged by the same rule",
              "vgg16": "5 seeds with Tanh/SELU, 1 with Sigmoid"}

for _id, (_fig, _table) in PANELS.items():
    _network = TABLES[_table]["model"]
    _smoke_runs = len(reading_runs(_table, "smoke"))
    _other = next(i for i, (f, t) in PANELS.items() if f == _fig and t != _table)
    register(Experiment(
        id=_id, paper="peng", target=f"Fig. {_fig} ({NETWORK_TITLE[_network]})",
        title=f"Training loss of BN and CBN, {NETWORK_TITLE[_network]} on "
              f"CIFAR-{10 if _fig == 4 else 100}, five activations",
        claim=f"CBN's training loss falls faster and lower than BN's with every activation "
              f"({NETWORK_TITLE[_network]}'s panels of Fig. {_fig}; the other network's are "
              f"{_other}).",
        smoke_changes=f"the compared runs of peng-table{_table}'s smoke preset (rows ① and ②; "
                      f"{SMOKE_ARMS[_network]}; noisy 16×16 digits, width ½, 40 epochs); the "
                      "claim is judged on the mean training loss over the run (the area under the "
                      "curve: lower = faster), by Welch's t-test.",
        cost={"smoke": f"{_smoke_runs} runs, shared with peng-table{_table} (none retrained in "
                       f"the same runs dir; alone in an empty one {SMOKE_MINUTES[_table]} min on 2 "
                       "cores)",
              "paper": f"{len(reading_runs(_table, 'paper'))} runs, shared with "
                       f"peng-table{_table}"},
        plan=_fig_plan(_table), analyze=_fig_analyze(_fig, _table),
        resolution=design_resolution(FIG_DESIGN)))
