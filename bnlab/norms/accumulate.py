"""Gradient accumulation that batch normalization understands.

With gradient accumulation an optimizer step sees k micro-batches, but BatchNorm updates its running
statistics once per micro-batch, from the micro-batch's statistics: k updates with the wrong weight
(momentum compounds k times) and from noisier statistics (pytorch#46516). Within ::

    with bnlab.norms.accumulate(model, steps=k):
        for x, y in micro_batches:          # k of them per optimizer step
            loss_fn(model(x), y).backward()
    optimizer.step()

every bnlab layer of ``model``:

* normalizes each micro-batch with its own statistics (``normalize="micro"``, the default), against
  the layer's state at the start of the optimizer step (``mbn``'s and ``cbn``'s moving statistics,
  ``brn``'s running ones are not advanced between micro-batches), so outputs and gradients are
  those of k independent forward passes from that state;
* updates its buffers ONCE per k micro-batches, from the exact statistics of their union: the
  micro-batches' per-channel (count, mean, biased variance) combined as the synchronized layers
  combine ranks (Chan, Golub & LeVeque's parallel update, :func:`combine_moments`), then the
  layer's own update rule (:meth:`~bnlab.norms.ChannelNorm.update_from_batch`, with the full batch's
  sample count where the rule reads it: ``mbn``'s λ and τ). The running statistics after the k
  micro-batches equal those after one step on the full batch (to rounding: the combination and
  the update's arithmetic are not torch's kernel's).

``normalize="full"`` — each micro-batch normalized with the full batch's statistics — is refused
with a ``ValueError``: the full batch's statistics of layer l depend on the outputs of layer l − 1
normalized with ITS full-batch statistics, so they exist only after a pre-pass over all k
micro-batches per normalization layer (depth × k forward passes), and the exact gradient needs the
sums Σ ∂L/∂μ, Σ ∂L/∂σ² over all micro-batches at every layer, which each depend on the later layers'
(depth × k backward passes more); with graphs kept across micro-batches instead, the memory is the
full batch's, which is what accumulation avoids. The exact full-batch step is then the full
batch itself.

A layer whose update is not a function of the batch's means and variances (``lp_bn`` with p=1 or
inf: its scale is a mean of |x − μ| or a top-k) is refused by name, as is torch's own BatchNorm
(convert it: :func:`bnlab.norms.convert`). Layers without batch statistics (``wn``) are untouched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from .base import ChannelNorm
from .batchnorm import NativeBatchNorm
from .guard import ACCUMULATORS, restore_if_nonfinite, run_from, snapshot
from .guard import nonfinite_guard_enabled
from .kernels import batch_statistics
from .sync import batch_samples

__all__ = ["NORMALIZE", "accumulate", "combine_moments"]

NORMALIZE = ("micro", "full")


def combine_moments(parts: list[tuple[int, Tensor, Tensor]]) -> tuple[int, Tensor, Tensor]:
    """``(n, mean, biased variance)`` of the union of batches given as such triples (per channel):
    ``μ = Σ nᵢμᵢ / N``, ``M2 = Σ nᵢσᵢ² + Σ nᵢ(μᵢ − μ)²``, ``σ² = M2 / N`` — exact, and stable at a
    large mean (no Σx² − (Σx)²/N); the parallel update of :func:`bnlab.norms.sync.synced_moments`.
    Computed in float64."""
    total = sum(n for n, _, _ in parts)
    if total == 0:
        raise ValueError("combine_moments: no values to combine")
    mean = sum(n * m.double() for n, m, _ in parts if n) / total
    m2 = sum(n * (v.double() + (m.double() - mean) ** 2) for n, m, v in parts if n)
    return total, mean, m2 / total


def _moments(layer: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, int]:
    with torch.no_grad():
        if isinstance(layer, ChannelNorm):
            return layer.batch_moments(x.detach())
        mean, var = batch_statistics(x.detach())
        return mean, var, x.numel() // x.shape[1]


class _LayerAccumulator:
    """One layer's micro-batches of the current optimizer step."""

    def __init__(self, layer: nn.Module, steps: int) -> None:
        self.layer, self.steps = layer, steps
        self.start: dict[str, Any] | None = None
        self.parts: list[tuple[int, Tensor, Tensor]] = []
        self.samples = 0

    def micro_step(self, layer: nn.Module, call, x: Tensor) -> Tensor:
        if self.start is None:
            self.start = snapshot(layer)
        # from the step's starting state; the buffer updates of this pass are discarded
        y = run_from(layer, self.start, call, rewind_generator=False)
        if x.numel():
            mean, var, n = _moments(layer, x)
            self.parts.append((n, mean, var))
            self.samples += batch_samples(layer, x)
        if len(self.parts) >= self.steps:
            self.flush()
        return y

    @torch.no_grad()
    def flush(self) -> None:
        """One update from the union of the micro-batches seen since the last one."""
        parts, samples = self.parts, self.samples
        self.start, self.parts, self.samples = None, [], 0
        if not parts:
            return
        layer = self.layer
        n, mean, var = combine_moments(parts)
        dtype = parts[0][1].dtype
        before = snapshot(layer) if nonfinite_guard_enabled() else None
        layer.update_from_batch(mean.to(dtype), var.to(dtype), n, samples)
        if before is not None:
            restore_if_nonfinite(layer, before)


