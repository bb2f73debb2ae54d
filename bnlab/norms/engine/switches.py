"""Every switch that steers how bnlab's layers run, and the state they keep between calls.

Process-wide (like ``torch.backends`` flags):

* :func:`compiled_steps` / :func:`set_compiled_steps` (or ``BNLAB_COMPILED_STEPS=1``): small CPU
  training steps run as compiled functions (:mod:`.compiled_step`);
* :func:`set_nonfinite_guard`: a training step whose statistics are not finite leaves the layer's
  buffers as they were (:mod:`.guard`);
* :data:`ACCUMULATORS`: the layers inside a running ``bnlab.norms.accumulate`` block;
* ``BNLAB_COMPILE_COEFFICIENTS`` (read on every call, :func:`coefficients_compiled`): the fused
  operators' per-channel math as compiled functions (:mod:`.coef_compile`).

Per thread (:data:`THREAD`; one thread's setting must not change another's layers):

* ``plain``: inside :class:`plain_autograd` (plain autograd ops, twice differentiable);
* ``inside``: ids of the layers whose guarded step is running (a layer called from its own step
  is not guarded twice); ``replay``: depth of checkpoint replays; ``as_with_grad``: a no-grad
  pass computes its statistics as a pass with grad does (:mod:`.guard`);
* ``tracing``: a compiled step is being traced (:mod:`.written_grad`).

Per layer, read from the layer and the process: :func:`module_group` (``sync=True`` inside a process
group of more than one rank), :func:`full_statistics` (inside ``accumulate(normalize="full")``)
and :func:`needs_guard` (the step runs under :mod:`.guard`'s guarantees).

These are every question :mod:`.route` and the step ask before they compute anything, so a reader
following a step finds each answer here, and the modules that act on a switch (:mod:`.guard`,
:mod:`.sync`, :mod:`.coef_compile`) are entered only when it is on. Nothing here imports the rest
of bnlab.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

THREAD = threading.local()


def thread_flag(name: str, default: Any) -> Any:
    """This thread's value of switch ``name`` (:data:`THREAD`), or ``default`` if never set."""
    return getattr(THREAD, name, default)


def tracing() -> bool:
    """Whether this thread is tracing a compiled training step (:func:`.written_grad.traced_step`):
    the layers' own forward runs, and their plain path detaches μ_B where its gradient is zero."""
    return thread_flag("tracing", False)


def inside_backward() -> bool:
    """Whether this call runs inside autograd's backward (e.g. ``torch.utils.checkpoint``
    recomputing its region)."""
    return torch._C._current_graph_task_id() >= 0


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


def full_statistics(layer: nn.Module) -> Any:
    """The full-batch statistics a layer normalizes with inside ``accumulate(normalize="full")``
    (a callable giving (mean, var, n) for its input), or None. Never under torch.compile (the
    block runs eagerly: its training steps are the wrapper's, which compile does not trace)."""
    if torch.compiler.is_compiling() or not ACCUMULATORS:
        return None
    return getattr(ACCUMULATORS.get(id(layer)), "full", None)


def guarded_layers() -> set[int]:
    """Ids of the layers whose guarded step is running in this thread (:mod:`.guard`)."""
    inside = thread_flag("inside", None)
    if inside is None:
        inside = THREAD.inside = set()
    return inside


def needs_guard(layer: nn.Module) -> bool:
    """Whether this call of the layer is a training step that needs :mod:`.guard`'s guarantees:
    training, eager, not already inside the layer's own guarded step, and the guard on, an
    accumulation running, or possibly a checkpointed region."""
    return (layer.training and not torch.compiler.is_compiling()
            and id(layer) not in guarded_layers()
            and bool(NONFINITE_GUARD[0] or ACCUMULATORS or maybe_checkpointed()))


def maybe_checkpointed() -> bool:
    """Cheap test before :func:`.guard.checkpoint_site`: saved-tensor hooks on, grad off (a
    reentrant checkpoint's first pass) or inside backward (its recomputation)."""
    return (torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
            or not torch.is_grad_enabled() or inside_backward())


# ---- synchronized statistics (per layer) ---------------------------------------------------------
def active_group(process_group=None):
    """The process group to synchronize over, or ``None`` when there is nothing to synchronize.

    ``None`` outside an initialized default group or when the group has a single rank;
    ``process_group`` ``None`` means the default (world) group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = process_group if process_group is not None else dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


def module_group(module: nn.Module):
    """The group a layer synchronizes its batch statistics over now (training, ``sync`` on,
    :mod:`.sync`), or None."""
    if not (getattr(module, "sync", False) and module.training):
        return None
    return active_group(getattr(module, "process_group", None))


# ---- compiled per-channel coefficients (process-wide, from the environment) ----------------------
def coefficients_compiled(device: torch.device) -> bool:
    """Whether ``BNLAB_COMPILE_COEFFICIENTS`` asks for the fused operators' per-channel math as
    compiled functions on ``device`` (:mod:`.coef_compile`): ``auto`` (default) on CUDA only, ``1``
    on every device, ``0`` never."""
    mode = os.environ.get("BNLAB_COMPILE_COEFFICIENTS", "auto").strip().lower()
    if mode in ("0", "false", "off", "no"):
        return False
    if mode in ("1", "true", "on", "yes"):
        return True
    if mode != "auto":
        raise ValueError(f"BNLAB_COMPILE_COEFFICIENTS={mode!r}: valid values are auto, 1 and 0")
    return device.type == "cuda"
