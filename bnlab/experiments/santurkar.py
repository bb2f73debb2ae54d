"""Santurkar, Tsipras, Ilyas & Madry 2018 — How does batch normalization help optimization?

Paper: /work/shared/papers/santurkar-how-does-bn-help-appendix.md (appendix; the main-text figures are
cited by number). Entries:

* ``santurkar-fig2`` — training of a VGG with no normalization, BN and "noisy" BN (App. A.2.1, Alg. 1).
* ``santurkar-fig6`` — ICS of Definition 2.1 per layer (probe ``ics``), VGG and the 25-layer DLN.
* ``santurkar-fig7`` — change of the activation moments caused by one update (probe ``moments``).
* ``santurkar-fig8`` — DLN activation distributions over training (probe ``histograms``).
* ``santurkar-fig9`` — DLN loss landscape, gradient predictiveness, effective β-smoothness (Figs 9–10,
  probe ``landscape`` over [1/100, 30] × lr, App. A.2.2), plus Fig. 10's gradient change against the
  distance moved (a small computation with :func:`bnlab.probes.evaluate_landscape`).
* ``santurkar-fig11`` — ℓp normalizations (``lp_bn`` p = 1, 2, ∞) against none and BN: training
  (Figs 11a, 13), landscapes (Figs 11b–d VGG, 12 DLN) and activation distributions (Fig. 14).

Shared runs: every VGG run of these entries uses one configuration per norm (:func:`vgg_config`) and
every DLN run one per norm (:func:`dln_config`), with all the probes any entry needs at per-probe
cadences. Identical configs have identical run ids, so after ``santurkar-fig2`` the VGG runs of
``fig6``/``fig7``/``fig11`` are already in the store and are not trained again (same for the DLN
runs of ``fig6``/``fig8``/``fig9``/``fig11``). Probes never change training (``bnlab.probes``), so a
run with them is the run without them.

Two settings differ from a literal reading of App. A.1 (both stated in the entries):

* DLN learning rate. The appendix gives 1e-6 for ‖W₁⋯W_k x − Ax‖² on 1000 samples; bnlab's regression
  loss is the mean over samples and outputs. We fix the rate by the appendix's own rule for the
  landscape range (A.2.2: the largest step, 30 × lr, "slightly smaller than the learning rate at which
  the standard network diverges"): the standard 25-layer DLN on our data diverges from lr ≈ 2.5e-2
  (13 steps at 2.5e-2 and 3e-2; still finite at 2e-2), so lr = 1e-3 (30 × lr = 3e-2). That is 1e-6 × 1000,
  i.e. the paper's loss summed over the 1000 samples. ``tests/test_experiments_santurkar.py`` checks
  both sides of the rule on the smoke data.
* Smoke VGG initialization. With Glorot's init (the paper's) the 11-layer ReLU VGG without BN sits at
  chance (loss 2.303) for the whole smoke budget: we measured ≥ 300 steps at lr 0.1 on digits with no
  progress; the paper's 15 000 steps are long enough to leave that plateau, 600 are not. Smoke runs
  therefore use He (Kaiming) init for all three networks; the paper preset uses Glorot.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from .base import Experiment, Outcome, Plan, RunSpec, register
from .common import finite_or_none, safe_panels, smooth

# ---- shared configurations --------------------------------------------------------------------

STANDARD, BN, NOISY = "Standard", "Standard + BatchNorm", 'Standard + "Noisy" BatchNorm'
L1, L2, LINF = "Standard + ℓ1", "Standard + ℓ2", "Standard + ℓ∞"
NORMS = {STANDARD: "none", BN: "bn", NOISY: "noisy_bn", L1: "lp_bn(p=1)", L2: "lp_bn(p=2)", LINF: "lp_bn(p=inf)"}

DLN_LR = 1e-3            # see the module docstring: 30 × lr sits at the standard DLN's divergence rate
DLN_RANGE = (0.01, 30.0)  # App. A.2.2, DLN
VGG_RANGE = (0.5, 4.0)    # App. A.2.2, VGG
SMOKE_VGG_STEPS = 600
SMOKE_DLN_STEPS = 600
COS_TOLERANCE = 0.02  # Fig. 6 "similar": BN's cos(G, G') may exceed standard's by this much and still count
SHIFT_FACTOR = 2.0    # Fig. 7 "significantly higher": at least twice the standard network's moment change


# ICS and moments are taken only in the runs whose entries plot them (fig6/fig7: none, bn, noisy_bn); the
# ℓp runs of fig11 carry the landscape and histograms probes only, which keeps that entry in budget.
_FULL_PROBES = ("none", "bn", "noisy_bn")


def vgg_config(preset: str, norm: str) -> dict[str, Any]:
    """The VGG run of every Santurkar entry for ``norm`` (App. A.1: SGD, lr 0.1, batch 128, no augmentation)."""
    full = norm in _FULL_PROBES
    if preset == "paper":
        probes = ["ics(every=150)", "moments(every=150)"] if full else []
        return dict(model="vgg_santurkar", norm=norm, data="cifar10", steps=15000, lr=0.1, batch_size=128,
                    momentum=0.0, augment=False, seed=0, eval_every=500,
                    probes=probes + ["histograms(every=75)", "landscape(every=150)"])
    probes = ["ics(every=10)", "moments(every=10)"] if full else []
    return dict(model="vgg_santurkar", norm=norm, model_options={"width": 0.125, "init": "kaiming"},
                data="digits", steps=SMOKE_VGG_STEPS, lr=0.1, batch_size=128, momentum=0.0, seed=0, eval_every=50,
                probes=probes + ["histograms(every=10)", "landscape(every=20)"])


def dln_config(preset: str, norm: str) -> dict[str, Any]:
    """The DLN run of every Santurkar entry for ``norm`` (App. A.1: 25 square 10×10 layers, full batch of 1000)."""
    base = dict(model="dln", norm=norm, model_options={"depth": 25, "width": 10}, data="gaussian_regression",
                data_options={"d": 10, "n": 1000}, batch_size="full", lr=DLN_LR, momentum=0.0, seed=0)
    full = norm in _FULL_PROBES
    if preset == "paper":
        probes = ["ics(every=100)"] if full else []
        return {**base, "steps": 10000, "probes": probes + ["histograms(every=50)", "landscape(every=100)"]}
    probes = ["ics(every=25)"] if full else []
    return {**base, "steps": SMOKE_DLN_STEPS, "probes": probes + ["histograms(every=10)", "landscape(every=25)"]}


def _vgg_runs(preset: str, labels, prefix: str = "") -> list[RunSpec]:
    return [RunSpec(prefix + label, vgg_config(preset, NORMS[label]), {"net": "vgg", "norm": NORMS[label]})
            for label in labels]


def _dln_runs(preset: str, labels, prefix: str = "") -> list[RunSpec]:
    return [RunSpec(prefix + label, dln_config(preset, NORMS[label]), {"net": "dln", "norm": NORMS[label]})
            for label in labels]


# ---- analysis helpers -------------------------------------------------------------------------

def _finite(values) -> list[float]:
    return [v for v in (finite_or_none(v) for v in values) if v is not None]


def _median(values) -> float | None:
    vals = _finite(values)
    return statistics.median(vals) if vals else None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else ("∞" if x == math.inf else f"{x:.{digits}g}")


def _runs_by_label(ctx) -> dict[str, Any]:
    return {r.label: r for r in ctx.runs}


def mean_train_loss(run) -> float | None:
    """Mean of the per-step training loss over the run: the area under the training curve, a 'how fast'
    measure. A diverged run counts as ∞ (it trained worse than any finite run); no data gives None."""
    if run is None:
        return None
    if run.status == "diverged":
        return math.inf
    vals = _finite(run.series("train_loss")[1])
    return sum(vals) / len(vals) if vals else None


_RANK = {"features": 0, "layers": 0, "classifier": 1}


def layer_key(name: str) -> tuple:
    """Order module paths as the model runs them: features before classifier, numbers numerically."""
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


def _values(run, metric: str) -> list[float]:
    return _finite(run.series(metric)[1]) if run is not None else []


def _layer_medians(run, probe: str, quantity: str, skip_zero: bool = False) -> float | None:
    """Median over probed steps and layers of ``probe/<probe>/<quantity>/<layer>``.

    ``skip_zero`` leaves out layers whose values are all exactly 0 (ICS of the first layer: nothing
    precedes it, so G' = G by definition and it says nothing about the network)."""
    if run is None:
        return None
    values = []
    for layer in probe_layers(run, probe, quantity):
        vals = _values(run, f"probe/{probe}/{quantity}/{layer}")
        if skip_zero and all(v == 0.0 for v in vals):
            continue
        values += vals
    return _median(values)


def _first_layer_zero(run, probe="ics") -> set[str]:
    out = set()
    for layer in probe_layers(run, probe, "l2"):
        vals = _values(run, f"probe/{probe}/l2/{layer}")
        if vals and all(v == 0.0 for v in vals):
            out.add(layer)
    return out


def _curve_panel(runs: dict, metric: str, title: str, ylabel: str, logy=False, points=80) -> dict:
    series = {}
    for label, r in runs.items():
        if r is None:
            continue
        xs, ys = r.series(metric)
        xs, ys = smooth(xs, ys, points)
        if xs:
            series[label] = (xs, ys)
    return {"series": series, "xlabel": "step", "ylabel": ylabel, "title": title, "logy": logy}


def _band_panel(runs: dict, lo: str, hi: str, mid: str | None, title: str, ylabel: str, logy=False) -> dict:
    """Shaded [lo, hi] per run against the step (the papers' 'variation' plots), ``mid`` as a line."""
    series, band = {}, {}
    for label, r in runs.items():
        if r is None:
            continue
        steps_lo, v_lo = r.series(lo)
        steps_hi, v_hi = r.series(hi)
        hi_at = dict(zip(steps_hi, v_hi))
        rows = [(s, a, hi_at.get(s)) for s, a in zip(steps_lo, v_lo)]
        rows = [(s, a, b) for s, a, b in rows if finite_or_none(a) is not None and finite_or_none(b) is not None]
        if mid is not None:
            xs, ys = r.series(mid)
            if _finite(ys):
                series[label] = (xs, ys)
        if rows:
            band[label + " (range)"] = ([s for s, _, _ in rows], [a for _, a, _ in rows], [b for _, _, b in rows])
            if mid is None:
                series[label] = ([s for s, _, _ in rows], [b for _, _, b in rows])
    return {"series": series, "band": band, "xlabel": "step", "ylabel": ylabel, "title": title, "logy": logy}


def _hist_units(run) -> list[str]:
    """Unit tags ``<layer>[<unit>]`` recorded by the histograms probe, in forward order."""
    prefix = "probe/histograms/q50/"
    return sorted({n[len(prefix):] for n in run.metric_names(prefix)}, key=layer_key) if run is not None else []


def _hist_layers(run) -> list[str]:
    return sorted({u.split("[")[0] for u in _hist_units(run)}, key=layer_key)


def _distribution_panel(run, unit: str, title: str) -> dict:
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

    Per unit: |median_last − median_first| / spread_first + |ln(spread_last / spread_first)|, spread =
    q95 − q05: a shift of the centre measured in initial spreads plus the log-ratio of widths. 0 for a
    distribution that stays put; both terms are scale-free, so networks of different activation scales
    compare."""
    if run is None:
        return None
    drifts = []
    for unit in _hist_units(run):
        q05, q50, q95 = (_values(run, f"probe/histograms/{q}/{unit}") for q in ("q05", "q50", "q95"))
        if len(q05) < 2 or len(q95) < 2 or len(q50) < 2:
            continue
        spread0, spread1 = q95[0] - q05[0], q95[-1] - q05[-1]
        if spread0 <= 0 or spread1 <= 0:
            continue
        drifts.append(abs(q50[-1] - q50[0]) / spread0 + abs(math.log(spread1 / spread0)))
    return _median(drifts)


def _inconclusive_if_tiny(ctx) -> str | None:
    if ctx.tiny:
        return "tiny run (a few steps, a wiring check): nothing to compare"
    return None


# ---- Fig. 2: standard vs BN vs "noisy" BN ------------------------------------------------------

FIG2_LABELS = (STANDARD, BN, NOISY)


def _fig2_plan(preset: str) -> Plan:
    return Plan(runs=_vgg_runs(preset, FIG2_LABELS))


def _fig2_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG2_LABELS}
    specs = [_curve_panel(runs, "train_loss", "training loss (block means)", "loss", logy=True),
             _curve_panel(runs, "train_accuracy", "training accuracy (batch, block means)", "accuracy"),
             _curve_panel(runs, "test_accuracy", "test accuracy", "accuracy", points=200)]
    for label in (BN, NOISY):
        r = runs.get(label)
        units = _hist_units(r)
        layers = _hist_layers(r)
        for layer in pick(layers, (0.2, 0.8)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(_distribution_panel(r, unit, f"{label}: activation {unit}"))
    fig = safe_panels(ctx.figure_path("training_curves"), specs, ncols=3,
                 title="Santurkar Fig. 2: VGG with standard, BN and noisy BN layers")
    means = {label: mean_train_loss(r) for label, r in runs.items()}
    finals = {label: (r.final("train_accuracy") if r is not None else None,
                      r.final("test_accuracy") if r is not None else None) for label, r in runs.items()}
    paper = {STANDARD: "trains slowest; test acc. 80 % (App. A.1, CIFAR-10, no augmentation)",
             BN: "trains fastest; test acc. 83 % (App. A.1)",
             NOISY: "trains like BN, faster than Standard, despite the noise (Fig. 2)"}
    table = [{"quantity": f"{label}: mean training loss / final train acc. / test acc.",
              "ours": f"{_fmt(means[label])} / {_fmt(finals[label][0])} / {_fmt(finals[label][1])}",
              "paper": paper[label]} for label in FIG2_LABELS]
    tiny = _inconclusive_if_tiny(ctx)
    if tiny or any(v is None for v in means.values()):
        return Outcome([fig], table, "inconclusive", tiny or "a run has no training-loss curve")
    std, bn, noisy = means[STANDARD], means[BN], means[NOISY]
    held = noisy < std
    return Outcome([fig], table, "held" if held else "not held",
                   f"mean training loss over the run (area under the curve): standard {_fmt(std)}, BN {_fmt(bn)}, "
                   f"noisy BN {_fmt(noisy)}; noisy BN {'trains faster than' if held else 'does not beat'} the "
                   f"standard network despite the injected, time-varying shift")


register(Experiment(
    id="santurkar-fig2", paper="santurkar", target="Fig. 2",
    title="Training with standard, BN and noisy BN VGG",
    claim="BN with injected, time-varying covariate shift ('noisy' BN) still trains as well as BN and better "
          "than the standard network: ICS reduction is not what makes BN work.",
    smoke_changes="digits (8×8) instead of CIFAR-10, VGG at 1/8 width, 600 steps (≈ 53 epochs of digits) "
                  "instead of 15 000, He instead of Glorot init (with Glorot the 11-layer standard VGG stays "
                  "at chance for the whole smoke budget), one seed. The runs carry the ics/moments/histograms/"
                  "landscape probes so that fig6, fig7 and fig11 reuse them. 'Trains faster' is judged by the "
                  "mean training loss over the run.",
    cost={"smoke": "≈ 55 s CPU, one thread (3 VGG runs of 600 steps with probes)",
          "paper": "3 runs × 15 000 steps VGG on CIFAR-10 (GPU, ≈ 1 h with probes)"},
    plan=_fig2_plan, analyze=_fig2_analyze))


# ---- Fig. 6: ICS (Definition 2.1) -------------------------------------------------------------

FIG6_LABELS = (STANDARD, BN)


def _fig6_plan(preset: str) -> Plan:
    return Plan(runs=_vgg_runs(preset, FIG6_LABELS, "VGG: ") + _dln_runs(preset, FIG6_LABELS, "DLN: "))


def _ics_summary(run) -> tuple[float | None, float | None]:
    """(median cos(G, G'), median ‖G − G'‖) over probed steps and layers, the first layer left out."""
    if run is None:
        return None, None
    skip = _first_layer_zero(run)
    cos = [v for layer in probe_layers(run, "ics", "cos") if layer not in skip
           for v in _values(run, f"probe/ics/cos/{layer}")]
    return _median(cos), _layer_medians(run, "ics", "l2", skip_zero=True)


def _fig6_analyze(ctx) -> Outcome:
    by_label = _runs_by_label(ctx)
    specs, table, verdicts = [], [], []
    summaries = {}
    for net in ("VGG", "DLN"):
        runs = {label: by_label.get(f"{net}: {label}") for label in FIG6_LABELS}
        reference = runs[STANDARD] or runs[BN]
        layers = [l for l in probe_layers(reference, "ics", "l2") if l not in _first_layer_zero(reference)] \
            if reference is not None else []
        for layer in pick(layers, (0.3, 0.9)):
            for quantity, ylabel in (("l2", "‖G − G′‖₂"), ("cos", "cos(G, G′)")):
                series = {}
                for label, r in runs.items():
                    if r is not None:
                        xs, ys = r.series(f"probe/ics/{quantity}/{layer}")
                        if xs:
                            series[label] = (xs, ys)
                specs.append({"series": series, "xlabel": "step", "ylabel": ylabel, "markers": True,
                              "title": f"{net} layer {layer}: {ylabel}", "logy": quantity == "l2"})
        for label, r in runs.items():
            summaries[(net, label)] = _ics_summary(r)
        (cos_std, l2_std), (cos_bn, l2_bn) = summaries[(net, STANDARD)], summaries[(net, BN)]
        table.append({"quantity": f"{net}: median cos(G, G′) standard / BN",
                      "ours": f"{_fmt(cos_std)} / {_fmt(cos_bn)}",
                      "paper": "BN similar or lower (worse) than standard (Fig. 6)"})
        table.append({"quantity": f"{net}: median ‖G − G′‖₂ standard / BN",
                      "ours": f"{_fmt(l2_std)} / {_fmt(l2_bn)}",
                      "paper": "BN similar or larger (worse) than standard (Fig. 6)"})
        if cos_std is not None and cos_bn is not None:
            verdicts.append((net, cos_bn <= cos_std + COS_TOLERANCE, cos_std, cos_bn))
    fig = safe_panels(ctx.figure_path("ics"), specs or [{"title": "no ICS measurements"}], ncols=4,
                 title="Santurkar Fig. 6: ICS (Definition 2.1) with and without BN")
    tiny = _inconclusive_if_tiny(ctx)
    if tiny or len(verdicts) < 2:
        return Outcome([fig], table, "inconclusive", tiny or "ICS was not measured for both networks")
    held = all(ok for _, ok, _, _ in verdicts)
    parts = "; ".join(f"{net}: standard {_fmt(c_std)}, BN {_fmt(c_bn)} — "
                      f"{'BN similar or worse (claim holds)' if ok else 'BN clearly less ICS (claim fails)'}"
                      for net, ok, c_std, c_bn in verdicts)
    return Outcome([fig], table, "held" if held else "not held",
                   f"median cos(G, G′) over probed steps and layers (first layer excluded; 'similar' = BN at most "
                   f"{COS_TOLERANCE} above standard): {parts}")


register(Experiment(
    id="santurkar-fig6", paper="santurkar", target="Fig. 6",
    title="Internal covariate shift (Definition 2.1) with and without BN",
    claim="Networks with BN have similar or even larger ICS — the change of a layer's gradient when the "
          "preceding layers are updated, ‖G − G′‖ and cos(G, G′) — than standard networks, while training better.",
    smoke_changes="VGG: the shared smoke VGG runs of fig2 (digits, 1/8 width, 600 steps, He init), ICS every 10 "
                  "steps. DLN: the paper's 25 layers of width 10 on 1000 Gaussian samples, full batch, 600 "
                  "instead of 10 000 steps, ICS every 25 steps. 'Similar or worse' is judged by the median "
                  "cos(G, G′) over steps and layers: BN's may not exceed standard's by more than 0.02.",
    cost={"smoke": "≈ 50 s CPU (2 VGG + 2 DLN runs; the VGG runs are fig2's)",
          "paper": "2 VGG × 15 000 steps on CIFAR-10 + 2 DLN × 10 000 steps (GPU, ≈ 45 min)"},
    plan=_fig6_plan, analyze=_fig6_analyze))


# ---- Fig. 7: moments drift --------------------------------------------------------------------

def _fig7_plan(preset: str) -> Plan:
    return Plan(runs=_vgg_runs(preset, FIG2_LABELS))


def _fig7_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG2_LABELS}
    specs = []
    # Layers differ in name (the conv output "features.4.0" without BN, the BN output "features.4.1" with it):
    # pair them by their block "features.4", at depths picked among the blocks every run has.
    block_maps = {label: {layer.rsplit(".", 1)[0]: layer for layer in probe_layers(r, "moments", "mean_change")}
                  if r is not None else {} for label, r in runs.items()}
    present = [m for m in block_maps.values() if m]
    common = sorted(set.intersection(*(set(m) for m in present)), key=layer_key) if present else []
    for block in pick(common, (0.25, 0.75)):
        for quantity, ylabel in (("mean_change", "|Δ mean|"), ("var_change", "|Δ variance|")):
            series = {}
            for label, blocks in block_maps.items():
                if block in blocks:
                    xs, ys = runs[label].series(f"probe/moments/{quantity}/{blocks[block]}")
                    if xs:
                        series[label] = (xs, ys)
            specs.append({"series": series, "xlabel": "step", "ylabel": ylabel, "logy": True,
                          "title": f"block {block} output: {ylabel} per step"})
    specs.append(_curve_panel(runs, "train_loss", "training loss (block means)", "loss", logy=True))
    fig = safe_panels(ctx.figure_path("moments"), specs, ncols=3,
                 title="Santurkar Fig. 7: change of activation moments between successive steps")
    medians = {label: (_layer_medians(r, "moments", "mean_change"), _layer_medians(r, "moments", "var_change"))
               for label, r in runs.items()}
    losses = {label: mean_train_loss(r) for label, r in runs.items()}
    paper = {STANDARD: "small change of mean and variance", BN: "small change",
             NOISY: "much larger change of both moments than Standard, yet trains faster (Figs 2, 7)"}
    table = [{"quantity": f"{label}: median |Δ mean| / |Δ var| per step; mean training loss",
              "ours": f"{_fmt(medians[label][0])} / {_fmt(medians[label][1])}; {_fmt(losses[label])}",
              "paper": paper[label]} for label in FIG2_LABELS]
    tiny = _inconclusive_if_tiny(ctx)
    values = [medians[STANDARD][0], medians[STANDARD][1], medians[NOISY][0], medians[NOISY][1],
              losses[STANDARD], losses[NOISY]]
    if tiny or any(v is None for v in values):
        return Outcome([fig], table, "inconclusive", tiny or "moments or training loss missing for a run")
    (m_std, v_std), (m_noisy, v_noisy) = medians[STANDARD], medians[NOISY]
    more_shift = m_noisy > SHIFT_FACTOR * m_std and v_noisy > SHIFT_FACTOR * v_std
    trains_better = losses[NOISY] < losses[STANDARD]
    held = more_shift and trains_better
    return Outcome([fig], table, "held" if held else "not held",
                   f"median per-step |Δ mean| noisy BN {_fmt(m_noisy)} vs standard {_fmt(m_std)}, |Δ var| "
                   f"{_fmt(v_noisy)} vs {_fmt(v_std)} (required: > {SHIFT_FACTOR}×); mean training loss noisy BN "
                   f"{_fmt(losses[NOISY])} vs standard {_fmt(losses[STANDARD])}")


register(Experiment(
    id="santurkar-fig7", paper="santurkar", target="Fig. 7",
    title="Change of activation moments per step: standard, BN, noisy BN",
    claim="'Noisy' BN layers change the mean and variance of a layer's activations between successive steps "
          "far more than a standard network does, yet the network trains better (cf. Fig. 2).",
    smoke_changes="the shared smoke VGG runs of fig2 (digits, 1/8 width, 600 steps, He init), moments probe every "
                  "10 steps; layers are the BN outputs (conv outputs without BN), paired across networks by "
                  "depth. 'Significantly higher' is taken as ≥ 2× the standard network's median change.",
    cost={"smoke": "≈ 52 s CPU (the 3 runs of fig2; free after fig2)",
          "paper": "the 3 runs of fig2 (GPU)"},
    plan=_fig7_plan, analyze=_fig7_analyze))


# ---- Fig. 8: DLN activation distributions -----------------------------------------------------

def _fig8_plan(preset: str) -> Plan:
    return Plan(runs=_dln_runs(preset, FIG6_LABELS))


def _fig8_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    specs = []
    for label, r in runs.items():
        units = _hist_units(r)
        for layer in pick(_hist_layers(r), (0.1, 0.5, 0.9)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(_distribution_panel(r, unit, f"{label}: {unit}"))
    fig = safe_panels(ctx.figure_path("activations"), specs or [{"title": "no activation histograms"}], ncols=3,
                 title="Santurkar Fig. 8: activation distributions of a 25-layer DLN over training")
    drift = {label: distribution_drift(r) for label, r in runs.items()}
    table = [{"quantity": f"{label}: median drift of a unit's distribution (centre shift in initial spreads "
                          f"+ |ln width ratio|)",
              "ours": _fmt(drift[label]),
              "paper": {STANDARD: "distributions shift and widen over training (Fig. 8)",
                        BN: "distributions stay stable (Fig. 8)"}[label]} for label in FIG6_LABELS]
    tiny = _inconclusive_if_tiny(ctx)
    if tiny or drift[STANDARD] is None or drift[BN] is None:
        return Outcome([fig], table, "inconclusive", tiny or "activation distributions missing for a run")
    held = drift[BN] < drift[STANDARD]
    return Outcome([fig], table, "held" if held else "not held",
                   f"median drift of a sampled unit's distribution from the first to the last measurement: "
                   f"BN {_fmt(drift[BN])}, standard {_fmt(drift[STANDARD])}; BN's distributions "
                   f"{'move less' if held else 'do not move less'}")


register(Experiment(
    id="santurkar-fig8", paper="santurkar", target="Fig. 8",
    title="Activation distributions of a deep linear network over training",
    claim="Sampled activations of a 25-layer DLN drift in distribution over training without BN and stay "
          "stable with BN (the distributional stability BN is usually credited with).",
    smoke_changes="the paper's DLN (25 layers of width 10, 1000 Gaussian samples, full batch) for 600 instead "
                  "of 10 000 steps at lr 1e-3 (module docstring: the paper's 1e-6 is for its summed loss), "
                  "2 units per layer every 10 steps; the figure shows 3 layers (10 %, 50 %, 90 % depth). The "
                  "verdict compares a scale-free drift of the distributions (the figure itself states no number).",
    cost={"smoke": "≈ 25 s CPU (2 DLN runs; shared with fig6/fig9)",
          "paper": "2 DLN runs × 10 000 steps (GPU or CPU, ≈ 10 min)"},
    plan=_fig8_plan, analyze=_fig8_analyze))


# ---- Figs 9–10: DLN landscape -----------------------------------------------------------------

LANDSCAPE = {"loss_range": "loss range along the gradient", "grad_change_max": "max ‖∇L(θ) − ∇L(θ − s g)‖",
             "beta_smoothness": "effective β-smoothness"}


def landscape_summary(run) -> dict[str, float | None]:
    """Median over probed steps of the landscape probe's loss range, largest gradient change and β."""
    return {k: _median(_values(run, f"probe/landscape/{k}")) for k in LANDSCAPE}


FIG10_MULTIPLIERS = (0.01, 1000.0)  # Fig. 10's replay goes past the paper's 30 × lr ("BN keeps smoothing further")
LITERAL_LR = 1e-2  # the paper's 1e-6 converted as if its loss summed over all 1000 samples and 10 outputs


def fig10_grid(lr: float = DLN_LR, points_per_decade: int = 5) -> list[float]:
    """Log-spaced step sizes over FIG10_MULTIPLIERS × lr plus the exact ends 30 × lr and 300 × lr.

    30 × lr ends the paper's range at our rate; 30 × LITERAL_LR = 300 × lr ends it at the other
    reading of the paper's rate, so both ranges can be cut from one curve."""
    lo, hi = (math.log10(m) for m in FIG10_MULTIPLIERS)
    count = round((hi - lo) * points_per_decade)
    multipliers = {10 ** (lo + i * (hi - lo) / count) for i in range(count + 1)} | {30.0, 300.0}
    return [m * lr for m in sorted(multipliers)]


def predictiveness_curves(preset: str = "smoke", tiny: bool = False) -> dict:
    """Fig. 10: ‖∇L(θ) − ∇L(θ − s g)‖ and L(θ − s g) against the step s along the gradient, DLN ± BN.

    Replays each DLN of :func:`dln_config` (same model, data and rate; a plain full-batch SGD loop,
    weights drawn with ``seed=0``) and at a few steps evaluates the landscape with
    :func:`bnlab.probes.evaluate_landscape` (naive, exact) on :func:`fig10_grid`. The training probe
    keeps only the range over its grid; this keeps the whole curve, and reaches past the paper's
    30 × lr up to 1000 × lr, which also covers [1/100, 30] × 1e-2 (the literal conversion of the
    paper's rate, module docstring).
    """
    import torch

    import bnlab.models as M
    from bnlab import data as D
    from bnlab.probes import ProbeContext, evaluate_landscape

    at = {"paper": (0, 1000, 10000), "smoke": (0, 200, SMOKE_DLN_STEPS)}[preset]
    if tiny:
        at = (0, 2)
    grid = torch.tensor(fig10_grid(), dtype=torch.float64)
    out: dict[str, Any] = {"at_steps": list(at), "lr": DLN_LR, "step_sizes": grid.tolist(), "runs": {}}
    for label in FIG6_LABELS:
        cfg = dln_config(preset, NORMS[label])
        ds = D.load(cfg["data"], **cfg["data_options"], seed=cfg["seed"])
        model = M.create("dln", norm=cfg["norm"], input_shape=ds.input_shape, num_classes=ds.num_outputs,
                         seed=cfg["seed"], **cfg["model_options"])
        opt = torch.optim.SGD(model.parameters(), lr=DLN_LR)
        x, y = ds.x_train, ds.y_train
        loss_fn = torch.nn.functional.mse_loss
        curves = []
        status = "finished"
        for step in range(max(at) + 1):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            if not torch.isfinite(loss):
                status = "diverged"
                break
            loss.backward()
            if step in at:
                res = evaluate_landscape(ProbeContext(model, loss_fn, (x, y), step, optimizer=opt), grid, "naive")
                curves.append({"step": step, "grad_change": [finite_or_none(v) for v in res.grad_changes],
                               "loss": [finite_or_none(v) for v in res.losses], "grad_norm": res.grad_norm,
                               "loss_at_theta": res.loss})
            opt.step()
        out["runs"][label] = {"status": status, "curves": curves}
    return out


def window_summary(curve: dict, step_sizes: list[float], lo: float, hi: float) -> dict[str, float | None]:
    """Loss range, largest gradient change and effective β of one Fig. 10 curve over s ∈ [lo, hi].

    Same definitions as the landscape probe (:class:`bnlab.probes.LandscapeResult`): the range of
    L(θ − s g), max ‖∇L(θ) − ∇L(θ − s g)‖ and max of that over s‖g‖; non-finite points are skipped."""
    rows = [(s, l, d) for s, l, d in zip(step_sizes, curve["loss"], curve["grad_change"])
            if lo * (1 - 1e-9) <= s <= hi * (1 + 1e-9)]
    losses = [l for _, l, _ in rows if l is not None]
    changes = [(s, d) for s, _, d in rows if d is not None]
    g = curve.get("grad_norm") or 0.0
    betas = [d / (s * g) for s, d in changes if s > 0 and g > 0]
    return {"loss_range": (max(losses) - min(losses)) if losses else None,
            "grad_change_max": max(d for _, d in changes) if changes else None,
            "beta_smoothness": max(betas) if betas else None}


def _fig9_plan(preset: str) -> Plan:
    return Plan(runs=_dln_runs(preset, FIG6_LABELS),
                compute={"predictiveness": lambda tiny=False: predictiveness_curves(preset, tiny)})


def _landscape_panels(runs: dict, prefix: str, lr: float) -> list[dict]:
    beta = _curve_panel(runs, "probe/landscape/beta_smoothness", f"{prefix}effective β-smoothness (dashed: 2/lr)",
                        "β", logy=True)
    beta["hline"] = 2.0 / lr  # gradient descent's stability edge: sharper directions make a step overshoot
    return [
        _band_panel(runs, "probe/landscape/loss_min", "probe/landscape/loss_max", "probe/landscape/loss",
                    f"{prefix}loss landscape (loss along the gradient)", "loss", logy=True),
        _band_panel(runs, "probe/landscape/grad_change_min", "probe/landscape/grad_change_max", None,
                    f"{prefix}gradient predictiveness", "‖∇L(θ) − ∇L(θ − s g)‖", logy=True),
        beta,
    ]


def _replay_windows(pred: dict) -> dict[str, dict[str, dict[str, float | None]]]:
    """Median over the replay's evaluation steps of :func:`window_summary`, per run, for the paper's
    range at our rate ([1/100, 30] × lr) and at the literal conversion ([1/100, 30] × 1e-2)."""
    lr = pred.get("lr") or DLN_LR
    sizes = pred.get("step_sizes") or []
    windows = {"ours": (DLN_RANGE[0] * lr, DLN_RANGE[1] * lr),
               "literal": (DLN_RANGE[0] * LITERAL_LR, DLN_RANGE[1] * LITERAL_LR)}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for label, info in (pred.get("runs") or {}).items():
        curves = info.get("curves") or []
        out[label] = {}
        for name, (lo, hi) in windows.items():
            summaries = [window_summary(c, sizes, lo, hi) for c in curves]
            out[label][name] = {k: _median([sm[k] for sm in summaries]) for k in LANDSCAPE}
    return out


def _fig10_panels(pred: dict) -> list[dict]:
    lr = pred.get("lr") or DLN_LR
    multiples = [v / lr for v in pred.get("step_sizes") or []]
    runs = pred.get("runs") or {}
    specs = []
    for quantity, ylabel in (("grad_change", "‖∇L(θ) − ∇L(θ − s g)‖"), ("loss", "L(θ − s g)")):
        for index, step in enumerate(pred.get("at_steps") or []):
            series = {}
            for label, info in runs.items():
                curves = info.get("curves") or []
                if index < len(curves):
                    series[label] = (multiples, curves[index][quantity])
            specs.append({"series": series, "xlabel": "step size s / lr (paper's range ends at 30)",
                          "ylabel": ylabel, "title": f"training step {step}", "logx": True, "logy": True,
                          "markers": True})
    return specs


def _fig9_analyze(ctx) -> Outcome:
    runs = {label: _runs_by_label(ctx).get(label) for label in FIG6_LABELS}
    specs = _landscape_panels(runs, "", DLN_LR)
    specs.append(_curve_panel(runs, "train_loss", "training loss", "loss", logy=True))
    fig9 = safe_panels(ctx.figure_path("landscape"), specs, ncols=4,
                       title="Santurkar Fig. 9: DLN landscape along the gradient, [1/100, 30] × lr")
    pred = (ctx.data or {}).get("predictiveness") or {}
    fig10 = safe_panels(ctx.figure_path("predictiveness"), _fig10_panels(pred) or [{"title": "no replay data"}],
                        ncols=3, title="Santurkar Fig. 10: gradient change and loss along the gradient, "
                                       "against the step size")
    summary = {label: landscape_summary(r) for label, r in runs.items()}
    paper = {"loss_range": "BN much smaller (Fig. 9a)", "grad_change_max": "BN much smaller (Figs 9b, 10)",
             "beta_smoothness": "BN smaller (Fig. 9c)"}
    table = [{"quantity": f"median {LANDSCAPE[k]} over training, [1/100, 30] × {DLN_LR:g}: standard / BN",
              "ours": f"{_fmt(summary[STANDARD][k])} / {_fmt(summary[BN][k])}", "paper": paper[k]} for k in LANDSCAPE]
    beta_bn = summary[BN]["beta_smoothness"]
    table.append({"quantity": "BN's median β × lr / 2 (1 = the stability edge 2/lr of gradient descent)",
                  "ours": _fmt(None if beta_bn is None else beta_bn * DLN_LR / 2), "paper": "—"})
    replay = _replay_windows(pred)
    literal_smaller = None
    if STANDARD in replay and BN in replay:
        for name, text in (("ours", f"[1/100, 30] × {DLN_LR:g}"), ("literal", f"[1/100, 30] × {LITERAL_LR:g}")):
            for k in LANDSCAPE:
                table.append({"quantity": f"Fig. 10 replay, {text}: median {LANDSCAPE[k]}, standard / BN",
                              "ours": f"{_fmt(replay[STANDARD][name][k])} / {_fmt(replay[BN][name][k])}",
                              "paper": paper[k]})
        pairs = [(replay[BN]["literal"][k], replay[STANDARD]["literal"][k]) for k in LANDSCAPE]
        if all(a is not None and b is not None for a, b in pairs):
            literal_smaller = sum(a < b for a, b in pairs)
    tiny = _inconclusive_if_tiny(ctx)
    if tiny or any(v is None for s in summary.values() for v in s.values()):
        return Outcome([fig9, fig10], table, "inconclusive", tiny or "landscape measurements missing for a run")
    smaller = {k: summary[BN][k] < summary[STANDARD][k] for k in LANDSCAPE}
    held = all(smaller.values())
    parts = ", ".join(f"{LANDSCAPE[k]} {_fmt(summary[BN][k])} vs {_fmt(summary[STANDARD][k])}" for k in LANDSCAPE)
    text = (f"medians over training at [1/100, 30] × {DLN_LR:g}, BN vs standard: {parts}; "
            + ("BN is smoother on all three" if held else
               "BN is not smoother on: " + ", ".join(LANDSCAPE[k] for k, ok in smaller.items() if not ok)))
    if beta_bn is not None:
        text += f" (BN's β is {beta_bn * DLN_LR / 2:.2f} × 2/lr: full-batch GD holds it at its stability edge)"
    if literal_smaller is not None:
        text += (f". Replay over [1/100, 30] × {LITERAL_LR:g} (the literal reading of the paper's rate): BN smaller "
                 f"on {literal_smaller} of 3")
    return Outcome([fig9, fig10], table, "held" if held else "not held", text)


register(Experiment(
    id="santurkar-fig9", paper="santurkar", target="Figs 9–10",
    title="DLN loss landscape, gradient predictiveness and β-smoothness with and without BN",
    claim="Along the gradient direction, over steps of [1/100, 30] × lr, a DLN with BN has a much smaller loss "
          "range, more predictive gradients and a smaller effective β-smoothness than without BN.",
    smoke_changes="the paper's DLN and range at lr 1e-3 (module docstring) for 600 instead of 10 000 steps, "
                  "landscape (8 linear points) every 25 steps; Fig. 10's curves at steps 0, 200, 600 (27 "
                  "log-spaced step sizes from 1/100 to 1000 × lr) come from a plain-SGD replay of the same two "
                  "DLNs, which also gives the landscape over [1/100, 30] × 1e-2 (the literal reading of the "
                  "paper's rate). The verdict uses the training probe at the paper's range.",
    cost={"smoke": "≈ 35 s CPU (2 DLN runs + the Fig. 10 replay; runs shared with fig6/fig8)",
          "paper": "2 DLN runs × 10 000 steps + replay (≈ 15 min on a CPU)"},
    plan=_fig9_plan, analyze=_fig9_analyze))


# ---- Figs 11–14: ℓp normalizations ------------------------------------------------------------

LP_LABELS = (STANDARD, BN, L1, L2, LINF)
SMOKE_LP_LABELS = (STANDARD, BN, L1, LINF)  # ℓ2 is BN up to where ε enters (measured equal, see docs)


def _fig11_plan(preset: str) -> Plan:
    labels = LP_LABELS if preset == "paper" else SMOKE_LP_LABELS
    return Plan(runs=_vgg_runs(preset, labels, "VGG: ") + _dln_runs(preset, labels, "DLN: "))


def _fig11_analyze(ctx) -> Outcome:
    by_label = _runs_by_label(ctx)
    labels = [l for l in LP_LABELS if f"VGG: {l}" in by_label or f"DLN: {l}" in by_label]
    normalized = [l for l in labels if l != STANDARD]
    figures, table = [], []
    # (net, criterion) -> [normalized labels that beat standard], [those that had data]
    wins: dict[tuple[str, str], list[str]] = {}
    tried: dict[tuple[str, str], list[str]] = {}
    for net, fig_name, target in (("VGG", "vgg", "Fig. 11"), ("DLN", "dln", "Fig. 12")):
        runs = {label: by_label.get(f"{net}: {label}") for label in labels}
        specs = [_curve_panel(runs, "train_loss", f"(a) {net} training loss", "loss", logy=True)]
        specs += _landscape_panels(runs, f"{net}: ", (vgg_config if net == "VGG" else dln_config)(ctx.preset, "none")["lr"])
        figures.append(safe_panels(ctx.figure_path(f"{fig_name}_lp"), specs, ncols=4,
                                   title=f"Santurkar {target}: {net} with ℓp normalizations"))
        losses = {label: mean_train_loss(r) for label, r in runs.items()}
        land = {label: landscape_summary(r) for label, r in runs.items()}
        for label in labels:
            table.append({"quantity": f"{net} {label}: mean training loss; median loss range; median β",
                          "ours": f"{_fmt(losses[label])}; {_fmt(land[label]['loss_range'])}; "
                                  f"{_fmt(land[label]['beta_smoothness'])}",
                          "paper": "worst training, roughest landscape" if label == STANDARD else
                                   "trains better and smoother than Standard (Figs 11–13)"})
        for label in normalized:
            for criterion, ours, ref in (
                    ("training loss", losses[label], losses.get(STANDARD)),
                    ("loss range", land[label]["loss_range"], land.get(STANDARD, {}).get("loss_range")),
                    ("β", land[label]["beta_smoothness"], land.get(STANDARD, {}).get("beta_smoothness"))):
                if ours is None or ref is None:
                    continue
                tried.setdefault((net, criterion), []).append(label)
                if ours < ref:
                    wins.setdefault((net, criterion), []).append(label)
    # Fig. 14: activation distributions of the VGG under the normalizations, one layer at 75 % depth.
    specs, drift = [], {}
    for label in labels:
        r = by_label.get(f"VGG: {label}")
        drift[label] = distribution_drift(r)
        units = _hist_units(r)
        for layer in pick(_hist_layers(r), (0.75,)):
            unit = next(u for u in units if u.split("[")[0] == layer)
            specs.append(_distribution_panel(r, unit, f"{label}: {unit}"))
    figures.append(safe_panels(ctx.figure_path("vgg_lp_activations"), specs or [{"title": "no activation histograms"}],
                               ncols=3, title="Santurkar Fig. 14: VGG activation distributions under ℓp normalizations"))
    table.append({"quantity": "VGG median distribution drift (Fig. 14): " + " / ".join(labels),
                  "ours": " / ".join(_fmt(drift[l]) for l in labels),
                  "paper": "ℓp normalizations shift the distributions more than BN, yet train well (Fig. 14)"})
    tiny = _inconclusive_if_tiny(ctx)
    expected = 2 * 3 * len(normalized)
    checks = sum(len(v) for v in tried.values())
    if tiny or not normalized or checks < expected:
        return Outcome(figures, table, "inconclusive",
                       tiny or f"only {checks} of {expected} comparisons with the standard network had data")
    won = sum(len(v) for v in wins.values())
    parts = "; ".join(f"{net} " + ", ".join(f"{criterion} {len(wins.get((net, criterion), []))}/{len(normalized)}"
                                            for criterion in ("training loss", "loss range", "β"))
                      for net in ("VGG", "DLN"))
    return Outcome(figures, table, "held" if won == expected else "not held",
                   f"{won} of {expected} comparisons of a normalized network ({', '.join(normalized)}) with the "
                   f"standard one favour the normalized network (mean training loss, median loss range and median "
                   f"β along the gradient; count of normalizations that win): {parts}")


register(Experiment(
    id="santurkar-fig11", paper="santurkar", target="Figs 11–14",
    title="ℓp normalizations (ℓ1, ℓ2, ℓ∞) against standard and BN: training, landscape, activations",
    claim="Every normalization — BN and the ℓ1, ℓ2, ℓ∞ batch normalizations, which do not fix the mean and "
          "variance of the activations — trains better than the standard network and makes its loss landscape "
          "smoother (smaller loss range and β-smoothness along the gradient), for the VGG and the DLN.",
    smoke_changes="the shared smoke VGG (digits, 1/8 width, 600 steps, He init) and DLN (600 steps, lr 1e-3) runs "
                  "with norms none, bn, lp_bn(p=1) and lp_bn(p=inf) (Hoffer's top-10 scale); ℓ2 is left to the "
                  "paper preset to stay in budget: it is BN up to where ε enters and trained to the same mean loss "
                  "(VGG 0.103 vs BN 0.109, DLN 7.42 vs 7.42 in a measured smoke run). Landscapes every 20 (VGG) / "
                  "25 (DLN) steps, histograms every 10.",
    cost={"smoke": "≈ 95 s CPU (4 VGG + 4 DLN runs; none/bn shared with the other entries)",
          "paper": "5 VGG × 15 000 steps on CIFAR-10 + 5 DLN × 10 000 steps (GPU, ≈ 2 h)"},
    plan=_fig11_plan, analyze=_fig11_analyze))
