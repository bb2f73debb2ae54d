"""ℓp batch normalization (Santurkar et al. 2018 §3.3; Hoffer et al. 2018, "Norm matters")."""

from __future__ import annotations

import torch
from torch import Tensor

from ..engine.kernels import autocast_off, stats_dtype
from ..engine.route import fused_enabled
from ..engine.switches import module_group, plain_requested
from .batchnorm import BatchNorm
from ..engine.lp_compiled import linf_normalize
from ..engine.lp_fused import L1_CONSTANT, hoffer_linf_constant, linf_top_entries, lp_normalize
from ..engine.sync import channel_count, channel_mean, channel_topk
from ..registry import BN_OPTIONS, Param, norm

__all__ = ["LpBatchNorm", "hoffer_linf_constant"]


def rms_scale(var: Tensor) -> Tensor:
    """√σ²_B, whose gradient is 0 where σ²_B = 0 instead of 0·∞ = NaN.

    A constant channel (a dead ReLU's zeros) has σ²_B = 0, where √ is not differentiable; the
    subgradient 0 is what torch's norms take there (``torch.linalg.vector_norm``). Elsewhere the
    value and the gradient are ``var.sqrt()``'s, bit for bit."""
    positive = var > 0
    return torch.where(positive, var, torch.ones_like(var)).sqrt() * positive


@norm("lp_bn", "centre, divide by a Gaussian-calibrated ℓp scale",
      "Santurkar et al. 2018 / Hoffer et al. 2018", "§3.3, App. B",
      {"p": Param("2", str, choices=("1", "2", "inf")), "topk": Param(10, int, minimum=1),
       **BN_OPTIONS})
