"""``accumulate(..., normalize="full")``: micro-batches normalized with the full batch's statistics,
outputs and gradients of one full-batch step, one micro-batch's graph in memory at a time.

What "exact" costs here (:mod:`bnlab.norms.accumulate` says why the user's own loop cannot give it):

* **Statistics pre-pass.** The full batch's statistics of normalization layer l are those of its
  input when every earlier layer normalized with the full batch's. So the pre-pass runs the k
  micro-batches without grad once per normalization layer, in the order the forward reaches them:
  pass d stops each micro-batch at the d-th layer, which collects its (count, mean, variance); the
  union's statistics are combined exactly (:func:`~bnlab.norms.tools.accumulate.combine_moments`)
  and fixed for the later passes.
* **Exact gradients.** With the statistics fixed, a micro-batch's own graph gives every term of the
  full-batch gradient but those through the statistics: ∂L/∂x_i gets ``Gμ/N + Gσ²·2(x_i − μ)/N``,
  where Gμ = Σ_j ∂L_j/∂μ and Gσ² = Σ_j ∂L_j/∂σ² sum over ALL micro-batches j. Each micro-batch's
  backward records its share (the layer's own coefficients' graph gives it, so every variant is
  covered: ``mbn``'s λ, ``cbn``'s β inside the second moment) and uses the previous round's sums.
  The sums of the deepest layer are exact after one round (nothing after it depends on them), the
  next after two, ...: the round whose sums come back unchanged used the exact ones, and its
  gradients are the full batch's. At most one round per normalization layer plus one.

Cost: (layers + rounds) × k passes — a tool to get the exact full-batch step within a memory
budget (and to measure what the usual shortcut loses), not a training speed-up.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from ..variants.base import ChannelNorm
from ..engine.guard import restore_if_nonfinite, snapshot
from ..engine.guard import nonfinite_guard_enabled
from ..engine.kernels import per_channel
from ..engine.sync import batch_samples

__all__ = ["FullStatistics", "StopPass", "full_step"]


class StopPass(Exception):
    """Raised by the layer collecting its statistics in a pre-pass: the rest of that forward is
    not needed."""


class FullStatistics:
    """One layer's full-batch statistics and the round sums of ∂L/∂μ, ∂L/∂σ²."""

    def __init__(self, layer: nn.Module, moments: Callable) -> None:
        self.layer, self.moments = layer, moments
        self.parts: list[tuple[int, Tensor, Tensor]] = []
        self.samples = 0
        self.mean: Tensor | None = None
        self.var: Tensor | None = None
        self.n = 0
        self.used: tuple[Tensor, Tensor] | None = None  # the sums this round's gradients add
        self.summed: list[Tensor] = []  # this round's Σ ∂L_j/∂μ, Σ ∂L_j/∂σ² (float64)
        self.calls = 0

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """The (mean, var, n) the layer normalizes x with (its plain path's moments)."""
        if self.mean is None:  # pre-pass: collect this micro-batch's statistics, stop the pass
            mean, var, n = self.moments(x)
            self.parts.append((n, mean, var))
            self.samples += batch_samples(self.layer, x)
            raise StopPass
        self.calls += 1
        mean, var = _Fixed.apply(x, self)
        return mean, var, self.n

    def fix(self, combine: Callable) -> None:
        n, mean, var = combine(self.parts)
        dtype = self.parts[0][1].dtype
        self.n, self.mean, self.var = n, mean.to(dtype), var.to(dtype)
        self.parts = []

    def start_round(self) -> None:
        self.summed, self.calls = [], 0

    def add(self, g_mean: Tensor, g_var: Tensor) -> None:
        g = (g_mean.double(), g_var.double())
        self.summed = [a + b for a, b in zip(self.summed, g)] if self.summed else list(g)

    def settled(self) -> bool:
        """Whether this round's sums are the ones its gradients used (then they were exact)."""
        assert self.mean is not None, "settled() before the statistics pre-pass"
        now = self.summed or [torch.zeros_like(self.mean, dtype=torch.float64)] * 2
        used = self.used or (torch.zeros_like(now[0]), torch.zeros_like(now[1]))
        return all(torch.equal(a, b) for a, b in zip(now, used))

    def next_round(self) -> None:
        if self.summed:
            self.used = (self.summed[0], self.summed[1])


class _Fixed(torch.autograd.Function):
    """(μ, σ²) of the full batch, constants forward; backward records this micro-batch's ∂L/∂μ,
    ∂L/∂σ² and gives x the full batch's statistics gradient from the previous round's sums."""

    @staticmethod
    def forward(ctx, x: Tensor, state: FullStatistics):
        ctx.state = state
        ctx.save_for_backward(x)
        assert state.mean is not None and state.var is not None, "no statistics pre-pass"
        return state.mean.clone(), state.var.clone()

    @staticmethod
    def backward(ctx, g_mean: Tensor, g_var: Tensor):
        state = ctx.state
        state.add(g_mean, g_var)
        if state.used is None:
            return None, None
        (x,) = ctx.saved_tensors
        g_mu, g_v = (g.to(x.dtype) for g in state.used)
        mean = state.mean.to(x.dtype)
        gx = per_channel(g_mu / state.n, x) + per_channel(2 * g_v / state.n, x) * (
            x - per_channel(mean, x))
        return gx, None


def full_step(model: nn.Module, states: dict[int, FullStatistics], inputs: list[Tensor],
              loss_fn: Callable[[Tensor, int], Tensor],
              combine: Callable) -> tuple[list[Tensor], int]:
    """The exact full-batch step of ``model`` on the micro-batches ``inputs`` (module docstring):
    gradients of Σ_i loss_fn(model(inputs[i]), i) added to ``.grad``, one statistics update per
    layer; returns the outputs (detached) and the number of gradient rounds run."""
    layers = list(states.values())
    _pre_pass(model, layers, inputs, combine)
    reached = [s for s in layers if s.mean is not None]
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.grad for p in params]
    outputs: list[Tensor] = []
    rounds = 0
    for rounds in range(1, len(reached) + 2):
        for p in params:
            p.grad = None
        for s in reached:
            s.start_round()
        outputs = []
        for i, x in enumerate(inputs):
            out = model(x)
            loss_fn(out, i).backward()
            outputs.append(out.detach())
            if any(s.calls > i + 1 for s in reached):
                raise ValueError("accumulate(normalize='full'): a normalization layer was called "
                                 "more than once in one forward pass (a shared layer); its "
                                 "statistics per call are not defined by the full batch alone")
        if all(s.settled() for s in reached):
            break
        for s in reached:
            s.next_round()
    for p, old in zip(params, before):  # accumulate into what was there, as backward does
        if old is not None:
            p.grad = old if p.grad is None else p.grad + old
    for s in reached:
        _update(s)
    return outputs, rounds


def _pre_pass(model: nn.Module, layers: list[FullStatistics], inputs: list[Tensor],
              combine: Callable) -> None:
    with torch.no_grad():
        while True:
            for x in inputs:
                try:
                    model(x)
                except StopPass:
                    pass
            collected = [s for s in layers if s.mean is None and s.parts]
            if not collected:
                return
            for s in collected:
                s.fix(combine)


@torch.no_grad()
def _update(state: FullStatistics) -> None:
    layer = state.layer
    before = snapshot(layer) if nonfinite_guard_enabled() else None
    assert isinstance(layer, ChannelNorm) and state.mean is not None and state.var is not None
    layer.update_from_batch(state.mean, state.var, state.n, state.samples)
    if before is not None:
        restore_if_nonfinite(layer, before)

