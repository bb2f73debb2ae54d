"""bnlab's layers where tools find BatchNorm by type: the predicate, weight-decay groups, fusion.

bnlab's layers are not instances of torch's ``_BatchNorm`` (docs/readme/tools.md says why: torch's
``convert_sync_batchnorm`` would replace every variant by plain ``SyncBatchNorm``, and
``fuse_conv_bn_eval``, timm's ``freeze_batch_norm_2d`` and torch.ao's fusion would apply plain BN's
eval map to layers whose eval map is another). So a rule written ``isinstance(m, nn.BatchNorm2d)``
skips them; :data:`BATCH_NORMS` and :func:`is_batch_norm` are the ones to write instead, and
:func:`param_groups_no_decay` is the common "no weight decay on normalization layers" rule.
:func:`fuse_conv_bn_eval` / :func:`fuse_linear_bn_eval` take torch's signatures and fold any
layer's eval map (each layer's own ``inference_affine``; Ioffe & Szegedy 2015, "Batch
Normalization: Accelerating Deep Network Training by Reducing Internal Covariate Shift", §3.2: in
eval mode the normalization is a linear transform); :func:`bnlab.norms.fold` does the same for a
whole model.
"""

from __future__ import annotations

import copy
from typing import Callable, TypeVar

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ..variants.base import ChannelNorm
from .fold import eval_affine

# Every BatchNorm-family layer: bnlab's (all derive from ChannelNorm, also si_bn's inner norm)
# and torch's (BatchNorm1d/2d/3d, SyncBatchNorm, lazy ones, bnlab's native_bn).
BATCH_NORMS: tuple[type[nn.Module], ...] = (ChannelNorm, _BatchNorm)

ConvT = TypeVar("ConvT", bound=_ConvNd)


def is_batch_norm(module: nn.Module) -> bool:
    """``isinstance(module, BATCH_NORMS)``: a BatchNorm-family layer, bnlab's or torch's."""
    return isinstance(module, BATCH_NORMS)


def param_groups_no_decay(model: nn.Module, weight_decay: float, *,
                          no_decay: Callable[[nn.Module], bool] = is_batch_norm) -> list[dict]:
    """Two optimizer parameter groups: ``weight_decay`` for every parameter except those of the
    modules ``no_decay`` selects (BatchNorm-family layers: γ, β), which get 0.

    The rule written ``isinstance(m, nn.BatchNorm2d)``, for bnlab's layers too. Each parameter is
    counted once, in the module that owns it. ``torch.optim.SGD(param_groups_no_decay(model, 5e-4),
    lr=0.1)``.
    """
    decay: list[nn.Parameter] = []
    exempt: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        group = exempt if no_decay(module) else decay
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                group.append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": exempt, "weight_decay": 0.0}]


def _affine_of(norm: nn.Module, caller: str) -> tuple[Tensor, Tensor]:
    if norm.training:
        raise ValueError(f"{caller}: fusion only for eval: call .eval() on the norm and the layer")
    affine, reason = eval_affine(norm)
    if affine is None:
        raise ValueError(f"{caller}: {type(norm).__name__} cannot be fused: {reason}")
    return affine


@torch.no_grad()
def _scaled(layer, scale: Tensor, shift: Tensor, axis: int):
    fused = copy.deepcopy(layer)
    w = fused.weight
    shape = [1] * w.dim()
    shape[axis] = -1
    bias = fused.bias if fused.bias is not None else torch.zeros_like(scale, dtype=w.dtype)
    fused.weight = nn.Parameter((w * scale.view(shape).to(w.dtype)), w.requires_grad)
    fused.bias = nn.Parameter((bias * scale + shift).to(w.dtype), w.requires_grad)
    return fused


def fuse_conv_bn_eval(conv: ConvT, norm: nn.Module, transpose: bool = False) -> ConvT:
    """``torch.nn.utils.fusion.fuse_conv_bn_eval`` for any BatchNorm-family layer in eval mode.

    A copy of ``conv`` whose output is ``norm(conv(x))``: weight scaled per output channel (dim 1
    of a transposed convolution's weight, ``transpose=True``), bias ``a·b + c`` with the norm's eval
    map ``y = a·x + c`` (each layer's own: cbn's centre and divisor, mbn's inference EMA, ...).
    torch's function reads ``running_mean``/``running_var`` as plain BN's, which is wrong for cbn,
    lp_bn and brn. ``ValueError`` in training mode and for a norm that is not affine in eval mode.
    """
    if conv.training:
        raise ValueError("fuse_conv_bn_eval: fusion only for eval: call .eval() on both modules")
    scale, shift = _affine_of(norm, "fuse_conv_bn_eval")
    return _scaled(conv, scale, shift, 1 if transpose else 0)


def fuse_linear_bn_eval(linear: nn.Linear, norm: nn.Module) -> nn.Linear:
    """``torch.nn.utils.fusion.fuse_linear_bn_eval`` for any BatchNorm-family layer (see
    :func:`fuse_conv_bn_eval`)."""
    if linear.training:
        raise ValueError("fuse_linear_bn_eval: fusion only for eval: call .eval() on both modules")
    scale, shift = _affine_of(norm, "fuse_linear_bn_eval")
    return _scaled(linear, scale, shift, 0)
