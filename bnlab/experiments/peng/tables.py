"""Peng, Yu & Yu — Re-thinking the effectiveness of batch normalization and beyond (Complete BN,
CBN).

Entries: ``peng-table1`` … ``peng-table4`` (the seven-row ablation of Tables 1–4) here;
``peng-fig4`` / ``peng-fig5`` (their training-loss curves, Figs 4–5) in ``curves.py``;
``peng-table6`` and ``peng-fig7``
(CBN's components, §6.3) in ``components.py``; ``peng-fig2`` (η_k and τ_k, Figs 2–3), ``peng-fig8``
(ρ sensitivity, §6.4, Figs 8–9) and ``peng-fig10`` (AMAT's gradient variance, §6.5) in
``figures.py``; the rows, the paper's numbers and the recipes in ``common.py``.

Rows ①–⑦ of Tables 1–4 as ``bnlab`` norm specs (checked against the tables' feature columns "Before
Opera." / "Decouple" / "Tune ρ" / "AMAT"):

=====  =================================  ======================================  ==============
row    features                           norm (``cbn(…)`` options)               placement
=====  =================================  ======================================  ==============
①      BN (baseline)                      ``bn``                                  pre_activation
②      before linear, decouple, ρ*, AMAT  ``rho=ρ*, amat=true``                   pre_linear
③      before linear                      ``decouple=false, amat=false``          pre_linear
④      before linear, decouple            ``amat=false``                          pre_linear
⑤      before linear, decouple, ρ*        ``rho=ρ*, amat=false``                  pre_linear
⑥      ρ*                                 ``decouple=false, rho=ρ*, amat=false``  pre_activation
⑦      ρ*, AMAT                           ``decouple=false, rho=ρ*, amat=true``   pre_activation
=====  =================================  ======================================  ==============

Row ② is CBN.

ρ* (the tuned ρ per activation): the paper does not print it. §6.4 says the best ρ for Sigmoid is
below 1 and that the best ρ of ReLU, Tanh and Sigmoid "become larger in order"; on the paper's grid
{0.25, 0.5, 1, 2, 4, 8} three strictly increasing values below 1 do not exist, and the explanation
given (Sigmoid's outputs are the smallest) points the other way, so we read the order as ReLU >
Tanh > Sigmoid and take ρ* = 0.5 (Sigmoid), 1 (Tanh), 2 (ReLU, and the ReLU-like SELU and Swish, on
which §6.4 finds CBN insensitive to ρ). ``peng-fig8`` measures the sensitivity this choice leans on.
"""

from __future__ import annotations

from dataclasses import replace

from bnlab.plots import bars

from ..base import Experiment, Outcome, Plan, RunSpec, register
from ..readings import combine_readings
from bnlab.formatting import fmt, mean_std
from ..common import (compare_arms, mean_curve, recipe_config, safe_panels,
                      SETTLE_FRACTION, smooth, value_at_fraction)
from .verdict import (CHANCE, chance, primary_activations, proxy_cells, table_design,
                      table_record, table_verdict)
from ..run_facts import arm_values, settle_fraction
from ..verdicts import settle
from ..resolution import design_resolution
from . import common
from .common import (ACT_TITLE, ACTIVATIONS, PAPER_TABLES, PAPER_TRIALS, RESIDUAL,
                          ROW_FEATURES, ROW_NAMES, ROWS, TABLE_SMOKE_RECIPE, TABLE_SMOKE_WIDTH,
                          TABLES, percent, run_config, status_note, padding_shares, row_spec,
                          smoke_seeds, smoke_steps_per_epoch, smoke_train_images,
                          table_base)
from .readings import (ARGUMENT, READINGS, SIDE, cells_of, is_main, mechanism, primary_reading,
                       reading_of, reading_report, runs_by_reading, side_readings)

COMPARED = ("①", "②")  # the rows the tables' claim compares (BN, CBN)

# ---- Tables 1–4 ----------------------------------------------------------------------------------


# the lr side arm's activation (_lr_rows: stores that hold Sigmoid at half the paper's lr)
SIDE_ACTIVATIONS = ("sigmoid",)


