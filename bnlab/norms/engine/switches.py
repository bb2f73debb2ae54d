"""Every switch that steers how bnlab's layers run, and the state they keep between calls.

Process-wide (like ``torch.backends`` flags):

* :func:`compiled_steps` / :func:`set_compiled_steps` (or ``BNLAB_COMPILED_STEPS=1``): small CPU
  training steps run as compiled functions (:mod:`.compiled_step`);
* :func:`set_nonfinite_guard`: a training step whose statistics are not finite leaves the layer's
  buffers as they were (:mod:`.guard`);
* :data:`ACCUMULATORS`: the layers inside a running ``bnlab.norms.accumulate`` block.

Per thread (:data:`THREAD`; one thread's setting must not change another's layers):

* ``plain``: inside :class:`plain_autograd` (plain autograd ops, twice differentiable);
* ``inside``: ids of the layers whose guarded step is running (a layer called from its own step
  is not guarded twice); ``replay``: depth of checkpoint replays; ``as_with_grad``: a no-grad
  pass computes its statistics as a pass with grad does (:mod:`.guard`);
* ``tracing``: a compiled step is being traced (:mod:`.written_grad`).

:mod:`.route` reads them to pick the route of each step. Nothing here imports the rest of bnlab.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch

THREAD = threading.local()


def thread_flag(name: str, default: Any) -> Any:
    """This thread's value of switch ``name`` (:data:`THREAD`), or ``default`` if never set."""
    return getattr(THREAD, name, default)


# ---- plain autograd (per thread) -----------------------------------------------------------------
def plain_requested() -> bool:
    """Whether this thread is inside :class:`plain_autograd`."""
    return thread_flag("plain", False)


def fast_paths_allowed() -> bool:
    """Whether an eager fast path (fused operators, brn's torch kernel, a compiled step) may stand
    in for the plain ops: not in :class:`plain_autograd` (double backward), ``torch.compile``
    (it fuses the plain ops) or a ``torch.func`` transform (vmap, grad: a closure graph)."""
    return (not plain_requested() and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


class plain_autograd:
    """Context manager: build normalization layers' graphs from plain autograd ops (slower, but
    twice differentiable), e.g. for Hessian-vector products. Thread-local."""

    def __enter__(self):
        self._previous = plain_requested()
        THREAD.plain = True
        return self

    def __exit__(self, *exc):
        THREAD.plain = self._previous
        return False


# ---- compiled steps (process-wide) ---------------------------------------------------------------
COMPILED_STEPS = [os.environ.get("BNLAB_COMPILED_STEPS", "0") == "1"]


def compiled_steps_enabled() -> bool:
    """Whether layers take their compiled step where they can (process-wide)."""
    return COMPILED_STEPS[0]


@contextmanager
def compiled_steps(enabled: bool = True) -> Iterator[None]:
    """Within the block, eligible training steps run as compiled functions
    (:mod:`bnlab.norms.engine.compiled_step`); process-wide, like ``torch.backends`` flags.
    ``set_compiled_steps`` switches it for good."""
    previous = COMPILED_STEPS[0]
    COMPILED_STEPS[0] = bool(enabled)
    try:
        yield
    finally:
        COMPILED_STEPS[0] = previous


def set_compiled_steps(enabled: bool) -> None:
    """Switch the compiled steps on or off for the rest of the process."""
    COMPILED_STEPS[0] = bool(enabled)


# ---- non-finite guard and accumulation (process-wide) --------------------------------------------
NONFINITE_GUARD = [False]

# layer id -> the accumulator of a running bnlab.norms.accumulate block (set and cleared there)
ACCUMULATORS: dict[int, Any] = {}


def set_nonfinite_guard(enabled: bool) -> bool:
    """Switch the non-finite-batch guard on or off for every bnlab layer (process-wide); returns the
    previous setting. On: a training step whose statistics are not finite leaves the layer's
    running and moving buffers (and its step counter) untouched, is counted on the layer
    (``bnlab.norms.nonfinite_batches``) and warns. Off (the default): torch's behaviour, the
    non-finite statistics enter the buffers."""
    previous = NONFINITE_GUARD[0]
    NONFINITE_GUARD[0] = bool(enabled)
    return previous


def nonfinite_guard_enabled() -> bool:
    """Whether the non-finite-batch guard is on (:func:`set_nonfinite_guard`)."""
    return NONFINITE_GUARD[0]
