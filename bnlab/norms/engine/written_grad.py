"""The statistics of a compiled training step, written so that its traced backward is factored.

A compiled training step (:mod:`bnlab.norms.engine.compiled_step`) is traced from the layer's plain
autograd ops, ``μ_B = mean x``, ``σ²_B = mean (x − μ_B)²``, ``(a, b) = coefficients(μ_B, σ²_B, …)``,
``y = a·(x − μ_B) + (b + a·μ_B)``. Autograd's backward of those ops is correct but not factored:
read from inductor's code for ``cbn`` on (1000, 10), its backward made seven passes over full-size
tensors, two of them reductions of full-size temporaries that are per-channel numbers in closed
form: ``Σ(g·a)`` (the output's dependence on μ_B through x − μ_B, which the shift's ``+ a·μ_B``
cancels exactly) and ``Σ 2(x − μ_B)·∂L/∂σ²/n`` (the variance's dependence on μ_B, which is
``Σ(x − μ_B) = 0``). The fused path's algebra (:mod:`bnlab.norms.engine.fused`) has neither:

    ∂L/∂x = a·g + ∂L/∂μ_B/n + (2/n)·∂L/∂σ²_B·(x − μ_B).

While a step is traced (:func:`traced_step`), the plain path takes μ_B *detached* wherever its
gradient is analytically zero — inside the variance's square (:func:`moments`) and in the affine
map's ``x − μ_B`` and ``b + a·μ_B`` (:func:`.step.plain_normalize`) — so autograd's backward is
that formula: ``Σg`` and ``Σg·(x − μ_B)`` in one reduction pass, the variant's per-channel chain on
C numbers, and ``∂L/∂x`` in one pointwise pass (autograd's own backward of the plain ops would
reduce two more full-size temporaries).
Values are the plain path's; gradients equal it up to rounding (they drop a computed Σ(x − μ_B),
as the fused path does). Plain ops only, so ``torch.func`` and functionalization trace them.
Outside a trace the plain path keeps μ_B attached: it is what ``plain_autograd`` differentiates
twice.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import Tensor

from .kernels import per_channel, reduce_dims
from .switches import THREAD, tracing


@contextmanager
def traced_step() -> Iterator[None]:
    """The block traces a compiled step (this thread): the layers' own forward runs (no nested
    compiled step) and their plain path detaches μ_B where its gradient is zero."""
    previous = tracing()
    THREAD.tracing = True
    try:
        yield
    finally:
        THREAD.tracing = previous


def moments(x: Tensor) -> tuple[Tensor, Tensor, int]:
    """(μ_B, σ²_B, n) of float32/float64 x, σ²_B with μ_B detached inside the square (module
    docstring): its gradient is (2/n)·(x − μ_B), without the zero Σ(x − μ_B) term."""
    dims = reduce_dims(x)
    mean = x.mean(dim=dims)
    var = (x - per_channel(mean.detach(), x)).pow(2).mean(dim=dims)
    return mean, var, x.numel() // x.shape[1]