def compared_runs(table: int, preset: str, rows=COMPARED, reading: str | None = None,
                  activations=ACTIVATIONS, lr_reading: str = "paper",
                  seeds=None) -> list[RunSpec]:
    """Rows ``rows`` × ``activations`` of ``peng-table<table>`` under ``reading`` (default the
    table's primary, :mod:`.readings`); ``seeds`` default: the paper's 10 trials, or in smoke 5 on
    the primary activations and ``common.SMOKE_SIDE``'s on the others."""
    spec = TABLES[table]
    reading = reading or primary_reading(table)
    form = READINGS[reading]
    base = table_base(spec["model"], spec["data"], preset, form.residual or RESIDUAL,
                      form.head_norm)
    tag = "" if reading == primary_reading(table) else f" · {form.title}"
    if lr_reading == "half":  # the lr side arm: both rows at half the paper's learning rate
        base = {**base, "lr": base["lr"] / 2}
        tag += f" · lr {base['lr']:g}"
    runs = []
    for act in activations:
        for row in rows:
            norm, placement = row_spec(row, act, form.order)
            chosen = seeds if seeds is not None else (
                range(PAPER_TRIALS) if preset == "paper" else smoke_seeds(spec["model"], act))
            for seed in chosen:
                runs.append(RunSpec(f"{row} {ROW_NAMES[row]} · {ACT_TITLE[act]}{tag} · seed {seed}",
                                    run_config(base, norm=norm, placement=placement, activation=act,
                                               seed=seed),
                                    {"row": row, "activation": act, "seed": seed, "norm": norm,
                                     "placement": placement, "residual": form.residual,
                                     "reading": reading, "lr_reading": lr_reading,
                                     "lr": base["lr"]}))
    return runs


def reading_runs(table: int, preset: str, rows=COMPARED) -> list[RunSpec]:
    """The compared rows under every reading of ``peng-table<table>``: ``rows`` under the primary
    one; in smoke the ResNet tables' other readings (readings.SIDE: their rows) on the primary
    activations with their seeds, in paper ① and ② under Eq. 7's block."""
    runs = compared_runs(table, preset, rows)
    model = TABLES[table]["model"]
    for name in side_readings(table):
        if preset == "paper":
            return runs + compared_runs(table, preset, reading="eq7")
        runs += compared_runs(table, preset, SIDE[name], reading=name,
                              activations=common.SMOKE_PRIMARY[model])
    return runs


def _table_plan(table: int):
    def plan(preset: str) -> Plan:
        # smoke spends its budget on the compared rows ① and ②; rows ③–⑦ run in the paper preset
        runs = reading_runs(table, preset, ROWS if preset == "paper" else COMPARED)
        model = TABLES[table]["model"]

        def shares(tiny: bool = False) -> dict:
            return padding_shares(model, {"width": TABLE_SMOKE_WIDTH}, n=16 if tiny else 128)

        return Plan(runs=runs, compute={"padding_shares": shares})

    return plan


def _cells_at(arms: dict[tuple, list], fraction: float, chance_accuracy: float = CHANCE,
              metric: str = "test_accuracy") -> dict[tuple[str, str], list[float]]:
    """Per (row, activation): each run's ``metric`` at ``fraction`` of its training (1: its final
    value); a diverged run (or a non-finite value) counts as chance accuracy
    (``verdict.arm_values``: failure of the arm, not missing data); crashed runs are left out."""
    cells: dict[tuple[str, str], list[float]] = {}

    def read(r):
        return r.final(metric) if fraction >= 1 else value_at_fraction(r.series(metric), fraction)

    for (_, row, act), runs in arms.items():
        cells.setdefault((row, act), []).extend(arm_values(runs, read, chance_accuracy)[0])
    return cells


def phase_reading(ctx) -> float:
    """Where the settling rule reads the table again: halfway through the final lr phase of the
    recipe."""
    config = recipe_config(ctx)
    return settle_fraction(config) if config else SETTLE_FRACTION