class LpBatchNorm(BatchNorm):
    """Subtract the batch mean, divide by a per-channel ℓp scale of the centred batch.

    The scales are normalised so that, for Gaussian inputs, they estimate the standard deviation:

    * ``p=2``: ``√(mean (x−μ)²)`` — BN itself;
    * ``p=1``: ``√(π/2) · mean |x−μ|`` — unbiased for Gaussians, since E|z| = σ√(2/π);
    * ``p=inf``: Hoffer's top-k: ``C(n) · mean of the k largest |x−μ|`` with ``C(n) = ½(1+√(π ln
      4))/√(2 ln n)``, n the number of values per channel, k = ``topk`` (10). This constant is
      Hoffer's, not an exact one: for Gaussian inputs and k=10 we measure the estimate at ≈1.06σ for
      n=128 and ≈1.20σ for n=1024 (the test pins the formula, docs/readme/norms.md the bias).

    ``eps`` is added to the scale (not to a variance). Inference uses a running ℓp scale, the one
    training divides by: an EMA (BN's ``momentum``; None = cumulative) of the batch scale s_B,
    stored squared in ``running_var`` (BN's name, so a BatchNorm state_dict loads; for p=2 it is the
    biased variance), and eval computes ``γ(x − μ)/(√running_var + ε) + β``. (Dividing by BN's
    running standard deviation instead made ℓ∞ eval outputs 2.5–3× off on heavy-tailed activations.)
    """

    def __init__(self, num_features: int, p: str = "2", topk: int = 10, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.p = str(p)
        self.topk = topk

    def extra_repr(self) -> str:
        return super().extra_repr() + f", p={self.p}"

    def batch_scale(self, centred: Tensor, var: Tensor | None = None) -> Tensor:
        """The calibrated ℓp scale of the centred batch (var: its biased variance if known, p=2's
        scale²)."""
        # channel_mean/_count/_topk reduce over all ranks when the layer is synced
        # (bnlab.norms.engine.sync)
        if self.p == "2":
            return rms_scale(channel_mean(self, centred.pow(2)) if var is None else var)
        if self.p == "1":
            return L1_CONSTANT * channel_mean(self, centred.abs())
        # p = inf: top-k of |x − μ| per channel. Unsynced, searched only in the k samples with the
        # largest peaks (lp_fused.linf_top_entries: no full transposed copy; this plain path runs
        # for small CPU inputs, half inputs under compile and in plain_autograd(), float inputs
        # under compile take lp_compiled);
        # synced, over all ranks from every entry, channels first so topk runs along one dim.
        constant = hoffer_linf_constant(channel_count(self, centred))
        if module_group(self) is None:
            return constant * linf_top_entries(centred, centred.new_zeros(self.num_features),
                                               self.topk)[0].mean(dim=1)
        flat = centred.transpose(0, 1).reshape(self.num_features, -1).abs()
        return constant * channel_topk(self, flat, self.topk).mean(dim=1)

    def coefficients(self, mean: Tensor, scale: Tensor, gamma: Tensor,
                     beta: Tensor) -> tuple[Tensor, Tensor]:
        """The layer as a per-channel affine map given the mean and the ℓp scale."""
        a = gamma / (scale + self.eps)
        return a, beta - mean * a

    def rms_coefficients(self, mean: Tensor, var: Tensor, gamma: Tensor,
                         beta: Tensor) -> tuple[Tensor, Tensor]:
        """p=2 from the batch moments: ε is added to the scale √σ²_B, not to the variance."""
        return self.coefficients(mean, rms_scale(var), gamma, beta)

    def normalize_by_lp_scale(self, x: Tensor, gamma: Tensor,
                              beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(y, μ_B, s_B) for p=1 and p=inf, in training: γ(x − μ_B)/(s_B + ε) + β.

        Eager and unsynced (:func:`~bnlab.norms.engine.route.fused_enabled`: half inputs too,
        computed in float32 and rounded once): one custom autograd function
        (:mod:`bnlab.norms.engine.lp_fused`, a few passes over x); p=inf under torch.compile: plain
        ops with a written-out gradient (:mod:`bnlab.norms.engine.lp_compiled`), which inductor
        fuses. Otherwise plain autograd: small CPU inputs, p=1 under torch.compile (inductor fuses
        it), with synchronized statistics (the collectives of bnlab.norms.engine.sync), and inside
        ``plain_autograd()`` (double backward)."""
        unsynced = module_group(self) is None
        if fused_enabled(x) and unsynced:
            return lp_normalize(x, self.p, gamma, beta, self.eps, self.topk)
        if (self.p == "inf" and unsynced and torch.compiler.is_compiling()
                and x.dtype in (torch.float32, torch.float64) and not plain_requested()):
            return linf_normalize(x, gamma, beta, self.eps, self.topk)
        x = x.to(stats_dtype(x))  # half: one float32 copy, the input gradient rounds to half once
        mean, var, _ = self.plain_moments(x)
        centred = x - self.per_channel(mean, x)  # float32 or better, whatever x's dtype
        scale = self.batch_scale(centred, var)
        a = gamma / (scale + self.eps)
        y = torch.addcmul(self.per_channel(beta.to(centred.dtype), x), centred,
                          self.per_channel(a.to(centred.dtype), x))
        return y, mean, scale

    def normalize(self, x: Tensor) -> Tensor:
        self.check_input(x)
        if (empty := self.empty_batch(x)) is not None:
            return empty
        if not self.use_batch_stats():  # γ(x − μ)/(s + ε) + β centred: the inference kernel, σ² = 1
            scale = self.weight_or_one() / (self.running_var.sqrt() + self.eps)
            ones = torch.ones_like(self.running_var)
            return self.centred_affine(x, self.running_mean, ones, 0.0, scale, self.bias)
        gamma, beta = self.gamma_beta(x)
        # the scale is √σ²_B: the shared statistics → coefficients machinery (fused)
        if self.p == "2":
            y, mean, var, _ = self.normalize_with_batch_stats(x, self.rms_coefficients, gamma, beta)
            scale = var.sqrt()
        else:
            with autocast_off(x):
                y, mean, scale = self.normalize_by_lp_scale(x, gamma, beta)
        self._update_running(mean, scale)
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running(self, mean: Tensor, scale: Tensor) -> None:
        """EMAs of μ_B and of the ℓp scale s_B (stored squared in ``running_var``)."""
        if not self.tracks_now():
            return
        self.num_batches_tracked.add_(1)
        m = self.momentum_weight()
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
        running_scale = self.running_var.sqrt().lerp_(scale.detach().to(self.running_var.dtype), m)
        self.running_var.copy_(running_scale**2)

    def accumulation_refusal(self) -> str | None:
        if self.p == "2":
            return None
        scale = "mean |x − μ|" if self.p == "1" else "the top-k |x − μ|"
        return (f"lp_bn(p={self.p}): its scale ({scale}) is not a function of the micro-batches' "
                "means and variances")

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        self._update_running(mean, var.sqrt())

    def inference_affine(self):
        return self.coefficients(self.running_mean, self.running_var.sqrt(), self.weight_or_one(),
                                 self.bias_or_zero())
