"""Peng et al. (CBN) §6.3, CBN's components (no normalization, mean removal, ℓ2 normalization, CBN):
``peng-table6`` (maximal learning rate) and ``peng-fig7`` (gradient norm). Registered on import (the
catalogue imports this module, :data:`bnlab.experiments.base.ENTRY_MODULES`)."""

from __future__ import annotations

import math

from bnlab.plots import bars
from bnlab.probes import max_stable_lr

from ..base import Experiment, Outcome, RunSpec, register
from ..resolution import family_resolution
from ..verdicts import COMPARE_RULE
from ..verdict_data import Verdict
from ..verdicts import NOT_HELD, conjunction, explain, family, is_held, ladder
from bnlab.formatting import finite_or_none, fmt, mean_std
from ..common import (CATALOGUE_PILOT, RULE, DesignSD, compare_arms, grouped_finals,
                      mean_curve, safe_panels, smooth)
from .blocks import block_plan, judged_by_block
from .verdict import CHANCE, conjunction_record
from .common import (ACT_TITLE, ACTIVATIONS, PAPER_TRIALS, SMOKE_SEEDS, percent, recipe_base,
                     run_config, status_note, usual_micro_batch_series)

# ---- Table 6: maximal learning rate of CBN's components ------------------------------------------

LR_CANDIDATES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # §6.3
# The four approaches of §6.3, all in front of the linear layer (CBN's position). "ℓ2 normalization"
# is Eq. 5 alone: CBN without mean removal, dividing by the root mean square of x + β.
T6_APPROACHES = {"no normalization": "none", "mean removal": "mean_only_bn",
                 "ℓ2 normalization": "cbn(center=false, amat=false)", "CBN": "cbn(amat=true)"}
T6_ORDER = tuple(T6_APPROACHES)
T6_SMOKE_ACTIVATIONS = ("sigmoid", "tanh", "relu")
# 1e-4 trains nothing in 36 steps, so it can never be the maximal stable rate there: left out of
# smoke.
SMOKE_LR_CANDIDATES = LR_CANDIDATES[1:]
T6_SEEDS = (0, 1, 2)
NONE_TRAINS = 1e-5  # the maximal stable lr of a seed where no candidate trains: below the grid


def _t6_runs(preset: str, residual: str) -> list[RunSpec]:
    if preset == "paper":
        # Table 6's caption says CIFAR-10 (as does Fig. 7's, the same ablation); §6.3's text says
        # CIFAR-100.
        base, acts = recipe_base("resnet20", "cifar10", "paper", residual), ACTIVATIONS
        extra_seeds, candidates = range(len(T6_SEEDS), PAPER_TRIALS), LR_CANDIDATES
    else:
        base = {**recipe_base("resnet20", "digits", "smoke", residual), "epochs": 3,
                "schedule": "constant"}
        acts, extra_seeds = T6_SMOKE_ACTIVATIONS, range(0)
        candidates = SMOKE_LR_CANDIDATES
    runs = []
    for act in acts:
        for name, norm in T6_APPROACHES.items():
            # the lr grid per seed: a maximal stable lr per seed, compared by the rule
            for seed in T6_SEEDS:
                for lr in candidates:
                    label = (f"{name} · {ACT_TITLE[act]} · lr {lr:g}"
                             + (f" · seed {seed}" if seed else ""))
                    runs.append(RunSpec(label,
                                        run_config(base, norm=norm, placement="pre_linear",
                                                   activation=act, seed=seed, lr=lr),
                                        {"approach": name, "activation": act, "lr": lr,
                                         "seed": seed}))
            for seed in extra_seeds:  # the accuracy columns: 10 trials at the recipe's lr 0.1
                runs.append(RunSpec(f"{name} · {ACT_TITLE[act]} · lr 0.1 · seed {seed}",
                                    run_config(base, norm=norm, placement="pre_linear",
                                               activation=act, seed=seed, lr=0.1),
                                    {"approach": name, "activation": act, "lr": 0.1, "seed": seed}))
    return runs


