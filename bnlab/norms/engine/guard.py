"""One statistics update per training forward: checkpoint recomputation and non-finite batches.

Every bnlab layer's ``forward`` runs its step through :func:`guarded_step` where
:func:`.switches.needs_guard` says so (:func:`bnlab.norms.engine.route.run` decides). In eval mode
and under ``torch.compile`` the step is a direct call. In training it adds what torch's BatchNorm
lacks:

* **Activation checkpointing** (``torch.utils.checkpoint``, ``use_reentrant=True`` and ``False``):
  the region's forward pass runs a second time inside backward. A layer whose training step reads
  buffers that the step itself updates (``mbn``'s and ``cbn``'s moving statistics, ``brn``'s
  running ones, ``noisy_bn``'s generator) would recompute different values, and every layer would
  update its statistics twice (torch's own BatchNorm does, pytorch#96136). Here the first pass of a
  checkpointed forward records the layer's buffers (C numbers each) and its generator's state on the
  checkpoint's own bookkeeping object (``torch.utils.checkpoint``'s frame, or the reentrant
  function's ``ctx``: the record lives exactly as long as the graph that may recompute it); the
  recomputation runs from that record on copies, so its values, and hence the gradients, are the
  first pass's, and the layer's buffers are updated once.
* **Non-finite batches** (:func:`.switches.set_nonfinite_guard`, off by default: torch's
  behaviour): a training step that would turn a finite running or moving buffer into NaN or ±inf
  (a batch whose statistics are not finite, e.g. the overflowed step an AMP grad scaler later
  skips) leaves every buffer of the layer as it was, counts the batch on the layer
  (:func:`nonfinite_batches`) and warns.
* **Gradient accumulation** (:func:`bnlab.norms.accumulate`): the step is handed to the layer's
  accumulator, which normalizes each micro-batch against the state at the start of the optimizer
  step and updates the statistics once, from the micro-batches' combined statistics.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, cast

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointFunction
from torch import Tensor

from ..user_line import warn as warn_at_user_line
from .switches import (  # ACCUMULATORS, nonfinite_guard_enabled: read here by the tools too
    ACCUMULATORS, NONFINITE_GUARD, THREAD, guarded_layers, inside_backward,
    nonfinite_guard_enabled, thread_flag,
)

__all__ = ["ACCUMULATORS", "guarded_step", "nonfinite_batches",
           "nonfinite_guard_enabled", "refuse_recomputation", "replaying",
           "statistics_as_with_grad"]


def nonfinite_batches(model: nn.Module) -> dict[str, int]:
    """``{layer name: batches skipped}`` for every layer of ``model`` whose guard skipped a batch
    (:func:`.switches.set_nonfinite_guard`); empty when none did. The count is
    ``layer.nonfinite_batches``."""
    # every bnlab layer declares the count (ChannelNorm's contract); torch's modules have none
    return {name: int(m.nonfinite_batches) for name, m in model.named_modules()
            if hasattr(m, "nonfinite_batches") and m.nonfinite_batches}


def replaying() -> bool:
    """Whether a layer's step is being recomputed from its checkpoint record (no refusal then)."""
    return thread_flag("replay", 0) > 0


def refuse_recomputation(layer: str, reason: str, remedy: str) -> None:
    """Raise if this forward pass runs inside backward: torch.utils.checkpoint recomputing its
    region, which for a layer whose step is not a pure function of its inputs (``reason``) would
    give silently wrong gradients."""
    if inside_backward() and not replaying():
        raise RuntimeError(f"{layer} is being run inside backward (torch.utils.checkpoint "
                           f"recomputing a checkpointed region): {reason}, so the recomputation "
                           f"would give silently wrong gradients. {remedy}")


def guarded_step(layer: nn.Module, call: Callable[[], Tensor], x: Tensor) -> Tensor:
    """``call()``, the layer's step on x, with this module's guarantees (where
    :func:`.switches.needs_guard`)."""
    inside = guarded_layers()
    inside.add(id(layer))
    try:
        return _guarded_step(layer, call, x)
    finally:
        inside.discard(id(layer))


def _guarded_step(layer: nn.Module, call: Callable[[], Tensor], x: Tensor) -> Tensor:
    site = checkpoint_site()
    if site is not None:
        owner, recomputing = site
        records = _records(owner)
        if recomputing:
            state = records.replay(layer)
            if state is not None:  # else: an unknown recomputation, the layer's own checks decide
                return run_from(layer, state, call)
        else:
            records.record(layer)
            if not torch.is_grad_enabled():  # reentrant: the recomputation will have grad on
                call = functools.partial(_as_with_grad, call)
    accumulator = ACCUMULATORS.get(id(layer))
    if accumulator is not None:
        return accumulator.micro_step(layer, call, x)
    if not NONFINITE_GUARD[0]:
        return call()
    before = snapshot(layer)
    y = call()
    restore_if_nonfinite(layer, before)
    return y


def _as_with_grad(call: Callable[[], Tensor]) -> Tensor:
    THREAD.as_with_grad = thread_flag("as_with_grad", 0) + 1
    try:
        return call()
    finally:
        THREAD.as_with_grad -= 1


def statistics_as_with_grad() -> bool:
    """Whether a no-grad forward must compute its batch statistics as a forward with grad does:
    the first pass of a reentrant checkpoint, which its recomputation (grad on) must reproduce
    bit for bit (the no-grad statistics kernel rounds differently)."""
    return thread_flag("as_with_grad", 0) > 0


# ---- layer state ---------------------------------------------------------------------------------
def snapshot(layer: nn.Module) -> dict[str, Any]:
    """Copies of the layer's buffers (C numbers each) and its generator's state, if it has one."""
    state: dict[str, Any] = {name: b.detach().clone() for name, b in layer._buffers.items()
                             if b is not None}
    generator = getattr(layer, "_generator", None)
    state["_generator"] = (None if generator is None
                           else (generator.device, generator.get_state()))
    return state


