"""The eager fused training path of the per-channel layers: few dispatched operations per call.

One training step of a layer ``y = a(μ_B, σ²_B)·x + b(μ_B, σ²_B)``
(:mod:`bnlab.norms.engine.step`) is two operators registered with ``torch.library`` (namespace
``bnlab``), one each way:

* ``bnlab::stats_affine(x, tensors, key) -> (y, μ_B, σ²_B)``: the batch statistics (torch's two-pass
  kernel), the variant's per-channel coefficients (its ``coefficients`` function, run with autograd
  on C numbers in float64 and kept for the backward pass), the full-size affine pass and the layer's
  running-buffer updates;
* ``bnlab::stats_affine_backward(g, x, key) -> [∂L/∂x, ∂L/∂tensors...]``: the two per-channel
  reductions (torch's BatchNorm backward kernel), the coefficient gradient (autograd on C numbers)
  and the full-size input gradient, ``∂L/∂x = scale·g + (2/n)·g_v·(x − μ) + g_μ/n``.

What this buys, honestly: the dispatcher (profilers, ``TorchDispatchMode``\\ s, autocast) sees one
operation each way instead of 25–60, and the Python-level autograd bookkeeping is one
``autograd.Function`` node. Inside each operator the per-channel coefficient math runs either as
ordinary eager ops on C-element tensors (about 10–25 each way, microseconds each on a CPU, but each
a kernel launch on a GPU), or, where :func:`.switches.coefficients_compiled` says so (CUDA by
default; ``BNLAB_COMPILE_COEFFICIENTS``), as one compiled function each way (:mod:`.coef_compile`):
the coefficients with their per-channel partials forward, the gradients' per-channel algebra
backward. The full-size passes are single kernels: statistics (1), affine (1) forward; reductions
(1), input gradient (2) backward.
Measured by ``benchmarks/coef_compile.py`` (on the CPU the compiled path is no faster: its calls'
guards cost more than the micro-ops they replace; not yet measured on a GPU).

The Python callables (statistics, coefficients, buffer update) cannot be operator arguments: each
call parks them in a table under an integer ``key`` that the operator pops. Eager only: under
``torch.compile`` the layers take plain ops, which inductor fuses into full-size loops.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable

import torch
from torch import Tensor

from .coef_compile import assemble, backward_coefficients, forward_coefficients
from .switches import coefficients_compiled
from .kernels import (centred_reductions, channel_affine, coef_dtype, filled, input_gradient,
                      stats_dtype)

CoefFn = Callable[..., tuple[Tensor, Tensor]]
MomentsFn = Callable[[Tensor], tuple[Tensor, Tensor, int]]
UpdateFn = Callable[[Tensor, Tensor, int], None]


def refuse_double_backward(what: str) -> None:
    """The fused functions' backward is not itself differentiable: say so, and how to get a graph
    that is."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"bnlab's fused {what} does not support double backward "
                           "(create_graph=True); run the forward pass inside `with "
                           "bnlab.norms.plain_autograd():`")


def lazily_disabled(fn: Callable) -> Callable:
    """``torch.compiler.disable(fn)``, built on the first call: applying it at import time imports
    ``torch._dynamo`` (most of ``import bnlab.norms``'s time), which eager users never need."""
    disabled: list[Callable] = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        # eager: straight in (the disable wrapper adds Python frames to every call)
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return call


# ---- the operators -------------------------------------------------------------------------------
_ENGINE = torch.autograd.Variable._execution_engine
_CALLS: dict[int, object] = {}  # key -> the Python side of one pending operator call
_KEYS = itertools.count()


class _Call:
    """The Python side of one fused call: callables in, the per-channel graph out (kept for
    backward)."""

    __slots__ = ("moments_fn", "coef_fn", "update_fn", "needs", "differentiable", "graph", "n")

    def __init__(self, moments_fn: MomentsFn, coef_fn: CoefFn, update_fn: UpdateFn | None,
                 needs, differentiable: bool = True) -> None:
        self.moments_fn, self.coef_fn = moments_fn, coef_fn
        self.update_fn, self.needs = update_fn, needs
        # False: no backward can follow (no_grad, inference_mode, nothing requires grad)
        self.differentiable = differentiable
        self.graph: tuple | None = None
        self.n = 0

    def park(self) -> int:
        return park(self)


def park(obj) -> int:
    """Hand a Python object to an operator kernel: the returned key is the operator's int
    argument."""
    key = next(_KEYS)
    _CALLS[key] = obj
    return key