def _is_cbn(factors: dict) -> bool:
    return factors.get("approach") == "CBN"


def run_trains(run, num_classes: int = 10) -> bool:
    """Did this run train without collapsing (Peng §6.3's criterion, made operational)?

    Collapsed: not finished (diverged to a non-finite loss, or failed), or the final epoch's mean
    training loss is not finite, not below the first step's loss, or not below chance level ln(C) −
    0.05 (a network stuck at uniform predictions). In a short smoke run the smallest candidates may
    also count as "not trained"; that does not move the *maximal* stable rate as long as a larger
    one trains.
    """
    if run.status != "finished":
        return False
    final = finite_or_none(run.final("train_loss"))
    first = run.series("train_loss")[1][:1]
    first = finite_or_none(first[0]) if first else None
    if final is None:
        return False
    if first is not None and final >= first:
        return False
    return final < math.log(num_classes) - 0.05


# Design SD of one seed's log10 maximal stable lr: the lr grid is a decade apart, so seeds agree
# exactly (SD 0 in 6 of the pilot's 12 judged comparisons) or differ by whole decades (pooled SDs
# 0.41–1.7, RMS 0.82 dex): the quantity's resolution, one grid step (1 dex), stands in.
TABLE6_DESIGN_SD = DesignSD(1.0, CATALOGUE_PILOT + "; quantized to the lr grid (SD 0 in 6 of 12, "
                            "RMS 0.82 dex): one grid step")


def table6_verdict(lr_max: dict[tuple[str, str], list[float | None]], tiny: bool = False,
                   design_sd: DesignSD = TABLE6_DESIGN_SD) -> tuple[str, str]:
    """Verdict on §6.3's ordering of the maximal learning rate, per activation.

    ``lr_max[(approach, activation)]`` = per-seed maximal stable lr (None: nothing trained, counted
    as :data:`NONE_TRAINS`). Claim: mean removal and ℓ2 normalization both raise the maximal stable
    lr over no normalization, ℓ2 more than mean removal, and CBN keeps at least ℓ2's. Each step of
    the order none ≤ mean removal ≤ ℓ2 ≤ CBN is tested on log10 lr by :data:`common.RULE` (Welch's
    t, ≥ 3 seeds; identical seeds make any difference significant). "not held" if a step is
    significantly reversed for some activation (Holm over all steps); "held" if none is and ℓ2
    significantly raises the rate over none for at least one activation (primary, pre-declared: ℓ2 −
    none in log10 lr, Holm over the activations); otherwise "inconclusive", stating the effect
    resolvable at ``design_sd`` (:data:`TABLE6_DESIGN_SD`).
    """
    acts = sorted({a for _, a in lr_max}, key=lambda a: ACTIVATIONS.index(a) if a in ACTIVATIONS
                  else 99)
    if not acts:
        return ladder(unusable=True), "no runs" + (" (tiny runs)" if tiny else "")
    lines, steps, raised = [], {}, {}
    for act in acts:
        logs = [[math.log10(v or NONE_TRAINS) for v in lr_max.get((name, act)) or []]
                for name in T6_ORDER]
        lines.append(f"{ACT_TITLE.get(act, act)}: " + " / ".join(
            "–" if not v else f"{10 ** (sum(v) / len(v)):.2g}" for v in logs))
        steps.update({(act, i): compare_arms(logs[i], logs[i + 1], design_sd=design_sd.of())
                      for i in range(len(T6_ORDER) - 1)})
        raised[act] = compare_arms(logs[0], logs[2], design_sd=design_sd.of())
    few = any(c.decision == "too few seeds" for c in steps.values())
    against = family(steps, "higher")
    reversed_ = list(dict.fromkeys(ACT_TITLE.get(a, a) for (a, _), v in against.items()
                                   if v == NOT_HELD))
    primary = any(is_held(v) for v in family(raised, "higher").values())
    summary = ("maximal stable lr, geometric mean over seeds (none / mean removal / ℓ2 / CBN; "
               "1e-05: nothing trained): " + "; ".join(lines)
               + f"; log10 lr compared at the {design_sd.text(unit=' dex')}")
    verdict = ladder(True if primary else None, unusable=tiny or few, against=bool(reversed_))
    mde = max((c.mde for c in raised.values() if c.mde is not None), default=0.0)
    return verdict, summary + explain(
        verdict, inconclusive=" (tiny runs)" if tiny else f"; fewer than 3 seeds ({RULE})" if few
        else "; no approach significantly changes the maximal lr on this grid (ℓ2 − none "
        f"resolvable ≥ {mde:.2g} dex; {RULE})",
        not_held="; the order none ≤ mean removal ≤ ℓ2 ≤ CBN is significantly reversed (Holm over "
        "the steps) for " + ", ".join(reversed_),
        held="; ℓ2 normalization significantly raises the maximal lr (Holm over the activations), "
        "and no step of the order is reversed")


