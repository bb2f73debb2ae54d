"""The training step of top-k ℓ∞ batch normalization (``lp_bn(p=inf)``) as torch.compile sees it.

Santurkar et al. 2018 §3.3 and Hoffer et al. 2018 ("Norm matters"): per channel, with c = x − μ_B
over its n values, s = C(n)·mean of the k largest |c| and a = γ/(s + ε), y = a·c + β.

Under ``torch.compile`` the layers take plain ops, which inductor fuses. For ℓ∞ that leaves two
costs (read from inductor's generated code), which made compiled ℓ∞ slower than native eager
BatchNorm:

* autograd's backward of the top-k search gathers k values from x, so it scatters their gradient
  into a new full-size zero tensor, which the input gradient then reads: a full-size write and read
  that carry k·C non-zero numbers;
* μ_B (a reduction per channel) and each row's min and max (a reduction per sample and channel,
  which the search needs) were two passes over x.

:class:`LinfNormalize` is the same function with its gradient written out (the formulas of
:mod:`.lp_fused`): ``∂L/∂x = a·g + const`` densely, one pass over g, plus the top-k entries'
``∂L/∂s·C(n)/k·sign c_i`` added in place at their k·C indices; μ_B is taken from the row sums,
which inductor reduces in the same loop as the rows' min and max. Plain ops only, so dynamo traces
forward and backward and inductor compiles both (``fullgraph=True`` holds). Measured by
``benchmarks/norms.py --modes compiled`` (benchmarks/results/norms_2threads*.json). Eager layers
keep the fused operators of :mod:`.lp_fused`; the top-k entries (ties to the lowest index) are
:func:`.lp_fused.linf_top_entries`' on every path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import per_channel, reduce_dims
from .lp_fused import hoffer_linf_constant, linf_terms, linf_top_entries, scale_gradients


class LinfNormalize(torch.autograd.Function):
    """(y, μ_B, s) of top-k ℓ∞ batch normalization in x's dtype (float32 or float64), from plain
    ops with a hand-written backward (module docstring); μ_B and s are not differentiable outputs
    (the layer's running statistics read them)."""

    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, beta: Tensor, eps: float, k: int):
        batch, channels = x.shape[:2]
        n = x.numel() // channels
        rows = x.reshape(batch * channels, -1)  # row b·C + j: sample b, channel j
        bounds = rows.amin(dim=1), rows.amax(dim=1)
        mean = rows.sum(dim=1).view(batch, channels).sum(dim=0) / n
        values, index, signs = linf_top_entries(x, mean, k, bounds)
        factor = hoffer_linf_constant(n) / values.shape[1]  # s = C(n)·(1/k')·Σ top-k
        scale = factor * values.sum(dim=1)
        gamma, beta = gamma.to(x.dtype), beta.to(x.dtype)
        a = gamma / (scale + eps)
        y = (x - per_channel(mean, x)) * per_channel(a, x) + per_channel(beta, x)
        ctx.save_for_backward(x, gamma, mean, scale, signs, *index)
        ctx.eps, ctx.n, ctx.factor = eps, n, factor
        ctx.mark_non_differentiable(mean, scale)
        ctx.set_materialize_grads(False)
        return y, mean, scale

    @staticmethod
    def backward(ctx, g: Tensor | None, _g_mean, _g_scale):
        if g is None:
            return None, None, None, None, None
        x, gamma, mean, scale, signs, *index = ctx.saved_tensors
        dims = reduce_dims(x)
        g_sum = g.sum(dim=dims)
        g_dot_c = (g * (x - per_channel(mean, x))).sum(dim=dims)
        inv, a, g_scale, const = scale_gradients(g_sum, g_dot_c, gamma, scale, ctx.eps, ctx.n)
        const, top = linf_terms(g_scale, const, ctx.factor, signs, ctx.n)
        gx = g * per_channel(a, g) + per_channel(const, g)
        gx = gx.index_put(tuple(index), top, accumulate=True)
        return gx, g_dot_c * inv, g_sum, None, None


def linf_normalize(x: Tensor, gamma: Tensor, beta: Tensor, eps: float,
                   k: int) -> tuple[Tensor, Tensor, Tensor]:
    """(y, μ_B, s) through :class:`LinfNormalize` (float32/float64 x; γ and β cast to its dtype,
    their gradients returned in theirs)."""
    return LinfNormalize.apply(x, gamma, beta, eps, k)
