"""The per-channel coefficient math of the fused operators, traced once per variant and compiled.

Inside ``bnlab::stats_affine`` (:mod:`.fused`) a variant's ``coefficients(μ_B, σ²_B, *tensors) ->
(scale, shift)`` runs on C numbers. Eagerly that is 10–50 small operations each way (each a kernel
launch on a GPU). Here, per (variant's code, dtype, device, requires-grad pattern), one function is
built that returns, in a single call, the coefficients AND their per-channel partial derivatives,

    P[0, i, c] = ∂scale_c/∂in_i,c,   P[1, i, c] = ∂shift_c/∂in_i,c    (in = μ_B, σ²_B, the tensors
                                                                        that require grad),

from two ``torch.func.vjp`` pulls (cotangents (1, 0) and (0, 1)), compiled by ``torch.compile``
(inductor, dynamic over C, ``fullgraph=True``): a kernel or two. The backward pass's per-channel
algebra — ``∂L/∂in_i = P[0, i]·Σg·x + P[1, i]·Σg``, then the two (C,) factors of the input gradient
(the chain rule through μ_B and σ²_B of Ioffe & Szegedy 2015, §3, with the variant's coefficients in
place of BN's) — is a second compiled function, :func:`assemble`, shared by every variant. No graph
is kept and nothing is recomputed, so buffers that the layer's update writes in place after the
forward pass (mbn's moving moments, cbn's AMAT, brn's running statistics) cannot change the
gradient.

This is exact only when the coefficient map is channel-wise (channel c's outputs depend on channel
c's inputs alone), which every BN-family variant is; it is checked once per key, on the first call,
against the full Jacobian (``torch.func.jacrev``), and a variant that fails the check (or whose
trace or compile raises, then or on a later call) keeps the eager per-channel path, with one
warning.

Policy (``BNLAB_COMPILE_COEFFICIENTS``, read on every call by
:func:`.switches.coefficients_compiled`): ``auto`` (default) compiles on CUDA only, where kernel
launches dominate (not yet measured on a GPU); ``1`` compiles on every device, ``0`` never. On the
CPU it is no faster (each compiled call goes through dynamo's guards and wrappers, which cost more
than the eager micro-ops it replaces) and the first step compiles for seconds per variant
(``benchmarks/coef_compile.py`` → benchmarks/results/norms_coef_compile.json), hence off there by
default.
``BNLAB_COEF_BACKEND`` picks the dynamo backend (default ``inductor``; ``aot_eager`` traces without
generating code, which the tests use).
"""

from __future__ import annotations

import os
import threading
import types
import warnings
from collections import Counter
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from .switches import coefficients_compiled

_LOCK = threading.Lock()
_BUILT: dict[
    tuple, Callable | None
] = {}  # key -> compiled partials function, or None (eager forever)
_WARNED: set[str] = set()
CALLS: Counter = (
    Counter()
)  # successful compiled calls by kind ("forward", "backward"): tests, diagnostics
_FUNCTORCH_FRONT = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode
# Coefficient functions read their layer's (C,) buffers (mbn's moving moments, brn's running
# statistics): dynamo makes module buffers static by default, which pins C and recompiles per
# channel count.
_FLAGS = ("force_nn_module_property_static_shapes", "force_parameter_static_shapes")


class _DynamicBuffers:
    """Both flags False while any thread is inside (a count, not a stack of saved values:
    threads may leave in any order; the last one out restores what the first one in found).
    dynamo's config is process-wide, so a user's own compile running at that moment in another
    thread sees it too. torch._dynamo is imported on first use: a slow import eager CPU users never
    need."""

    def __init__(self) -> None:
        self.depth, self.lock = 0, threading.Lock()
        self.saved: tuple[Any, ...] = ()

    def __enter__(self) -> None:
        with self.lock:
            if self.depth == 0:
                config = torch._dynamo.config
                self.saved = tuple(getattr(config, f) for f in _FLAGS)
                for flag in _FLAGS:
                    setattr(config, flag, False)
            self.depth += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                for flag, value in zip(_FLAGS, self.saved):
                    setattr(torch._dynamo.config, flag, value)


_PATCH = _DynamicBuffers()


def _dynamic_buffers() -> _DynamicBuffers:
    return _PATCH