def _t6_analyze(ctx) -> Outcome:
    acts = [a for a in ACTIVATIONS if any(r.factors.get("activation") == a for r in ctx.runs)]
    lr_max, trained = {}, {}
    for act in acts:
        for name in T6_ORDER:
            for seed in T6_SEEDS:
                by_lr = {r.factors["lr"]: r for r in ctx.runs if r.factors.get("approach") == name
                         and r.factors.get("activation") == act and r.factors.get("seed") == seed}
                status = {lr: run_trains(run) for lr, run in by_lr.items()}
                if seed == 0:
                    trained[(name, act)] = status
                if status:
                    lr_max.setdefault((name, act), []).append(
                        max_stable_lr(lambda lr, s=status: s[lr], candidates=list(status),
                                      strategy="all").lr)
    accuracy = grouped_finals(ctx, ("approach", "activation", "lr"), "test_accuracy",
                              failure_value=CHANCE)
    rows = []
    paper_claim = ("not in our copy (Table 6's body is missing); §6.3: none < mean removal < ℓ2, "
                   "ℓ2 “contributes more”; CBN “1 + 1 > 2”")
    for act in acts:
        for name in T6_ORDER:
            rates = lr_max.get((name, act)) or []
            mean, std = mean_std(accuracy.get((name, act, 0.1), []))
            status = trained.get((name, act), {})
            rows.append({"quantity": f"max stable lr per seed · {name} · {ACT_TITLE[act]}",
                         "ours": " / ".join("none trains" if r is None else f"{r:g}" for r in rates)
                         or "—",
                         "trained at (seed 0)": " ".join(f"{lr:g}:{'✓' if ok else '✗'}"
                                                         for lr, ok in sorted(status.items())),
                         "test acc at lr 0.1 (%)": fmt(
                             percent(mean), std=percent(std),
                             n=len(accuracy.get((name, act, 0.1), [])), decimals=2),
                         "paper": paper_claim})
    groups = {ACT_TITLE[a]: {n: _mean_log10(lr_max.get((n, a))) for n in T6_ORDER} for a in acts}
    fig_lr = bars(ctx.figure_path("max_stable_lr"), groups,
                  ylabel="log10 maximal stable lr, mean over seeds (−5: none)",
                  title=f"Peng Table 6 / §6.3: maximal lr from {{1e-4 … 1}} ({ctx.preset})")
    acc_groups = {ACT_TITLE[a]: {n: (percent(mean_std(accuracy.get((n, a, 0.1), []))[0])
                                     or float("nan"))
                                 for n in T6_ORDER} for a in acts}
    fig_acc = bars(ctx.figure_path("test_accuracy"), acc_groups,
                   ylabel="test accuracy at lr 0.1 (%)",
                   title=f"Peng Table 6: test accuracy of CBN's components ({ctx.preset})")
    verdict, summary = table6_verdict(lr_max, ctx.tiny)
    return Outcome([fig_lr, fig_acc], rows, verdict, summary + status_note(ctx),
                   table6_record(verdict, lr_max))


