"""Frozen BatchNorm for fine-tuning: fixed statistics and/or fixed affine parameters, any layer.

Fine-tuning with small batches (detection backbones, few-shot transfer) keeps BatchNorm's
statistics fixed: the layer normalizes with its running statistics in training too, as in eval,
and updates nothing — torchvision's and timm's ``FrozenBatchNorm2d``, whose γ and β are fixed as
well. :func:`freeze` does this in place for every normalization layer of a model — bnlab's layers,
each with its own eval map (mbn's inference EMA, cbn's AMAT centre and divisor, brn's running
statistics, lp_bn's running ℓp scale), and torch's own ``nn.BatchNorm*`` — with the choice
explicit: ``stats`` (eval-mode statistics in training) and ``affine`` (``requires_grad=False`` on
γ and β). :func:`unfreeze` restores the training behaviour exactly: freezing changes no parameter,
buffer or random state, only a flag, two forward hooks and ``requires_grad``.

How: a frozen-statistics layer carries a forward pre-hook that runs its forward with
``training=False`` (and a hook that gives the flag back, also when the forward raises), so
``model.train()`` still reports training and switches every other module as usual. The hooks are
module-level functions: a frozen model deep-copies, pickles and ``fold``s. The frozen state is not
part of a ``state_dict``: after loading a checkpoint into a fresh model, call :func:`freeze` again.

timm's ``unfreeze_batch_norm_2d`` (also reached through ``timm.utils.unfreeze``) finds frozen
layers by type (its ``FrozenBatchNorm2d``) and would leave a layer frozen here frozen: once timm
is imported, :func:`freeze` (and ``import bnlab.integrations.timm``) extend it to undo this
module's freezing too, layer by layer as its walk reaches them; for every other module timm's
function runs unchanged.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..variants.base import ChannelNorm

FLAG = "bnlab_frozen"  # {"stats": bool, "affine": bool, "requires_grad": {name: bool}}


def freezable(module: nn.Module) -> bool:
    """A BatchNorm-family layer: any bnlab channel norm, torch's ``_BatchNorm`` subclasses."""
    return isinstance(module, (ChannelNorm, _BatchNorm))


def stats_frozen(module: nn.Module) -> bool:
    """Whether ``module``'s statistics were frozen by :func:`freeze`."""
    return bool(getattr(module, FLAG, {}).get("stats", False))


def _run_as_eval(module: nn.Module, args) -> None:
    module.__dict__["_bnlab_was_training"] = module.training
    module.training = False


def _give_training_back(module: nn.Module, args, output) -> None:
    module.training = module.__dict__.pop("_bnlab_was_training", module.training)


def freeze(model: nn.Module, *, stats: bool = True, affine: bool = False) -> nn.Module:
    """Freeze the BatchNorm-family layers of ``model`` (or ``model`` itself) in place; returns it.

    ``stats=True``: each layer normalizes with its running statistics in training as in eval (its
    eval-mode forward; gradients flow to the input and to γ, β) and updates none of its buffers.
    ``affine=True``: γ and β get ``requires_grad=False``. Both: torchvision's/timm's
    ``FrozenBatchNorm2d`` (same outputs, also for the gradient with respect to the input). A layer
    without running statistics (``track_running_stats=False`` and no buffers) cannot have its
    statistics frozen: ``ValueError`` naming it, before anything changes. Freezing again adds to
    what is frozen; :func:`unfreeze` undoes all of it.
    """
    if not (stats or affine):
        raise ValueError("freeze: nothing to freeze; choose stats=True and/or affine=True")
    layers = [(name, m) for name, m in model.named_modules() if freezable(m)]
    if not layers:
        raise ValueError(f"freeze: {type(model).__name__} has no BatchNorm-family layer "
                         "(bnlab.norms layers or torch.nn.BatchNorm*)")
    if stats:
        missing = [name or "<model>" for name, m in layers
                   if getattr(m, "running_mean", None) is None
                   or getattr(m, "running_var", None) is None]
        if missing:
            raise ValueError(f"freeze(stats=True): {', '.join(missing)} keep no running statistics "
                             "(track_running_stats=False): nothing to normalize with; freeze "
                             "their affine parameters only (stats=False, affine=True)")
    for _, m in layers:
        state = getattr(m, FLAG, None) or {"stats": False, "affine": False, "requires_grad": {}}
        if stats and not state["stats"]:
            m.register_forward_pre_hook(_run_as_eval)
            m.register_forward_hook(_give_training_back, always_call=True)
            state["stats"] = True
        if affine and not state["affine"]:
            for name, p in m.named_parameters(recurse=False):
                state["requires_grad"][name] = p.requires_grad
                p.requires_grad_(False)
            state["affine"] = True
        setattr(m, FLAG, state)
    if "timm.layers.norm_act" in sys.modules:
        extend_timm_unfreeze()
    return model


def unfreeze(model: nn.Module) -> nn.Module:
    """Undo :func:`freeze` in place (statistics and affine); returns ``model``. Layers never frozen
    are left as they are; γ and β get back the ``requires_grad`` they had when frozen."""
    for m in model.modules():
        _unfreeze_layer(m)
    return model


def _unfreeze_layer(m: nn.Module) -> None:
    state = getattr(m, FLAG, None)
    if state is None:
        return
    for hooks, fn in ((m._forward_pre_hooks, _run_as_eval),
                      (m._forward_hooks, _give_training_back)):
        for key in [k for k, hook in hooks.items() if hook is fn]:
            del hooks[key]
            m._forward_hooks_always_called.pop(key, None)
    for name, p in m.named_parameters(recurse=False):
        if name in state["requires_grad"]:
            p.requires_grad_(state["requires_grad"][name])
    delattr(m, FLAG)


def _with_bnlab_layers(timm_unfreeze: Callable[[nn.Module], nn.Module]):
    def unfreeze_batch_norm_2d(module: nn.Module) -> nn.Module:
        _unfreeze_layer(module)  # this module only: timm's walk calls us again for each child
        return timm_unfreeze(module)

    unfreeze_batch_norm_2d.__doc__ = timm_unfreeze.__doc__
    unfreeze_batch_norm_2d.__wrapped__ = timm_unfreeze  # type: ignore[attr-defined]
    unfreeze_batch_norm_2d.bnlab_layers = True  # type: ignore[attr-defined]
    return unfreeze_batch_norm_2d


def extend_timm_unfreeze() -> None:
    """Make timm's ``unfreeze_batch_norm_2d`` undo :func:`freeze` on the layers its walk reaches
    (idempotent; timm must be imported). Its recursion looks the function up in
    ``timm.layers.norm_act`` at each call, so replacing it there reaches every child; the names
    ``timm.layers`` and ``timm.utils.model`` re-export are replaced as well."""
    norm_act = sys.modules["timm.layers.norm_act"]
    if getattr(norm_act.unfreeze_batch_norm_2d, "bnlab_layers", False):
        return
    extended = _with_bnlab_layers(norm_act.unfreeze_batch_norm_2d)
    for name in ("timm.layers.norm_act", "timm.layers", "timm.utils.model", "timm.utils"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "unfreeze_batch_norm_2d"):
            setattr(module, "unfreeze_batch_norm_2d", extended)


def frozen_layers(model: nn.Module) -> dict[str, dict[str, bool]]:
    """``{path: {"stats": ..., "affine": ...}}`` for every layer :func:`freeze` froze."""
    return {name or "<model>": {"stats": state["stats"], "affine": state["affine"]}
            for name, m in model.named_modules() if (state := getattr(m, FLAG, None))}
