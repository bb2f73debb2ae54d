"""Luo et al. 2019, §5, Fig. 5: γ² (and ζ) of the CNN against the batch size. The CNN, its data
and the smoke recipe are shared with Fig. 4 (:mod:`bnlab.experiments.luo.cnn`)."""

from __future__ import annotations

import math

import numpy as np

from ..base import Experiment, Outcome, Plan, RunSpec, register
from ..verdicts import explain, ladder, settle
from ..resolution import family_resolution
from bnlab.formatting import finite_or_none, fmt
from ..common import CATALOGUE_PILOT, RULE, SETTLE_FRACTION, DesignSD, compare_arms, safe_panels
from .cnn import cnn_base, train_size
from .common import plot_points


# ================================================================================================
# Fig. 5: γ² and ζ against the batch size
# ================================================================================================

_FIG5_BATCHES = (16, 32, 64, 128, 256)


FIG5_SEEDS = (0, 1, 2)


def _fig5_plan(preset: str) -> Plan:
    base = cnn_base(preset, 60)
    n_train = train_size(base)
    runs = []
    for M in _FIG5_BATCHES:
        spe = -(-n_train // M)
        every = max(1, base["epochs"] * spe // 20)
        if spe > 1 and every % spe == 0:
            # else every probe lands on the epoch's last (partial) batch, whose M is not M
            every += 1
        for seed in FIG5_SEEDS:
            config = {**base, "norm": "bn", "batch_size": M, "lr": base["lr"] * M / 64,
                      "seed": seed, "probes": ["gamma", "bn_regularization"], "probe_every": every}
            runs.append(RunSpec(f"BN, M = {M}" + (f" (seed {seed})" if seed else ""), config,
                                {"batch_size": M, "seed": seed, "steps_per_epoch": spe,
                                 "partial_last_batch": n_train % M != 0}))
    return Plan(runs=runs)


def _last_per_layer(run, prefix: str, k: int = 1, fraction: float = 1.0) -> dict[str, float]:
    """Per layer, the mean of the last ``k`` finite values of ``<prefix><layer>`` recorded up to
    ``fraction`` of the run.

    Values measured on an epoch's last, partial batch are skipped: the probe takes M from the batch
    it sees, and Theorem 1's ζ ∝ 1/M would then belong to another batch size.
    """
    spe = run.factors.get("steps_per_epoch")
    skip_epoch_end = bool(run.factors.get("partial_last_batch")) and spe
    out = {}
    for name in run.metric_names(prefix):
        steps, values = run.series(name)
        kept = [v for s, v in zip(steps, values) if finite_or_none(v) is not None
                and s <= steps[-1] * fraction
                and not (skip_epoch_end and s % spe == 0)]
        if kept:
            out[name[len(prefix):]] = float(np.mean(kept[-k:]))
    return out


# Design SD of one seed's γ²: the root-mean-square of the pooled per-arm SDs of every
# judged comparison (per layer: M = 16 vs 256 and each neighbouring pair, at the end and at 2/3 of
# training; 50 comparisons, SDs 0.0006–0.089, the pairs with M = 256 the widest) in the pilot.
FIG5_DESIGN_SD = DesignSD(0.031, f"{CATALOGUE_PILOT}; RMS over the per-layer batch-size "
                                 "comparisons")


def fig5_trend(gamma_sq: dict[int, list[float]], *,
               design_sd: DesignSD = FIG5_DESIGN_SD) -> tuple[str, str]:
    """One BN layer's γ² against M (``gamma_sq``: M -> per-seed values) by :data:`common.RULE`
    (Welch's t, α = 0.05, ≥ 3 seeds): the largest batch against the smallest, and each pair of
    neighbouring batch sizes.

    "rises": significantly higher at the largest M and significantly lower at no larger neighbour;
    "falls": significantly lower at the largest M; "dips": higher at the largest M but significantly
    lower somewhere between neighbours; "unresolved" / "too few seeds" otherwise. The resolvable
    rise is stated at ``design_sd`` (:data:`FIG5_DESIGN_SD`), not at these seeds' spread. Returns
    (decision, text).
    """
    batches = sorted(gamma_sq)
    if len(batches) < 2 or any(not gamma_sq[m] for m in batches):
        return "too few seeds", "no γ record at some M"
    sd = design_sd.of()
    comp = compare_arms(gamma_sq[batches[0]], gamma_sq[batches[-1]], design_sd=sd)
    dips = [f"{a}→{b}" for a, b in zip(batches, batches[1:])
            if compare_arms(gamma_sq[a], gamma_sq[b], design_sd=sd).decision == "lower"]
    means = " → ".join(f"{np.mean(gamma_sq[m]):.4f}" for m in batches)
    text = f"{means} (M = {batches[-1]} − {batches[0]}: {comp.text()}"
    text += f"; falls at M = {', '.join(dips)})" if dips else ")"
    if comp.decision in ("too few seeds", "lower"):
        return ("falls" if comp.decision == "lower" else comp.decision), text
    if comp.decision == "higher":
        return ("dips" if dips else "rises"), text
    return "unresolved", text + f" [resolvable ≥ {comp.mde:.3g} at the design SD]"


def fig5_verdict(per_layer: dict[str, dict[int, list[float]]], tiny: bool = False, *,
                 design_sd: DesignSD = FIG5_DESIGN_SD) -> tuple[str, str]:
    """Fig. 5's claim — γ² grows with the batch size in each BN layer (the paper: five models, BN in
    one layer each) — from per-layer, per-seed γ² (``per_layer``: layer -> M -> values), by
    :func:`fig5_trend`.

    Held: every layer "rises"; not held: some layer "falls"; otherwise inconclusive (fewer than 3
    seeds, a significant fall between neighbouring M, or a rise the seeds do not resolve, with what
    they resolve). Primary, pre-declared: γ² at the largest M − at the smallest, higher, in every
    layer (the paper's five models each have one BN layer, so the claim is their conjunction).
    """
    if tiny:
        return ladder(unusable=True), "tiny run: γ has barely moved from 1"
    if not per_layer:
        return ladder(unusable=True), "no finished run recorded γ"
    trends = {layer: fig5_trend(values, design_sd=design_sd)
              for layer, values in sorted(per_layer.items())}
    summary = "γ² per BN layer (seed means, M ascending): " + "; ".join(
        f"{layer} {d}: {t}" for layer, (d, t) in trends.items())
    decisions = [d for d, _ in trends.values()]
    few = "too few seeds" in decisions
    verdict = ladder(True if all(d == "rises" for d in decisions) else None, unusable=few,
                     against="falls" in decisions)
    return verdict, summary + explain(
        verdict, not_held=f" — γ² significantly lower at the large batch in some layer ({RULE})",
        held=f" — γ² rises with M in every layer ({RULE})",
        inconclusive=f" — fewer than 3 seeds ({RULE})" if few else
        f" — {decisions.count('rises')}/{len(decisions)} layers rise ({RULE})") \
        + f"; resolution from the {design_sd.text()}"


def _fig5_values(runs, prefix: str, k: int = 1,
                 fraction: float = 1.0) -> dict[str, dict[int, list[float]]]:
    """Layer -> batch size -> per-seed final values of ``prefix`` (``_last_per_layer``)."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in runs:
        if r.status != "finished":
            continue
        for layer, value in _last_per_layer(r, prefix, k, fraction).items():
            out.setdefault(layer, {}).setdefault(r.factors.get("batch_size"), []).append(value)
    return out


def _layer_mean(per_layer: dict[str, dict[int, list[float]]], m: int) -> float | None:
    """Mean over layers of the seed means at batch size ``m``."""
    means = [float(np.mean(v[m])) for v in per_layer.values() if v.get(m)]
    return float(np.mean(means)) if means else None


def _fig5_analyze(ctx) -> Outcome:
    runs = sorted(ctx.runs, key=lambda r: (r.factors.get("batch_size", 0),
                                           r.factors.get("seed", 0)))
    batches = sorted({r.factors.get("batch_size") for r in runs})
    by_m = {m: [r for r in runs if r.factors.get("batch_size") == m] for m in batches}
    gamma = _fig5_values(runs, "probe/gamma/sq_mean/")
    zetas = _fig5_values(runs, "probe/bn_regularization/zeta/", k=3)
    mean_sq = [_layer_mean(gamma, m) for m in batches]
    mean_zeta = [_layer_mean(zetas, m) for m in batches]
    val = [_mean_or_none([finite_or_none(r.final("test_loss")) for r in by_m[m]
                          if r.status == "finished"])
           for m in batches]
    # log₂ M on a linear axis: matplotlib labels the minor ticks of a short log axis unreadably
    x = [math.log2(m) if m else None for m in batches]
    gamma_series = {layer: plot_points(x, [float(np.mean(v[m])) if v.get(m) else None
                                           for m in batches])
                    for layer, v in sorted(gamma.items())}
    gamma_series["mean over layers"] = plot_points(x, mean_sq)
    zeta_series = {"ζ (Theorem 1, layer mean)": plot_points(x, mean_zeta)}
    first = next(((m, z) for m, z in zip(batches, mean_zeta) if z), None)
    if first:
        zeta_series["∝ 1/M"] = (x, [first[1] * first[0] / m for m in batches])
    curves = {}
    for m in batches:
        per_run = [_layer_mean_curve(r) for r in by_m[m] if r.status == "finished"]
        if per_run and all(c[0] for c in per_run):
            length = min(len(c[0]) for c in per_run)
            curves[f"M = {m}"] = (per_run[0][0][:length],
                                  [float(np.mean([c[1][i] for c in per_run]))
                                                           for i in range(length)])
    fig = safe_panels(ctx.figure_path("gamma_vs_batch"), [
        {"series": gamma_series, "xlabel": "log₂ M", "ylabel": "mean γ²", "markers": True,
         "title": "(a) γ² per BN layer (seed means)"},
        {"series": {"validation loss": plot_points(x, val)}, "xlabel": "log₂ M",
         "ylabel": "validation loss", "markers": True, "title": "(b) validation loss"},
        {"series": zeta_series, "xlabel": "log₂ M", "ylabel": "ζ", "logy": True, "markers": True,
         "title": "ζ from the data (Eq. 4)"},
        {"series": curves, "xlabel": "step", "ylabel": "layer-mean γ²",
         "title": "(d) γ² during training"},
    ], title="Luo Fig. 5: batch size, γ² and regularization strength")
    mid = _fig5_values(runs, "probe/gamma/sq_mean/", fraction=SETTLE_FRACTION)
    verdict, summary = settle(fig5_verdict(gamma, ctx.tiny), fig5_verdict(mid, ctx.tiny))
    summary += left_out_note(runs)
    table = [{"quantity": f"M = {m}: layer-mean γ² / ζ / validation loss (seed means)",
              "ours": f"{fmt(g)} / {fmt(z)} / {fmt(v)}",
              "paper": "γ² grows with M; validation loss grows with M"}
             for m, g, z, v in zip(batches, mean_sq, mean_zeta, val)]
    table += [{"quantity": f"γ² of {layer} against M: decision at the end (at 2/3 of training)",
               "ours": f"{fig5_trend(v)[0]} ({fig5_trend(mid.get(layer, {}))[0]})",
               "paper": "γ increases with M (each of five one-BN models)"}
              for layer, v in sorted(gamma.items())]
    return Outcome([fig], table, verdict, summary)


def left_out_note(runs) -> str:
    """The summary's note on the runs γ² is not read from: a diverged run has no γ² to compare (it
    is left out, not given a failure value), so the summary says how many — by status."""
    left = [r.status for r in runs if r.status != "finished"]
    if not left:
        return ""
    counts = ", ".join(f"{left.count(s)} {s}" for s in sorted(set(left)))
    return f"; {len(left)} of {len(runs)} runs left out of the γ² comparisons ({counts})"


def _mean_or_none(values) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _layer_mean_curve(run) -> tuple[list, list]:
    """(steps, mean over BN layers of γ²) as recorded by the ``gamma`` probe."""
    names = run.metric_names("probe/gamma/sq_mean/")
    series = [run.series(n) for n in names]
    if not series:
        return [], []
    length = min(len(s[0]) for s in series)
    return series[0][0][:length], [float(np.mean([s[1][i] for s in series])) for i in range(length)]


register(Experiment(
    id="luo-fig5", paper="luo", target="Fig. 5",
    title="γ² and validation loss against the batch size",
    claim="Larger batches weaken BN's regularization ζ ∝ 1/M, so the learned γ² grows with the "
          "batch size (and the validation loss with it).",
    smoke_changes="digits with 70 % held out, luo_cnn at 1/4 width, 60 epochs, lr 0.05·M/64, 3 "
                  "seeds per batch size; BN in every layer at once (the paper trains five models "
                  "with BN in one layer each — bnlab.models has one norm spec for all layers, so "
                  "each layer is read and judged). Verdict: per layer, γ² at M = 16 vs 256 by "
                  "Welch's t (α = 0.05) and no significant fall between neighbouring batch sizes, "
                  "repeated at 2/3 of training (settling).",
    cost={"smoke": "≈165 s wall (15 runs, one thread, 2-core machine under load ≈ 4)",
          "paper": "15 runs × 100 epochs luo_cnn on CIFAR-10 (GPU)"},
    plan=_fig5_plan, analyze=_fig5_analyze,
    resolution=family_resolution(
        "direction only: γ² falls and ζ rises as the batch shrinks (Fig. 5)", FIG5_DESIGN_SD, 3,
        unit=" in γ²")))
