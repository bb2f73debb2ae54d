"""Santurkar et al. 2018, Appendix A.2.1, Algorithm 1: "noisy" BatchNorm."""

from __future__ import annotations

import torch
from torch import Tensor

from ..engine.kernels import stats_dtype
from ..engine.fused import lazily_disabled
from ..engine.guard import refuse_recomputation
from .batchnorm import BatchNorm
from ..engine.switches import module_group
from ..engine.sync import global_batch_rows
from ..registry import BN_OPTIONS, Param, norm
from ..user_line import warn as warn_at_user_line

NOISY_STATISTICS = (
    "noisy_bn in eval mode after training with its noise: the running statistics of every layer "
    "after a noisy_bn were collected on noisy activations, which eval no longer gives them "
    "(Santurkar et al.'s Alg. 1 adds the noise in training only), and eval accuracy can fall far "
    "below training (e.g. 0.44 against 0.91 in a ReLU VGG); call "
    "bnlab.norms.recollect_running_stats(model, batches) after training for the clean network's "
    "population statistics")


class StochasticLayer:
    """Mixin for layers that draw random numbers: one private, seedable ``torch.Generator``.

    The generator lives on the input's device and is exposed as ``self.generator`` so a trainer can
    checkpoint its state; :func:`bnlab.norms.seed_layers` gives each layer of a model its own seed.
    """

    def init_generator(self) -> None:
        # Draw the default seed from torch's global RNG so `torch.manual_seed` makes models
        # reproducible; on the CPU whatever the default device (a model built under
        # `torch.device("meta")` has no values to read a seed from)
        self._seed = int(torch.randint(0, 2**62, (1,), device="cpu").item())
        self._generator: torch.Generator | None = None

    def reseed(self, seed: int) -> None:
        self._seed = int(seed)
        self._generator = None

    def generator_for(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self._seed)
        return self._generator

    @property
    def generator(self) -> torch.Generator:
        return (self._generator if self._generator is not None
                else self.generator_for(torch.device("cpu")))


@norm("noisy_bn", "BN + time-varying non-zero-mean, non-unit-variance noise",
      "Santurkar et al. 2018", "App. A.2.1, Alg. 1",
      {"n_mu": Param(0.5, float, minimum=0.0), "n_sigma": Param(1.25, float, minimum=1.0),
       "r_mu": Param(0.1, float, minimum=0.0), "r_sigma": Param(0.1, float, minimum=0.0),
       **BN_OPTIONS})
class NoisyBatchNorm(BatchNorm, StochasticLayer):
    """BN followed by time-varying, non-zero-mean, non-unit-variance noise (Santurkar Alg. 1).

    After the BN output ``a`` (affine included), at each training step and for each unit j draw
    ``μ_j ~ U(−n_μ, n_μ)`` and ``σ_j ~ U(1, n_σ)``; then for every sample i (and, for convolutions,
    every spatial position, which counts as a batch dimension) draw ``m_ij ~ U(μ_j − r_μ, μ_j +
    r_μ)`` and ``s_ij ~ N(σ_j, r_σ²)`` (r_σ is a standard deviation) and output ``s_ij · a_ij +
    m_ij``. The noise is only applied in training; evaluation is plain BN. ``noise = False`` (an
    attribute) switches it off in training too, drawing nothing: the batch-statistics forward of
    Alg. 1 with s = 1, m = 0 (:func:`bnlab.norms.recollect_running_stats` uses it).
    """

    def __init__(self, num_features: int, n_mu: float = 0.5, n_sigma: float = 1.25,
                 r_mu: float = 0.1, r_sigma: float = 0.1, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.n_mu, self.n_sigma, self.r_mu, self.r_sigma = n_mu, n_sigma, r_mu, r_sigma
        self.noise = True
        self.noisy_statistics = False  # trained with the noise since the last recollection
        self.init_generator()

    def normalize(self, x: Tensor) -> Tensor:
        a = super().normalize(x)
        if not self.training and getattr(self, "noisy_statistics", False):
            self.noisy_statistics = False  # once per layer (and per training spell)
            warn_at_user_line(NOISY_STATISTICS)
        if not self.training or not getattr(self, "noise", True) or (
                a.numel() == 0 and module_group(self) is None):  # empty: no draws
            return a
        self.noisy_statistics = self.track_running_stats
        # drawn and applied in float32 or better, as the statistics
        scale, offset = self.draw_noise(a)
        return _ScaleShiftInPlace.apply(a, scale, offset).to(a.dtype)

    @lazily_disabled  # torch.compiler.disable, applied on the first call: no torch._dynamo import
    def draw_noise(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """(s, m) of Algorithm 1 for an output shaped like ``a``, from the layer's own generator.

        Each full-size draw is made in place by ``uniform_``/``normal_`` with Alg. 1's spread, then
        shifted by its per-channel centre (torch's CPU generator, which is serial, is most of the
        cost); both are fresh tensors that nothing else holds. Excluded from torch.compile: dynamo
        does not trace draws from a ``torch.Generator`` (one graph break per noisy layer; the
        normalization before it and the noise application are compiled)."""
        refuse_recomputation("noisy_bn",
                             "its noise comes from the layer's own torch.Generator, which "
                             "checkpoint does not replay, and would differ from the forward's",
                             "Keep noisy_bn outside checkpointed regions (or set layer.noise = "
                             "False there)")
        # a meta tensor has no values and no generator: shapes only (as nn.BatchNorm on meta)
        g = None if a.device.type == "meta" else self.generator_for(a.device)
        # synced: the global batch's noise, this rank's rows
        shape, rows = global_batch_rows(self, a)
        dtype = stats_dtype(a)

        def blank(size: tuple[int, ...]) -> Tensor:
            # drawn in the logical (contiguous) order, whatever a's memory format: the same
            # input gives the same noise on channels_last and contiguous tensors
            return torch.empty(size, dtype=dtype, device=a.device)

        def own_rows(t: Tensor) -> Tensor:
            t = t if rows == slice(None) else t[rows].clone()
            if a.is_contiguous() or t.shape != a.shape:
                return t
            return torch.empty_like(a, dtype=dtype).copy_(t)  # a's layout: channels_last stays so

        mu = blank((self.num_features,)).uniform_(-self.n_mu, self.n_mu, generator=g)
        sigma = blank((self.num_features,)).uniform_(1.0, self.n_sigma, generator=g)
        m = own_rows(blank(shape).uniform_(-self.r_mu, self.r_mu, generator=g))
        m.add_(self.per_channel(mu, a))  # m_ij ~ U(μ_j − r_μ, μ_j + r_μ)
        s = own_rows(blank(shape).normal_(0.0, self.r_sigma, generator=g))
        s.add_(self.per_channel(sigma, a))  # s_ij ~ N(σ_j, r_σ²)
        return s, m


class _ScaleShiftInPlace(torch.autograd.Function):
    """``s·a + m`` written into m (a fresh noise draw), with ∂/∂a = g·s: one full-size pass each
    way.

    torch's own ``addcmul`` differentiates with two full-size products (``g·(s·1)``); s and m are
    random draws, never differentiated."""

    @staticmethod
    def forward(ctx, a: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
        ctx.save_for_backward(scale)
        ctx.mark_dirty(offset)
        return offset.addcmul_(scale, a)

    @staticmethod
    def backward(ctx, g: Tensor):
        (scale,) = ctx.saved_tensors
        return g * scale, None, None
