"""timm with bnlab's layers: import beside any torch, build converted models, freeze.

``import bnlab.integrations.timm`` imports timm through :func:`bnlab.models.vision_compat.
import_timm` (torchvision's missing C++ operators declared first where its wheel does not match
the installed torch), so no manual step comes before it, and ``import timm`` works afterwards.

* :func:`create_model`: ``timm.create_model`` then :func:`bnlab.norms.convert` to a spec;
* :func:`freeze_batch_norm_2d`: timm's, for bnlab's layers too (timm's finds ``nn.BatchNorm2d``
  by type and leaves every bnlab layer training): torch's layers become timm's
  ``FrozenBatchNorm2d``, bnlab's are frozen in place (:func:`bnlab.norms.freeze`, statistics and
  affine), with the same outputs;
* :func:`unfreeze_batch_norm_2d`: its inverse, for every layer: timm's ``FrozenBatchNorm2d``
  become ``BatchNorm2d`` again, bnlab's layers train again exactly as before freezing
  (:func:`bnlab.norms.unfreeze`). Importing this module also extends timm's own
  ``unfreeze_batch_norm_2d`` (and ``timm.utils.unfreeze``) to bnlab's frozen layers
  (:func:`bnlab.norms.tools.freeze.extend_timm_unfreeze`), so either route unfreezes them;
* :func:`param_groups_weight_decay`: timm's, unchanged — its rule is by shape (1-D parameters and
  biases get no decay), which bnlab's γ and β follow.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch.nn as nn

from bnlab.models.vision_compat import import_timm
from bnlab.norms.tools.convert import convert
from bnlab.norms.tools.freeze import extend_timm_unfreeze, freezable, freeze, unfreeze

timm = import_timm()
param_groups_weight_decay = importlib.import_module("timm.optim").param_groups_weight_decay
importlib.import_module("timm.utils.model")  # so that its name for unfreeze is extended too
extend_timm_unfreeze()

__all__ = ["create_model", "freeze_batch_norm_2d", "param_groups_weight_decay", "timm",
           "unfreeze_batch_norm_2d"]


def create_model(name: str, norm: str | None = None, **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, **kwargs)``, its BatchNorm layers converted to ``norm`` (a bnlab
    spec such as ``"mbn"``; None keeps torch's)."""
    model = timm.create_model(name, **kwargs)
    return model if norm is None else convert(model, norm)


def freeze_batch_norm_2d(module: nn.Module) -> nn.Module:
    """timm's ``freeze_batch_norm_2d`` for every layer: returns the (possibly new) module.

    torch's ``BatchNorm2d``/``SyncBatchNorm`` (and timm's norm-act forms) are replaced by timm;
    bnlab's layers, which timm's function does not see, are frozen in place (statistics and
    affine), so every layer computes what timm's ``FrozenBatchNorm2d`` would.
    """
    module = timm.layers.freeze_batch_norm_2d(module)
    if any(freezable(m) for m in module.modules()):
        freeze(module, stats=True, affine=True)
    return module


def unfreeze_batch_norm_2d(module: nn.Module) -> nn.Module:
    """The inverse of :func:`freeze_batch_norm_2d`: returns the (possibly new) module.

    timm's ``FrozenBatchNorm2d`` become ``BatchNorm2d`` (timm's function); bnlab's frozen layers
    are unfrozen in place (:func:`bnlab.norms.unfreeze`): buffers, ``requires_grad`` and the
    training-mode output are those of a layer never frozen.
    """
    return unfreeze(timm.layers.unfreeze_batch_norm_2d(module))
