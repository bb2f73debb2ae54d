"""Peng, Yu & Yu — Re-thinking the effectiveness of batch normalization and beyond (Complete BN,
CBN).

Entries: ``peng-table1`` … ``peng-table4`` (the seven-row ablation of Tables 1–4) and ``peng-fig4``
/ ``peng-fig5`` (their training-loss curves, Figs 4–5) here; ``peng-table6`` and ``peng-fig7``
(CBN's components, §6.3) in ``components.py``; ``peng-fig2`` (η_k and τ_k, Figs 2–3), ``peng-fig8``
(ρ sensitivity, §6.4, Figs 8–9) and ``peng-fig10`` (AMAT's gradient variance, §6.5) in
``figures.py``; the rows, the paper's numbers and the recipes in ``common.py``.

Rows ①–⑦ of Tables 1–4 as ``bnlab`` norm specs (checked against the tables' feature columns "Before
Opera." / "Decouple" / "Tune ρ" / "AMAT"):

=====  ==========================================  ===============  =========================
row    features                                    norm             placement
=====  ==========================================  ===============  =========================
①      BN (baseline)                               ``bn``           ``pre_activation``
②      before linear, decouple, ρ*, AMAT (CBN)     ``cbn(rho=ρ*, amat=true)``  ``pre_linear``
③      before linear                               ``cbn(decouple=false, amat=false)``  ``pre_linear``
④      before linear, decouple                     ``cbn(amat=false)``  ``pre_linear``
⑤      before linear, decouple, ρ*                 ``cbn(rho=ρ*, amat=false)``  ``pre_linear``
⑥      ρ*                                          ``cbn(decouple=false, rho=ρ*, amat=false)``  ``pre_activation``
⑦      ρ*, AMAT                                    ``cbn(decouple=false, rho=ρ*, amat=true)``  ``pre_activation``
=====  ==========================================  ===============  =========================

ρ* (the tuned ρ per activation): the paper does not print it. §6.4 says the best ρ for Sigmoid is below
1 and that the best ρ of ReLU, Tanh and Sigmoid "become larger in order"; on the paper's grid
{0.25, 0.5, 1, 2, 4, 8} three strictly increasing values below 1 do not exist, and the explanation given
(Sigmoid's outputs are the smallest) points the other way, so we read the order as ReLU > Tanh > Sigmoid
and take ρ* = 0.5 (Sigmoid), 1 (Tanh), 2 (ReLU, and the ReLU-like SELU and Swish, on which §6.4 finds
CBN insensitive to ρ). ``peng-fig8`` measures the sensitivity this choice leans on.
"""

from __future__ import annotations

import math

from bnlab.plots import bars

from ..base import Experiment, Outcome, Plan, RunSpec, register
from bnlab.formatting import fmt, mean_std
from ..common import (compare_arms, grouped_finals, mean_curve, mean_over_run, safe_panels,
                      SETTLE_FRACTION, smooth, value_at_fraction)
from .verdict import CHANCE, table_design, table_verdict
from ..rule_stats import arm_values, holm, settle_fraction
from ..verdicts import NOT_HELD, Design, explain, family, judge, ladder, settle
from .common import (ACT_TITLE, ACTIVATIONS, NON_RELU, PAPER_TABLES, PAPER_TRIALS, ROW_FEATURES,
                          ROW_NAMES, ROWS, SMOKE_SEEDS, SMOKE_WIDTH, TABLES, _base, _pct, _run,
                          _status_note,
                          padding_shares, row_spec)

COMPARED = ("①", "②")  # the rows the tables' claim compares (BN, CBN)

# ---- Tables 1–4 ----------------------------------------------------------------------------------


# He's block form as a smoke side arm for the bounded activations, where the two forms differ most
# (He's squashes the running sum through the activation at every block).
SIDE_ACTIVATIONS = ("sigmoid", "tanh")


def _compared_runs(table: int, preset: str, rows=COMPARED, residual: str = "peng",
                   activations=ACTIVATIONS) -> list[RunSpec]:
    spec = TABLES[table]
    base = _base(spec["model"], spec["data"], preset, residual)
    seeds = range(PAPER_TRIALS) if preset == "paper" else SMOKE_SEEDS
    if residual != "peng":
        seeds = seeds[:1]
    form = residual if spec["model"] == "resnet20" else None
    tag = " · He's block" if residual != "peng" else ""
    runs = []
    for act in activations:
        for row in rows:
            norm, placement = row_spec(row, act)
            for seed in seeds:
                runs.append(RunSpec(f"{row} {ROW_NAMES[row]} · {ACT_TITLE[act]}{tag} · seed {seed}",
                                    _run(base, norm=norm, placement=placement, activation=act, seed=seed),
                                    {"row": row, "activation": act, "seed": seed, "norm": norm,
                                     "placement": placement, "residual": form}))
    return runs


