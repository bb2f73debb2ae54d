"""Momentum Batch Normalization (Yong, Huang, Meng, Hua & Zhang, ECCV 2020)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChannelNorm
from .conventions import factory_kwargs
from ..registry import BN_OPTIONS, Param, norm
from ..user_line import warn as warn_at_user_line


def mbn_lambda(epoch: int, epochs: int, batch_size: int, ideal_batch: int) -> float:
    """MBN's momentum λ at epoch t (1-based) of T for batch size m and ideal batch m0.

    ρ = min(m/m0, 1)^{1/T},  λ(t) = ρ^{T/(T−1)·max(T−t, 0)} − ρ^T,
    so λ(1) = 0 (plain BN at the start) and λ(T) = 1 − min(m/m0, 1) (strongest smoothing at the end,
    none at all when m ≥ m0). For T = 1 there is only the first epoch, λ = 0.
    """
    if epochs < 1 or epoch < 1:
        raise ValueError(f"epoch and epochs are 1-based and positive, got epoch={epoch}, "
                         f"epochs={epochs}")
    ratio = min(batch_size / ideal_batch, 1.0)
    if epochs == 1:
        return 0.0
    rho = ratio ** (1.0 / epochs)
    return rho ** (epochs / (epochs - 1) * max(epochs - epoch, 0)) - rho**epochs


@norm("mbn", "normalize with moving statistics, λ scheduled by epoch",
      "Yong et al. 2020 (Momentum BN)", "Eqs. 3-4, λ schedule",
      {"ideal_batch": Param(32, int, minimum=1),
       "tau0": Param(0.9, float, minimum=0.0, maximum=1.0), **BN_OPTIONS})
class MomentumBatchNorm(ChannelNorm):
    """MBN: normalize with moving statistics that already include the current batch.

    Training, with λ from :func:`mbn_lambda` (needs :func:`bnlab.norms.set_progress`; before it is
    called λ = 0 and MBN is BN):

        μ ← λ μ + (1−λ) μ_B,   σ² ← λ σ² + (1−λ) σ²_B,   x̂ = (x − μ)/√(σ² + ε)

    The old μ, σ² are constants for autograd: gradients flow through μ_B and σ²_B only (scaled by
    1−λ). Inference uses a separate EMA (``running_mean``/``running_var``, BN's conventions) with τ
    = τ0^{m/m0}, i.e. update weight 1 − τ (Yong et al.'s rule; the ``momentum`` option is not used).
    ``track_running_stats=False``: no inference EMA, eval normalizes with the batch (λ = 0).

    λ lives in a tensor (``λ = r^e − r`` with r = min(m/m0, 1) and the exponent e set by
    :meth:`set_progress`; e = 1 gives λ = 0), so a compiled model does not recompile every epoch.
    Training without epoch and epochs warns once.
    """

    reads_own_updates = True  # refused in checkpoint recomputation (ChannelNorm.check_input)

    train_mean: Tensor  # buffers, declared for the type checker (see ChannelNorm)
    train_var: Tensor
    _lambda_exponent: Tensor

    def __init__(self, num_features: int, ideal_batch: int = 32, tau0: float = 0.9,
                 **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if isinstance(ideal_batch, bool) or not isinstance(ideal_batch, int) or ideal_batch < 1:
            raise ValueError(f"mbn: ideal_batch must be a positive integer, got {ideal_batch!r}")
        # the inference EMA keeps τ = τ0^(m/m0) of the old value: a decay, so in [0, 1] (τ0 > 1
        # gave a negative momentum and running statistics that run away)
        if not 0.0 <= tau0 <= 1.0:
            raise ValueError(f"mbn: tau0 must be in [0, 1], got {tau0!r}")
        self.ideal_batch = ideal_batch
        self.tau0 = tau0
        self.epoch: int | None = None
        self.epochs: int | None = None
        self._warned_progress = False
        factory = factory_kwargs(kwargs)
        self.register_moving_buffers(factory)
        self.register_buffer("_lambda_exponent", torch.tensor(1.0, **factory), persistent=False)

    def moving_buffers(self, **factory) -> dict[str, Tensor]:
        return {"train_mean": torch.zeros(self.num_features, **factory),
                "train_var": torch.ones(self.num_features, **factory)}

    def transient_buffers(self) -> dict[str, Tensor]:
        return {"_lambda_exponent": torch.tensor(1.0)}  # λ = 0 until set_progress gives the epoch

    @torch.no_grad()
    def reset_running_stats(self) -> None:
        """BN's buffers and the moving statistics that training normalizes with."""
        super().reset_running_stats()
        self.reset_moving_buffers()

    def set_progress(self, *, lr=None, epoch=None, epochs=None) -> None:
        if epoch is not None:
            self.epoch = int(epoch)
        if epochs is not None:
            self.epochs = int(epochs)
        if self.epoch is not None and self.epochs is not None and self.epochs > 1:
            t, big_t = min(self.epoch, self.epochs), self.epochs
            # λ = ρ^{T/(T−1)·max(T−t,0)} − ρ^T with ρ = r^{1/T}  ⇔  λ = r^{max(T−t,0)/(T−1)} − r
            mbn_lambda(t, big_t, 1, 1)  # validates epoch, epochs
            self._lambda_exponent.fill_(max(big_t - t, 0) / (big_t - 1))

    def current_lambda(self, batch_size: int) -> float:
        if self.epoch is None or self.epochs is None:
            return 0.0
        return mbn_lambda(min(self.epoch, self.epochs), self.epochs, batch_size, self.ideal_batch)

    def lambda_tensor(self, batch_size: int) -> Tensor:
        ratio = min(batch_size / self.ideal_batch, 1.0)
        return ratio ** self._lambda_exponent - ratio

    def normalize(self, x: Tensor) -> Tensor:
        if (y := self.without_batch_stats(x)) is not None:
            return y
        gamma, beta = self.gamma_beta(x)
        # MBN's m (over all ranks when synced) is the number of samples, not samples × positions
        m = self.step_samples(x)
        learning = self.training
        if (learning and not torch.compiler.is_compiling()
                and (self.epoch is None or self.epochs is None) and not self._warned_progress):
            self._warned_progress = True
            warn_at_user_line("mbn is training without epoch/epochs, so its momentum λ is 0 (plain "
                              "BN): call bnlab.norms.set_progress(model, epoch=..., epochs=...) "
                              "every epoch, or bnlab.norms.track(model, optimizer, epochs=...) "
                              "once")

        # called inside the fused operator: no dispatched operations of its own
        def lam() -> Tensor:
            return self.lambda_tensor(m) if learning else torch.zeros_like(self._lambda_exponent)

        def coefficients(mean_b, var_b, gamma, beta):
            mean, var = self.moving_statistics(mean_b, var_b, lam())
            scale = gamma * torch.rsqrt(var + self.eps)
            return scale, beta - mean * scale

        def update(mean_b, var_b, n):  # without grad, after the coefficients were taken
            if learning:
                self._update(mean_b, var_b, n, m, lam())

        return self.normalize_with_batch_stats(x, coefficients, gamma, beta, update=update)[0]

    @torch.no_grad()
    def _update(self, mean_b: Tensor, var_b: Tensor, n: int, m: int, lam: Tensor) -> None:
        """The moving statistics (Eq. 3, with λ) and the inference EMA (τ = τ0^{m/m0})."""
        mean, var = self.moving_statistics(mean_b, var_b, lam)
        self.write_buffer("train_mean", mean)
        self.write_buffer("train_var", var)
        self.update_running_stats(mean_b, var_b, n,
                                  momentum=1 - self.tau0 ** (m / self.ideal_batch))

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        """λ and τ of a batch of ``samples`` samples (MBN's m)."""
        self._update(mean, var, n, samples, self.lambda_tensor(samples))

    def moving_statistics(self, mean_b: Tensor, var_b: Tensor,
                          lam: Tensor) -> tuple[Tensor, Tensor]:
        """μ ← λμ + (1−λ)μ_B, σ² ← λσ² + (1−λ)σ²_B; the old moving values are constants for
        autograd."""
        return lam * self.train_mean + (1 - lam) * mean_b, lam * self.train_var + (1 - lam) * var_b

    def inference_affine(self):
        return self.running_affine(self.weight_or_one(), self.bias_or_zero())