def _refusals(model: nn.Module) -> tuple[list[str], list[str]]:
    refused, allowed = [], []
    for name, module in model.named_modules():
        label = name or type(module).__name__
        if isinstance(module, ChannelNorm):
            reason = module.accumulation_refusal()
            (refused.append(f"{label}: {reason}") if reason else allowed.append(label))
        elif isinstance(module, NativeBatchNorm):
            allowed.append(label)
        elif isinstance(module, nn.modules.batchnorm._NormBase):
            refused.append(f"{label}: torch's {type(module).__name__} updates per micro-batch "
                           "(bnlab.norms.convert(model) turns it into bnlab's bn)")
    return refused, allowed


class accumulate:
    """Context manager: over every ``steps`` training forwards of each bnlab layer of ``model`` (the
    micro-batches of one optimizer step), one statistics update equal to the full batch's (module
    docstring). Leaving the block applies the update of a last, incomplete group (as a short last
    batch would). ``normalize``: ``"micro"`` (each micro-batch normalized with its own statistics);
    ``"full"`` is refused (module docstring says why). ``ValueError`` names every layer whose
    method does not allow it, and those that do."""

    def __init__(self, model: nn.Module, steps: int, normalize: str = "micro") -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"accumulate: steps must be a positive integer (micro-batches per "
                             f"optimizer step), got {steps!r}")
        if normalize not in NORMALIZE:
            raise ValueError(f"accumulate: normalize must be one of {', '.join(NORMALIZE)}, got "
                             f"{normalize!r}")
        refused, allowed = _refusals(model)
        if normalize == "full":
            raise ValueError(
                "accumulate(normalize='full') is refused for every layer: normalizing a "
                "micro-batch with the full batch's statistics needs, at each normalization layer, "
                "the statistics of the layer before it already normalized with the full batch's "
                "(a pre-pass over all micro-batches per layer) and an exact gradient needs every "
                "micro-batch's ∂L/∂μ, ∂L/∂σ² first; that is the full batch's compute or memory. "
                "Use normalize='micro' (exact running statistics) or the full batch. Layers with "
                f"exact running statistics under 'micro': {', '.join(allowed) or 'none'}")
        if refused:
            raise ValueError(
                "accumulate: these layers' statistics cannot be combined exactly over "
                f"micro-batches: {'; '.join(refused)}. Layers that allow it: "
                f"{', '.join(allowed) or 'none'} (bn, mean_only_bn, var_only_bn, native_bn, "
                "noisy_bn, mbn, cbn, brn, lp_bn(p=2), si_bn)")
        self.model, self.steps, self.normalize = model, steps, normalize
        self._layers: list[nn.Module] = []

    def __enter__(self) -> accumulate:
        for module in self.model.modules():
            if isinstance(module, (ChannelNorm, NativeBatchNorm)):
                if id(module) in ACCUMULATORS:
                    raise RuntimeError(f"accumulate: {type(module).__name__} is already inside "
                                       "another accumulate block")
                ACCUMULATORS[id(module)] = _LayerAccumulator(module, self.steps)
                self._layers.append(module)
        return self

    def flush(self) -> None:
        """Apply the pending update of every layer now (an optimizer step ended early)."""
        for layer in self._layers:
            ACCUMULATORS[id(layer)].flush()

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            for layer in self._layers:
                ACCUMULATORS.pop(id(layer), None)
            self._layers = []