def run_from(layer: nn.Module, state: dict[str, Any], call: Callable[[], Tensor],
             rewind_generator: bool = True) -> Tensor:
    """``call()`` with the layer's buffers (and, ``rewind_generator``, its generator) rebound to
    copies of ``state``, then put back: its values are those of a step from ``state``, and whatever
    it updates is discarded (the layer's own buffers are never written, so no saved tensor's
    version changes)."""
    own = dict(layer._buffers)
    own_generator = getattr(layer, "_generator", None)
    for name, value in state.items():
        if name != "_generator":
            layer._buffers[name] = value.clone()
    rewind_generator = rewind_generator and hasattr(layer, "_generator")
    if "_generator" in state and rewind_generator:
        saved = state["_generator"]
        generator = None
        if saved is not None:
            generator = torch.Generator(device=saved[0])
            generator.set_state(saved[1])
        setattr(layer, "_generator", generator)
    THREAD.replay = thread_flag("replay", 0) + 1
    try:
        return call()
    finally:
        THREAD.replay -= 1
        layer._buffers.update(own)
        if rewind_generator:
            setattr(layer, "_generator", own_generator)


def _newly_nonfinite(layer: nn.Module, before: dict[str, Any]) -> list[str]:
    names = []
    for name, old in before.items():
        new = layer._buffers.get(name)
        if name == "_generator" or new is None or not new.is_floating_point():
            continue
        if bool((torch.isfinite(old) & ~torch.isfinite(new)).any()):
            names.append(name)
    return names


@torch.no_grad()
def restore_if_nonfinite(layer: nn.Module, before: dict[str, Any]) -> bool:
    """After a guarded step: if it made a finite buffer non-finite, put every buffer back to
    ``before`` (through ``.data``: torch's kernel saved its running buffers for backward, whose
    version must not change), count and warn. Returns whether the step was skipped."""
    bad = _newly_nonfinite(layer, before)
    if not bad:
        return False
    for name, old in before.items():
        new = layer._buffers.get(name)
        if name != "_generator" and new is not None:
            new.data.copy_(old)
    cast(Any, layer).nonfinite_batches += 1  # declared 0 on the class; per layer from here
    warn_at_user_line(
        f"{type(layer).__name__}: a training batch whose statistics are not finite (NaN or inf) "
        f"would have written them into {', '.join(bad)}; its running and moving buffers were left "
        f"as they were (batches skipped so far: {layer.nonfinite_batches}; "
        "bnlab.norms.nonfinite_batches(model) lists them, bnlab.norms.set_nonfinite_guard(False) "
        "switches the guard off)", RuntimeWarning)
    return True


# ---- checkpoint recomputation --------------------------------------------------------------------
class _Records:
    """Per checkpointed region: each layer's states before its first-pass steps, in call order, and
    how many of them each backward (graph task) has recomputed."""

    def __init__(self) -> None:
        self.states: dict[int, list[dict[str, Any]]] = {}
        self.replayed: dict[tuple[int, int], int] = {}
        self.layers: list[nn.Module] = []  # keeps the ids above meaningful while the region lives

    def record(self, layer: nn.Module) -> None:
        if id(layer) not in self.states:
            self.layers.append(layer)
        self.states.setdefault(id(layer), []).append(snapshot(layer))

    def replay(self, layer: nn.Module) -> dict[str, Any] | None:
        states = self.states.get(id(layer))
        key = (torch._C._current_graph_task_id(), id(layer))
        index = self.replayed.get(key, 0)
        if not states or index >= len(states):
            return None
        self.replayed[key] = index + 1
        return states[index]


def _records(owner: Any) -> _Records:
    records = getattr(owner, "_bnlab_records", None)
    if records is None:
        records = _Records()
        owner._bnlab_records = records
    return records


_CODES: list = []  # the code objects of CheckpointFunction.forward and .backward


def _reentrant_codes() -> tuple:
    if not _CODES:
        _CODES.extend((CheckpointFunction.forward.__code__, CheckpointFunction.backward.__code__))
    return _CODES[0], _CODES[1]


def checkpoint_site() -> tuple[Any, bool] | None:
    """``(owner, recomputing)`` when this call runs inside ``torch.utils.checkpoint``: owner is the
    checkpoint's bookkeeping object for this region (non-reentrant: its ``_CheckpointFrame``;
    reentrant: the ``CheckpointFunction`` ctx), recomputing whether this is the recomputation in
    backward. None outside a checkpointed region."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is not None:  # non-reentrant: checkpoint's saved-tensor hooks are on top
        pack = inspect.unwrap(hooks[0])
        qualname = getattr(pack, "__qualname__", "")
        code = getattr(pack, "__code__", None)
        free = dict(zip(code.co_freevars if code is not None else (),
                        (c.cell_contents for c in (getattr(pack, "__closure__", None) or ()))))
        if qualname.startswith("_checkpoint_hook.") and "frame" in free:
            return free["frame"], False
        if qualname.startswith("_recomputation_hook.") and "target_frame_ref" in free:
            frame = free["target_frame_ref"]()
            return (frame, True) if frame is not None else None
    # reentrant: the first pass runs under no_grad inside CheckpointFunction.forward, the
    # recomputation inside its backward (a graph task)
    if torch.is_grad_enabled() and torch._C._current_graph_task_id() < 0:
        return None
    forward, backward = _reentrant_codes()
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code is forward or code is backward:
            return frame.f_locals["ctx"], code is backward
        frame = frame.f_back
    return None
