"""One training step of a layer with batch statistics: the statistics, the per-channel affine map
and the buffer writes.

A variant says what its step is as a function ``coef_fn(μ_B, σ²_B, *tensors) -> (scale, shift)``
on C numbers; :func:`normalize_with_batch_stats` applies it to x,

    y = scale·(x − μ_B) + (shift + scale·μ_B)      (= scale·x + shift, per channel)

and returns the batch's statistics for the buffer update. The centred form keeps a large
activation mean out of the full-size arithmetic and out of autograd: x − μ_B is small where x is
not, so neither y nor the input gradient loses the digits that scale·x + shift would.

Two routes compute the same map (:func:`.route.takes_fused` picks one):

* **fused** (:func:`.fused.fused_normalize`): eager, large enough inputs. Statistics, coefficients
  and their gradients run inside one autograd function, about four dispatched operations a step
  instead of forty to a hundred; the coefficient graph is differentiated on C numbers.
* **plain** (:func:`plain_normalize`): ordinary autograd ops, for whatever the fused function
  cannot serve: ``torch.compile`` (inductor fuses the plain ops itself), ``torch.func``
  transforms, synced statistics (autograd through the collectives), small CPU inputs (the fused
  function's fixed cost is larger than what it saves), ``accumulate(normalize="full")`` and
  ``plain_autograd()`` (double backward).

The statistics come from the layer's ``batch_moments`` method on both routes, never from this
module's :func:`batch_moments` directly: the method is the overridable hook (synchronized
statistics across processes), and this function is only its default.

Numerics: statistics are two-pass or Welford, accumulated in float32 or better whatever x's dtype;
the coefficients run in :func:`.kernels.coef_dtype`; y has x's dtype, autocast off. Where torch's
CPU kernel would keep half-precision statistics (:func:`saves_half_statistics`) the coefficients
see those and the buffers the exact ones, as torch's kernel does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import route, written_grad
from .fused import CoefFn, UpdateFn, fused_normalize
from .guard import statistics_as_with_grad
from .kernels import (
    autocast_off, batch_statistics, coef_dtype, per_channel, saved_statistics, stats_dtype,
)
from .switches import full_statistics, module_group, tracing
from .sync import batch_samples, synced_moments


def batch_moments(layer: Any, x: Tensor) -> tuple[Tensor, Tensor, int]:
    """Per-channel mean, biased variance and count of x over the batch and all trailing dims: the
    default of ``ChannelNorm.batch_moments``.

    Results are in :func:`.kernels.stats_dtype` (float32 or better), two-pass or Welford, so a mean
    of 1e4 costs no variance digits. Differentiable when grad is on; without grad (inside the fused
    function) torch's two-pass statistics kernel runs instead. Synced layers in a process group:
    the statistics over all ranks (:func:`.sync.synced_moments`).
    """
    if (group := module_group(layer)) is not None:  # training with sync=True in a process group
        return synced_moments(x, group, stats_dtype(x))
    n = x.numel() // x.shape[1]
    plain = (torch.is_grad_enabled() or x.device.type not in ("cpu", "cuda")
             or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active())
    if not plain:  # one call, double accumulation; eager and no-grad only
        return (*batch_statistics(x), n)
    dims = layer.reduce_dims(x)
    if torch.compiler.is_compiling() and x.device.type == "cpu":
        # inductor's one Welford reduction (as stable to a large mean as two passes): one read
        # of x instead of two (benchmarks/norms.py --modes compiled). Not on CUDA: with torch
        # 2.11 Triton fails to compile cbn(decouple=false)'s var_mean kernel there.
        var, mean = torch.var_mean(x.to(stats_dtype(x)), dim=dims, correction=0)
        return mean, var, n
    # eager: two passes, and a graph whose Σ(x − μ) term var_only_bn's gradient at large means
    # needs
    mean = x.mean(dim=dims, dtype=stats_dtype(x))
    var = (x - per_channel(mean, x)).pow(2).mean(dim=dims)
    return mean, var, n


def saves_half_statistics(layer: Any, x: Tensor) -> bool:
    """Whether torch's CPU kernel would keep this step's statistics in half precision: a half
    input into a layer whose parameters and buffers are that dtype too (or that has none).
    With float32 state (autocast) they stay float32, and torch's CUDA kernels keep float32
    statistics for every half input (:func:`.kernels.saved_statistics`)."""
    if (x.dtype not in route.HALF_DTYPES or x.device.type != "cpu" or full_statistics(layer)
            or module_group(layer) is not None):  # synced: global statistics, kept in float32
        return False
    state = next((t for t in (layer.weight, layer.bias, layer.running_mean, layer.running_var)
                  if t is not None), None)
    return state is None or state.dtype == x.dtype


def step_samples(layer: Any, x: Tensor) -> int:
    """The samples of the batch this step normalizes over: x's (over all ranks when synced),
    or the full batch's inside ``accumulate(normalize="full")``."""
    if (full := full_statistics(layer)) is not None:
        return full.samples
    return x.shape[0] if module_group(layer) is None else batch_samples(layer, x)


