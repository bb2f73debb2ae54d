"""Gradient accumulation that batch normalization understands.

With gradient accumulation an optimizer step sees k micro-batches, but BatchNorm updates its running
statistics once per micro-batch, from the micro-batch's statistics: k updates with the wrong weight
(momentum compounds k times) and from noisier statistics (pytorch#46516). Within ::

    with bnlab.norms.accumulate(model, steps=k):
        for x, y in micro_batches:          # k of them per optimizer step
            loss_fn(model(x), y).backward()
    optimizer.step()

every bnlab layer of ``model``:

* normalizes each micro-batch with its own statistics (``normalize="micro"``, the default),
  against the layer's state at the start of the optimizer step (``mbn``'s and ``cbn``'s moving
  statistics, ``brn``'s running ones are not advanced between micro-batches), so outputs and
  gradients are those of k independent forward passes from that state — not the full batch's;
* updates its buffers ONCE per k micro-batches, from the exact statistics of their union (this is
  what equals the full batch, in both modes): the micro-batches' per-channel (count, mean, biased
  variance) combined as the synchronized layers combine ranks (Chan, Golub & LeVeque's parallel
  update, :func:`combine_moments`), then the layer's own update rule
  (:meth:`~bnlab.norms.ChannelNorm.update_from_batch`, with the full batch's
  sample count where the rule reads it: ``mbn``'s λ and τ). The running statistics after the k
  micro-batches equal those after one step on the full batch (to rounding: the combination and
  the update's arithmetic are not torch's kernel's).

``normalize="full"`` — each micro-batch normalized with the full batch's statistics, outputs and
gradients those of one full-batch step — cannot run in the user's loop: the full batch's statistics
of layer l exist only once every micro-batch has passed layers 1..l, normalized with the full
batch's statistics there, and the exact gradient of micro-batch i carries Σ ∂L/∂μ, Σ ∂L/∂σ² over ALL
micro-batches. So a ``"full"`` block takes the micro-batches at once, ``acc.step(inputs, loss_fn)``,
which runs a statistics pre-pass and as many gradient rounds as it needs
(:mod:`bnlab.norms.tools.accumulate_full`: exact, one micro-batch's graph in memory, (layers +
rounds) × k passes). Layers that allow it: those normalizing with a function of the batch moments
whose step is deterministic (``noisy_bn`` draws the full batch's noise in one draw, ``native_bn`` is
torch's kernel; both are refused, as are synchronized layers).

A layer whose update is not a function of the batch's means and variances (``lp_bn`` with p=1 or
inf: its scale is a mean of |x − μ| or a top-k) is refused by name, as is torch's own BatchNorm
(convert it: :func:`bnlab.norms.convert`). Layers without batch statistics (``wn``) are untouched.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
from torch import Tensor

from ..variants.base import ChannelNorm
from ..variants.batchnorm import NativeBatchNorm
from ..variants.noisy import NoisyBatchNorm
from .accumulate_full import FullStatistics, full_step
from ..engine.guard import ACCUMULATORS, restore_if_nonfinite, run_from, snapshot
from ..engine.guard import nonfinite_guard_enabled
from ..engine.kernels import batch_statistics
from ..engine.sync import batch_samples

__all__ = ["NORMALIZE", "accumulate", "combine_moments"]

NORMALIZE = ("micro", "full")
MICRO_KINDS = ("bn, mean_only_bn, var_only_bn, native_bn, noisy_bn, mbn, cbn, brn, lp_bn(p=2), "
               "si_bn")
FULL_KINDS = "bn, mean_only_bn, var_only_bn, mbn, cbn, brn, lp_bn(p=2), si_bn"


def combine_moments(parts: list[tuple[int, Tensor, Tensor]]) -> tuple[int, Tensor, Tensor]:
    """``(n, mean, biased variance)`` of the union of batches given as such triples (per channel):
    ``μ = Σ nᵢμᵢ / N``, ``M2 = Σ nᵢσᵢ² + Σ nᵢ(μᵢ − μ)²``, ``σ² = M2 / N`` — exact, and stable at a
    large mean (no Σx² − (Σx)²/N); the parallel update of
    :func:`bnlab.norms.engine.sync.synced_moments`. Computed in float64."""
    total = sum(n for n, _, _ in parts)
    if total == 0:
        raise ValueError("combine_moments: no values to combine")
    mean = sum(n * m.double() for n, m, _ in parts if n) / total
    m2 = sum(n * (v.double() + (m.double() - mean) ** 2) for n, m, v in parts if n)
    return total, torch.as_tensor(mean), torch.as_tensor(m2 / total)


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
        self.full: FullStatistics | None = None  # normalize="full": the full batch's statistics
        self.stepping = False  # normalize="full": inside accumulate.step

    def micro_step(self, layer: nn.Module, call, x: Tensor) -> Tensor:
        if self.start is None:
            self.start = snapshot(layer)
        if self.full is not None:  # the passes of accumulate.step: no update until its end
            if not self.stepping:
                raise RuntimeError(
                    "inside accumulate(normalize='full') the step needs every micro-batch at once: "
                    "call acc.step(inputs, loss_fn) instead of the model")
            return run_from(layer, self.start, call, rewind_generator=False)
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
        layer: Any = self.layer  # a bnlab layer or NativeBatchNorm: both have update_from_batch
        n, mean, var = combine_moments(parts)
        dtype = parts[0][1].dtype
        before = snapshot(layer) if nonfinite_guard_enabled() else None
        layer.update_from_batch(mean.to(dtype), var.to(dtype), n, samples)
        if before is not None:
            restore_if_nonfinite(layer, before)


def _full_refusal(module: nn.Module) -> str | None:
    if isinstance(module, NoisyBatchNorm):
        return ("noisy_bn: the full batch draws its noise in one draw, which no split into "
                "micro-batches reproduces")
    if isinstance(module, NativeBatchNorm):
        return "native_bn: torch's kernel takes no given statistics (bn does)"
    if getattr(module, "sync", False):
        return "synchronized statistics (sync=True): the rounds' sums are not reduced over ranks"
    return None


def _refusals(model: nn.Module, full: bool) -> tuple[list[str], list[str]]:
    refused, allowed = [], []
    for name, module in model.named_modules():
        label = name or type(module).__name__
        if isinstance(module, (ChannelNorm, NativeBatchNorm)):
            reason = (module.accumulation_refusal() if isinstance(module, ChannelNorm) else None)
            reason = reason or (_full_refusal(module) if full else None)
            (refused.append(f"{label}: {reason}") if reason else allowed.append(label))
        elif isinstance(module, nn.modules.batchnorm._NormBase):
            refused.append(f"{label}: torch's {type(module).__name__} updates per micro-batch "
                           "(bnlab.norms.convert(model) turns it into bnlab's bn)")
    return refused, allowed


def _refusal_message(normalize: str, refused: list[str], allowed: list[str],
                     micro_ok: bool) -> str:
    if normalize == "micro":
        return (f"accumulate(normalize='micro'): the running statistics of these layers cannot be "
                f"made equal to the full batch's (their update is not a function of the "
                f"micro-batches' means and variances): {'; '.join(refused)}. Layers that allow it: "
                f"{', '.join(allowed) or 'none'} (of {MICRO_KINDS}). Only the running "
                f"statistics are made equal; each micro-batch is normalized with its own.")
    hint = (" normalize='micro' accepts this model: running statistics equal to the full "
            "batch's, each micro-batch normalized with its own statistics." if micro_ok else "")
    return (f"accumulate(normalize='full'): these layers cannot normalize the micro-batches with "
            f"the full batch's statistics (outputs and gradients of one full-batch step): "
            f"{'; '.join(refused)}. Layers that allow it: {', '.join(allowed) or 'none'} (of "
            f"{FULL_KINDS}).{hint}")


class accumulate:
    """Context manager for the k micro-batches of each optimizer step (``steps=k``). What equals
    one step on the full batch: every layer's running (and moving) statistics, always — one update
    per ``steps`` training forwards of each bnlab layer, from the exact statistics of their union;
    the normalization itself (outputs and gradients) only with ``normalize="full"``, whose
    :meth:`step` takes the micro-batches at once. With ``"micro"`` (the default, the user's loop)
    each micro-batch is normalized with its own statistics from the step's starting state: its
    outputs and gradients are not the full batch's. Leaving the block applies the update of a last,
    incomplete group (as a short last batch would). ``ValueError`` names every layer whose method
    does not allow the chosen mode, with the reason, and the layers that do."""

    def __init__(self, model: nn.Module, steps: int, normalize: str = "micro") -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"accumulate: steps must be a positive integer (micro-batches per "
                             f"optimizer step), got {steps!r}")
        if normalize not in NORMALIZE:
            raise ValueError(f"accumulate: normalize must be one of {', '.join(NORMALIZE)}, got "
                             f"{normalize!r}")
        refused, allowed = _refusals(model, normalize == "full")
        if refused:
            raise ValueError(_refusal_message(normalize, refused, allowed,
                                              micro_ok=not _refusals(model, False)[0]))
        self.model, self.steps, self.normalize = model, steps, normalize
        self.rounds = 0  # normalize="full": gradient rounds the last step ran
        self._layers: list[nn.Module] = []

    def __enter__(self) -> accumulate:
        for module in self.model.modules():
            if isinstance(module, (ChannelNorm, NativeBatchNorm)):
                if id(module) in ACCUMULATORS:
                    raise RuntimeError(f"accumulate: {type(module).__name__} is already inside "
                                       "another accumulate block")
                accumulator = ACCUMULATORS[id(module)] = _LayerAccumulator(module, self.steps)
                if self.normalize == "full":
                    accumulator.full = FullStatistics(module,
                                                      lambda x, m=module: _moments(m, x))
                self._layers.append(module)
        return self

    def step(self, inputs: list[Tensor], loss_fn: Callable[[Tensor, int], Tensor]) -> list[Tensor]:
        """``normalize="full"``: one exact full-batch step on the micro-batches ``inputs`` (the
        ``steps`` of them): the gradients of Σ_i ``loss_fn(model(inputs[i]), i)`` added to the
        parameters' ``.grad`` (return each micro-batch's share of the full batch's loss, e.g. its
        summed loss divided by the full batch's size), one statistics update per layer; returns the
        outputs (detached). :mod:`bnlab.norms.tools.accumulate_full` says what it runs."""
        if self.normalize != "full":
            raise RuntimeError("accumulate.step is the normalize='full' step; with "
                               "normalize='micro' run the micro-batches through the model")
        if len(inputs) != self.steps:
            raise ValueError(f"accumulate.step: expected {self.steps} micro-batches (steps), got "
                             f"{len(inputs)}")
        accumulators = [ACCUMULATORS[id(layer)] for layer in self._layers]
        states = {id(a.layer): a.full for a in accumulators if a.full is not None}
        for a in accumulators:
            a.stepping, a.start = True, None
        try:
            outputs, self.rounds = full_step(self.model, states, list(inputs), loss_fn,
                                             combine_moments)
            return outputs
        finally:
            for a in accumulators:
                a.stepping, a.start = False, None
                a.full = FullStatistics(a.layer, lambda x, m=a.layer: _moments(m, x))

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