def _table_analyze(table: int):
    spec = TABLES[table]

    def analyze(ctx) -> Outcome:
        failed = chance(table, ctx.preset)  # what a diverged run scores
        cells = cells_of([r for r in ctx.runs if is_main(r.factors, table)
                          and r.factors.get("row") in ROWS], failed)
        paper = PAPER_TABLES[table]
        rows, ours_bars, ours_err, paper_bars = [], {}, {}, {}
        for i, act in enumerate(ACTIVATIONS):
            title = ACT_TITLE[act]
            ours_bars[title], ours_err[title], paper_bars[title] = {}, {}, {}
            for row in ROWS:
                values = cells.get((row, act), [])
                mean, std = mean_std(values)
                pm, ps = paper[row][i]
                rows.append({"quantity": f"{row} {ROW_NAMES[row]} · {ACT_TITLE[act]}",
                             "ours": fmt(percent(mean), std=percent(std), n=len(values), decimals=2)
                             if values else "— (paper preset only)",
                             "paper": fmt(pm, std=ps, decimals=2)
                             + (f" (n={PAPER_TRIALS})" if ps is not None else " (std unreadable)"),
                             "features": "/".join("✓" if f else "-" for f in ROW_FEATURES[row])})
                ours_bars[ACT_TITLE[act]][row] = percent(mean) if mean is not None else float("nan")
                ours_err[ACT_TITLE[act]][row] = percent(std) or 0.0
                paper_bars[ACT_TITLE[act]][row] = pm
        rows += _lr_rows(ctx, table_design(table, ctx.preset).n_test)
        rows += _proxy_rows(ctx)
        fig_ours = bars(ctx.figure_path("test_accuracy_ours"), ours_bars, errors=ours_err,
                        ylabel="test accuracy (%)", title=f"Peng {spec['target']} (ours, "
                                                          f"{ctx.preset}): rows per activation, "
                                                          "mean ± std over seeds")
        fig_paper = bars(ctx.figure_path("test_accuracy_paper"), paper_bars,
                         ylabel="test accuracy (%)",
                         title=f"Peng {spec['target']} as printed ({spec['what']}, 10 trials)")
        fig_curves = curve_panels(ctx, ctx.figure_path("test_accuracy_curves"), "test_accuracy",
                                  "Test accuracy during training, BN (①) vs CBN (②), mean over "
                                  f"seeds ({ctx.preset})", table)
        arms = main_arm_runs(ctx, table)
        reading = phase_reading(ctx)
        design, proxy = table_design(table, ctx.preset), proxy_cells(arms, failed)
        primary = primary_activations(table, ctx.preset)
        verdict, summary = settle(
            table_verdict(_cells_at(arms, 1.0, failed), ctx.tiny, design, table, proxy, primary),
            table_verdict(_cells_at(arms, reading, failed), ctx.tiny, design, table, proxy,
                          primary),
            f"{reading:.0%} of training (inside the final lr phase)")
        summary += settling(arms, "test_accuracy", fraction=reading)
        record = table_record(verdict, _cells_at(arms, 1.0, failed), design, table, proxy,
                              primary)
        side_rows, others = reading_report(ctx.runs, table, failed, ctx.tiny, design)
        if others:  # every reading must agree (the catalogue's rule for readings)
            verdict, summary = combine_readings(
                [(READINGS[primary_reading(table)].title, verdict, summary), *others])
            summary = f"{ARGUMENT}; {summary}" + mechanism(runs_by_reading(ctx.runs, table))
        return Outcome([fig_ours, fig_paper, fig_curves], rows + side_rows, verdict,
                       summary + status_note(ctx), replace(record, verdict=verdict))

    return analyze


def main_arm_runs(ctx, table: int | None = None) -> dict[tuple, list]:
    """(table, row, activation) -> the runs of the compared rows under the table's primary reading
    at the paper's lr (the main arms; :func:`.readings.is_main`)."""
    arms: dict[tuple, list] = {}
    for r in ctx.runs:
        if r.factors.get("row") in COMPARED and is_main(r.factors, table):
            arms.setdefault((r.factors.get("table", table), r.factors["row"],
                             r.factors["activation"]), []).append(r)
    return arms