def table6_record(verdict: str, lr_max: dict[tuple[str, str], list[float | None]],
                  design_sd: DesignSD = TABLE6_DESIGN_SD) -> Verdict:
    """The structured verdict of Table 6: ℓ2 − none in log10 maximal lr for the activation the
    verdict rests on — the first step of the order significantly reversed where it is not held,
    else the primary (:func:`table6_verdict`) with the smallest p."""
    acts = [a for a in ACTIVATIONS if any(k[1] == a for k in lr_max)]
    logs = {(name, a): [math.log10(v or NONE_TRAINS) for v in lr_max.get((name, a)) or []]
            for name in T6_ORDER for a in acts}
    raised = {a: compare_arms(logs[(T6_ORDER[0], a)], logs[(T6_ORDER[2], a)],
                              design_sd=design_sd.of()) for a in acts}
    steps = {(a, i): compare_arms(logs[(T6_ORDER[i], a)], logs[(T6_ORDER[i + 1], a)],
                                  design_sd=design_sd.of())
             for a in acts for i in range(len(T6_ORDER) - 1)}
    reversed_ = [k for k, v in family(steps, "higher").items() if v == NOT_HELD]
    if reversed_:
        a, i = reversed_[0]
        return Verdict.from_comparison(
            verdict, f"{T6_ORDER[i + 1]} − {T6_ORDER[i]}, log10 maximal stable lr, "
                     f"{ACT_TITLE[a]}", steps[(a, i)], paper="higher (direction only)",
            unit=" dex")
    if not raised:
        return Verdict(verdict, COMPARE_RULE)
    best = min(raised, key=lambda a: 1.0 if raised[a].p is None else raised[a].p)
    return Verdict.from_comparison(
        verdict, f"ℓ2 normalization − no normalization, log10 maximal stable lr, {ACT_TITLE[best]}",
        raised[best], paper="higher (direction only)", unit=" dex")


def _mean_log10(rates: list[float | None] | None) -> float:
    """Mean over seeds of log10 maximal stable lr (NONE_TRAINS where nothing trained); NaN without
    runs."""
    return sum(math.log10(r or NONE_TRAINS) for r in rates) / len(rates) if rates else float("nan")


register(Experiment(
    id="peng-table6", paper="peng", target="Table 6",
    title="Maximal learning rate (and accuracy) of CBN's components: none, mean removal, ℓ2 "
          "normalization, CBN",
    claim="Mean removal and normalization via the ℓ2 norm both lower the gradient Lipschitz "
          "constant, so both raise the maximal stable learning rate (lr_max = 1/L, Theorem 1), ℓ2 "
          "normalization more; together (CBN) they do better than either.",
    smoke_changes="digits, ResNet-20 at width 1/4, 3 epochs at a constant lr, Sigmoid/Tanh/ReLU "
                  "only, three seeds per candidate lr from 1e-3 to 1 (1e-4 trains nothing in 36 "
                  "steps, so it cannot be the maximum); the paper also reports 10-trial "
                  "accuracies, smoke's accuracy column is the three lr-0.1 runs. ℓ2 normalization "
                  "is Eq. 5 alone, `cbn(center=false, amat=false)` (root mean square).",
    cost={"smoke": "144 short runs, ≈6 min on 2 CPU cores",
          "paper": "440 runs (4 approaches × 5 activations × (5 candidate lrs × 3 seeds + 7 more "
                   "trials at 0.1)) × 120 epochs of ResNet-20 on CIFAR-10 (GPU)"},
    plan=block_plan(_t6_runs), analyze=judged_by_block(_t6_analyze, _is_cbn),
    resolution=family_resolution(
        "the maximal stable lr per activation, in the order none < mean removal < ℓ2 < CBN "
        "(Table 6)", TABLE6_DESIGN_SD, 3, unit=" dex (log10 lr)")))




# ---- Fig. 7: gradient norm of CBN's components ---------------------------------------------------

F7_SMOKE_ACTIVATIONS = ("sigmoid", "tanh", "relu")
# 96 steps at a constant lr: the gradient norm is compared after its first quarter
F7_SMOKE_EPOCHS = 8
F7_PROBE_EVERY = 4


