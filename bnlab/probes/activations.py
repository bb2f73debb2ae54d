"""Activation distributions over training (Santurkar et al. 2018, Figs 7, 8 and 14)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .base import (
    PROBES, Probe, ProbeContext, bn_layers,
    capture_inputs, channels_first, select_layers, weight_layers,
)
from .state import simulated_step


def activation_layers(model, names):
    """Default layers whose outputs are watched: the BN layers, or the Linear/Conv layers if
    none."""
    default = bn_layers(model) or weight_layers(model)
    return select_layers(model, names, default, "BN (or Linear/Conv)")


def forward_outputs(ctx: ProbeContext, layers, params=None,
                    reset_rng: bool = True) -> dict[str, torch.Tensor]:
    if ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state(rng=reset_rng)
    with capture_inputs(layers, outputs=True) as cap, torch.no_grad():
        if params is None:
            ctx.model(ctx.x)
        else:
            torch.func.functional_call(ctx.model, params, (ctx.x,))
    return cap.values


@PROBES.register()
class MomentsProbe(Probe):
    """Change of each layer's activation moments caused by one update (Santurkar et al. 2018,
    App. A.2.1, Fig. 7).

    For every unit (channel; batch and spatial positions pooled, as BN pools them) the mean and
    variance of the layer's output on this step's batch, at the current parameters W and at W'
    (after this step's update, simulated as in ``ics``). Records ``mean_change/<layer>`` = mean over
    units |μ(W') − μ(W)| and ``var_change/<layer>`` = mean over units |σ²(W') − σ²(W)|. Both passes
    use the same batch and running statistics; the second draws fresh layer noise (``noisy_bn``) as
    the next training step would, so the noise injected by Santurkar's "noisy" BN shows up as shift.
    Layers: the BN layers' outputs by default (the Linear/Conv outputs if the model has no BN), or
    ``layers=[...]``.

    Cost: 1 simulated optimizer step + 2 forward passes (no backward).
    """

    name = "moments"
    summary = ("change of each layer's activation mean/variance caused by one update "
               "(Santurkar Fig. 7)")
    cost = "1 optimizer step (simulated) + 2 forward passes"

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        model = ctx.model
        model.train()
        layers = activation_layers(model, self.layers)
        before = forward_outputs(ctx, layers)
        lr = None if ctx.optimizer is not None else ctx.learning_rate()
        updated_by_id = simulated_step(ctx.require_snapshot(), lr)
        updated = {n: updated_by_id[id(p)] for n, p in model.named_parameters()}
        after = forward_outputs(ctx, layers, updated, reset_rng=False)
        out = {}
        for name, _ in layers:
            if name not in before or name not in after:
                continue
            a, b = channels_first(before[name].double()), channels_first(after[name].double())
            var_a, mean_a = torch.var_mean(a, dim=1, correction=0)
            var_b, mean_b = torch.var_mean(b, dim=1, correction=0)
            out[f"mean_change/{name}"] = float((mean_b - mean_a).abs().mean())
            out[f"var_change/{name}"] = float((var_b - var_a).abs().mean())
        return out
