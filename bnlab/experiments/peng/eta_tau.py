"""The measurements behind Peng et al.'s Figs 2–3 (``peng-fig2``, in ``figures.py``): per run, the
share of channels whose η_k and τ_k lie in Theorems 2–3's ranges at the paper's layers, and the
figure's panels."""

from __future__ import annotations

from bnlab.formatting import finite_or_none

from ..common import mean_series

FIG2_LAYERS = {"layer#2 (stage1.0.cbn1)": "stage1.0.unit1",
               "layer#8 (stage2.0.cbn1)": "stage2.0.unit1",
               "layer#14 (stage3.0.cbn1)": "stage3.0.unit1"}

# the first half of training is the start-up transient; the verdict reads the second half
FIG2_SKIP = 0.5


def _find_layer_metric(run, quantity: str, layer: str) -> str | None:
    """The stored name of ``probe/cbn_ratios/<quantity>/<layer>[.k]`` (the norm's index inside the
    block varies)."""
    prefix = f"probe/cbn_ratios/{quantity}/{layer}"
    names = [n for n in run.metric_names(prefix) if n == prefix or n.startswith(prefix + ".")]
    return names[0] if names else None


def ratio_fractions(run, skip: float = FIG2_SKIP) -> dict[str, dict[str, float | None]]:
    """Mean over the probe steps after the first ``skip`` of training (the start-up transient, where
    the moving averages are still filling) of the fraction of channels with 0 ≤ η ≤ 2 and 0 < τ < 1,
    per Fig. 2 layer."""
    out = {}
    for title, layer in FIG2_LAYERS.items():
        out[title] = {}
        for ratio in ("eta", "tau"):
            name = _find_layer_metric(run, f"{ratio}_in_range", layer)
            steps, raw = run.series(name) if name else ([], [])
            start = steps[-1] * skip if steps else 0
            values = [v for st, v in zip(steps, (finite_or_none(v) for v in raw)) if v is not None
                      and st > start]
            out[title][ratio] = sum(values) / len(values) if values else None
    return out


def seed_shares(runs) -> dict[tuple[str, str], list[float | None]]:
    """Per (layer, ratio), each run's :func:`ratio_fractions` share; a diverged run counts as 0
    (rule 4: a CBN that diverged did not satisfy the assumptions in practice; no missing data)."""
    shares: dict[tuple[str, str], list[float | None]] = {
        (layer, ratio): [] for layer in FIG2_LAYERS for ratio in ("eta", "tau")}
    for run in runs:
        if run.status not in ("finished", "diverged"):
            continue
        fractions = ratio_fractions(run) if run.status == "finished" else None
        for layer, ratio in shares:
            shares[(layer, ratio)].append(0.0 if fractions is None else fractions[layer][ratio])
    return shares


def band_specs(runs) -> list[dict]:
    """Figs 2–3's panels: median over channels and its 5–95 % band, each the mean over seeds."""
    specs = []
    for ratio, symbol, bounds in (("eta", "η_k", (0.0, 2.0)), ("tau", "τ_k", (0.0, 1.0))):
        for title, layer in FIG2_LAYERS.items():
            series, band = {}, {}
            # the layer's metric names per run (the norm's index inside the block varies)
            names = [{q: _find_layer_metric(r, f"{ratio}_{q}", layer) for q in ("q05", "q50",
                                                                                "q95")}
                     for r in runs]
            if runs and all(all(n.values()) for n in names):
                curves = {q: mean_series([r.series(n[q]) for r, n in zip(runs, names)])
                          for q in ("q05", "q50", "q95")}
                series[f"median over channels (mean of {len(runs)} seeds)"] = curves["q50"]
                band["5–95 % of channels"] = (curves["q05"][0], curves["q05"][1],
                                              curves["q95"][1])
            # η = (μ_B − β)/μ_A explodes where the moving mean μ_A is near 0: the axis shows the
            # bounds' neighbourhood, where the median and the bulk of the channels are
            clip = ratio == "eta"
            specs.append({"series": series, "band": band, "xlabel": "step", "ylabel": symbol,
                          "title": f"{symbol}, {title}" + (" (axis clipped)" if clip else ""),
                          "hline": bounds[1], "ylim": (-1.0, 4.0) if clip else None})
    return specs
