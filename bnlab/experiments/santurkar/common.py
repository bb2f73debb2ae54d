"""Shared configurations, helpers and the statistical rule of the Santurkar et al. 2018 entries; the
paper's notes (what is measured and why) are in :mod:`bnlab.experiments.santurkar`."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from ..base import RunSpec
from bnlab.formatting import finite_or_none
from ..common import Comparison, smooth

# ---- shared configurations --------------------------------------------------------------------

STANDARD, BN, NOISY = "Standard", "Standard + BatchNorm", 'Standard + "Noisy" BatchNorm'
L1, L2, LINF = "Standard + ℓ1", "Standard + ℓ2", "Standard + ℓ∞"
NORMS = {STANDARD: "none", BN: "bn", NOISY: "noisy_bn", L1: "lp_bn(p=1)", L2: "lp_bn(p=2)",
         LINF: "lp_bn(p=inf)"}

# see the module docstring: 30 × lr sits at the standard DLN's divergence rate
DLN_LR = 1e-3
# the other reading: the paper's 1e-6 converted as if its loss summed over all 1000 samples and
# 10 outputs
LITERAL_LR = 1e-2
DLN_RANGE = (0.01, 30.0)  # App. A.2.2, DLN
VGG_RANGE = (0.5, 4.0)    # App. A.2.2, VGG
SMOKE_VGG_STEPS = 600
SMOKE_DLN_STEPS = 600
# Fig. 6 "similar": BN's cos(G, G') may exceed standard's by this much and still count
COS_TOLERANCE = 0.02
# Fig. 7 "significantly higher": at least twice the standard network's moment change
SHIFT_FACTOR = 2.0


SEEDS = (0, 1, 2)  # every compared arm, both presets: the verdicts test differences over seeds
SMOKE_IMAGE_SIZE = 16  # digits upsampled from 8 × 8 (module docstring)
# The sharpness probe (Lanczos + Hutchinson on Hessian-vector products, train-mode BN): a few calls
# per run.
SMOKE_HESSIAN = "hessian(iters=12, samples=4, every=100)"
SMOKE_DLN_HESSIAN = "hessian(iters=12, samples=4, every=50)"
PAPER_HESSIAN = "hessian(iters=20, samples=10, every=500)"

# ICS and moments are taken only in the runs whose entries plot them (fig6/fig7: none, bn,
# noisy_bn); the ℓp runs of fig11 carry the landscape, histograms and hessian probes only, which
# keeps that entry in budget.
_FULL_PROBES = ("none", "bn", "noisy_bn")


def vgg_config(preset: str, norm: str, seed: int = 0) -> dict[str, Any]:
    """The VGG run of every Santurkar entry for ``norm`` (App. A.1: SGD, lr 0.1, batch 128, no
    augmentation)."""
    full = norm in _FULL_PROBES
    if preset == "paper":
        probes = ["ics(every=150)", "moments(every=150)"] if full else []
        return dict(model="vgg_santurkar", norm=norm, data="cifar10", steps=15000, lr=0.1,
                    batch_size=128, momentum=0.0, augment=False, seed=seed, eval_every=500,
                    probes=probes + ["histograms(every=75)", "landscape(every=150)", PAPER_HESSIAN])
    probes = ["ics(every=30)", "moments(every=15)"] if full else []
    return dict(model="vgg_santurkar", norm=norm, model_options={"width": 0.125, "init": "kaiming"},
                data="digits", data_options={"size": SMOKE_IMAGE_SIZE}, steps=SMOKE_VGG_STEPS,
                lr=0.1, batch_size=128, momentum=0.0, seed=seed, eval_every=50,
                probes=probes + ["histograms(every=20)", "landscape(every=30)", SMOKE_HESSIAN])


def dln_config(preset: str, norm: str, seed: int = 0, lr: float = DLN_LR) -> dict[str, Any]:
    """The DLN run of every Santurkar entry for ``norm`` (App. A.1: 25 square 10×10 layers, full
    batch of 1000); ``lr``: the other reading of the paper's rate for fig9's second arm pair."""
    base = dict(model="dln", norm=norm, model_options={"depth": 25, "width": 10},
                data="gaussian_regression", data_options={"d": 10, "n": 1000}, batch_size="full",
                lr=lr, momentum=0.0, seed=seed)
    full = norm in _FULL_PROBES
    if preset == "paper":
        probes = ["ics(every=100)"] if full else []
        return {**base, "steps": 10000,
                "probes": probes + ["histograms(every=50)", "landscape(every=100)", PAPER_HESSIAN]}
    probes = ["ics(every=25)"] if full else []
    return {**base, "steps": SMOKE_DLN_STEPS,
            "probes": probes + ["histograms(every=10)", "landscape(every=25)", SMOKE_DLN_HESSIAN]}


def vgg_runs(preset: str, labels, prefix: str = "") -> list[RunSpec]:
    return [RunSpec(f"{prefix}{label} · seed {seed}", vgg_config(preset, NORMS[label], seed),
                    {"net": "vgg", "norm": NORMS[label], "arm": prefix + label, "seed": seed})
            for label in labels for seed in SEEDS]


def dln_runs(preset: str, labels, prefix: str = "", lr: float = DLN_LR) -> list[RunSpec]:
    return [RunSpec(f"{prefix}{label} · seed {seed}", dln_config(preset, NORMS[label], seed, lr),
                    {"net": "dln", "norm": NORMS[label], "arm": prefix + label, "seed": seed})
            for label in labels for seed in SEEDS]


# ---- analysis helpers -------------------------------------------------------------------------

def _finite(values) -> list[float]:
    return [v for v in (finite_or_none(v) for v in values) if v is not None]


def finite_median(values) -> float | None:
    vals = _finite(values)
    return statistics.median(vals) if vals else None


def arm_runs(ctx) -> dict[str, list]:
    """Runs per arm (``factors["arm"]``, else the label), in seed order: what the statistics
    compare."""
    arms: dict[str, list] = {}
    for r in sorted(ctx.runs, key=lambda r: r.factors.get("seed", 0)):
        arms.setdefault(r.factors.get("arm", r.label), []).append(r)
    return arms


def runs_by_label(ctx) -> dict[str, Any]:
    """One run per arm for the figures: the first seed's."""
    return {arm: runs[0] for arm, runs in arm_runs(ctx).items()}