def _table_plan(table: int):
    def plan(preset: str) -> Plan:
        if preset == "paper":
            return Plan(runs=_compared_runs(table, preset, ROWS))
        # smoke spends its budget on the compared rows ① and ② (3 seeds each); rows ③–⑦ run in the
        # paper preset. The ResNet tables add He's block form (activation after the shortcut sum) as
        # a side arm.
        runs = _compared_runs(table, preset)
        if TABLES[table]["model"] == "resnet20":
            runs += _compared_runs(table, preset, residual="he", activations=SIDE_ACTIVATIONS)
        model = TABLES[table]["model"]

        def shares(tiny: bool = False) -> dict:
            return padding_shares(model, {"width": SMOKE_WIDTH[model]}, n=16 if tiny else 128)

        return Plan(runs=runs, compute={"padding_shares": shares})

    return plan


def _cells_at(arms: dict[tuple, list], fraction: float,
              metric: str = "test_accuracy") -> dict[tuple[str, str], list[float]]:
    """Per (row, activation): each run's ``metric`` at ``fraction`` of its training (1: its final
    value); a diverged run (or a non-finite value) counts as chance accuracy
    (``verdict.arm_values``: failure of the arm, not missing data); crashed runs are left out."""
    cells: dict[tuple[str, str], list[float]] = {}

    def read(r):
        return r.final(metric) if fraction >= 1 else value_at_fraction(r.series(metric), fraction)

    for (_, row, act), runs in arms.items():
        cells.setdefault((row, act), []).extend(arm_values(runs, read, CHANCE)[0])
    return cells


def _phase_reading(ctx) -> float:
    """Where the settling rule reads the table again: halfway through the final lr phase of the
    recipe."""
    runs = ctx.experiment.plan(ctx.preset).runs
    return settle_fraction(runs[0].config) if runs else SETTLE_FRACTION


def _side_rows(cells: dict, main: dict) -> list[dict]:
    """He's block form vs Eq. 7's (ResNet tables): one seed each, shown, not judged."""
    rows = []
    for (row, act, form), values in sorted(cells.items(), key=lambda kv: (ACTIVATIONS.index(kv[0][1]), kv[0][0])):
        if form != "he":
            continue
        mean, _ = mean_std(values)
        peng_mean, _ = mean_std(main.get((row, act), []))
        rows.append({"quantity": f"side arm · {row} {ROW_NAMES[row]} · {ACT_TITLE[act]} · He's block (act after sum)",
                     "ours": fmt(_pct(mean), n=len(values), decimals=2),
                     "paper": f"Eq. 7's form (main rows): {fmt(_pct(peng_mean), decimals=2)}"})
    return rows