def _f7_runs(preset: str, residual: str) -> list[RunSpec]:
    if preset == "paper":
        # Fig. 7's caption: ResNet-20 on CIFAR-10, the Table 6 approaches, the standard recipe.
        base = {**recipe_base("resnet20", "cifar10", "paper", residual), "probe_every": 390}
        acts, seeds = ACTIVATIONS, range(PAPER_TRIALS)
    else:
        base = {**recipe_base("resnet20", "digits", "smoke", residual), "epochs": F7_SMOKE_EPOCHS,
                "schedule": "constant", "probe_every": F7_PROBE_EVERY}
        acts, seeds = F7_SMOKE_ACTIVATIONS, SMOKE_SEEDS
    return [RunSpec(f"{name} · {ACT_TITLE[act]} · seed {seed}",
                    run_config(base, norm=norm, placement="pre_linear", activation=act,
                               seed=seed, probes=["grad_stats"]),
                    {"approach": name, "activation": act, "seed": seed})
            for act in acts for name, norm in T6_APPROACHES.items() for seed in seeds]


def mean_sq_grad_norm(run, skip_fraction: float = 0.25) -> float | None:
    """log10 of the mean of ``probe/grad_stats/sq_norm`` (E‖g‖², Peng's "stochastic gradient squared
    expectation") after the first quarter of the probes, at the run's usual micro-batch size
    (:func:`common.usual_micro_batch_series`: in the smoke every third probe fell on an epoch's
    last batch of 30, micro-batches of 3 instead of 16); log because the approaches differ by
    orders of magnitude and seeds spread multiplicatively. None without positive measurements."""
    values = [v for v in usual_micro_batch_series(run, "probe/grad_stats/sq_norm", skip_fraction)
              if v > 0]
    return math.log10(sum(values) / len(values)) if values else None


F7_CLAIMS = (("mean removal", "no normalization"), ("ℓ2 normalization", "no normalization"))


# Design SD of one seed's log10 E‖g‖²: the root-mean-square of the pooled per-arm SDs of the six
# judged comparisons in the pilot (mean removal − none, ℓ2 − none × Sigmoid/Tanh/ReLU: 0.55, 0.28,
# 0.21, 0.26, 1.9, 1.9 dex; ReLU's no-normalization arm scatters by orders of magnitude).
FIG7_DESIGN_SD = DesignSD(1.1, CATALOGUE_PILOT + ", RMS over the 6 judged comparisons")


def fig7_verdict(sq: dict[str, dict[str, list[float]]], tiny: bool = False,
                 design_sd: DesignSD = FIG7_DESIGN_SD) -> tuple[str, str]:
    """§6.3 / Fig. 7: mean removal and ℓ2 normalization each lower E‖g‖² relative to no
    normalization.

    ``sq[activation][approach]`` = per-seed log10 E‖g‖² (:func:`mean_sq_grad_norm`). Each claim
    (mean removal < none, ℓ2 < none) per activation by :data:`common.RULE`. Primary, pre-declared:
    their conjunction (:func:`verdicts.conjunction`): held when every comparison is significantly
    "lower"; not held when some is significantly "higher" after Holm's correction over the family;
    otherwise inconclusive. ℓ2 vs mean removal and CBN vs none are reported, not judged. Every
    comparison states its resolvable effect at ``design_sd`` (:data:`FIG7_DESIGN_SD`).
    """
    if not sq:
        return ladder(unusable=True), "no runs" + (" (tiny runs)" if tiny else "")
    parts, claims = [], {}
    for act, d in sq.items():
        for a, b in F7_CLAIMS + (("ℓ2 normalization", "mean removal"), ("CBN", "no normalization")):
            c = compare_arms(d.get(b, []), d.get(a, []), design_sd=design_sd.of())
            parts.append(f"{ACT_TITLE.get(act, act)} {a} − {b} {c.text(unit=' dex')}")
            if (a, b) in F7_CLAIMS:
                claims[(act, a)] = c
    summary = ("log10 E‖g‖² after the first quarter: " + "; ".join(parts)
               + f"; resolvable effects at the {design_sd.text(unit=' dex')}")
    few = any(c.decision == "too few seeds" for c in claims.values())
    verdict = ladder(conjunction(claims, "lower"), unusable=tiny or few)
    return verdict, summary + explain(
        verdict, inconclusive=" (tiny runs)" if tiny
        else f"; fewer than 3 seeds somewhere ({RULE})" if few else "",
        not_held="; a normalization raises E‖g‖² over no normalization (Holm)",
        held="; mean removal and ℓ2 normalization both lower E‖g‖² with every activation")