def per_seed(runs: list | None, statistic) -> list[float]:
    """``statistic(run)`` of every seed's run (non-finite or missing values left out; ∞ kept)."""
    out = []
    for r in runs or []:
        value = statistic(r)
        if value is not None and (value == math.inf or finite_or_none(value) is not None):
            out.append(float(value))
    return out


def log_values(values: list[float]) -> list[float]:
    """ln of positive values (ratios of scale-dependent quantities compare on a log scale); ∞ stays
    ∞."""
    return [math.log(v) if v != math.inf else math.inf for v in values if v > 0]


def compare_text(c: Comparison, what: str, log: bool = False) -> str:
    """One comparison in words: 'BN − standard, ln mean loss: −0.8 ± 0.1 (SE; Welch p=…) →
    lower'."""
    return f"{what}{' (ln)' if log else ''}: {c.text()} → {c.decision}"


# ---- sharpness (hessian probe) ----------------------------------------------------------------

def sharpness_ratio(run, lr: float, half: bool = True) -> float | None:
    """Median of λ_max / (2/lr) over the hessian probe's calls (the second half of training with
    ``half``): 1 is gradient descent's stability edge on a quadratic of that curvature."""
    if run is None:
        return None
    steps, values = run.series("probe/hessian/top_eigenvalue")
    rows = [(s, v) for s, v in zip(steps, values) if finite_or_none(v) is not None]
    if half and rows:
        cut = rows[-1][0] / 2
        rows = [(s, v) for s, v in rows if s >= cut] or rows[-1:]
    return finite_median([v * lr / 2 for _, v in rows])


