"""BatchNorm written from tensor ops, and Luo et al.'s mean-only / variance-only variants."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .base import ChannelNorm
from .conventions import checked_eps, checked_momentum
from ..engine import route
from ..engine.switches import full_statistics, module_group
from ..registry import BN_OPTIONS, norm


@norm("bn", "BatchNorm (torch's kernel in training); equals nn.BatchNorm2d", "Ioffe & Szegedy 2015",
      "Alg. 1", BN_OPTIONS)
class BatchNorm(ChannelNorm):
    """Batch normalization (Ioffe & Szegedy 2015, Alg. 1), the reference the variants build on.

    Training: ``y = γ (x − μ_B)/√(σ²_B + ε) + β`` with per-channel statistics over the batch and all
    trailing dimensions (biased variance); ``running_var`` receives the unbiased variance, momentum
    0.1, exactly as ``torch.nn.BatchNorm2d`` (``momentum=None``: cumulative average). Eval: the
    running statistics replace the batch ones (batch statistics if ``track_running_stats=False``).
    """

    def normalize(self, x: Tensor) -> Tensor:
        if (y := self.without_batch_stats(x)) is not None:
            return y
        if (module_group(self) is None and not self.compiled_cumulative()
                and trains_as_torch_bn(self) and full_statistics(self) is None):
            return self.native_batch_norm(x)
        gamma, beta = self.gamma_beta(x)
        return self.normalize_with_batch_stats(x, self.coefficients, gamma, beta,
                                               update=self.update_running_stats)[0]

    def native_batch_norm(self, x: Tensor) -> Tensor:
        """Training with batch statistics through torch's own kernel, as ``nn.BatchNorm2d.forward``.

        Plain BN's coefficients are exactly what torch's fused kernel computes, so ``bn`` and every
        subclass that keeps BN's training step (:func:`trains_as_torch_bn`: ``noisy_bn``, whose
        noise comes after BN's output) run that one kernel forward and one backward (double
        backward included): on small tensors the shared path's per-channel ops cost several times
        the kernel (``benchmarks/norms.py``, small shapes). The shared path
        (:meth:`normalize_with_batch_stats`, which the variants use) still runs for synced layers
        (its statistics are reduced across ranks); tests hold the two paths equal.
        """
        tracks = self.tracks_now()
        if tracks:
            self.num_batches_tracked.add_(1)
        momentum = float(self.momentum_weight()) if tracks else 0.0
        return F.batch_norm(x, self.running_mean if tracks else None,
                            self.running_var if tracks else None, self.weight, self.bias, True,
                            momentum, self.eps)

    def compiled_cumulative(self) -> bool:
        """``momentum=None`` under torch.compile: the kernel needs 1/t as a Python float, a graph
        break on every step; the shared path takes it as a tensor."""
        return self.momentum is None and torch.compiler.is_compiling()

    def coefficients(self, mean: Tensor, var: Tensor, gamma: Tensor,
                     beta: Tensor) -> tuple[Tensor, Tensor]:
        """The layer as a per-channel affine map of x given the statistics: (scale, shift)."""
        scale = gamma * torch.rsqrt(var + self.eps)
        return scale, beta - mean * scale

    def inference_affine(self):
        return self.coefficients(self.running_mean, self.running_var, self.weight_or_one(),
                                 self.bias_or_zero())


# The methods that define BN's training step on the shared path: a class that overrides none of them
# trains exactly as torch's kernel computes.
BN_TRAINING_STEP = ("coefficients", "batch_moments", "update_running_stats",
                    "normalize_with_batch_stats", "gamma_beta")


def trains_as_torch_bn(layer: type | nn.Module) -> bool:
    """Whether a :class:`BatchNorm` subclass (or one layer) keeps BN's training step (none of
    :data:`BN_TRAINING_STEP` overridden), so torch's kernel can run it. A variant that overrides its
    ``coefficients`` (or the statistics, or the buffer update) takes the shared path — also when
    the override is an attribute set on one layer, or a method patched on the class after import:
    both are compared with BN's methods as defined here, so no user's function is silently
    skipped."""
    if isinstance(layer, nn.Module) and any(name in vars(layer) for name in BN_TRAINING_STEP):
        return False
    cls = layer if isinstance(layer, type) else type(layer)
    return all(getattr(cls, name) is _BN_METHODS[name] for name in BN_TRAINING_STEP)


# BN's own training-step methods, as this module defines them (see trains_as_torch_bn)
_BN_METHODS = {name: getattr(BatchNorm, name) for name in BN_TRAINING_STEP}


@norm("mean_only_bn", "subtract the batch mean only", "Luo et al. 2019", "§5 (with WN)", BN_OPTIONS)
class MeanOnlyBatchNorm(BatchNorm):
    """Mean-only BN (Luo et al. 2019 §5; Salimans & Kingma 2016): ``y = γ (x − μ_B) + β``.

    Only the batch mean is used (and tracked into ``running_mean``); ``running_var`` is kept for
    state_dict compatibility but ignored. Combined with weight normalization it isolates the
    regularization that comes from the noise of μ_B.
    """

    def normalize(self, x: Tensor) -> Tensor:
        if (y := self.without_batch_stats(x)) is not None:
            return y
        gamma, beta = self.gamma_beta(x)
        return self.normalize_with_batch_stats(x, self.coefficients, gamma, beta,
                                               update=self.update_running_mean)[0]

    def update_running_mean(self, mean: Tensor, var: Tensor, n: int) -> None:
        """Only the mean is tracked; running_var keeps its value."""
        if self.tracks_now():
            self.num_batches_tracked.add_(1)
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum_weight())

    def coefficients(self, mean, var, gamma, beta):
        return gamma, beta - mean * gamma

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        self.update_running_mean(mean, var, n)

    def running_normalize(self, x: Tensor) -> Tensor:
        """γ(x − μ) + β, centred: variance 1 and ε = 0 in the inference kernel (1/√1 is exactly
        1)."""
        ones = torch.ones_like(self.running_mean)
        return self.centred_affine(x, self.running_mean, ones, 0.0, self.weight, self.bias)


@norm("var_only_bn", "divide by the batch std only", "Luo et al. 2019", "§5 (with WN)", BN_OPTIONS,
      removes_mean=False)
class VarOnlyBatchNorm(BatchNorm):
    """Variance-only BN (Luo et al. 2019 §5): ``y = γ x / √(σ²_B + ε) + β``; the mean is not
    removed.

    σ²_B is still the variance around the batch mean (what BN divides by); only the division is
    kept, so the noise of σ_B alone is studied.
    """

    def coefficients(self, mean, var, gamma, beta):
        return gamma * torch.rsqrt(var + self.eps), beta

    def running_normalize(self, x: Tensor) -> Tensor:
        """γx/√(σ² + ε) + β: the inference kernel with mean 0 (the mean is not removed)."""
        zeros = torch.zeros_like(self.running_mean)
        return self.centred_affine(x, zeros, self.running_var, self.eps, self.weight, self.bias)


# no sync option: convert_sync swaps it for nn.SyncBatchNorm
@norm("native_bn", "torch's own fused BatchNorm", "Ioffe & Szegedy 2015", "Alg. 1",
      {k: v for k, v in BN_OPTIONS.items() if k != "sync"})
class NativeBatchNorm(nn.modules.batchnorm._BatchNorm):
    """torch's own fused BatchNorm, accepting (N, C) and (N, C, *) like the other layers; ``eps``
    and ``momentum`` are checked at construction as bnlab's layers check them."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True) -> None:
        super().__init__(num_features, checked_eps(eps), checked_momentum(momentum), affine,
                         track_running_stats, device, dtype, bias=bias)

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError("NativeBatchNorm expects input of shape (N, C) or (N, C, *), got "
                             f"{tuple(x.shape)}")

    # ChannelNorm's contract (its check_input runs here too)
    nonfinite_batches = 0
    reads_own_updates = False

    def forward(self, x: Tensor) -> Tensor:
        """torch's BatchNorm on x, routed as every bnlab layer (:func:`.route.run`)."""
        return route.run(self, x)

    def normalize(self, x: Tensor) -> Tensor:
        ChannelNorm.check_input(self, x)
        return super().forward(x)

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        """torch's kernel's update: ``(1 − m)·running + m·batch``, the unbiased variance."""
        if not (self.training and self.track_running_stats and self.running_mean is not None
                and self.running_var is not None and self.num_batches_tracked is not None):
            return
        self.num_batches_tracked.add_(1)
        m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (n / max(n - 1, 1))
        for buffer, value in ((self.running_mean, mean), (self.running_var, unbiased)):
            buffer.mul_(1 - m).add_(value.to(buffer.dtype), alpha=m)

    def inference_affine(self):
        w = self.weight if self.weight is not None else torch.ones_like(self.running_mean)
        b = self.bias if self.bias is not None else torch.zeros_like(self.running_mean)
        scale = w * torch.rsqrt(self.running_var + self.eps)
        return scale, b - self.running_mean * scale
