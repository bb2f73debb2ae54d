"""small-batch: the noise of BN's batch statistics at this batch size.

Yong et al., Momentum Batch Normalization for Deep Learning with Small Batch Size, Theorem 1: for
a channel with population mean μ and variance σ², the statistics of a batch of m values give
ξ_μ = (μ − μ_B)/σ ~ N(0, 1/m) and ξ_σ = σ²_B/σ² ~ χ²(m−1)/m, so the normalized signal carries
noise of variance ~1/m. m is the per-channel count BN pools: batch × spatial positions (positions
of one image are correlated, so a conv layer's effective m is smaller; this check measures rather
than assumes it).

Measured: each BN layer's inputs in train mode for every given batch, against the population
statistics of those inputs over all the batches (Ioffe & Szegedy's Alg. 2, as
:func:`bnlab.norms.recollect_running_stats` collects them for BN):
the mean-noise power E[ξ_μ²] (over channels and batches; theory 1/m) and Var ξ_σ (theory
2(m−1)/m² for Gaussian inputs). The value is the largest E[ξ_μ²] over layers; it warns above 0.1,
the noise of fewer than 10 independent values per channel (the batch mean alone then moves every
normalized value by √0.1 = 0.32 SD); at 16 values it is 1/16, a margin of 1.6 for sampling noise.
Layers that already smooth their statistics (``mbn``, ``brn``, ``cbn`` with AMAT) are not blamed.

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

from bnlab.norms import BatchRenorm, CompleteBatchNorm, MomentumBatchNorm, mbn_lambda
from bnlab.probes.base import bn_layers, capture_inputs, channels_first

from .context import Checkup, as_trained, frozen_layers
from .findings import Finding

THRESHOLD = 0.1
PAPER = ("Yong, Huang, Meng, Hua & Zhang, Momentum Batch Normalization for Deep Learning with "
         "Small Batch Size (ECCV 2020), Theorem 1: ξ_μ ~ N(0, 1/m), ξ_σ ~ χ²(m−1)/m")
WHY = ("E[ξ_μ²] = 0.1 is the noise of fewer than 10 independent values per channel: the batch "
       "mean alone moves every normalized value by √0.1 = 0.32 SD from batch to batch"
       "; false alarms: 0 of 320 healthy networks, closest 0.20× the line "
       "(benchmarks/doctor_false_alarms.py)")


def _batch_moments(checkup: Checkup) -> dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]]:
    """Per layer that computes batch statistics in training, each batch's (mean, biased variance,
    m) of its input, in float64, from one train-mode pass over the batches on a copy."""
    twin = as_trained(copy.deepcopy(checkup.model))
    frozen = frozen_layers(twin)
    layers = [(n, m) for n, m in bn_layers(twin) if n not in frozen]
    out: dict[str, list] = {n: [] for n, _ in layers}
    with torch.no_grad():
        for x, _ in checkup.batches:
            with capture_inputs(layers) as cap:
                twin(x)
            for name, value in cap.values.items():
                rows = channels_first(value.double())
                if rows.shape[1] >= 2:
                    var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
                    out[name].append((mean_b, var_b, rows.shape[1]))
    return {n: v for n, v in out.items() if v}


def noise_by_layer(checkup: Checkup) -> dict[str, dict[str, float]]:
    """Per BN layer: m, E[ξ_μ²], E ξ_σ, Var ξ_σ and their Theorem 1 values, over all batches.

    The population statistics are those of the layer's inputs over all the batches — μ the mean of
    the batch means, σ² the mean of the unbiased batch variances (Ioffe & Szegedy's Alg. 2, what
    ``recollect_running_stats`` collects for BN) — computed from the inputs, so layers whose
    buffers hold something else (CBN's centre and second moment) are measured alike."""
    out = {}
    for name, moments in _batch_moments(checkup).items():
        mu = torch.stack([mean for mean, _, _ in moments]).mean(0)
        var = torch.stack([v * m / (m - 1) for _, v, m in moments]).mean(0)
        xi_mu = torch.stack([(mu - mean) / (var + 1e-12).sqrt() for mean, _, _ in moments])
        xi_sigma = torch.stack([v / (var + 1e-12) for _, v, _ in moments])
        m = moments[0][2]
        out[name] = {"m": int(m), "xi_mu_power": float(xi_mu.pow(2).mean()),
                     "xi_mu_theory": 1.0 / m, "xi_sigma_mean": float(xi_sigma.mean()),
                     "xi_sigma_var": float(xi_sigma.var(correction=0)),
                     "xi_sigma_theory": 2.0 * (m - 1) / m**2}
    return out


def smoothed(module) -> bool:
    """Layers that normalize with moving statistics in training, the remedies themselves: MBN,
    Batch Renormalization, CBN with AMAT or a fixed η."""
    if isinstance(module, (MomentumBatchNorm, BatchRenorm)):
        return True
    return isinstance(module, CompleteBatchNorm) and (module.amat or module.eta is not None)


def mbn_remedy(batch_size: int, noise: float) -> tuple[int, float]:
    """(ideal_batch, final λ) of MBN that brings mean-noise power ``noise`` down to THRESHOLD/2."""
    target = THRESHOLD / 2
    lam = max((noise - target) / (noise + target), 0.0)
    ideal = max(int(math.ceil(batch_size / max(1.0 - lam, 1e-3))), batch_size)
    return ideal, mbn_lambda(2, 2, batch_size, ideal)


def check(checkup: Checkup, report) -> None:
    if not bn_layers(checkup.model):
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
    noise = {n: v for n, v in noise.items() if not smoothed(modules[n])}
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