def _table_analyze(table: int):
    spec = TABLES[table]

    def analyze(ctx) -> Outcome:
        by_form = grouped_finals(ctx, ("row", "activation", "residual"), "test_accuracy")
        cells: dict[tuple[str, str], list[float]] = {}
        for (row, act, form), values in by_form.items():
            if form != "he":
                cells.setdefault((row, act), []).extend(values)
        paper = PAPER_TABLES[table]
        rows, ours_bars, ours_err, paper_bars = [], {}, {}, {}
        for i, act in enumerate(ACTIVATIONS):
            ours_bars[ACT_TITLE[act]], ours_err[ACT_TITLE[act]], paper_bars[ACT_TITLE[act]] = {}, {}, {}
            for row in ROWS:
                values = cells.get((row, act), [])
                mean, std = mean_std(values)
                pm, ps = paper[row][i]
                rows.append({"quantity": f"{row} {ROW_NAMES[row]} · {ACT_TITLE[act]}",
                             "ours": fmt(_pct(mean), std=_pct(std), n=len(values), decimals=2)
                             if values else "— (paper preset only)",
                             "paper": fmt(pm, std=ps, decimals=2)
                             + (f" (n={PAPER_TRIALS})" if ps is not None else " (std unreadable)"),
                             "features": "/".join("✓" if f else "-" for f in ROW_FEATURES[row])})
                ours_bars[ACT_TITLE[act]][row] = _pct(mean) if mean is not None else float("nan")
                ours_err[ACT_TITLE[act]][row] = _pct(std) or 0.0
                paper_bars[ACT_TITLE[act]][row] = pm
        rows += _side_rows(by_form, cells)
        rows += _proxy_rows(ctx)
        fig_ours = bars(ctx.figure_path("test_accuracy_ours"), ours_bars, errors=ours_err, ylabel="test accuracy (%)",
                        title=f"Peng {spec['target']} (ours, {ctx.preset}): rows per activation, mean ± std over seeds")
        fig_paper = bars(ctx.figure_path("test_accuracy_paper"), paper_bars, ylabel="test accuracy (%)",
                         title=f"Peng {spec['target']} as printed ({spec['what']}, 10 trials)")
        fig_curves = _curves(ctx, ctx.figure_path("test_accuracy_curves"), "test_accuracy",
                             f"Test accuracy during training, BN (①) vs CBN (②), mean over seeds ({ctx.preset})")
        arms = _arm_runs(ctx)
        reading = _phase_reading(ctx)
        verdict, summary = settle(table_verdict(_cells_at(arms, 1.0), ctx.tiny, table_design(table, ctx.preset)),
                                  table_verdict(_cells_at(arms, reading), ctx.tiny, table_design(table, ctx.preset)),
                                  f"{reading:.0%} of training (inside the final lr phase)")
        summary += settling(arms, "test_accuracy", fraction=reading)
        return Outcome([fig_ours, fig_paper, fig_curves], rows, verdict, summary + _status_note(ctx))

    return analyze


def _arm_runs(ctx, table: int | None = None) -> dict[tuple, list]:
    """(table, row, activation) -> the runs of the compared rows in Eq. 7's form (the main arms)."""
    arms: dict[tuple, list] = {}
    for r in ctx.runs:
        if r.factors.get("row") in COMPARED and r.factors.get("residual") != "he":
            arms.setdefault((r.factors.get("table", table), r.factors["row"], r.factors["activation"]), []).append(r)
    return arms


def _proxy_rows(ctx) -> list[dict]:
    shares = (ctx.data or {}).get("padding_shares") or {}
    return [{"quantity": f"padding-pattern share of the norms' input variance at init · {arm} · {size} input",
             "ours": ", ".join(f"{k} maps {v:.2f}" for k, v in by_map.items()),
             "paper": "CIFAR is 32×32 (digits 8×8 made 2×2 deep maps, all border)"}
            for arm, by_size in shares.items() for size, by_map in by_size.items()]


def _curves(ctx, path, metric: str, title: str):
    arms = _arm_runs(ctx)
    specs = []
    for key in sorted({k[0] for k in arms}, key=lambda t: (t is None, t)):
        for act in ACTIVATIONS:
            series = {}
            for row in COMPARED:
                runs = arms.get((key, row, act), [])
                if runs:
                    series[f"{row} {ROW_NAMES[row]} (n={len(runs)})"] = smooth(*mean_curve(runs, metric))
            specs.append({"series": series, "xlabel": "step", "ylabel": metric, "logy": metric.endswith("loss"),
                          "title": ACT_TITLE[act] + (f" · Table {key}" if key is not None else "")})
    return safe_panels(path, specs, title=title, ncols=5)


def settling(arms: dict[tuple, list], metric: str, scale: float = 100.0, fraction: float = SETTLE_FRACTION) -> str:
    """How far the compared quantity still moved: ``; ② − ① in <metric> at <fraction> of training →
    at the end: …`` (mean curves over seeds; ``scale`` 100 gives points). A gap that changes little
    over the last third has settled; the figure shows the whole curves."""
    parts = []
    for table, act in sorted({(k[0], k[2]) for k in arms}, key=lambda k: (k[0] is None, k[0] or 0,
                                                                         ACTIVATIONS.index(k[1]))):
        bn, cbn = arms.get((table, "①", act)), arms.get((table, "②", act))
        if not bn or not cbn:
            continue
        a, b = mean_curve(bn, metric), mean_curve(cbn, metric)
        ends = [(value_at_fraction(b, f), value_at_fraction(a, f)) for f in (fraction, 1.0)]
        if any(x is None or y is None for x, y in ends):
            continue
        label = ACT_TITLE[act] + (f" (T{table})" if table is not None else "")
        parts.append(f"{label} {scale * (ends[0][0] - ends[0][1]):+.1f} → {scale * (ends[1][0] - ends[1][1]):+.1f}")
    return f"; ② − ① in {metric} at {fraction:.0%} of training → at the end: " + ", ".join(parts) if parts else ""


