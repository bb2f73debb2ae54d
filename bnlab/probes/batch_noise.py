"""MBN's batch noise: how far each batch's statistics are from the population's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import Tensor

from .base import PROBES, Probe, ProbeContext, bn_layers, channels_first, select_layers
from .bn_stats import bn_inputs, heldout_inputs


@PROBES.register()
class BatchNoiseProbe(Probe):
    """The noise BN's batch statistics inject, per BN layer (MBN, Yong et al. 2020, Theorem 1).

    For each channel, with μ_B, σ²_B (biased) the statistics of this batch's m values and μ, σ² the
    population statistics: ξ_μ = (μ − μ_B)/σ and ξ_σ = σ²_B/σ². Theorem 1: ξ_μ → N(0, 1/m) and ξ_σ →
    χ²(m−1)/m, so E ξ_σ = (m−1)/m and Var ξ_σ = 2(m−1)/m² (exact for Gaussian inputs; for other
    inputs Var ξ_σ ≈ (κ−1)/m with κ the kurtosis — the supplement's N(1, κ/m) should read N(1,
    (κ−1)/m), the variance of (x−μ)²/σ² being κ − 1, and equals 2/m only for Gaussian data).

    Population statistics: from ``heldout`` (a large batch of inputs, run through the model in
    training mode, whose BN inputs are pooled) or else each layer's running statistics. m counts the
    values BN pools per channel (batch × spatial positions; positions of one image are correlated,
    so the effective m of a conv layer is smaller). Records per layer, over channels:
    ``xi_mu_mean``, ``xi_mu_var``, ``xi_sigma_mean``, ``xi_sigma_var``, ``m``, and the theory's
    ``xi_mu_var_theory`` = 1/m, ``xi_sigma_mean_theory`` = (m−1)/m, ``xi_sigma_var_theory`` =
    2(m−1)/m².

    Cost: 1 forward pass (+ 1 on the held-out batch if given).
    """

    name = "batch_noise"
    summary = "ξ_μ, ξ_σ of each BN layer against N(0, 1/m) and χ²(m−1)/m (MBN Thm 1)"
    cost = "1 forward pass (+1 on the held-out batch)"

    def __init__(self, every: int = 1, heldout=None, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.heldout = heldout_inputs(heldout)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        population = {}
        if self.heldout is None:
            for name, module in layers:
                if getattr(module, "running_mean", None) is not None:
                    population[name] = (cast(Tensor, module.running_mean).detach().double().clone(),
                                        cast(Tensor, module.running_var).detach().double().clone())
        inputs = bn_inputs(ctx, layers)
        if self.heldout is not None:
            held = bn_inputs(ctx, layers, self.heldout.to(ctx.x.device))
            for name, value in held.items():
                var, mean = torch.var_mean(channels_first(value.double()), dim=1, correction=0)
                population[name] = (mean, var)
        out = {}
        for name, _ in layers:
            if name not in inputs or name not in population:
                continue
            rows = channels_first(inputs[name].double())
            m = rows.shape[1]
            var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
            mu, var = population[name]
            xi_mu = (mu - mean_b) / var.sqrt()
            xi_sigma = var_b / var
            out[f"xi_mu_mean/{name}"] = float(xi_mu.mean())
            out[f"xi_mu_var/{name}"] = (float(xi_mu.var(correction=1)) if xi_mu.numel() > 1
                                        else float("nan"))
            out[f"xi_sigma_mean/{name}"] = float(xi_sigma.mean())
            out[f"xi_sigma_var/{name}"] = (float(xi_sigma.var(correction=1))
                                           if xi_sigma.numel() > 1 else float("nan"))
            out[f"m/{name}"] = float(m)
            out[f"xi_mu_var_theory/{name}"] = 1.0 / m
            out[f"xi_sigma_mean_theory/{name}"] = (m - 1) / m
            out[f"xi_sigma_var_theory/{name}"] = 2.0 * (m - 1) / m**2
        return out
