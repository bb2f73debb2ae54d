"""The normalization of a compiled training step, written so that its traced backward is factored.

A compiled training step (:mod:`bnlab.norms.compiled_step`) is traced from the layer's plain
autograd ops, ``μ_B = mean x``, ``σ²_B = mean (x − μ_B)²``, ``(a, b) = coefficients(μ_B, σ²_B, …)``,
``y = a·(x − μ_B) + (b + a·μ_B)``. Autograd's backward of those ops is correct but not factored:
read from inductor's code for ``cbn`` on (1000, 10), its backward made seven passes over full-size
tensors, two of them reductions of full-size temporaries that are per-channel numbers in closed
form: ``Σ(g·a)`` (the output's dependence on μ_B through x − μ_B, which the shift's ``+ a·μ_B``
cancels exactly) and ``Σ 2(x − μ_B)·∂L/∂σ²/n`` (the variance's dependence on μ_B, which is
``Σ(x − μ_B) = 0``). The fused path's algebra (:mod:`bnlab.norms.fused`) has neither:

    ∂L/∂x = a·g + ∂L/∂μ_B/n + (2/n)·∂L/∂σ²_B·(x − μ_B).

Here the same ops take μ_B *detached* wherever its gradient is analytically zero — inside the
variance's square and in the affine map's ``x − μ_B`` and ``b + a·μ_B`` — so autograd's backward is
that formula: ``Σg`` and ``Σg·(x − μ_B)`` in one reduction pass, the variant's per-channel chain on
C numbers, and ``∂L/∂x`` in one pointwise pass (cbn on (1000, 10): 28.6 → 14.0 µs a backward call).
Values are the plain path's; gradients equal it up to rounding (they drop a computed Σ(x − μ_B),
as the fused path does). Plain ops only, so ``torch.func`` and functionalization trace them.
Only the compiled step's trace uses it (:func:`written_gradients`): the plain path stays what
``plain_autograd`` differentiates twice.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor

from .fused import per_channel, reduce_dims

_STATE = threading.local()


def requested() -> bool:
    """Whether this thread traces a compiled step (:func:`written_gradients`)."""
    return getattr(_STATE, "on", False)


@contextmanager
def written_gradients() -> Iterator[None]:
    """Within the block (this thread), the layers' plain path normalizes through
    :func:`normalize` (the compiled step's trace)."""
    previous = requested()
    _STATE.on = True
    try:
        yield
    finally:
        _STATE.on = previous


def normalize(x: Tensor, coef_fn: Callable[..., tuple[Tensor, Tensor]], coef_dtype: torch.dtype,
              *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(y, μ_B, σ²_B) of ``y = a·x + b``, ``(a, b) = coef_fn(μ_B, σ²_B, *tensors)`` taken in
    ``coef_dtype``, for float32/float64 x (statistics in x's dtype, not detached)."""
    dims = reduce_dims(x)
    mean = x.mean(dim=dims)
    fixed = per_channel(mean.detach(), x)  # μ_B where its gradient is zero (module docstring)
    var = (x - fixed).pow(2).mean(dim=dims)
    a, b = coef_fn(mean.to(coef_dtype), var.to(coef_dtype), *tensors)
    shift = b + a * mean.detach().to(coef_dtype)  # the output at the mean, as the plain path's
    y = torch.addcmul(per_channel(shift.to(x.dtype), x), x - fixed, per_channel(a.to(x.dtype), x))
    return y, mean, var
