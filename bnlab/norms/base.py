"""Shared machinery of the per-channel normalization layers.

Every layer here keeps ``torch.nn.BatchNorm``'s names (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) so that state_dicts interchange where the semantics match.

Most layers are, for a fixed batch, an affine map per channel whose coefficients depend on the batch
statistics: ``y = a(μ_B, σ²_B) · x + b(μ_B, σ²_B)``. They compute ``(μ_B, σ²_B)`` with one fused
``torch.var_mean``, build the per-channel ``a, b`` with ordinary autograd (cheap: C numbers), and apply
them with a single ``addcmul``. Autograd then differentiates through the statistics exactly, which is
what makes the variants (moving statistics, stop-gradient corrections) one-liners and keeps them close
to the speed of torch's fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor


class ChannelNorm(nn.Module):
    """Base class: parameters, buffers, input checks and running-statistics bookkeeping."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive integer, got {num_features!r}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"

    # ---- helpers -------------------------------------------------------------------------------
    def check_input(self, x: Tensor) -> None:
        """Clear errors for the mistakes people make when dropping a layer into a model."""
        if not torch.is_tensor(x) or not x.is_floating_point():
            dtype = getattr(x, "dtype", type(x).__name__)
            raise ValueError(f"{type(self).__name__} expects a floating-point tensor, got {dtype}")
        if x.dim() < 2:
            raise ValueError(f"{type(self).__name__} expects input of shape (N, C) or (N, C, *), got {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_features} channels but the input has "
                f"{x.shape[1]} (shape {tuple(x.shape)})"
            )
        if self.training and x.numel() // x.shape[1] <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input of shape {tuple(x.shape)}"
            )

    @staticmethod
    def reduce_dims(x: Tensor) -> list[int]:
        return [0, *range(2, x.dim())]

    @staticmethod
    def per_channel(t: Tensor, x: Tensor) -> Tensor:
        """View a (C,) tensor so that it broadcasts against x of shape (N, C, *)."""
        return t.view(1, -1, *([1] * (x.dim() - 2)))

    def batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Per-channel mean and biased variance over the batch and all trailing dims, and the count."""
        var, mean = torch.var_mean(x, dim=self.reduce_dims(x), correction=0)
        return mean, var, x.numel() // x.shape[1]

    def use_batch_stats(self) -> bool:
        return self.training or not self.track_running_stats

    @torch.no_grad()
    def update_running_stats(self, mean: Tensor, var: Tensor, n: int, momentum: float | None = None) -> None:
        """PyTorch's convention: biased variance normalizes, the unbiased one goes into running_var."""
        if not (self.training and self.track_running_stats):
            return
        m = self.momentum if momentum is None else momentum
        self.num_batches_tracked.add_(1)
        if m is None:  # cumulative moving average, as torch does for momentum=None
            m = 1.0 / float(self.num_batches_tracked)
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
        unbiased = var.detach() * (n / max(n - 1, 1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)

    def gamma_beta(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.affine:
            return self.weight, self.bias
        one = torch.ones(self.num_features, dtype=x.dtype, device=x.device)
        return one, torch.zeros_like(one)

    def weight_or_one(self) -> Tensor:
        return self.weight if self.affine else torch.ones_like(self.running_mean)

    def bias_or_zero(self) -> Tensor:
        return self.bias if self.affine else torch.zeros_like(self.running_mean)

    def apply_affine(self, x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """y = scale·x + shift per channel, in one pass."""
        return torch.addcmul(self.per_channel(shift, x), x, self.per_channel(scale, x))

    # ---- inference ---------------------------------------------------------------------------
    def inference_affine(self) -> tuple[Tensor, Tensor] | None:
        """The eval-mode map as per-channel (scale, shift), or None if the layer is not affine.

        Used by :func:`bnlab.norms.fold`. Subclasses that are affine at inference override it.
        """
        return None