MAX_CHECKED_C = 1024  # the one-time Jacobian check is (2C)×C per input: above this, stay eager


def partials(
    coef_fn: Callable,
    needs: tuple[bool, ...],
    cdt: torch.dtype,
    xdt: torch.dtype,
    mean: Tensor,
    var: Tensor,
    *tensors: Tensor,
) -> tuple[Tensor, ...]:
    """The forward operator's per-channel work in one function: (scale, shift, μ_B) in x's dtype
    ``xdt``, μ_B in ``cdt`` and P of shape (2, k, C) in ``cdt`` as in the module docstring."""
    m, v = mean.to(cdt), var.to(cdt)

    def f(m, v, *wanted):
        it = iter(wanted)
        return coef_fn(m, v, *[next(it) if need else t for t, need in zip(tensors, needs)])

    wanted = [t for t, need in zip(tensors, needs) if need]
    vjp = torch.func.vjp(f, m, v, *wanted)
    (scale, shift), pull = vjp[0], vjp[1]
    one, zero = torch.ones_like(scale), torch.zeros_like(scale)
    rows = [
        torch.stack([d.to(cdt).expand_as(m) for d in pull((one, zero))]),
        torch.stack([d.to(cdt).expand_as(m) for d in pull((zero, one))]),
    ]
    return scale.to(xdt), shift.to(xdt), m.to(xdt), m, torch.stack(rows)


def assemble(
    p: Tensor,
    m: Tensor,
    m_x: Tensor,
    g_sum: Tensor,
    g_dot_centred: Tensor,
    n: int,
    dtypes: tuple[torch.dtype, ...],
) -> tuple[Tensor, ...]:
    """The backward operator's per-channel work in one function: from the reductions Σg and
    Σg·(x − μ), the gradients of μ_B, σ²_B and the tensors, and the input gradient's (C,) factors
    (s, c) of ∂L/∂x = s·x + c + scale·g (:mod:`.fused`); in the dtypes of what they belong to."""
    g_sum = g_sum.to(m.dtype)
    g_dot = (
        g_dot_centred.to(m.dtype) + m_x.to(m.dtype) * g_sum
    )  # Σ g·x, exactly, without cancellation
    grads = p[0] * g_dot + p[1] * g_sum  # (k, C): ∂L/∂in_i = P[0, i]·Σg·x + P[1, i]·Σg
    s = (2.0 / n) * grads[1]
    const = grads[0] / n - s * m_x.to(m.dtype)  # the constant in float64: only s·x rounds at |x|
    return (
        s.to(m_x.dtype),
        const.to(m_x.dtype),
        *[grads[2 + i].to(dt) for i, dt in enumerate(dtypes)],
    )


