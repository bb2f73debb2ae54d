"""Luo et al.'s implicit regularization strength ζ per BN layer, from the data (Theorem 1).

The estimator is :func:`bnlab.theory.luo_zeta.zeta_terms` (numpy only, shared with
:func:`bnlab.theory.luo.zeta_relu_estimate`); this probe feeds it each BN layer's pre-BN values.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from bnlab.spec import check_choice
from bnlab.theory.luo_zeta import ACTIVATIONS, zeta_terms

from .base import PROBES, Probe, ProbeContext, bn_affine, bn_layers, channels_first, select_layers
from .bn_stats import bn_inputs, heldout_inputs


def luo_zeta(h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, batch_size: int,
             activation: str = "relu") -> dict[str, torch.Tensor]:
    """Luo et al. 2019, Theorem 1 (Eq. 4), per channel, from the pre-BN values ``h`` of shape (C,
    P): :func:`bnlab.theory.luo_zeta.zeta_terms` (keys ``kurtosis``, ``fisher``, ``sigma_term``,
    ``mu_term``, ``zeta``) as float64 tensors on ``h``'s device."""
    def as_array(t: torch.Tensor):
        return t.detach().double().cpu().numpy()

    terms = zeta_terms(as_array(h), batch_size, as_array(gamma), as_array(beta), activation)
    return {key: torch.from_numpy(value).to(h.device) for key, value in terms.items()}


@PROBES.register()
class BNRegularizationProbe(Probe):
    """Luo et al.'s implicit regularization strength ζ per BN layer (Theorem 1), from the data.

    The pre-BN values of each channel (this batch, or ``heldout`` inputs as the population) give the
    kurtosis ρ, the Fisher term F_γ, the μ_B term and ζ (see :func:`luo_zeta`). ``activation`` picks
    A'' (``relu``: sigmoid, the paper's softplus approximation; ``linear``, ``tanh``, ``sigmoid``);
    M is the training batch size (``batch_size`` overrides). Records per layer the channel means of
    ``zeta``, ``sigma_term``, ``mu_term``, ``kurtosis``, ``fisher``, and ``penalty`` = Σ_c ζ_c γ_c².

    Cost: 1 forward pass (on the held-out batch instead if given).
    """

    name = "bn_regularization"
    summary = "Luo's ζ per BN layer from the data: kurtosis, Fisher term, μ_B term (Luo Thm 1)"
    cost = "1 forward pass"

    def __init__(self, every: int = 1, activation: str = "relu", batch_size: int | None = None,
                 heldout=None, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        check_choice("activation", activation, ACTIVATIONS)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 2):
            raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}")
        self.activation = activation
        self.batch_size = batch_size
        self.heldout = heldout_inputs(heldout)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        x = None if self.heldout is None else self.heldout.to(ctx.x.device)
        inputs = bn_inputs(ctx, layers, x)
        batch_size = self.batch_size or int(ctx.x.shape[0])
        out = {}
        for name, module in layers:
            if name not in inputs:
                continue
            rows = channels_first(inputs[name].double())
            gamma, beta = bn_affine(module, rows[:, 0])
            terms = luo_zeta(rows, gamma, beta, batch_size, self.activation)
            for key, value in terms.items():
                out[f"{key}/{name}"] = float(value.mean())
            out[f"penalty/{name}"] = float((terms["zeta"] * gamma.double() ** 2).sum())
        return out
