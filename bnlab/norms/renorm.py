"""Batch Renormalization (Ioffe 2017), the stop-gradient technique CBN borrows."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChannelNorm


class BatchRenorm(ChannelNorm):
    """Batch Renormalization (Ioffe 2017, Algorithm 1).

    ``x̂ = (x − μ_B)/σ_B · r + d`` with ``σ_B = √(σ²_B + ε)``, ``σ = √(running_var + ε)``,
    ``r = stop_grad(clip(σ_B/σ, 1/r_max, r_max))``, ``d = stop_grad(clip((μ_B − μ)/σ, −d_max, d_max))``,
    then ``y = γ x̂ + β``. When the clips are inactive the forward equals normalization by the running
    statistics while gradients flow through the batch ones. Inference is BN with running statistics.
    """

    def __init__(self, num_features: int, r_max: float = 3.0, d_max: float = 5.0, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if not self.track_running_stats:
            raise ValueError("brn needs running statistics (track_running_stats=True)")
        self.r_max, self.d_max = r_max, d_max

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        gamma, beta = self.gamma_beta(x)
        if not self.training:
            return self.apply_affine(x, *self.running_affine(gamma, beta))
        std = torch.sqrt(self.running_var + self.eps)

        def coefficients(mean_b, var_b, gamma, beta):
            std_b = torch.sqrt(var_b + self.eps)
            r = (std_b / std).clamp(1 / self.r_max, self.r_max).detach()
            d = ((mean_b - self.running_mean) / std).clamp(-self.d_max, self.d_max).detach()
            scale = gamma * r / std_b
            return scale, beta + gamma * d - mean_b * scale

        y, mean_b, var_b, n = self.normalize_with_batch_stats(x, coefficients, gamma, beta)
        self.update_running_stats(mean_b, var_b, n)
        return y

    def inference_affine(self):
        return self.running_affine(self.weight_or_one(), self.bias_or_zero())