def _f7_analyze(ctx) -> Outcome:
    sq: dict[str, dict[str, list[float]]] = {}
    specs = []
    for act in ACTIVATIONS:
        runs = [r for r in ctx.runs if r.factors.get("activation") == act]
        if not runs:
            continue
        sq[act] = {}
        series = {}
        for name in T6_ORDER:
            arm = [r for r in runs if r.factors.get("approach") == name]
            sq[act][name] = [v for v in (mean_sq_grad_norm(r) for r in arm) if v is not None]
            series[f"{name} (n={len(arm)})"] = smooth(*mean_curve(arm, "probe/grad_stats/sq_norm"))
        specs.append({"series": series, "xlabel": "step", "ylabel": "E‖g‖² (mean over seeds)",
                      "logy": True, "title": ACT_TITLE[act]})
    fig = safe_panels(ctx.figure_path("gradient_sq_norm"), specs, ncols=len(specs) or 1,
                      title="Peng Fig. 7: stochastic-gradient squared norm of CBN's components "
                            f"({ctx.preset})")
    rows = [{"quantity": f"log10 E‖g‖² · {ACT_TITLE[act]} · {name}",
             "ours": fmt(values, decimals=2),
             "paper": "mean removal and ℓ2 normalization below no normalization (curves only)"}
            for act, d in sq.items() for name, values in d.items()]
    verdict, summary = fig7_verdict(sq, ctx.tiny)
    claims = {(act, a): compare_arms(d.get(b, []), d.get(a, []), design_sd=FIG7_DESIGN_SD.of())
              for act, d in sq.items() for a, b in F7_CLAIMS}
    record = conjunction_record(
        verdict, claims, "lower",
        lambda k: f"{k[1]} − no normalization, log10 E‖g‖², {ACT_TITLE.get(k[0], k[0])}",
        paper="lower (direction only)", unit=" dex")
    return Outcome([fig], rows, verdict, summary + status_note(ctx), record)


register(Experiment(
    id="peng-fig7", paper="peng", target="Fig. 7",
    title="Gradient norm of CBN's components: no normalization, mean removal, ℓ2 "
          "normalization, CBN",
    claim="Mean removal and normalization with the ℓ2 norm both reduce the stochastic-gradient "
          "squared expectation E‖g‖² (Theorems 2–3, second conclusion), relative to no "
          "normalization.",
    smoke_changes="digits at 16×16, ResNet-20 at width 1/4 in Eq. 7's block "
                  f"form, {F7_SMOKE_EPOCHS} epochs ({12 * F7_SMOKE_EPOCHS} steps) at the constant "
                  "lr 0.1, Sigmoid/Tanh/ReLU, 3 seeds per arm, E‖g‖² from 8 micro-batches "
                  f"every {F7_PROBE_EVERY} steps (grad_stats probe), compared in log10 by Welch's "
                  "t-test.",
    cost={"smoke": "36 runs with a probe, ≈8 min on 2 CPU cores (estimated from the step cost, "
                   "uncontended)",
          "paper": "200 runs × 120 epochs of ResNet-20 on CIFAR-10 with a gradient probe per epoch "
                   "(GPU)"},
    plan=block_plan(_f7_runs), analyze=judged_by_block(_f7_analyze, _is_cbn),
    resolution=family_resolution(
        "direction only: mean removal and ℓ2 normalization each lower E‖g‖² against no "
        "normalization (Fig. 7)", FIG7_DESIGN_SD, 3, unit=" dex (log10 E‖g‖²)")))
