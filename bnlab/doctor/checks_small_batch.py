"""small-batch: the noise of BN's batch statistics at this batch size.

Yong et al., Momentum Batch Normalization for Deep Learning with Small Batch Size, Theorem 1: for
a channel with population mean μ and variance σ², the statistics of a batch of m values give
ξ_μ = (μ − μ_B)/σ ~ N(0, 1/m) and ξ_σ = σ²_B/σ² ~ χ²(m−1)/m, so the normalized signal carries
noise of variance ~1/m. m is the per-channel count BN pools: batch × spatial positions (positions
of one image are correlated, so a conv layer's effective m is smaller; this check measures rather
than assumes it).

Measured: each BN layer's inputs in train mode for every given batch, against the population
statistics recollected over all of them (:func:`bnlab.norms.recollect_running_stats` on a copy):
the mean-noise power E[ξ_μ²] (over channels and batches; theory 1/m) and Var ξ_σ (theory
2(m−1)/m² for Gaussian inputs). The value is the largest E[ξ_μ²] over layers; it warns above 0.1,
the noise of fewer than 10 independent values per channel (the batch mean alone then moves every
normalized value by √0.1 = 0.32 SD); at 16 values it is 1/16, a margin of 1.6 for sampling noise.
Layers that already smooth their statistics (``mbn``, ``brn``) are not blamed.

Remedy: ``mbn`` with ``ideal_batch`` chosen from the measured noise (a moving average with
weight λ divides the noise variance by (1+λ)/(1−λ), so λ = (v − v₀)/(v + v₀) brings v to v₀, and
MBN's final λ = 1 − m/m₀ gives m₀ = m/(1−λ); :func:`bnlab.norms.mbn_lambda`), statistics synced
across devices (:func:`bnlab.norms.convert_sync`) or Batch Renormalization (``brn``).

Cost: the batches' forward passes once in train mode (on a copy).
"""

from __future__ import annotations

import copy
import math

import torch

from bnlab.norms import BatchRenorm, MomentumBatchNorm, mbn_lambda
from bnlab.probes.base import capture_inputs, channels_first

from .context import Checkup, as_trained, frozen_layers, tracking_layers
from .findings import Finding

THRESHOLD = 0.1
SMOOTHED = (MomentumBatchNorm, BatchRenorm)
PAPER = ("Yong, Huang, Meng, Hua & Zhang, Momentum Batch Normalization for Deep Learning with "
         "Small Batch Size (ECCV 2020), Theorem 1: ξ_μ ~ N(0, 1/m), ξ_σ ~ χ²(m−1)/m")
WHY = ("E[ξ_μ²] = 0.1 is the noise of fewer than 10 independent values per channel: the batch "
       "mean alone moves every normalized value by √0.1 = 0.32 SD from batch to batch"
       "; false alarms: 0 of 160 healthy networks, closest 0.18× the line "
       "(benchmarks/doctor_false_alarms.py)")


def noise_by_layer(checkup: Checkup) -> dict[str, dict[str, float]]:
    """Per tracking layer: m, E[ξ_μ²], Var ξ_σ and their Theorem 1 values, over all batches."""
    population = checkup.population_stats()
    twin = as_trained(copy.deepcopy(checkup.model))
    frozen = frozen_layers(twin)
    layers = [(n, m) for n, m in tracking_layers(twin) if n in population and n not in frozen]
    sums: dict[str, list[float]] = {n: [0.0, 0.0, 0.0, 0.0] for n, _ in layers}
    counts: dict[str, int] = {n: 0 for n, _ in layers}
    with torch.no_grad():
        for x, _ in checkup.batches:
            with capture_inputs(layers) as cap:
                twin(x)
            for name, value in cap.values.items():
                rows = channels_first(value.double())
                m = rows.shape[1]
                if m < 2:
                    continue
                var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
                mu, var = population[name]
                eps = 1e-12
                xi_mu = (mu - mean_b) / (var + eps).sqrt()
                xi_sigma = var_b / (var + eps)
                s = sums[name]
                s[0] += float(xi_mu.pow(2).mean())
                s[1] += float(xi_sigma.mean())
                s[2] += float(xi_sigma.pow(2).mean())
                s[3] = m
                counts[name] += 1
    out = {}
    for name, (mu2, sig, sig2, m) in sums.items():
        k = counts[name]
        if not k:
            continue
        mean_sig = sig / k
        out[name] = {"m": int(m), "xi_mu_power": mu2 / k, "xi_mu_theory": 1.0 / m,
                     "xi_sigma_mean": mean_sig, "xi_sigma_var": max(sig2 / k - mean_sig**2, 0.0),
                     "xi_sigma_theory": 2.0 * (m - 1) / m**2}
    return out


def mbn_remedy(batch_size: int, noise: float) -> tuple[int, float]:
    """(ideal_batch, final λ) of MBN that brings mean-noise power ``noise`` down to THRESHOLD/2."""
    target = THRESHOLD / 2
    lam = max((noise - target) / (noise + target), 0.0)
    ideal = max(int(math.ceil(batch_size / max(1.0 - lam, 1e-3))), batch_size)
    return ideal, mbn_lambda(2, 2, batch_size, ideal)


def check(checkup: Checkup, report) -> None:
    if not tracking_layers(checkup.model):
        return
    noise = noise_by_layer(checkup)
    report.measurements["noise_vs_batch"] = noise
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    report.measurements["noise_vs_batch/_curve"] = {"batch": sizes,
                                                    "theory_xi_mu_var": [1.0 / b for b in sizes]}
    if not noise:
        return
    modules = dict(checkup.model.named_modules())
    # layers that already smooth their statistics (the remedies themselves) are not blamed
    noise = {n: v for n, v in noise.items() if not isinstance(modules[n], SMOOTHED)}
    if not noise:
        return
    worst = max(noise, key=lambda n: noise[n]["xi_mu_power"])
    value = noise[worst]["xi_mu_power"]
    if value <= THRESHOLD:
        return
    named = tuple(n for n in noise if noise[n]["xi_mu_power"] > THRESHOLD)
    b = checkup.batch_size
    ideal, lam = mbn_remedy(b, value)
    detail = (f"E[ξ_μ²] = {value:.3g} at {worst} (m = {noise[worst]['m']} values per channel, "
              f"Theorem 1: {noise[worst]['xi_mu_theory']:.3g}) at batch {b}")
    remedy = (f"bnlab.norms.create('mbn(ideal_batch={ideal})') (final λ = {lam:.2f}, "
              "bnlab.norms.mbn_lambda), statistics synced across devices "
              "(bnlab.norms.convert_sync), or 'brn' (Batch Renormalization); or a larger batch")
    report.add(Finding("small-batch", "warn", named, value, THRESHOLD, WHY, PAPER, remedy,
                       detail))
