"""Eager fused training step of ℓ1 and ℓ∞ batch normalization (``lp_bn(p=1)``, ``lp_bn(p=inf)``).

Santurkar et al. 2018 §3.3 and Hoffer et al. 2018 ("Norm matters", ℓ1 and top-k ℓ∞ batch norm). Per
channel, with c = x − μ_B over the n values of the channel, the ℓp scale s and a = γ/(s + ε):

    y = a·c + β,   s = √(π/2)·mean|c|  (p = 1)   or   s = C(n)·mean of the k largest |c|  (p = inf).

Plain autograd on these expressions keeps several full-size temporaries (c, |c|, its sign, the
gradients of each step). Here the forward pass takes μ_B and s in a few passes over x, and the
backward pass assembles the input gradient from per-channel numbers:

    ∂L/∂x_i = a·g_i − (a/n)·Σg + (∂L/∂s)·∂s/∂x_i,        ∂L/∂s = −γ·Σ(g·c)/(s + ε)²,
    p = 1:   ∂s/∂x_i = (√(π/2)/n)·(sign c_i − mean sign c),
    p = inf: ∂s/∂x_i = (C(n)/k)·(1[i ∈ top-k]·sign c_i − Σ_{j ∈ top-k} sign c_j / n),

where the −mean terms come from μ_B (∂c_j/∂x_i = δ_ij − 1/n), ``(Σg, Σg·c)`` come from one pass of
torch's BatchNorm backward kernel (:func:`~bnlab.norms.engine.kernels.centred_reductions`), and
∂L/∂γ = Σ(g·c)/(s+ε), ∂L/∂β = Σg. Subgradients where c_i = 0 follow ``torch.abs`` (sign 0), as the
plain path does.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import Tensor

from .fused import define, lazily_disabled, park, refuse_double_backward, take
from .kernels import (centred_reductions, channel_affine, coef_dtype, input_gradient, per_channel,
                      reduce_dims, stats_dtype)
from .sync import topk_first

L1_CONSTANT = math.sqrt(math.pi / 2)  # E|z| = σ·√(2/π) for Gaussian z: √(π/2)·mean|c| estimates σ


def hoffer_linf_constant(n: int) -> float:
    """C(n) = ½(1 + √(π ln 4)) / √(2 ln n), the constant Hoffer et al. give for the ℓ∞ (top-k)
    scale."""
    return 0.5 * (1 + math.sqrt(math.pi * math.log(4))) / math.sqrt(2 * math.log(n))


def centred_sign(x: Tensor, mean: Tensor) -> Tensor:
    """sign(x − μ) per channel, as x's dtype (0 where x = μ, as ``torch.abs``'s gradient; a half x
    is compared with the float32 μ exactly, the signs are exact in half)."""
    return torch.sub(x, per_channel(mean, x)).sign_().to(x.dtype)


def l1_sign_and_scale(x: Tensor, mean: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(sign(x − μ) as a full-size tensor, per-channel Σ sign, per-channel ℓ1 scale s, float64).

    Σ|c| = Σ sign(c)·c comes with Σ sign(c) from one pass of the BatchNorm backward kernel over the
    sign buffer and x (accumulated in double on CPU), so no |c| temporary is written."""
    sign = centred_sign(x, mean)
    sign_sum, abs_sum = centred_reductions(sign, x, mean)
    n = x.numel() // x.shape[1]
    dt = coef_dtype(x)
    return sign, sign_sum.to(dt), (L1_CONSTANT / n) * abs_sum.to(dt)


