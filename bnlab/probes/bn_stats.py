"""What the BN-statistics probes share: the inputs of the BN layers in one forward, quantile
metrics and held-out inputs. The probes are ``gamma``, ``cbn_ratios``, ``batch_noise`` and
``bn_regularization``, one module each."""

from __future__ import annotations

import torch

from .base import ProbeContext, capture_inputs


def bn_inputs(ctx: ProbeContext, layers, x: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Inputs of the given BN layers in one train-mode forward of ``x`` (default: this step's
    batch)."""
    if ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state()
    ctx.model.train()
    with capture_inputs(layers) as cap, torch.no_grad():
        ctx.model(ctx.x if x is None else x)
    return cap.values


def add_quantiles(values: torch.Tensor, prefix: str, layer: str, out: dict) -> None:
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return
    q = torch.quantile(finite, torch.tensor([0.05, 0.5, 0.95], dtype=finite.dtype,
                                            device=finite.device))
    for tag, v in zip(("q05", "q50", "q95"), q.tolist()):
        out[f"{prefix}_{tag}/{layer}"] = v


def heldout_inputs(heldout):
    if heldout is None:
        return None
    if isinstance(heldout, (tuple, list)):
        heldout = heldout[0]
    if not torch.is_tensor(heldout):
        raise ValueError("heldout must be a tensor of inputs or an (inputs, targets) pair, "
                         f"got {type(heldout).__name__}")
    return heldout
