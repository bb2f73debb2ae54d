"""Stochastic-gradient statistics (Peng et al., Theorems 1–3 and Figs 7, 10)."""

from __future__ import annotations

import torch

from .base import PROBES, Probe, ProbeContext, loss_and_grads


@PROBES.register()
class GradStatsProbe(Probe):
    """E‖g‖² of the stochastic gradient and its variance, from k disjoint micro-batches of this
    batch.

    The batch of B samples is cut into k contiguous micro-batches of m = ⌊B/k⌋ samples (the
    remainder is left out); g_i is the gradient of the loss on micro-batch i, in training mode.
    Records

    * ``sq_norm``   = (1/k) Σ ‖g_i‖²             — estimates E‖g‖² (Peng's "stochastic gradient
      squared expectation", the quantity Theorems 2–3 bound),
    * ``variance``  = 1/(k−1) Σ ‖g_i − ḡ‖²        — unbiased estimate of E‖g − E g‖² (trace of the
      covariance),
    * ``norm_variance`` = unbiased variance of ‖g_i‖ (Peng's V[‖v_k‖]),
    * ``mean_sq_norm`` = ‖ḡ‖²,

    all for stochastic gradients at batch size m, and with ``per_layer=True`` also
    ``sq_norm/<param>`` and ``variance/<param>`` per parameter tensor.

    Why micro-batches and not per-sample gradients: under training-mode BN a sample's output depends
    on the whole batch through μ_B and σ_B, so "the gradient of one sample" is not defined; each
    micro-batch is normalized with its own statistics, exactly as a training step of batch size m
    is.

    Cost: k forward/backward passes on micro-batches of B/k samples (≈ one full-batch pass).
    """

    name = "grad_stats"
    summary = "E‖g‖² and variance of the stochastic gradient from k micro-batches (Peng Figs 7, 10)"
    cost = "k forward/backward passes on B/k samples each (about one full-batch pass)"

    def __init__(self, every: int = 1, k: int = 8, per_layer: bool = False) -> None:
        super().__init__(every)
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"k (number of micro-batches) must be an integer >= 2, got {k!r}")
        self.k = k
        self.per_layer = per_layer

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        model = ctx.model
        model.train()
        x, y = ctx.x, ctx.y
        m = x.shape[0] // self.k
        if m < 2:
            raise ValueError("grad_stats needs at least 2 samples per micro-batch: batch of "
                             f"{x.shape[0]} split into k={self.k}")
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        per_batch = []
        for i in range(self.k):
            part = slice(i * m, (i + 1) * m)
            _, grads = loss_and_grads(ctx, names, x=x[part], y=y[part])
            per_batch.append([g.detach().double().reshape(-1) for g in grads])
        k = self.k
        full = torch.stack([torch.cat(gs) for gs in per_batch])  # (k, P)
        mean = full.mean(dim=0)
        sq = full.pow(2).sum(dim=1)
        out = {
            "sq_norm": float(sq.mean()),
            "variance": float((full - mean).pow(2).sum(dim=1).sum() / (k - 1)),
            "norm_variance": float(sq.sqrt().var(correction=1)),
            "mean_sq_norm": float(mean.pow(2).sum()),
            "micro_batch": float(m),
        }
        if self.per_layer:
            for j, name in enumerate(names):
                layer = torch.stack([gs[j] for gs in per_batch])
                out[f"sq_norm/{name}"] = float(layer.pow(2).sum(dim=1).mean())
                out[f"variance/{name}"] = float((layer - layer.mean(dim=0)).pow(2).sum() / (k - 1))
        return out