def _lr_rows(ctx, n_test: int | None) -> list[dict]:
    """The lr side arm: rows ① and ② with Sigmoid at half the paper's lr, and CBN − BN there
    (Welch, SE floored at the binomial SE on ``n_test`` test images: the table's design), beside
    the same difference at the paper's lr. Reported, not judged: the pre-declared primary
    comparison is at the paper's lr."""
    arms: dict[tuple[str, str], list] = {}
    for r in ctx.runs:
        if r.factors.get("row") in COMPARED and reading_of(r.factors) == "eq7":
            arms.setdefault((r.factors.get("lr_reading", "paper"), r.factors["row"]), []).append(r)
    if not any(k[0] == "half" for k in arms):
        return []
    rows = []
    for reading in ("half", "paper"):
        runs = {row: [r for r in arms.get((reading, row), [])
                      if r.factors["activation"] in SIDE_ACTIVATIONS] for row in COMPARED}
        values = {row: arm_values(runs[row], lambda run: run.final("test_accuracy"), CHANCE)[0]
                  for row in COMPARED}
        lr = runs["①"][0].factors.get("lr") if runs["①"] else None
        diff = compare_arms(values["①"], values["②"], n_test=n_test)
        rows.append({"quantity": f"lr reading · Sigmoid at lr {lr:g} · ② CBN − ① BN (points)"
                     if lr is not None else "lr reading · Sigmoid",
                     "ours": f"{_signed(percent(diff.diff))} (Welch p = {fmt(diff.p, 2)}; "
                             f"① {fmt([percent(v) for v in values['①']], decimals=1)}, "
                             f"② {fmt([percent(v) for v in values['②']], decimals=1)})",
                     "paper": "lr 0.1 (both arms)"})
    return rows


def _signed(points: float | None) -> str:
    return "—" if points is None else f"{points:+.1f}"


def _proxy_rows(ctx) -> list[dict]:
    shares = (ctx.data or {}).get("padding_shares") or {}
    return [{"quantity": f"padding-pattern share of the norms' input variance at init · {arm} · "
                         f"{size} input",
             "ours": ", ".join(f"{k} maps {v:.2f}" for k, v in by_map.items()),
             "paper": "CIFAR is 32×32 (digits 8×8 made 2×2 deep maps, all border)"}
            for arm, by_size in shares.items() for size, by_map in by_size.items()]


def curve_panels(ctx, path, metric: str, title: str, table: int | None = None):
    arms = main_arm_runs(ctx, table)
    specs = []
    for key in sorted({k[0] for k in arms}, key=lambda t: (t is None, t)):
        for act in ACTIVATIONS:
            series = {}
            for row in COMPARED:
                runs = arms.get((key, row, act), [])
                if runs:
                    series[
                        f"{row} {ROW_NAMES[row]} (n={len(runs)})"
                    ] = smooth(*mean_curve(runs, metric))
            specs.append({"series": series, "xlabel": "step", "ylabel": metric,
                          "logy": metric.endswith("loss"),
                          "title": ACT_TITLE[act] + (f" · Table {key}" if key is not None else "")})
    return safe_panels(path, specs, title=title, ncols=5)


def settling(arms: dict[tuple, list], metric: str, scale: float = 100.0,
             fraction: float = SETTLE_FRACTION) -> str:
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
        parts.append(f"{label} {scale * (ends[0][0] - ends[0][1]):+.1f} → "
                     f"{scale * (ends[1][0] - ends[1][1]):+.1f}")
    if not parts:
        return ""
    return f"; ② − ① in {metric} at {fraction:.0%} of training → at the end: " + ", ".join(parts)


_TABLE_CLAIM = ("CBN (②: normalization moved in front of the linear layer, mean removal decoupled "
                "from the ℓ2 scaling, tuned ρ, AMAT) beats vanilla BN (①) with every activation, "
                "by the most where the activation is least like ReLU (Sigmoid, Tanh, SELU); rows "
                "③–⑦ add one feature at a time.")
_TABLE_SMOKE = ("digits upsampled to 16×16 with fixed Gaussian pixel noise of SD 1.5 "
                "(digits(noise=1.5); 10 classes) instead of CIFAR, {model} at width ½{form}, 40 "
                "epochs on the paper's two-step schedule (lr 0.1 ÷10 at epochs 20 and 33, as at 60 "
                "and 100 of 120; {steps} steps), rows ① and ② only: {arms} "
                "(rows ③–⑦ run in the paper preset){side}{extra}; the cbn_ratios probe every 48 "
                "steps (η, τ, var/(var+β²) per layer){evals}. The report lists the padding-pattern "
                "share of the norms' input variance at 8×8, 16×16 and 32×32.")
