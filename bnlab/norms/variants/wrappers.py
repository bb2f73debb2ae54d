"""Normalizations that need the weight of the layer they follow: SI-BN (Arora) and WN (Salimans)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.utils.parametrizations import weight_norm

from .base import ChannelNorm
from ..engine import route
from ..registry import BN_OPTIONS, Param, norm

LINEAR_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def out_features_of(layer: nn.Module) -> int:
    if isinstance(layer, nn.Linear):
        return layer.out_features
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return layer.out_channels
    raise ValueError(f"expected nn.Linear or nn.Conv1d/2d/3d, got {type(layer).__name__}")


def row_sq_norms(weight: Tensor) -> Tensor:
    """‖w_k‖² of each output channel k of a linear/conv weight."""
    return weight.flatten(1).pow(2).sum(dim=1)


class _WeightScaledEpsBN(ChannelNorm):
    """BN whose ε of channel k is ε·‖w_k‖² (the SI-BN of Arora et al. 2019, Eq. 8), ``w`` the
    weight of the layer it follows."""

    def forward(self, z: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        """The layer on z, the output of the layer whose ``weight`` is given (routed as
        :meth:`ChannelNorm.forward`)."""
        return route.run(self, z, weight)

    def normalize(self, z: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        # ‖w‖² here, not in the wrapper: the compiled step (bnlab.norms.engine.compiled_step) then
        # fuses it and its gradient with the normalization (benchmarks/norms.py --modes
        # compiled_step)
        weight_sq = row_sq_norms(weight)
        self.check_input(z)
        if (empty := self.empty_batch(z)) is not None:
            return empty
        if not self.use_batch_stats():  # centred (the inference kernel), per-channel ε‖w‖²
            scale = self.weight_or_one() * torch.rsqrt(self.running_var + self.eps * weight_sq)
            ones = torch.ones_like(self.running_var)
            return self.centred_affine(z, self.running_mean, ones, 0.0, scale, self.bias)
        gamma, beta = self.gamma_beta(z)
        return self.normalize_with_batch_stats(z, self.coefficients, gamma, beta, weight_sq,
                                               update=self.update_running_stats)[0]

    def coefficients(self, mean, var, gamma, beta, weight_sq):
        scale = gamma * torch.rsqrt(var + self.eps * weight_sq)
        return scale, beta - mean * scale


@norm("si_bn", "BN with ε‖w‖² smoothing: keeps the weight scale-invariant", "Arora et al. 2019",
      "Eq. 8, Lemma 2.4", BN_OPTIONS, kind="wrapper")
class ScaleInvariantBN(nn.Module):
    """A linear/conv layer followed by BN that keeps its weight exactly scale-invariant.

    Arora, Li & Lyu 2019, Eq. 8: for channel k with weight w_k,
    ``z̃ = γ_k (w_kᵀx − u)/‖w_k‖_{S+εI} + β_k`` where
    ``‖w‖²_{S+εI} = wᵀSw + ε‖w‖² = Var(w_kᵀx) + ε‖w_k‖²``. (The paper's text says "replace ε with
    ε‖w_k‖₂"; inside the square root it is ε‖w_k‖₂² that makes the map exactly invariant to
    w_k → c·w_k, which is what we implement and test.) Hence
    ⟨w, ∇_w L⟩ = 0 (Lemma 2.4) holds to rounding, while plain BN with ε > 0 violates it.

    State dict: ``layer.weight`` (and ``layer.bias`` if any) and ``norm.{weight,bias,running_mean,
    running_var,num_batches_tracked}`` — the BN names. Build the layer with ``bias=False``.
    """

    # the class of .norm (bnlab.norms.engine.compiled_step keys on it)
    normalization = _WeightScaledEpsBN

    def __init__(self, layer: nn.Module, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True, sync: bool = False) -> None:
        super().__init__()
        features = out_features_of(layer)
        self.layer = layer
        weight = cast(Tensor, layer.weight)  # the norm's tensors default to the layer's place
        factory = {"device": weight.device if device is None else device,
                   "dtype": weight.dtype if dtype is None else dtype}
        self.norm = _WeightScaledEpsBN(features, eps, momentum, affine, track_running_stats,
                                       **factory, bias=bias, sync=sync)

    def reset_parameters(self) -> None:
        """The layer's own initialization and the norm's (torch's ``reset_parameters``)."""
        reset = getattr(self.layer, "reset_parameters", None)
        if callable(reset):
            reset()
        self.norm.reset_parameters()

    def reset_running_stats(self) -> None:
        self.norm.reset_running_stats()

    def weight_sq(self) -> Tensor:
        return row_sq_norms(cast(Tensor, self.layer.weight))

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.layer(x), self.layer.weight)

    def inference_affine(self):
        n = self.norm
        return n.coefficients(n.running_mean, n.running_var, n.weight_or_one(), n.bias_or_zero(),
                              self.weight_sq())


# The issue and the model builders name the two uses; they are the same module.
ScaleInvariantConvBN = ScaleInvariantBN
ScaleInvariantLinearBN = ScaleInvariantBN


@norm("wn", "weight normalization w = γ v/‖v‖, optional γ-decay ζ Σγ²",
      "Salimans & Kingma 2016; Luo et al. 2019", "Luo Eq. 15",
      {"zeta": Param(0.0, float, minimum=0.0)}, kind="wrapper", removes_mean=False)
class WeightNorm(nn.Module):
    """Weight normalization (Salimans & Kingma 2016) of a linear/conv layer: ``w_k = γ_k
    v_k/‖v_k‖``.

    Built on ``torch.nn.utils.parametrizations.weight_norm`` (γ = ``original0``, v = ``original1``).
    ``zeta`` > 0 exposes Luo et al.'s γ-decay (their Eq. 15, the term ζ Σ_k γ_k² that BN's noise
    induces implicitly) through :meth:`regularization_loss`; :func:`bnlab.norms.regularization_loss`
    sums it over a model, and the trainer adds it to the loss.
    """

    def __init__(self, layer: nn.Module, zeta: float = 0.0) -> None:
        super().__init__()
        out_features_of(layer)
        self.layer = weight_norm(layer, dim=0)
        self.zeta = zeta

    @property
    def gamma(self) -> Tensor:
        return self.layer.parametrizations.weight.original0.flatten()

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def regularization_loss(self) -> Tensor:
        return self.zeta * self.gamma.pow(2).sum()