def _fresh(fn: Callable, tag: int) -> Callable:
    """A copy of ``fn`` with its own code object: dynamo keeps its compiled entries (and its limit
    of recompiles) per code object, so each variant gets its own instead of sharing one."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _channelwise(coef_fn: Callable, needs: tuple[bool, ...], m: Tensor, v: Tensor, tensors) -> bool:
    """True when every output channel depends on its own channel of every input only (exact zeros
    off the diagonal of the Jacobian), and every differentiated input is a (C,) tensor."""
    c = m.shape[0]
    if c > MAX_CHECKED_C or any(need and tuple(t.shape) != (c,) for t, need in zip(tensors, needs)):
        return False
    wanted = [t.detach().to(m.dtype) for t, need in zip(tensors, needs) if need]

    def f(m, v, *wanted):
        it = iter(wanted)
        full = [next(it).to(t.dtype) if need else t for t, need in zip(tensors, needs)]
        scale, shift = coef_fn(m, v, *full)
        return torch.stack([scale.expand(c), shift.expand(c)])

    jac = torch.func.jacrev(f, argnums=tuple(range(2 + len(wanted))))(m, v, *wanted)
    off = ~torch.eye(c, dtype=torch.bool, device=m.device)
    return all(bool((j[:, off] == 0).all()) for j in jac)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _build(name: str, fn: Callable, args, check: Callable[[], bool] | None) -> Callable | None:
    try:
        if check is not None and not check():
            _warn_once(f"bnlab: {name} is not channel-wise; its coefficients stay eager")
            return None
        backend = os.environ.get("BNLAB_COEF_BACKEND", "inductor")
        compiled = torch.compile(
            _fresh(fn, len(_BUILT)), backend=backend, dynamic=True, fullgraph=True
        )
        with _dynamic_buffers():
            compiled(*args)  # compile now, inside the try
        return compiled
    except (
        Exception
    ) as exc:  # no C++ compiler, an untraceable variant: remember, warn once, stay eager
        _warn_once(
            f"bnlab: compiling the per-channel math of {name} failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); it stays eager"
        )
        return None


def run(
    key: tuple,
    name: str,
    fn: Callable,
    args: tuple,
    device: torch.device,
    check: Callable[[], bool] | None = None,
):
    """``fn(*args)`` compiled once per ``key``, or None where the eager path must run instead
    (policy off, under compile or a foreign dispatch mode, compile failed, not channel-wise)."""
    if not coefficients_compiled(device) or torch.compiler.is_compiling():
        return None
    mode = _get_current_dispatch_mode()  # dynamo refuses to run under a user's dispatch mode
    if mode is not None and not hasattr(mode, "record_compiled_call"):
        return None
    if mode is None:
        if torch._C._dispatch_tls_is_dispatch_key_excluded(_FUNCTORCH_FRONT):
            # a mode's handler re-dispatched the operator (its mode popped): torch.func is off
            return None
        return _call(key, name, fn, args, check)
    # bnlab.norms.tools.opcount's counter: one call, counted as one kernel
    with _disable_current_modes():
        out = _call(key, name, fn, args, check)
    if out is not None:
        mode.record_compiled_call()
    return out


def _call(key: tuple, name: str, fn: Callable, args, check):
    if key not in _BUILT:
        with _LOCK:  # one thread compiles; the others wait for it instead of compiling again
            if key not in _BUILT:
                _BUILT[key] = _build(name, fn, args, check)
    compiled = _BUILT[key]
    if compiled is None:
        return None
    try:
        with _dynamic_buffers():
            out = compiled(*args)
        CALLS[key[0]] += 1
        return out
    except (
        Exception
    ) as exc:  # e.g. a recompile (new guards) that fails, or dynamo's recompile limit
        _BUILT[key] = None
        _warn_once(
            f"bnlab: calling the compiled per-channel math of {name} failed "
            f"({type(exc).__name__}); it stays eager"
        )
        return None


def forward_coefficients(
    coef_fn: Callable,
    needs: tuple[bool, ...],
    cdt: torch.dtype,
    xdt: torch.dtype,
    mean: Tensor,
    var: Tensor,
    tensors,
) -> tuple[Tensor, ...] | None:
    """:func:`partials` compiled for this variant, or None (eager path). The caller asks
    :func:`.switches.coefficients_compiled` first (the usual CPU case: no key, no name built)."""
    code = getattr(coef_fn, "__func__", coef_fn).__code__
    key = ("forward", code, cdt, xdt, mean.device.type, needs, tuple(t.dtype for t in tensors))
    # not getattr's default: that would build the layer's repr on every step
    name = getattr(coef_fn, "__qualname__", None) or repr(coef_fn)

    def check() -> bool:
        return _channelwise(coef_fn, needs, mean.to(cdt), var.to(cdt), tensors)

    return run(
        key, name, partials, (coef_fn, needs, cdt, xdt, mean, var, *tensors), mean.device, check
    )


def backward_coefficients(
    p: Tensor,
    m: Tensor,
    m_x: Tensor,
    g_sum: Tensor,
    g_dot_centred: Tensor,
    n: int,
    dtypes: tuple[torch.dtype, ...],
) -> tuple[Tensor, ...] | None:
    """:func:`assemble` compiled (one function for every variant), or None (eager path)."""
    key = ("backward", m.dtype, m_x.dtype, g_sum.dtype, m.device.type, dtypes)
    return run(
        key, "the fused backward", assemble, (p, m, m_x, g_sum, g_dot_centred, n, dtypes), m.device
    )


def reset() -> None:
    """Forget every compiled function and failure (tests; after changing the policy's backend)."""
    with _LOCK:
        _BUILT.clear()
        _WARNED.clear()
