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
whole model. On import, torch's own ``torch.nn.utils.fusion.fuse_conv_bn_eval`` /
``fuse_linear_bn_eval`` and torch.ao's ``fuse_modules`` are extended to do the same for bnlab's
layers (:func:`extend_torch_fusion`); torch's layers still reach torch's code unchanged.
"""

from __future__ import annotations

import copy
import importlib
from typing import Callable, TypeVar

import torch
import torch.ao.nn.intrinsic as nni
import torch.nn as nn
import torch.nn.utils as utils
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.utils import fusion

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


# torch's own fusion functions, made right for bnlab's layers. torch.ao's ``fuse_modules`` looks a
# fuser up by the exact module types (none for bnlab's: "did not find fuser method"), and
# ``torch.nn.utils.fusion.fuse_conv_bn_eval`` applies plain BN's eval formula to whatever
# ``running_mean``/``running_var`` a layer holds (wrong for cbn, var_only_bn, lp_bn). Both are
# extended on import, for bnlab's layers only: everything else reaches torch's code unchanged.


def _conv_relu(linear_or_conv: nn.Module, relu: nn.Module) -> nn.Module:
    fused = {nn.Conv1d: nni.ConvReLU1d, nn.Conv2d: nni.ConvReLU2d, nn.Conv3d: nni.ConvReLU3d,
             nn.Linear: nni.LinearReLU}.get(type(linear_or_conv))
    if fused is None:
        raise ValueError(f"fuse_modules: no fused {type(linear_or_conv).__name__} + ReLU module "
                         "in torch.ao; fuse the first two modules only, or use bnlab.norms.fold")
    return fused(linear_or_conv, relu)


def fuse_bnlab_modules(is_qat: bool, first: nn.Module, norm: nn.Module,
                       relu: nn.Module | None = None) -> nn.Module:
    """torch.ao's fuser method (``fuser_method(is_qat, *modules)``) for a conv or linear followed
    by any BatchNorm-family layer (and a ReLU): the eval-mode fusion of :func:`fuse_conv_bn_eval`.
    Quantization-aware training (``is_qat``, ``fuse_modules_qat``) would train torch's fused
    conv-bn, plain BN's method, in place of the layer's: ``ValueError`` naming the alternatives."""
    name = type(norm).__name__
    if is_qat:
        raise ValueError(f"fuse_modules_qat: {name} cannot be fused for quantization-aware "
                         "training (torch.ao's fused modules train plain BatchNorm, not "
                         f"{name}); train unfused, then fuse in eval mode (fuse_modules or "
                         "bnlab.norms.fold)")
    if first.training or norm.training:
        raise ValueError("fuse_modules: fusion only for eval: call .eval() on the model "
                         "(or use fuse_modules_qat for torch's own layers)")
    if isinstance(first, nn.Linear):
        fused: nn.Module = fuse_linear_bn_eval(first, norm)
    elif isinstance(first, _ConvNd):
        fused = fuse_conv_bn_eval(first, norm, transpose=first.transposed)
    else:
        raise ValueError(f"fuse_modules: cannot fuse {type(first).__name__} with {name}: "
                         "the first module must be a convolution or nn.Linear")
    return fused if relu is None else _conv_relu(fused, relu)


def _bnlab_pattern(op_list: tuple) -> bool:
    return (len(op_list) in (2, 3) and isinstance(op_list[1], type)
            and issubclass(op_list[1], BATCH_NORMS)
            and (len(op_list) == 2 or issubclass(op_list[2], nn.ReLU)))


def _extend_torch_ao() -> None:
    # the submodule (the package's attribute of that name is the function)
    module = importlib.import_module("torch.ao.quantization.fuse_modules")
    torch_lookup = module.get_fuser_method
    if getattr(torch_lookup, "bnlab_layers", False):
        return

    def get_fuser_method(op_list, additional_fuser_method_mapping=None):
        known = torch.ao.quantization.fuser_method_mappings._DEFAULT_OP_LIST_TO_FUSER_METHOD
        if (_bnlab_pattern(op_list) and op_list not in known
                and op_list not in (additional_fuser_method_mapping or {})):
            return fuse_bnlab_modules
        return torch_lookup(op_list, additional_fuser_method_mapping)

    get_fuser_method.bnlab_layers = True  # type: ignore[attr-defined]
    get_fuser_method.__wrapped__ = torch_lookup  # type: ignore[attr-defined]
    setattr(module, "get_fuser_method", get_fuser_method)


def _extend_torch_fusion() -> None:
    """``torch.nn.utils.fusion.fuse_{conv,linear}_bn_eval`` (and their ``torch.nn.utils`` names)
    fold a bnlab layer with the layer's own eval map; torch's layers are passed to torch's."""
    torch_conv, torch_linear = fusion.fuse_conv_bn_eval, fusion.fuse_linear_bn_eval
    if getattr(torch_conv, "bnlab_layers", False):
        return

    def conv_fn(conv, bn, transpose=False):
        if isinstance(bn, ChannelNorm):
            return fuse_conv_bn_eval(conv, bn, transpose)
        return torch_conv(conv, bn, transpose)

    def linear_fn(linear, bn):
        return (fuse_linear_bn_eval(linear, bn) if isinstance(bn, ChannelNorm)
                else torch_linear(linear, bn))

    for fn, original in ((conv_fn, torch_conv), (linear_fn, torch_linear)):
        fn.__doc__, fn.__name__ = original.__doc__, original.__name__
        fn.__wrapped__ = original  # type: ignore[attr-defined]
        fn.bnlab_layers = True  # type: ignore[attr-defined]
    for owner in (fusion, utils):
        setattr(owner, "fuse_conv_bn_eval", conv_fn)
        setattr(owner, "fuse_linear_bn_eval", linear_fn)


def extend_torch_fusion() -> None:
    """Extend torch's ``fuse_conv_bn_eval``/``fuse_linear_bn_eval`` and torch.ao's
    ``fuse_modules`` to bnlab's layers (run on ``import bnlab.norms``; idempotent)."""
    _extend_torch_fusion()
    _extend_torch_ao()


extend_torch_fusion()