def take(key: int):
    """The object :func:`park` stored under ``key`` (removed from the table)."""
    return _CALLS.pop(key)


def autograd_inside():
    """Autograd on inside an operator's kernel: a dispatch mode (a profiler, an op counter) runs the
    kernel with autograd's dispatch keys excluded, and the per-channel graph needs them."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in ("AutogradFunctionality", "AutogradOther", "ADInplaceOrView"):
        exclude = exclude.remove(getattr(torch._C.DispatchKey, key))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


class _Partials:
    """Kept for backward in place of the coefficient graph: the compiled per-channel partials P."""

    __slots__ = ("p",)

    def __init__(self, p: Tensor) -> None:
        self.p = p


def _coefficients(call: _Call, x: Tensor, mean: Tensor, var: Tensor,
                  tensors) -> tuple[Tensor, Tensor]:
    """(scale, shift) in :func:`stats_dtype` (x's dtype, float32 for half x); keeps on
    ``call.graph`` what the backward pass needs: the compiled per-channel partials
    (:mod:`.coef_compile`) where allowed, else the eager autograd graph."""
    leaves = [t.detach() for t in tensors]
    dt, xdt = coef_dtype(x), stats_dtype(x)
    if not call.differentiable:  # no graph: under inference_mode one could not even be recorded
        with torch.no_grad():
            scale, shift = call.coef_fn(mean.detach().to(dt), var.detach().to(dt), *leaves)
        return scale.to(xdt), shift.to(xdt)
    out = (forward_coefficients(call.coef_fn, tuple(call.needs), dt, xdt, mean, var, leaves)
           if coefficients_compiled(mean.device) else None)
    if out is not None:
        scale_x, shift_x, m_x, m, p = out
        dtypes = tuple(t.dtype for t, need in zip(leaves, call.needs) if need)
        call.graph = (m, m_x, dtypes, scale_x, _Partials(p))
        return scale_x, shift_x
    with torch.enable_grad():
        m = mean.detach().to(dt).requires_grad_()
        v = var.detach().to(dt).requires_grad_()
        leaves = [t.requires_grad_(need) for t, need in zip(leaves, call.needs)]
        scale, shift = call.coef_fn(m, v, *leaves)
    call.graph = (m, v, leaves, scale, shift)
    return scale.detach().to(xdt), shift.detach().to(xdt)


def _stats_affine(x: Tensor, tensors: list[Tensor], key: int) -> tuple[Tensor, Tensor, Tensor]:
    call = take(key)
    with autograd_inside():  # (autocast is off inside an operator kernel)
        mean, var, n = call.moments_fn(x)
        scale, shift = _coefficients(call, x, mean, var, tensors)
        call.n = n
        y = channel_affine(x, scale, shift)
        if call.update_fn is not None:
            with torch.no_grad():
                call.update_fn(mean, var, n)
    return y, mean, var


def _stats_affine_backward(g: Tensor, x: Tensor, key: int) -> list[Tensor]:
    call = take(key)
    with autograd_inside():
        if isinstance(call.graph[4], _Partials):  # compiled coefficients: P kept, no graph
            m, m_x, dtypes, scale_x, partials = call.graph
            g_sum, g_dot_centred = centred_reductions(g, x, m_x)
            args = (partials.p, m, m_x, g_sum, g_dot_centred, call.n, dtypes)
            s, const, *rest = backward_coefficients(*args) or assemble(*args)
        else:
            scale_x, s, const, rest = _eager_backward(call, g, x)
        gx = input_gradient(x, g, s, const, scale_x)
    return [gx, *rest]


def _eager_backward(call: _Call, g: Tensor,
                    x: Tensor) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """(scale, s, const, tensors' gradients) from the eager coefficient graph; the first three in
    :func:`stats_dtype`. What :func:`.coef_compile.assemble` computes from the compiled partials
    instead."""
    assert call.graph is not None, "the eager coefficient graph is kept when nothing was compiled"
    m, v, leaves, scale, shift = call.graph
    xdt = stats_dtype(x)
    m_x = m.detach().to(xdt)  # the mean as the kernels take it: every use below takes this value
    g_sum, g_dot_centred = centred_reductions(g, x, m_x)
    g_sum = g_sum.to(m.dtype)
    g_dot = g_dot_centred.to(m.dtype) + m_x.to(m.dtype) * g_sum  # Σ g·x exactly: no cancellation
    inputs = [m, v] + [t for t in leaves if t.requires_grad]
    # a coefficient that is a frozen parameter itself (mean_only_bn's scale γ, var_only_bn's shift
    # β) has no graph: the engine refuses it as an output, and it contributes no gradient
    pairs = [(out, grad) for out, grad in ((scale, g_dot), (shift, g_sum)) if out.requires_grad]
    with torch.enable_grad():  # the engine directly: torch.autograd.grad's checks cost more
        raw = (_ENGINE.run_backward(tuple(o for o, _ in pairs), tuple(g for _, g in pairs), True,
                                    False, tuple(inputs), True, False)
               if pairs else (None,) * len(inputs))
    # a statistic the variant ignores (var_only_bn's mean) gets the cached zero: read-only below
    grads = [(filled(t, 0.0) if i < 2 else torch.zeros_like(t)) if gr is None else gr
             for i, (gr, t) in enumerate(zip(raw, inputs))]
    s = (2.0 / call.n) * grads[1]
    # gx = s·(x − μ) + g_μ/n + scale·g = s·x + (g_μ/n − s·μ) + scale·g: the constant in float64, so
    # only s·x rounds at |x| (as nn.BatchNorm's own x·a + b does)
    const = (grads[0] / call.n - s * m_x.to(m.dtype)).to(xdt)
    rest = [gr.to(t.dtype) for gr, t in zip(grads[2:], (t for t in leaves if t.requires_grad))]
    return scale.detach().to(xdt), s.to(xdt), const, rest


_LIB = torch.library.Library("bnlab", "FRAGMENT")
# name -> the Python kernel of each bnlab:: operator (opcount reads it)
KERNELS: dict[str, Callable] = {}


def define(schema: str, kernel: Callable) -> None:
    """Register ``bnlab::<schema>`` with ``kernel`` for every device (the kernel picks its full-size
    ops)."""
    _LIB.define(schema)
    name = schema.split("(", 1)[0]
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    KERNELS[name] = kernel


define("stats_affine(Tensor x, Tensor[] tensors, int key) -> (Tensor, Tensor, Tensor)",
       _stats_affine)
define("stats_affine_backward(Tensor g, Tensor x, int key) -> Tensor[]", _stats_affine_backward)


class _StatsAffine(torch.autograd.Function):
    """y = scale·x + shift with (scale, shift) = coef_fn(μ_B, σ²_B, *tensors): one operator each
    way.

    The per-channel coefficient graph is built with ordinary autograd (in float64) inside the
    forward operator and differentiated in the backward one; the (N, C, *) part of the gradient is
    assembled from the centred input, so a large mean cancels nothing. Double backward is refused
    with a clear error: use ``with bnlab.norms.plain_autograd():``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, moments_fn: MomentsFn, coef_fn: CoefFn, update_fn: UpdateFn | None,
                differentiable: bool, *tensors: Tensor):
        call = _Call(moments_fn, coef_fn, update_fn, [t.requires_grad for t in tensors],
                     differentiable)
        y, mean, var = torch.ops.bnlab.stats_affine(x, list(tensors), call.park())
        ctx.call, ctx.needs = call, call.needs
        ctx.set_materialize_grads(False)  # no zero gradients built for the statistics outputs
        ctx.save_for_backward(x)
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g: Tensor, _gm, _gv):
        refuse_double_backward("normalization")
        if g is None:  # y's gradient undefined (set_materialize_grads(False)): nothing flows back
            return (None,) * (5 + len(ctx.needs))
        (x,) = ctx.saved_tensors
        gx, *rest = torch.ops.bnlab.stats_affine_backward(g, x, ctx.call.park())
        grads = iter(rest)
        return (gx, None, None, None, None,
                *[next(grads) if need else None for need in ctx.needs])


@lazily_disabled
def fused_normalize(x: Tensor, moments_fn: MomentsFn, coef_fn: CoefFn, *tensors: Tensor,
                    update: UpdateFn | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(y, μ_B, σ²_B) through :class:`_StatsAffine`, eagerly and never traced: dynamo once inlined
    the function's forward as plain code and dropped its backward (1e-2 relative error). Where no
    backward can follow (``torch.no_grad``, ``torch.inference_mode``, no input requiring grad) the
    coefficients are taken without a graph."""
    differentiable = torch.is_grad_enabled() and (
        x.requires_grad or any(t.requires_grad for t in tensors))
    return _StatsAffine.apply(x, moments_fn, coef_fn, update, differentiable, *tensors)