_TABLE_CLAIM = ("CBN (②: normalization moved in front of the linear layer, mean removal decoupled from the ℓ2 "
                "scaling, tuned ρ, AMAT) beats vanilla BN (①) with every activation, by the most where the "
                "activation is least like ReLU (Sigmoid, Tanh, SELU); rows ③–⑦ add one feature at a time.")
_TABLE_SMOKE = ("digits upsampled to 16×16 (10 classes) instead of CIFAR, {model} at width {width:g}{form}, {steps} "
                "steps with the lr ÷10 for the last {last} (so AMAT acts), rows ① and ② only with 3 seeds each "
                "(compared by Welch's t-test; rows ③–⑦ run in the paper preset){side}{extra}. The report lists the "
                "padding-pattern share of the norms' input variance at 8×8, 16×16 and 32×32.")


def _register_table(table: int) -> None:
    spec = TABLES[table]
    c100 = spec["data"] == "cifar100"
    extra = ("; half the digits go to the test split as a harder stand-in for CIFAR-100 (digits has 10 classes, "
             "not 100)") if c100 else ""
    resnet = spec["model"] == "resnet20"
    register(Experiment(
        id=f"peng-table{table}", paper="peng", target=spec["target"],
        title=f"BN vs CBN and its ablations, {spec['what']}, five activations",
        claim=_TABLE_CLAIM,
        smoke_changes=_TABLE_SMOKE.format(
            model=spec["model"], width=SMOKE_WIDTH[spec["model"]], steps=176 if c100 else 180, last=32 if c100 else 36,
            form=" in Peng's block form (Eq. 7: activation before the shortcut sum) for BN and CBN alike" if resnet
            else "", side="; side arm: rows ① and ② in He's block form with Sigmoid and Tanh, 1 seed" if resnet else "",
            extra=extra),
        cost={"smoke": (f"{34 if resnet else 30} runs, ≈{'11' if resnet else '7'} min on 2 CPU cores (estimated from "
                        "the step cost uncontended; not measured end to end)"),
              "paper": f"350 runs (7 rows × 5 activations × 10 trials) × 120 epochs of {spec['what']} (GPU; "
                       f"≈ {'0.5' if resnet else '1'} GPU-hour each)"},
        plan=_table_plan(table), analyze=_table_analyze(table)))


for _t in TABLES:
    _register_table(_t)


# ---- Figs 4–5: training-loss curves of BN and CBN ------------------------------------------------

FIGURES = {4: (1, 2), 5: (3, 4)}  # Fig. 4: CIFAR-10 (Tables 1, 2); Fig. 5: CIFAR-100 (Tables 3, 4)


def _fig_plan(fig: int):
    def plan(preset: str) -> Plan:
        runs = []
        for table in FIGURES[fig]:  # the tables' compared runs, shared with them in one runs dir
            runs += [RunSpec(f"Table {table} · {r.label}", r.config, {**r.factors, "table": table})
                     for r in _compared_runs(table, preset)]
        return Plan(runs=runs)

    return plan


# Figs 4–5 print curves, not numbers: the paper's effect is a direction (CBN lower). Design SD of
# one seed's mean training loss over the run, mean over the Sigmoid/Tanh/SELU panels of both tables:
# 0.1 (the smoke's BN + Sigmoid runs sit near ln 10 ≈ 2.3 for a seed-dependent 5–9 of 15 epochs;
# issue 19).
FIG_DESIGN = Design("CBN − BN mean training loss over the run, mean over the Sigmoid/Tanh/SELU panels of both tables",
                    -1.0, 0.1, len(SMOKE_SEEDS),
                    "issue-19 re-run of the smoke: BN + Sigmoid at chance 5–9 of 15 epochs",
                    se_floor=1e-3, magnitude_known=False)


