"""Full-size kernels and dtype rules shared by the layers' fused and plain paths.

The passes over an (N, C, *) tensor that every per-channel layer makes — per-channel views, the
two reductions of BatchNorm's backward, ``scale·x + shift``, the input gradient ``s·x + const +
scale·g`` — on torch's own vectorized kernels, and which dtype statistics (float32 or better) and
per-channel coefficients (float64) are computed in. Half inputs (float16/bfloat16, as autocast hands
them on) are computed in float32 and rounded to half once, as torch's BatchNorm kernels do.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor


def reduce_dims(x: Tensor) -> list[int]:
    """The dims a per-channel statistic of x (N, C, *) reduces over: all but 1."""
    return [0, *range(2, x.dim())]


def per_channel(t: Tensor, x: Tensor) -> Tensor:
    """View a (C,) tensor so that it broadcasts against x of shape (N, C, *)."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


# (value, C, dtype, device) -> a (C,) tensor of value that no kernel writes to
_FILLED: dict[tuple, Tensor] = {}


def filled(like: Tensor, value: float) -> Tensor:
    """A cached (C,) tensor of ``value`` shaped like ``like``, for the kernels' constant arguments:
    on a GPU each fresh ``ones_like``/``zeros_like`` is a kernel launch (up to 5 a step). Read-only
    by contract: BatchNorm's inference kernel and its backward never write their weight, mean or
    variance arguments. Built outside inference mode, so later autograd steps may use it."""
    key = (value, like.shape[0], like.dtype, like.device)
    if (t := _FILLED.get(key)) is None:
        with torch.inference_mode(False):
            t = _FILLED[key] = torch.full((like.shape[0],), value, dtype=like.dtype,
                                          device=like.device)
    return t


def centred_reductions(g: Tensor, x: Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (Σ g, Σ g·(x − mean)) in one pass over g and x, accumulated in double on CPU.

    torch's BatchNorm backward kernel computes exactly these two reductions for its weight and bias
    gradients; with invstd = 1 its "x̂" is x − mean. Elsewhere: a centred temporary and two
    reductions.
    """
    if x.device.type in ("cpu", "cuda"):
        one = filled(mean, 1.0)  # invstd = 1, and weight = 1: CUDA's kernel refuses weight=None
        _, dot, total = torch.ops.aten.native_batch_norm_backward(
            g, x, one, None, None, mean, one, True, 0.0, [False, True, True])
        return total, dot
    dims = reduce_dims(x)
    return g.sum(dims, dtype=mean.dtype), (g * (x - per_channel(mean, x))).sum(dims)


def stats_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision inputs (no overflow of Σx², no 8-bit mantissa sums), else x's
    dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def batch_statistics(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (mean, biased variance) of x in :func:`stats_dtype` from torch's statistics
    kernel, without grad. For half x the kernel accumulates in float and returns float32 where it
    is handed float32 running buffers (CPU; CUDA always does): two scratch buffers, which
    momentum 0 leaves as they were, serve as those (an allocation each, no kernel)."""
    if x.dtype == stats_dtype(x):
        return torch.batch_norm_update_stats(x, None, None, 0.0)
    scratch = torch.empty((2, x.shape[1]), dtype=stats_dtype(x), device=x.device)
    return torch.batch_norm_update_stats(x, scratch[0], scratch[1], 0.0)


def saved_statistics(x: Tensor, mean: Tensor, var: Tensor,
                     eps: float) -> tuple[Tensor, Tensor]:
    """(μ_B, σ²_B) as torch's CPU BatchNorm kernel keeps them for a layer entirely in
    float16/bfloat16: its saved mean and invstd have the parameters' dtype, and the output and
    gradients are computed in float32 from those rounded values. They are taken from torch's own
    kernel (one statistics pass over the half x, no grad), so the rounding is torch's, and
    returned as forward values μ_h and σ²_h = invstd_h⁻² − ε (float64, so that 1/√(σ²_h + ε) is
    invstd_h again) with the gradients of torch's backward, which centres x at μ_h
    (∂σ²/∂x = 2(x − μ_h)/n: the last term below). A variant's coefficients take them as they take
    the exact (μ_B, σ²_B), so its BN limit is torch's half BatchNorm."""
    with torch.no_grad():
        _, saved_mean, saved_invstd = torch.native_batch_norm(x.detach(), None, None, None, None,
                                                              True, 0.0, eps)
    mean_h = saved_mean.to(mean.dtype)
    exact = var.detach().double()
    var_h = saved_invstd.double().pow(-2) - eps
    offset = (mean.detach() - mean_h).double()
    var_out = var.double() + (var_h - exact) + 2 * offset * (mean - mean.detach()).double()
    return mean + (mean_h - mean.detach()), var_out


def coef_dtype(x: Tensor) -> torch.dtype:
    """The per-channel coefficient graph runs in float64 (C numbers), except where float64 is
    missing."""
    return torch.float32 if x.device.type == "mps" else torch.float64


# Devices whose affine pass is torch's inference BatchNorm kernel (a vectorized loop there);
# elsewhere addcmul. The tests empty it to run the other devices' formulas on the CPU.
BATCH_NORM_AFFINE_DEVICES = ("cpu",)


def channel_affine(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """scale·x + shift per channel (scale, shift: (C,) in :func:`stats_dtype`), into a new tensor
    of x's dtype (half x: computed in float32, rounded once).

    On CPU through torch's inference BatchNorm kernel with zero mean, unit variance and ε = 0 (its
    per-channel factor is then scale·1/√1 = scale and its offset shift, exactly): a vectorized loop,
    where ``addcmul`` with two broadcast operands takes a scalar one (``benchmarks/norms.py``
    times the fused path that runs it)."""
    if x.device.type in BATCH_NORM_AFFINE_DEVICES:
        return torch.batch_norm(x, scale, shift, filled(scale, 0.0), filled(scale, 1.0), False, 0.0,
                                0.0, False)
    # a half x with float32 factors computes in float32 (type promotion): rounded to x's dtype once
    return torch.addcmul(per_channel(shift, x), x, per_channel(scale, x)).to(x.dtype)


def input_gradient(x: Tensor, g: Tensor, s: Tensor, const: Tensor, scale: Tensor) -> Tensor:
    """∂L/∂x = s·x + const + scale·g per channel, in x's dtype (s, const, scale: (C,) in
    :func:`stats_dtype`). For half x and g everything is computed in float32 and rounded once, as
    torch's BatchNorm backward kernel and the plain path (whose float32 copy of x gathers the
    gradient) do: an affine pass in half and an in-place add in half would round twice."""
    if x.dtype == s.dtype:
        return channel_affine(x, s, const).addcmul_(g, per_channel(scale, x))
    if x.device.type in BATCH_NORM_AFFINE_DEVICES:  # torch's kernel: float32 in, float32 out
        gx = channel_affine(x.to(s.dtype), s, const)
    else:  # addcmul promotes half x to float32
        gx = torch.addcmul(per_channel(const, x), x, per_channel(s, x))
    return gx.addcmul_(g, per_channel(scale, x)).to(x.dtype)


def autocast_off(x: Tensor):
    """Autocast off on x's device (the layers compute in x's dtype or better, as nn.BatchNorm), or
    nothing where the device has no autocast (meta tensors: shape inference)."""
    if torch.amp.is_autocast_available(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()