def linf_top_entries(x: Tensor, mean: Tensor, k: int,
                     bounds: tuple[Tensor, Tensor] | None = None
                     ) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
    """The k largest |x − μ| of each channel: values (C, k'), their indices into x, their signs (C,
    k'). ``bounds``: each row's (min, max) (rows as below), where the caller has them already.

    k' = min(k, n). Found without sorting the whole channel: each channel's top-k entries lie in the
    k rows (samples) whose largest |x − μ| is biggest (any entry outside them is beaten by the peaks
    of k other rows), and a row's largest |x − μ| is max(row max − μ, μ − row min).
    The values are the plain path's |x − μ| bit for bit; equal values are taken lowest index
    (sample, then position) first, as :func:`bnlab.norms.engine.sync.topk_first` does on every path:
    an unpicked row's peak ties a picked row's only with a higher sample index."""
    batch, channels = x.shape[:2]
    # row b·C + j: sample b, channel j (a view for contiguous x)
    rows = x.reshape(batch * channels, -1)
    inner = rows.shape[1]
    channel = torch.arange(channels, device=x.device)
    if inner == 1:  # one value per (sample, channel): the entries themselves are the candidates
        centred = rows.view(batch, channels) - mean
        values, sample = topk_first(centred.abs(), min(k, batch), dim=0)
        signs = centred.gather(0, sample).sign()
        sample = sample.t().contiguous()
        zeros = (torch.zeros_like(sample),) * (x.dim() - 2)
        # (C, k) laid out as the rows below: a sum over k then adds in the same order
        return (values.t().contiguous(), (sample, channel[:, None].expand_as(sample), *zeros),
                signs.t().contiguous())
    # two vectorized passes: on the CPU torch's aminmax along this dim is much slower than both
    low, high = (rows.amin(dim=1), rows.amax(dim=1)) if bounds is None else bounds
    peak = torch.maximum(high.view(batch, channels) - mean, mean - low.view(batch, channels))
    # (C, k_rows): the rows with the largest peaks, in sample order, so that candidate positions
    # follow the batch's order and ties below go to the lowest index
    top_rows = topk_first(peak, min(k, batch), dim=0)[1].t().sort(dim=1).values
    # (C·k_rows, inner)
    candidates = rows.index_select(0, (top_rows * channels + channel[:, None]).flatten())
    flat = candidates.view(channels, -1)
    # in place where x has μ's dtype; a half x is centred in float32, as the plain path's copy
    flat = flat.sub_(mean[:, None]) if flat.dtype == mean.dtype else flat - mean[:, None]
    values, position = topk_first(flat.abs(), min(k, batch * inner), dim=1)
    signs = flat.gather(1, position).sign()
    sample = top_rows.gather(1, torch.div(position, inner, rounding_mode="floor"))
    spatial = torch.unravel_index(position % inner, x.shape[2:]) if x.dim() > 2 else ()
    return values, (sample, channel[:, None].expand_as(sample), *spatial), signs


def _lp_forward(x: Tensor, gamma: Tensor, beta: Tensor, p: str, eps: float, topk: int,
                key: int) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel of ``bnlab::lp_normalize``: (y, μ_B, s); what backward needs goes on the parked
    state."""
    state = take(key)
    # the plain path's μ_B, the same call: the same float (float32 for half x)
    mean = x.mean(dim=reduce_dims(x), dtype=stats_dtype(x))
    n, dt = x.numel() // x.shape[1], coef_dtype(x)
    if p == "1":
        state.sign, sign_sum, scale = l1_sign_and_scale(x, mean)
        state.sign_mean = sign_sum / n
    else:
        values, state.top_index, signs = linf_top_entries(x, mean, topk)
        state.top_factor = hoffer_linf_constant(n) / values.shape[1]  # s = C(n)·(1/k')·Σ top-k
        scale = state.top_factor * values.to(dt).sum(1)
        state.top_signs = signs.to(dt)
    g64, b64, m64 = gamma.detach().to(dt), beta.detach().to(dt), mean.to(dt)
    a, xdt = g64 / (scale + eps), stats_dtype(x)
    y = channel_affine(x, a.to(xdt), (b64 - a * m64).to(xdt))
    state.p, state.eps, state.n, state.scale = p, eps, n, scale
    return y, mean, scale.to(xdt)


def _lp_backward(g: Tensor, x: Tensor, gamma: Tensor, mean: Tensor, key: int) -> list[Tensor]:
    """Kernel of ``bnlab::lp_normalize_backward``: [∂L/∂x, ∂L/∂γ, ∂L/∂β]."""
    state = take(key)
    scale = state.scale
    g_sum, g_dot_c = (t.to(scale.dtype) for t in centred_reductions(g, x, mean))
    inv, a, g_scale, const = scale_gradients(g_sum, g_dot_c, gamma.detach().to(scale.dtype),
                                             scale, state.eps, state.n)
    if state.p == "1":
        gx = _l1_input_grad(state, x, mean, g, a, g_scale, const)
    else:
        gx = _linf_input_grad(state, g, a, g_scale, const)
    return [gx, (g_dot_c * inv).to(gamma.dtype), g_sum.to(gamma.dtype)]


def scale_gradients(g_sum: Tensor, g_dot_c: Tensor, gamma: Tensor, scale: Tensor, eps: float,
                    n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The per-channel factors of the backward pass (module docstring), given Σg and Σg·c:
    (1/(s + ε), a = γ/(s + ε), ∂L/∂s = −γ·Σ(g·c)/(s + ε)², the mean's share −a·Σg/n)."""
    inv = 1.0 / (scale + eps)
    a = gamma * inv
    return inv, a, -a * inv * g_dot_c, -a * g_sum / n