def sharpness_panel(runs: dict, lr: float, prefix: str = "") -> dict:
    """λ_max of the train-mode loss over training per arm, with the edge 2/lr dashed."""
    series = {}
    for label, r in runs.items():
        if r is None:
            continue
        xs, ys = r.series("probe/hessian/top_eigenvalue")
        if xs:
            series[label] = (xs, ys)
    return {"series": series, "xlabel": "step", "ylabel": "λ_max(∇²L), train-mode BN", "logy": True,
            "markers": True, "hline": 2.0 / lr,
            "title": f"{prefix}sharpness (dashed: 2/lr = {2.0 / lr:g})"}


def sharpness_line(arms: dict[str, list], lr: float) -> str:
    """'sharpness λ_max·lr/2 (2nd half, median over seeds): Standard 0.4, BN 1.1' for the
    summaries."""
    parts = []
    for label, runs in arms.items():
        values = per_seed(runs, lambda r: sharpness_ratio(r, lr))
        if values:
            parts.append(f"{label} {statistics.median(values):.2g}")
    if not parts:
        return "sharpness not measured"
    return ("sharpness λ_max / (2/lr) of the train-mode loss, second half of training, median over "
            "seeds: "
            + ", ".join(parts) + " (≈ 1: at gradient descent's stability edge)")



def mean_train_loss(run) -> float | None:
    """Mean of the per-step training loss over the run: the area under the training curve, a 'how
    fast' measure. A diverged run counts as ∞ (it trained worse than any finite run); no data gives
    None."""
    if run is None:
        return None
    if run.status == "diverged":
        return math.inf
    vals = _finite(run.series("train_loss")[1])
    return sum(vals) / len(vals) if vals else None


_RANK = {"features": 0, "layers": 0, "classifier": 1}


def layer_key(name: str) -> tuple:
    """Order module paths as the model runs them: features before classifier, numbers
    numerically."""
    key = []
    for part in re.split(r"[.\[\]]+", name):
        if not part:
            continue
        key.append((0, int(part), "") if part.isdigit() else (1 + _RANK.get(part, 0), 0, part))
    return tuple(key)


def probe_layers(run, probe: str, quantity: str) -> list[str]:
    """Layer suffixes of ``probe/<probe>/<quantity>/<layer>`` metrics, in forward order."""
    prefix = f"probe/{probe}/{quantity}/"
    return sorted({n[len(prefix):] for n in run.metric_names(prefix)}, key=layer_key)


def pick(items: list, fractions=(0.25, 0.75)) -> list:
    """Items at the given relative depths (distinct, in order), e.g. an early and a late layer."""
    if not items:
        return []
    chosen = sorted({min(len(items) - 1, round(f * (len(items) - 1))) for f in fractions})
    return [items[i] for i in chosen]


def finite_values(run, metric: str) -> list[float]:
    return _finite(run.series(metric)[1]) if run is not None else []


def layer_medians(run, probe: str, quantity: str, skip_zero: bool = False) -> float | None:
    """Median over probed steps and layers of ``probe/<probe>/<quantity>/<layer>``.

    ``skip_zero`` leaves out layers whose values are all exactly 0 (ICS of the first layer: nothing
    precedes it, so G' = G by definition and it says nothing about the network)."""
    if run is None:
        return None
    values = []
    for layer in probe_layers(run, probe, quantity):
        vals = finite_values(run, f"probe/{probe}/{quantity}/{layer}")
        if skip_zero and all(v == 0.0 for v in vals):
            continue
        values += vals
    return finite_median(values)


def first_layer_zero(run, probe="ics") -> set[str]:
    out = set()
    for layer in probe_layers(run, probe, "l2"):
        vals = finite_values(run, f"probe/{probe}/l2/{layer}")
        if vals and all(v == 0.0 for v in vals):
            out.add(layer)
    return out


