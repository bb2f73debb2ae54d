"""Complete Batch Normalization (Peng et al., Eqs. 4–9 and Algorithm 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChannelNorm


def amat_eta(lr: float | None, omega: float) -> float:
    """AMAT's moving-average weight η = max(1 − ω·lr, 0) (Peng Algorithm 1); 0 while lr is unknown."""
    if lr is None:
        return 0.0
    return max(1.0 - omega * float(lr), 0.0)


def _forward_as(value: Tensor, carrier: Tensor) -> Tensor:
    """A tensor equal to ``value`` in the forward pass whose gradient flows into ``carrier``.

    ``carrier + stop_grad(value − carrier)``: Batch-Renorm's additive correction.
    """
    return carrier + (value - carrier).detach()


class CompleteBatchNorm(ChannelNorm):
    """CBN, placed before the linear layer (``placement="pre_linear"``).

    Training with ``decouple=True`` (Peng Eqs. 4–5 with AMAT, Eqs. 8–9), per channel, η as in
    :func:`amat_eta` when ``amat`` is on, else η = 0::

        μ_A ← η μ_A + (1−η) μ_B                 (the current batch is folded in first)
        x'  = x − μ_A + β
        σ²_B = mean(x'²)                         (second moment of x', β included)
        σ²_A ← η σ²_A + (1−η) σ²_B
        x'' = (γ/ρ) · x' / √(σ²_A + ε)

    The forward pass uses the moving values, the backward pass the batch ones, through stop-gradient
    corrections (the exact form): ``μ_A = μ_B + sg(μ_A − μ_B)`` (additive, as Batch Renorm's d) and
    ``√(σ²_A+ε) = √(σ²_B+ε) · sg(√(σ²_A+ε)/√(σ²_B+ε))`` (multiplicative, as Batch Renorm's r).
    Algorithm 1 prints the mean correction as a ratio r_μ = μ_A/μ_B, which is singular when μ_B → 0
    (e.g. after tanh); the additive form has the same forward value and an unscaled gradient. Its
    σ²_A update prints (η σ_A)² where Eq. 9 has η σ²_A; we follow Eq. 9. With η = 0 the layer is
    exactly the decoupled normalization of Eqs. 4–5. The first training batch initializes μ_A, σ²_A.

    ``decouple=False``: vanilla centring and normalization with the same moving statistics,
    ``y = (γ/ρ)(x − μ_A)/√(σ²_A + ε) + β`` (σ²_A the moving variance) — rows ③, ⑥, ⑦ of Tables 1–4.

    ``eta=0.9`` fixes the moving-average weight instead of AMAT's learning-rate rule (the "fixed η"
    arm of Peng's Fig. 10); it overrides ``amat``.

    ``center=False`` drops the mean removal (μ_A ≡ 0): with ``decouple=True`` that is Eq. 5 alone,
    ``x'' = (γ/ρ)(x + β)/√(mean((x+β)²) + ε)`` — the "normalization with the ℓ2-norm" ablation of
    Table 6 (root mean square, not standard deviation).

    Inference: ``running_mean``/``running_var`` tracked as in BN (mean and unbiased variance of x),
    with the second moment of x' taken as ``running_var + β²``.
    """

    def __init__(self, num_features: int, rho: float = 1.0, amat: bool = True, omega: float = 10.0,
                 decouple: bool = True, center: bool = True, eta: float | None = None, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if not self.track_running_stats:
            raise ValueError("cbn needs running statistics (track_running_stats=True)")
        if eta is not None and not 0 <= eta < 1:
            raise ValueError(f"cbn: eta must be in [0, 1), got {eta!r}")
        self.rho, self.amat, self.omega, self.decouple, self.center = rho, amat, omega, decouple, center
        self.eta = eta
        self.lr: float | None = None
        self.register_buffer("amat_mean", torch.zeros(num_features))
        self.register_buffer("amat_var", torch.ones(num_features))

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", rho={self.rho}, amat={self.amat}, omega={self.omega}, "
                f"decouple={self.decouple}, center={self.center}")

    def set_progress(self, *, lr=None, epoch=None, epochs=None) -> None:
        if lr is not None:
            self.lr = float(lr)

    def current_eta(self) -> float:
        if int(self.num_batches_tracked) == 0:
            return 0.0
        if self.eta is not None:  # a fixed moving weight (Peng §6.4's "fixed η = 0.9" comparison)
            return self.eta
        return amat_eta(self.lr, self.omega) if self.amat else 0.0

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        gamma, beta = self.gamma_beta(x)
        if not self.training:
            return self.apply_affine(x, *self._affine(gamma, beta))
        eta = self.current_eta()
        moving = {}

        def coefficients(mean_b, var_b, gamma, beta):
            if self.center:
                mean = _forward_as(eta * self.amat_mean + (1 - eta) * mean_b.detach(), mean_b)
            else:
                mean = torch.zeros_like(mean_b)
            if not self.decouple and not self.center:
                var_b = var_b + mean_b**2  # second moment about 0: nothing is centred
            if self.decouple:
                shift = beta - mean                              # x' = x + shift
                second_b = var_b + (mean_b + shift) ** 2         # mean(x'²), differentiable
            else:
                second_b = var_b
            second_a = eta * self.amat_var + (1 - eta) * second_b.detach()
            std_b = torch.sqrt(second_b + self.eps)
            std = std_b * (torch.sqrt(second_a + self.eps) / std_b).detach()
            moving.update(mean=mean.detach(), second=second_a)
            scale = gamma / (self.rho * std)
            return scale, (shift * scale if self.decouple else beta - mean * scale)

        y, mean_b, var_b, n = self.normalize_with_batch_stats(x, coefficients, gamma, beta)
        with torch.no_grad():
            self.amat_mean.copy_(moving["mean"])
            self.amat_var.copy_(moving["second"])
        self.update_running_stats(mean_b, var_b, n)
        return y

    def _affine(self, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        centre = self.running_mean if self.center else torch.zeros_like(self.running_mean)
        offset = self.running_mean - centre  # mean of x about the centre that is removed
        if self.decouple:  # second moment of x' = x − centre + β
            scale = gamma / (self.rho * torch.sqrt(self.running_var + (offset + beta) ** 2 + self.eps))
            return scale, (beta - centre) * scale
        scale = gamma / (self.rho * torch.sqrt(self.running_var + offset**2 + self.eps))
        return scale, beta - centre * scale

    def inference_affine(self):
        return self._affine(self.weight_or_one(), self.bias_or_zero())