def linf_terms(g_scale: Tensor, const: Tensor, factor: float, signs: Tensor,
               n: int) -> tuple[Tensor, Tensor]:
    """The ℓ∞ scale's share of ∂L/∂x (module docstring), ``factor`` = C(n)/k': the per-channel
    constant with the top-k signs' share through μ_B added, and the (C, k') values to add at the
    top-k entries, ∂L/∂s·C(n)/k'·sign c_i."""
    q = g_scale * factor
    return const - q * signs.sum(1) / n, q[:, None] * signs


define("lp_normalize(Tensor x, Tensor gamma, Tensor beta, str p, float eps, int topk, int key) "
       "-> (Tensor, Tensor, Tensor)", _lp_forward)
define("lp_normalize_backward(Tensor g, Tensor x, Tensor gamma, Tensor mean, int key) -> Tensor[]",
       _lp_backward)


class _LpNormalize(torch.autograd.Function):
    """y = γ·(x − μ_B)/(s + ε) + β with the ℓ1 or top-k ℓ∞ scale s; see the module docstring. One
    ``torch.library`` operator each way (:mod:`bnlab.norms.engine.fused` says what that does and
    does not fuse); the state the backward pass needs (sign buffer, top-k entries) stays on
    ``ctx.state``."""

    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, beta: Tensor, p: str, eps: float, topk: int):
        ctx.state = SimpleNamespace()
        y, mean, scale_out = torch.ops.bnlab.lp_normalize(x, gamma, beta, p, eps, topk,
                                                          park(ctx.state))
        ctx.save_for_backward(x, gamma, mean)
        ctx.mark_non_differentiable(mean, scale_out)
        ctx.set_materialize_grads(False)
        return y, mean, scale_out

    @staticmethod
    def backward(ctx, g: Tensor, _g_mean, _g_scale):
        refuse_double_backward("ℓp normalization")
        if g is None:
            return None, None, None, None, None, None
        x, gamma, mean = ctx.saved_tensors
        gx, g_gamma, g_beta = torch.ops.bnlab.lp_normalize_backward(g, x, gamma, mean,
                                                                    park(ctx.state))
        return (gx, g_gamma if ctx.needs_input_grad[1] else None,
                g_beta if ctx.needs_input_grad[2] else None, None, None, None)


def _l1_input_grad(state, x: Tensor, mean: Tensor, g: Tensor, a: Tensor, g_scale: Tensor,
                   const: Tensor) -> Tensor:
    """a·g + q·(sign c − mean sign c) + const, q = ∂L/∂s·√(π/2)/n, written into the sign buffer.

    The forward pass's sign buffer becomes the gradient (no new full-size tensor); a second backward
    through the same graph (retain_graph=True) recomputes it from x and μ_B."""
    sign = state.sign if state.sign is not None else centred_sign(x, mean)
    state.sign = None
    q = g_scale * (L1_CONSTANT / state.n)
    const = const - q * state.sign_mean
    xdt = stats_dtype(x)
    if xdt != x.dtype:  # half: in float32, rounded once
        return input_gradient(sign, g, q.to(xdt), const.to(xdt), a.to(xdt))
    # one broadcast each: vectorized
    sign.mul_(per_channel(q.to(x.dtype), x)).add_(per_channel(const.to(x.dtype), x))
    return sign.addcmul_(g, per_channel(a.to(x.dtype), g))


def _linf_input_grad(state, g: Tensor, a: Tensor, g_scale: Tensor, const: Tensor) -> Tensor:
    """a·g + const everywhere, plus ∂L/∂s·C(n)/k·sign c_i at each channel's top-k entries."""
    const, top = linf_terms(g_scale, const, state.top_factor, state.top_signs, state.n)
    xdt = stats_dtype(g)  # half g: in float32, rounded once
    gx = channel_affine(g.to(xdt), a.to(xdt), const.to(xdt))
    return gx.index_put_(state.top_index, top.to(xdt), accumulate=True).to(g.dtype)


@lazily_disabled
def lp_normalize(x: Tensor, p: str, gamma: Tensor, beta: Tensor, eps: float,
                 topk: int) -> tuple[Tensor, Tensor, Tensor]:
    """(y, μ_B, s) of ℓ1 (p="1") or top-k ℓ∞ (p="inf") batch normalization, eagerly and never traced
    (like :func:`bnlab.norms.engine.fused.fused_normalize`: dynamo would inline forward and drop
    backward)."""
    return _LpNormalize.apply(x, gamma, beta, p, eps, topk)
