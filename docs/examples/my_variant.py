"""A new variant in one file: batch normalization (Ioffe & Szegedy 2015, Alg. 1) whose running
statistics start as an even average of the first batches, then become torch's moving average.

The step's weight is max(momentum, 1/t) at step t: the first 1/momentum batches count equally
(torch's ``momentum=None`` average), later ones as ``nn.BatchNorm2d`` does. Training output and
gradients are BatchNorm's. docs/readme/writing-a-variant.md walks through it.
"""

import torch
from torch import Tensor

from bnlab.norms import ChannelNorm


class WarmStartBatchNorm(ChannelNorm):
    """BN whose running statistics weigh step t by max(momentum, 1/t)."""

    def normalize(self, x: Tensor) -> Tensor:
        self.check_input(x)
        if (empty := self.empty_batch(x)) is not None:
            return empty
        if not self.use_batch_stats():  # inference rule: BN with the running statistics
            return self.running_normalize(x)
        gamma, beta = self.gamma_beta(x)
        return self.normalize_with_batch_stats(x, self.coefficients, gamma, beta,
                                               update=self.update_running_stats)[0]

    def coefficients(self, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor):
        scale = gamma * torch.rsqrt(var + self.eps)  # y = scale·x + shift per channel
        return scale, beta - mean * scale

    @torch.no_grad()
    def update_running_stats(self, mean: Tensor, var: Tensor, n: int) -> None:
        if self.tracks_now():
            self.num_batches_tracked.add_(1)
            t = self.num_batches_tracked.to(self.running_mean.dtype)
            m = (1.0 / t).clamp(min=self.momentum or 0.0)  # a tensor: compile never guards on t
            self.running_mean.lerp_(mean.to(m.dtype), m)
            self.running_var.lerp_((var * n / max(n - 1, 1)).to(m.dtype), m)

    def inference_affine(self):  # eval as a per-channel (scale, shift): what fold() folds
        return self.running_affine(self.weight_or_one(), self.bias_or_zero())
