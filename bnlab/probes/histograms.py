"""Distribution of a few sampled units' activations over training (Santurkar et al. 2018, Figs 8 and
14)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from .activations import forward_outputs, activation_layers
from .base import PROBES, Probe, ProbeContext, channels_first


@PROBES.register()
class HistogramsProbe(Probe):
    """Distribution of a few sampled units' activations over training (Santurkar et al. 2018,
    App. A.2, Figs 8 and 14).

    At the first call ``units`` channels per layer are drawn (numpy ``default_rng(seed)``) and kept;
    at each call their activations over the batch (and spatial positions) are summarized by
    ``quantiles`` (default 5, 25, 50, 75, 95 %) plus mean and std, as metrics
    ``q05/<layer>[<unit>]``, ``mean/…``, ``std/…``. Plotting the quantile bands against the step
    gives the figures' shaded distributions.

    Cost: 1 forward pass.
    """

    name = "histograms"
    summary = "quantiles of sampled units' activations over training (Santurkar Figs 8, 14)"
    cost = "1 forward pass"

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None, units: int = 2,
                 quantiles: Sequence[float] = (0.05, 0.25, 0.5, 0.75, 0.95), seed: int = 0) -> None:
        super().__init__(every)
        if not isinstance(units, int) or units < 1:
            raise ValueError(f"units must be a positive integer, got {units!r}")
        if not quantiles or any(not 0.0 <= float(q) <= 1.0 for q in quantiles):
            raise ValueError(f"quantiles must lie in [0, 1], got {quantiles!r}")
        self.layers = None if layers is None else list(layers)
        self.units = units
        self.quantiles = [float(q) for q in quantiles]
        self.seed = seed
        self.chosen: dict[str, list[int]] = {}

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        model = ctx.model
        model.train()
        layers = activation_layers(model, self.layers)
        outputs = forward_outputs(ctx, layers)
        rng = np.random.default_rng(self.seed)
        out = {}
        for name, _ in layers:
            if name not in outputs:
                continue
            rows = channels_first(outputs[name].double())
            if name not in self.chosen:
                count = min(self.units, rows.shape[0])
                self.chosen[name] = sorted(int(u) for u in rng.choice(rows.shape[0], size=count,
                                                                      replace=False))
            for unit in self.chosen[name]:
                values = rows[unit]
                tag = f"{name}[{unit}]"
                q = torch.tensor(self.quantiles, dtype=values.dtype, device=values.device)
                for level, value in zip(self.quantiles, torch.quantile(values, q).tolist()):
                    out[f"q{round(level * 100):02d}/{tag}"] = value
                out[f"mean/{tag}"] = float(values.mean())
                out[f"std/{tag}"] = float(values.std(correction=0))
        return out
