"""Batch Renormalization (Ioffe 2017), the stop-gradient technique CBN borrows."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChannelNorm
from .registry import BN_OPTIONS, Param, norm


def relaxed_limit(step: Tensor, start: float, final: float, relax_from: int, reach_at: int) -> Tensor | float:
    """Ioffe 2017 §4's warm-up of r_max / d_max: ``start`` before step ``relax_from``, then linear to
    ``final`` at step ``reach_at`` (the paper: r_max 1 → 3 between steps 5k and 40k, d_max 0 → 5 between
    5k and 25k). ``reach_at <= relax_from`` switches at ``relax_from``. During a warm-up a tensor (no
    recompiles as it moves); without one (both 0) the plain number ``final``, so inductor has fewer ops to
    inline into the full-size loops (compiled brn 1.15 → 1.03× native eager on (128, 64, 32, 32))."""
    if relax_from == 0 and reach_at <= 0:
        return final
    step = step.to(torch.float32)
    if reach_at > relax_from:
        frac = ((step - relax_from) / (reach_at - relax_from)).clamp(0.0, 1.0)
    else:
        frac = (step >= relax_from).to(torch.float32)
    return start + (final - start) * frac


@norm("brn", "Batch Renormalization (stop-gradient r, d corrections)", "Ioffe 2017", "Alg. 1", {
    "r_max": Param(3.0, float, minimum=1.0), "d_max": Param(5.0, float, minimum=0.0),
    "relax_from": Param(0, int, minimum=0, help="warm-up: r_max=1, d_max=0 before this step"),
    "r_max_at": Param(0, int, minimum=0, help="warm-up: step at which r_max is reached"),
    "d_max_at": Param(0, int, minimum=0, help="warm-up: step at which d_max is reached"),
    **BN_OPTIONS})
class BatchRenorm(ChannelNorm):
    """Batch Renormalization (Ioffe 2017, Algorithm 1).

    ``x̂ = (x − μ_B)/σ_B · r + d`` with ``σ_B = √(σ²_B + ε)`` (biased σ²_B), ``r = stop_grad(clip(σ_B/σ,
    1/r_max, r_max))``, ``d = stop_grad(clip((μ_B − μ)/σ, −d_max, d_max))``, then ``y = γ x̂ + β``; the
    running values follow Algorithm 1: ``μ ← μ + α(μ_B − μ)``, ``σ ← σ + α(σ_B − σ)`` — an EMA of σ_B
    itself, not of the unbiased variance. ``running_var`` keeps BN's name and holds ``σ² − ε``, so
    ``√(running_var + ε) = σ`` and a BatchNorm state_dict loads with its meaning. Inference is BN with
    the running statistics. ``relax_from``/``r_max_at``/``d_max_at`` (steps) enable §4's warm-up, r_max
    from 1 and d_max from 0 (default: none). ``track_running_stats=False``: r = 1, d = 0 (plain BN).
    """

    def __init__(self, num_features: int, r_max: float = 3.0, d_max: float = 5.0, relax_from: int = 0,
                 r_max_at: int = 0, d_max_at: int = 0, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.r_max, self.d_max = r_max, d_max
        self.relax_from, self.r_max_at, self.d_max_at = relax_from, r_max_at, d_max_at

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", r_max={self.r_max}, d_max={self.d_max}, relax_from={self.relax_from}, "
                f"r_max_at={self.r_max_at}, d_max_at={self.d_max_at}")

    def limits(self) -> tuple[Tensor | float, Tensor | float]:
        """(r_max, d_max) at the current step."""
        t = self.num_batches_tracked
        return (relaxed_limit(t, 1.0, self.r_max, self.relax_from, self.r_max_at),
                relaxed_limit(t, 0.0, self.d_max, self.relax_from, self.d_max_at))

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        gamma, beta = self.gamma_beta(x)
        if not self.use_batch_stats():
            return self.apply_affine(x, *self.running_affine(gamma, beta))
        if not self.track_running_stats:  # no running statistics: r = 1, d = 0
            return self.normalize_with_batch_stats(x, self.batch_norm_coefficients, gamma, beta)[0]
        def coefficients(mean_b, var_b, gamma, beta):
            std, (r_max, d_max) = torch.sqrt(self.running_var + self.eps), self.limits()
            std_b = torch.sqrt(var_b + self.eps)
            r = (std_b / std).clamp(1 / r_max, r_max).detach()
            d = ((mean_b - self.running_mean) / std).clamp(-d_max, d_max).detach()
            scale = gamma * r / std_b
            return scale, beta + gamma * d - mean_b * scale

        update = self._update_running if self.training else None
        return self.normalize_with_batch_stats(x, coefficients, gamma, beta, update=update)[0]

    def batch_norm_coefficients(self, mean_b, var_b, gamma, beta):
        scale = gamma * torch.rsqrt(var_b + self.eps)
        return scale, beta - mean_b * scale

    @torch.no_grad()
    def _update_running(self, mean_b: Tensor, var_b: Tensor, n: int = 0) -> None:
        # running statistics and the step are read by this step's graph (r, d, warm-up): see write_buffer
        self.write_buffer("num_batches_tracked", self.num_batches_tracked + 1)
        alpha = self.momentum_weight()
        std = torch.sqrt(self.running_var + self.eps).lerp_(torch.sqrt(var_b + self.eps).to(self.running_var.dtype), alpha)
        self.write_buffer("running_mean", self.running_mean.lerp(mean_b.to(self.running_mean.dtype), alpha))
        self.write_buffer("running_var", (std**2 - self.eps).clamp_min(0))

    def inference_affine(self):
        return self.running_affine(self.weight_or_one(), self.bias_or_zero())