def curve_panel(runs: dict, metric: str, title: str, ylabel: str, logy=False, points=80) -> dict:
    series = {}
    for label, r in runs.items():
        if r is None:
            continue
        xs, ys = r.series(metric)
        xs, ys = smooth(xs, ys, points)
        if xs:
            series[label] = (xs, ys)
    return {"series": series, "xlabel": "step", "ylabel": ylabel, "title": title, "logy": logy}


def band_panel(runs: dict, lo: str, hi: str, mid: str | None, title: str, ylabel: str,
               logy=False) -> dict:
    """Shaded [lo, hi] per run against the step (the papers' 'variation' plots), ``mid`` as a
    line."""
    series, band = {}, {}
    for label, r in runs.items():
        if r is None:
            continue
        steps_lo, v_lo = r.series(lo)
        steps_hi, v_hi = r.series(hi)
        hi_at = dict(zip(steps_hi, v_hi))
        rows = [(s, a, hi_at.get(s)) for s, a in zip(steps_lo, v_lo)]
        rows = [(s, a, b) for s, a, b in rows if finite_or_none(a) is not None
                and finite_or_none(b) is not None]
        if mid is not None:
            xs, ys = r.series(mid)
            if _finite(ys):
                series[label] = (xs, ys)
        if rows:
            band[label + " (range)"] = ([s for s, _, _ in rows], [a for _, a, _ in rows],
                                        [b for _, _, b in rows])
            if mid is None:
                series[label] = ([s for s, _, _ in rows], [b for _, _, b in rows])
    return {"series": series, "band": band, "xlabel": "step", "ylabel": ylabel, "title": title,
            "logy": logy}


def hist_units(run) -> list[str]:
    """Unit tags ``<layer>[<unit>]`` recorded by the histograms probe, in forward order."""
    prefix = "probe/histograms/q50/"
    return sorted({n[len(prefix):] for n in run.metric_names(prefix)},
                  key=layer_key) if run is not None else []


def hist_layers(run) -> list[str]:
    return sorted({u.split("[")[0] for u in hist_units(run)}, key=layer_key)


def distribution_panel(run, unit: str, title: str) -> dict:
    """One sampled unit over training: 5–95 % and 25–75 % bands and the median (Figs 2, 8, 14)."""
    def s(q):
        return run.series(f"probe/histograms/{q}/{unit}")
    x05, v05 = s("q05")
    x95, v95 = s("q95")
    x25, v25 = s("q25")
    x75, v75 = s("q75")
    x50, v50 = s("q50")
    band = {}
    if x05 and len(x05) == len(x95):
        band["5–95 %"] = (x05, v05, v95)
    if x25 and len(x25) == len(x75):
        band["25–75 %"] = (x25, v25, v75)
    return {"series": {"median": (x50, v50)} if x50 else {}, "band": band, "xlabel": "step",
            "ylabel": "activation", "title": title}


def distribution_drift(run) -> float | None:
    """How far a layer's activation distribution moves over training, median over the sampled units.

    Per unit: |median_last − median_first| / spread_first + |ln(spread_last / spread_first)|, spread
    = q95 − q05: a shift of the centre measured in initial spreads plus the log-ratio of widths. 0
    for a distribution that stays put; both terms are scale-free, so networks of different
    activation scales compare."""
    if run is None:
        return None
    drifts = []
    for unit in hist_units(run):
        q05, q50, q95 = (finite_values(run, f"probe/histograms/{q}/{unit}")
                         for q in ("q05", "q50", "q95"))
        if len(q05) < 2 or len(q95) < 2 or len(q50) < 2:
            continue
        spread0, spread1 = q95[0] - q05[0], q95[-1] - q05[-1]
        if spread0 <= 0 or spread1 <= 0:
            continue
        drifts.append(abs(q50[-1] - q50[0]) / spread0 + abs(math.log(spread1 / spread0)))
    return finite_median(drifts)


def inconclusive_if_tiny(ctx) -> str | None:
    if ctx.tiny:
        return "tiny run (a few steps, a wiring check): nothing to compare"
    return None