def plain_moments(layer: Any, x: Tensor) -> tuple[Tensor, Tensor, int]:
    """The layer's ``batch_moments`` for the plain route. Without grad they come from torch's
    statistics kernel, which rounds differently from the two passes taken with grad; in the
    first pass of a reentrant checkpoint (no grad) the two passes run, so that the
    recomputation (grad on) reproduces the step bit for bit (:mod:`.guard`)."""
    if (full := full_statistics(layer)) is not None:  # bnlab.norms.tools.accumulate_full
        return full(x)
    if torch.is_grad_enabled() or not statistics_as_with_grad():
        return layer.batch_moments(x)
    with torch.enable_grad():
        mean, var, n = layer.batch_moments(x)
    return mean.detach(), var.detach(), n


def normalize_with_batch_stats(layer: Any, x: Tensor, coef_fn: CoefFn, *tensors: Tensor,
                               update: UpdateFn | None = None
                               ) -> tuple[Tensor, Tensor, Tensor, int]:
    """Apply the per-channel affine map ``coef_fn(μ_B, σ²_B, *tensors) -> (scale, shift)`` to x.

    Returns ``(y, μ_B, σ²_B, n)`` (statistics detached, for running-statistics updates).
    Gradients flow through μ_B, σ²_B and ``tensors`` exactly as autograd on the plain expression
    would give. ``y`` has x's dtype; everything per-channel is computed in float32 or better,
    autocast off. ``update(μ_B, σ²_B, n)``, if given, updates the layer's buffers without grad,
    after the coefficients were taken (inside the fused operator: no extra dispatched
    operations).
    """
    with autocast_off(x):
        if route.takes_fused(layer, x):
            if not layer.saves_half_statistics(x):
                y, mean, var = fused_normalize(x, layer.batch_moments, coef_fn, *tensors,
                                               update=update)
                return y, mean, var, x.numel() // x.shape[1]
            # the coefficients see torch's half statistics, the buffers the exact ones
            exact: list[Tensor] = []

            def moments(xs: Tensor) -> tuple[Tensor, Tensor, int]:
                mean, var, n = layer.batch_moments(xs)
                exact[:] = [mean, var]
                return (*saved_statistics(x, mean, var, layer.eps), n)

            def exact_update(_mean: Tensor, _var: Tensor, n: int) -> None:
                if update is not None:
                    update(exact[0], exact[1], n)
            y, _, _ = fused_normalize(x, moments, coef_fn, *tensors, update=exact_update)
            return y, exact[0], exact[1], x.numel() // x.shape[1]
        y, mean, var, n = plain_normalize(layer, x, coef_fn, *tensors)
    if update is not None:
        # read by write_buffer (dynamo traces neither torch.is_inference_mode_enabled nor
        # Tensor.is_inference, so the grad mode of the call is the test)
        layer._step_has_backward = torch.is_grad_enabled()
        with torch.no_grad():
            update(mean, var, n)
    return y, mean, var, n


def plain_normalize(layer: Any, x: Tensor, coef_fn: CoefFn,
                    *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """:func:`normalize_with_batch_stats` from plain autograd ops (compile, half inputs, sync,
    vmap)."""
    # half inputs: one float32 copy feeds μ_B, σ²_B and the centred x, so their three
    # input-gradient paths add up in float32 and round to half once (as torch's kernel)
    xs = x.to(stats_dtype(x))
    if tracing() and xs is x and module_group(layer) is None:
        # a compiled step's trace: μ_B detached where its gradient is zero (.written_grad)
        mean, var, n = written_grad.moments(x)
        anchor = mean.detach()
    else:
        mean, var, n = layer.plain_moments(xs)
        anchor = mean
    exact = mean.detach(), var.detach()
    if layer.saves_half_statistics(x):
        mean, var = saved_statistics(x, mean, var, layer.eps)
        anchor = mean
    dt = coef_dtype(x)
    scale, shift = coef_fn(mean.to(dt), var.to(dt), *tensors)
    # y = scale·(x − μ) + (shift + scale·μ): the centred form keeps a large mean out of autograd
    centred = xs - per_channel(anchor, xs)
    y = torch.addcmul(per_channel((shift + scale * anchor).to(centred.dtype), x), centred,
                      per_channel(scale.to(centred.dtype), x))
    return y.to(x.dtype), *exact, n


@torch.no_grad()
def write_buffer(layer: Any, name: str, value: Tensor) -> None:
    """Set a buffer that this step's differentiable graph READ (moving statistics, step
    counters).

    Eager: in place. Under torch.compile the buffer is rebound to a new tensor instead:
    AOTAutograd may recompute forward values in backward from the buffer, and after an in-place
    update it reads the new value (wrong gradients, measured with torch 2.13 on mbn: 1e-3 off;
    cbn, brn likewise). Buffers only read outside the graph (BN's running statistics) are
    updated in place. So are all where the step has no backward (grad off when the layer was
    called, :func:`normalize_with_batch_stats`): under ``torch.inference_mode`` a rebound
    buffer would be an inference tensor that no later training step could save.
    """
    old = getattr(layer, name)
    value = value.detach().to(old.dtype)
    if torch.compiler.is_compiling() and getattr(layer, "_step_has_backward", True):
        setattr(layer, name, value)
    else:
        old.copy_(value)
