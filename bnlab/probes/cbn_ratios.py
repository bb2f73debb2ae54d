"""Peng et al.'s CBN ratios η and τ per BN layer."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from bnlab.norms import CompleteBatchNorm

from .base import (
    PROBES, Probe, ProbeContext, bn_affine, bn_layers, cbn_rho, channels_first, select_layers,
)
from .bn_stats import bn_inputs, add_quantiles


@PROBES.register()
class CBNRatiosProbe(Probe):
    """Peng et al.'s η_k and τ_k per channel (Theorems 2–3, Figs 2–3), summarized over channels.

    η_k = (μ_B − β)/E[x] with E[x] replaced, as Peng do, by the moving average μ_A (CBN's
    ``amat_mean``; ``running_mean`` for other BN layers); τ_k = γ/(ρ σ_B) with σ²_B the second
    moment of x' = x − μ_B + β for decoupled CBN (Eq. 5: var_B + β²) and the batch variance
    otherwise, ε added. Theorem 2 assumes 0 ≤ η ≤ 2 and Theorem 3 0 < τ < 1. Records
    ``eta_q05|q50|q95/<layer>``, ``eta_in_range/<layer>`` (fraction of channels with 0 ≤ η ≤ 2) and
    the same for ``tau`` (0 < τ < 1), and ``var_share_q50/<layer>``, the median over channels of
    var_B/(var_B + β²), the batch variance's share of decoupled CBN's divisor (Eq. 5). For non-CBN
    layers the same formulas are applied (ρ = 1, β the layer's shift) for comparison.

    Cost: 1 forward pass.
    """

    name = "cbn_ratios"
    summary = "Peng's η_k = (μ_B − β)/E[x] and τ_k = γ/(ρσ_B) per channel (Peng Figs 2-3)"
    cost = "1 forward pass"

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        # E[x] ≈ μ_A as the training forward of this step left it (read before our own forward).
        moving = {}
        for name, module in layers:
            buf = (getattr(module, "amat_mean", None) if isinstance(module, CompleteBatchNorm)
                   else None)
            buf = buf if buf is not None else getattr(module, "running_mean", None)
            if buf is not None:
                moving[name] = buf.detach().clone()
        inputs = bn_inputs(ctx, layers)
        out: dict[str, float] = {}
        for name, module in layers:
            if name not in inputs:
                continue
            rows = channels_first(inputs[name].double())
            var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
            gamma, beta = bn_affine(module, mean_b)
            expected = moving[name].double() if name in moving else mean_b
            eta = (mean_b - beta) / expected
            decoupled = isinstance(module, CompleteBatchNorm) and module.decouple
            second = var_b + beta**2 if decoupled else var_b
            tau = gamma / (
                cbn_rho(module) * torch.sqrt(second + float(getattr(module, "eps", 0.0)))
            )
            add_quantiles(eta, "eta", name, out)
            add_quantiles(tau, "tau", name, out)
            out[f"eta_in_range/{name}"] = float(((eta >= 0) & (eta <= 2)).double().mean())
            out[f"tau_in_range/{name}"] = float(((tau > 0) & (tau < 1)).double().mean())
            # the batch variance's share of decoupled CBN's divisor var_B + β² (Eq. 5); near 0, β
            # swamps the batch and the layer no longer normalizes it (the width-½ failure)
            share = var_b / (var_b + beta**2).clamp_min(torch.finfo(var_b.dtype).tiny)
            out[f"var_share_q50/{name}"] = float(share.median())
        return out