_TABLE_ARMS = {
    "resnet20": "5 seeds with Sigmoid, Tanh and SELU (the primary comparison), 2 with ReLU and "
                "Swish",
    "vgg16": "5 seeds with Tanh and SELU (the primary comparison, declared without Sigmoid: at "
             "16×16 VGG-16's fifth stage normalizes 1×1 maps and BN + Sigmoid's inference "
             "statistics failed in every earlier store), 1 with Sigmoid to show that failure; "
             "ReLU and Swish in the paper preset only"}
# why a table's split is what it is (common.TABLE_SMOKE_SPLIT)
_SPLIT_WHY = {2: ": 1,438 took 32 minutes", 3: ": at 899 each epoch ended with a batch of 3",
              4: ": at 899 each epoch ended with a batch of 3"}


def _smoke_data(table: int) -> str:
    """The training set of ``peng-table<table>``'s smoke runs, in batches of 128, and why."""
    model, data = TABLES[table]["model"], TABLES[table]["data"]
    n, size = smoke_train_images(model, data), TABLE_SMOKE_RECIPE["batch_size"]
    batches = (f"{n // size} whole batches" if n % size == 0
               else f"{n // size} batches of {size} and one of {n % size}")
    return f"{n:,} training images ({batches} an epoch{_SPLIT_WHY.get(table, '')})"


# 2026-11-27, empty store, 2 workers: ResNet-20 ≈ 30 s a run; VGG-16 at
# 8 (Table 2) or 7 (Table 4) batches an epoch ≈ 70 s
_TABLE_COST = {"resnet20": "113 runs, ≈ 60–85 CPU-minutes (≈ 32–45 s a run, 2026-12-06)",
               "vgg16": "22 runs, ≈ 26 CPU-minutes (12–14 min on 2 cores)"}


def _register_table(table: int) -> None:
    spec = TABLES[table]
    c100 = spec["data"] == "cifar100"
    extra = f"; {_smoke_data(table)}" + ("; half the digits go to the test split as a harder "
                                          "stand-in for CIFAR-100 (digits has 10 classes, not "
                                          "100)" if c100 else "")
    resnet = spec["model"] == "resnet20"
    register(Experiment(
        id=f"peng-table{table}", paper="peng", target=spec["target"],
        title=f"BN vs CBN and its ablations, {spec['what']}, five activations",
        claim=_TABLE_CLAIM,
        smoke_changes=_TABLE_SMOKE.format(
            model=spec["model"],
            steps=TABLE_SMOKE_RECIPE["epochs"] * smoke_steps_per_epoch(spec["model"],
                                                                       spec["data"]),
            evals="; the test split every 2 epochs" if not resnet else "",
            arms=_TABLE_ARMS[spec["model"]],
            form=" in He's block form (activation after the shortcut sum) for BN and CBN alike, "
                 "the primary reading (§6.1: \"the same as ... the original paper proposing "
                 "ResNet\")"
            if resnet else "",
            side=("; the other readings of the network (bnlab.experiments.peng.readings) on "
                  "Sigmoid/Tanh/SELU: rows ① and ② in Eq. 7's block form (activation before the "
                  "sum); rows ① and ② in Eq. 7's form with the norm in front of the "
                  "classifier; row ② in He's form with CBN in Algorithm 1's literal order "
                  "(against the primary reading's BN); 5 seeds each, every reading judged by "
                  "the same rule, the entry held or not held only where all agree") if resnet
            else "",
            extra=extra),
        cost={"smoke": _TABLE_COST[spec["model"]],
              "paper": f"{450 if resnet else 350} runs (7 rows × 5 activations × 10 trials"
                       f"{', and rows ① and ② under Eq. 7' if resnet else ''}) × 120 epochs of "
                       f"{spec['what']} (GPU; ≈ {'0.5' if resnet else '1'} GPU-hour each)"},
        plan=_table_plan(table), analyze=_table_analyze(table),
        resolution=design_resolution(table_design(table), scale=100, unit=" points")))


for _t in TABLES:
    _register_table(_t)