def loss_curve_verdict(losses: dict[tuple[int, str], dict[str, list[float]]], tiny: bool = False,
                       design: Design = FIG_DESIGN) -> tuple[str, str]:
    """Figs 4–5: CBN's training loss lies below BN's for every activation, on both networks.

    ``losses[(table, activation)]["①" | "②"]`` = per-seed mean training loss over the run (a
    diverged run at its failure value). Primary (:data:`FIG_DESIGN`, judged by ``verdict.judge``):
    the per-seed mean over the Sigmoid/Tanh/SELU panels. Secondary, judged with Holm's correction
    over all panels: CBN's loss is nowhere significantly higher ("not held" if it is).
    """
    if not losses:
        return ladder(unusable=True), "no runs" + (" (tiny runs)" if tiny else "")
    comps = {key: compare_arms(d.get("①", []), d.get("②", []), se_floor=design.se_floor) for key, d in losses.items()}
    adjusted = holm({key: c.p for key, c in comps.items()})
    trio = [d for (t, a), d in sorted(losses.items()) if a in NON_RELU]

    def per_seed(row):
        lists = [d.get(row, []) for d in trio]
        n = min((len(v) for v in lists), default=0)
        return [sum(v[i] for v in lists) / len(lists) for i in range(n)]

    primary = judge(per_seed("①"), per_seed("②"), design)
    summary = primary.text(design) + "; per panel, CBN − BN (reported): " + "; ".join(
        f"T{t} {ACT_TITLE.get(a, a)} {c.diff:+.3g}" + (f" (p_Holm={adjusted[(t, a)]:.2g})"
                                                       if adjusted[(t, a)] is not None else " (too few seeds)")
        for (t, a), c in sorted(comps.items()) if c.diff is not None)
    against = family(comps, "lower", design.alpha)
    higher = [f"T{t} {ACT_TITLE.get(a, a)}" for (t, a), v in sorted(against.items())
              if v == NOT_HELD]
    verdict = ladder(primary.verdict, unusable=tiny, against=bool(higher))
    return verdict, summary + explain(
        verdict, inconclusive=" (tiny runs)" if tiny else "",
        not_held="; CBN's loss is significantly higher (Holm) in " + ", ".join(higher)
        if higher else "")


def _mean_losses(runs, fraction: float) -> dict[tuple[int, str], dict[str, list[float]]]:
    """``[(table, activation)][row]`` = per-seed mean training loss over the first ``fraction`` of
    each run; a diverged run counts as ln 10 (the loss of a chance-level ten-class classifier:
    failure, not missing data)."""
    losses: dict[tuple[int, str], dict[str, list[float]]] = {}
    for r in runs:
        entry = losses.setdefault((r.factors["table"], r.factors["activation"]), {}).setdefault(r.factors["row"], [])
        entry.extend(arm_values([r], lambda run: mean_over_run(run, "train_loss", fraction), math.log(10))[0])
    return losses


def _fig_analyze(fig: int):
    def analyze(ctx) -> Outcome:
        reading = _phase_reading(ctx)
        losses, early = _mean_losses(ctx.runs, 1.0), _mean_losses(ctx.runs, reading)
        fig_loss = _curves(ctx, ctx.figure_path("training_loss"), "train_loss",
                           f"Peng Fig. {fig}: training loss, BN (①) vs CBN (②), mean over seeds ({ctx.preset})")
        rows = [{"quantity": f"mean training loss over the run · Table {t} ({TABLES[t]['what']}) · {ACT_TITLE[a]} · "
                             f"{row} {ROW_NAMES[row]}",
                 "ours": fmt(d.get(row, []), decimals=3),
                 "paper": "CBN below BN in every panel (curves only)"}
                for (t, a), d in sorted(losses.items()) for row in COMPARED]
        verdict, summary = settle(loss_curve_verdict(losses, ctx.tiny), loss_curve_verdict(early, ctx.tiny),
                                  f"{reading:.0%} of training (the mean loss up to there)")
        summary += settling(_arm_runs(ctx), "train_loss", scale=1.0, fraction=reading)
        return Outcome([fig_loss], rows, verdict, summary + _status_note(ctx))

    return analyze


for _fig, (_a, _b) in FIGURES.items():
    register(Experiment(
        id=f"peng-fig{_fig}", paper="peng", target=f"Fig. {_fig}",
        title=f"Training loss of BN and CBN, ResNet-20 and VGG-16 on CIFAR-{10 if _fig == 4 else 100}, five activations",
        claim="CBN's training loss falls faster and lower than BN's with every activation, on both networks.",
        smoke_changes=f"the compared runs of peng-table{_a} and peng-table{_b}'s smoke presets (rows ① and ②, 3 seeds, "
                      "digits at 16×16); the claim is judged on the mean training loss over the run (the area under "
                      "the curve: lower = faster), by Welch's t-test.",
        cost={"smoke": f"60 runs, shared with peng-table{_a}/{_b} (none retrained in the same runs dir)",
              "paper": f"100 runs, shared with peng-table{_a}/{_b}"},
        plan=_fig_plan(_fig), analyze=_fig_analyze(_fig)))

