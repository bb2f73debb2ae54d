"""γ of the BN layers (Luo et al. 2019, Fig. 5: γ² against the batch size)."""

from __future__ import annotations

from collections.abc import Iterable


from .base import PROBES, Probe, ProbeContext, bn_layers, select_layers


@PROBES.register()
class GammaProbe(Probe):
    """|γ| per BN layer over training (Luo et al. 2019, Fig. 5a): ``abs_mean/<layer>`` = mean_c
    |γ_c| and ``sq_mean/<layer>`` = mean_c γ_c² (the quantity Theorem 1's ζγ² penalizes).

    Cost: no forward or backward pass.
    """

    name = "gamma"
    summary = "mean |γ| and γ² per BN layer (Luo Fig. 5a)"
    cost = "0 passes (reads γ)"
    read_only = True

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        out = {}
        for name, module in select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN"):
            weight = getattr(module, "weight", None)
            if weight is None:
                continue
            w = weight.detach().double()
            out[f"abs_mean/{name}"] = float(w.abs().mean())
            out[f"sq_mean/{name}"] = float(w.pow(2).mean())
        return out
