"""torchvision's ImageNet networks with any bnlab norm, activation, placement and residual form.

Peng et al. (Complete BN, Table 5 / Fig. 6) train ResNet-18, ResNet-50 and EfficientNet-B0 on
ILSVRC2012 "following the PyTorch official codes", i.e. torchvision's models, with five activations
and with BN or CBN. ``tv_resnet18``, ``tv_resnet50`` and ``tv_efficientnet_b0`` build those models
(no pretrained weights, torchvision's own initialization) and then:

1. swap the activation: every ``nn.ReLU`` / ``nn.SiLU`` becomes the requested one (EfficientNet's
   squeeze-excitation gate, a ``Sigmoid``, stays: it is a gate, not the network's nonlinearity);
2. ``placement="pre_linear"`` (Peng's Fig. 1(c), CBN's position): every BatchNorm moves in front of
   the convolution that fed it, normalizing that convolution's input (``[conv, bn, act]`` becomes
   ``[bn, conv, act]``; the convolution gets a bias, as bnlab's own pre-linear units do, because no
   mean-removing norm follows it any more);
3. ``residual="peng"`` (ResNets): Peng's Eq. 7 / Eq. 13 block ``x + δ(y)`` — the activation applied
   to the residual branch before the shortcut sum — instead of torchvision's (He's) ``δ(x + y)``;
4. ``bnlab.norms.convert(model, norm)`` replaces every BatchNorm by the requested layer;
5. ``head_norm=true`` (ResNets): the requested norm on the pooled features, in front of ``fc``
   (``fc`` becomes ``[norm, linear]``; Peng's Fig. 1(c) neither shows nor excludes it).

torchvision is imported only when one of these models is built; without it (or where its compiled
extension cannot load) the error says what to install.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

import bnlab.norms as norms
from bnlab.spec import check_choice

from .blocks import BlockFactory, activation
from .catalog import model
from .resnet import HEAD_NORM, RESIDUAL, RESIDUAL_FORMS
from .vision_compat import VisionImportError, import_torchvision

# the nonlinearities of torchvision's ResNets (ReLU) and EfficientNet (SiLU)
SWAPPED = (nn.ReLU, nn.SiLU)


def torchvision_models():
    """``torchvision.models`` (through :func:`bnlab.models.vision_compat.import_torchvision`, so a
    torchvision whose C++ operators do not match torch still gives its Python models), or a
    ``ValueError`` that says how to get a working torchvision."""
    try:
        return import_torchvision().models
    except VisionImportError as err:
        # not installed (a RuntimeError: installed, broken)
        if isinstance(err.__cause__, ImportError):
            raise ValueError("the tv_* models need torchvision: pip install torchvision (the "
                             f"release built for your torch {torch.__version__}); {err}") from None
        raise ValueError(f"the tv_* models need an importable torchvision: {err}") from None


def swap_activations(model: nn.Module, name: str) -> int:
    """Replace every ``nn.ReLU``/``nn.SiLU`` of ``model`` by a fresh ``activation(name)``; returns
    how many."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, SWAPPED):
                setattr(module, child_name, activation(name))
                count += 1
    return count


def _producer(module: nn.Module, norm_name: str) -> str | None:
    """The name of the convolution that feeds the BatchNorm ``norm_name`` inside ``module``, if
    known: the previous child of an ``nn.Sequential`` (``Conv2dNormActivation``, ResNet's
    ``downsample``), or the sibling ``convK`` of ``bnK`` (torchvision's ResNet stem and blocks)."""
    if isinstance(module, nn.Sequential):
        names = [n for n, _ in module.named_children()]
        i = names.index(norm_name)
        return names[i - 1] if i > 0 else None
    match = re.fullmatch(r"bn(\d+)", norm_name)
    return f"conv{match.group(1)}" if match else None


def place_before_convs(model: nn.Module) -> int:
    """Move every ``nn.BatchNorm2d`` in front of the convolution that produced its input
    (pre_linear).

    The moved norm has the convolution's input channels and a fresh state; the old position holds an
    ``nn.Identity``. A BatchNorm whose producing convolution cannot be found is an error naming it
    (nothing is left half-moved: the check runs before any change). Returns the number of norms
    moved.
    """
    plan = []
    for path, module in model.named_modules():
        for name, child in module.named_children():
            if not isinstance(child, nn.BatchNorm2d):
                continue
            conv_name = _producer(module, name)
            conv = getattr(module, conv_name, None) if conv_name else None
            if not isinstance(conv, nn.Conv2d):
                raise ValueError(f"cannot place norm {path + '.' if path else ''}{name} before a "
                                 "linear layer: no convolution found right before it")
            plan.append((module, name, conv_name, conv))
    for module, name, conv_name, conv in plan:
        if conv.bias is None:
            zeros = torch.zeros(conv.out_channels, dtype=conv.weight.dtype,
                                device=conv.weight.device)
            conv.register_parameter("bias", nn.Parameter(zeros))
        norm = nn.BatchNorm2d(conv.in_channels).to(device=conv.weight.device,
                                                   dtype=conv.weight.dtype)
        setattr(module, conv_name, nn.Sequential(norm, conv))
        setattr(module, name, nn.Identity())
    return len(plan)


def peng_residual(model: nn.Module, act: str) -> int:
    """Turn torchvision's residual blocks into Peng's Eq. 7 form ``x + δ(y)``; returns the blocks
    changed.

    torchvision's BasicBlock/Bottleneck apply ``self.relu`` after every ``bnK`` and after the sum.
    Here each ``bnK`` is followed by its own activation and ``self.relu`` becomes the identity, so
    the last activation acts on the branch before the sum and none after it.
    """
    tvm = torchvision_models()
    blocks = [m for m in model.modules()
              if isinstance(m, (tvm.resnet.BasicBlock, tvm.resnet.Bottleneck))]
    for block in blocks:
        names = [n for n, _ in block.named_children() if re.fullmatch(r"bn\d+", n)]
        for name in names:
            extra = [_Copy()] if name == names[-1] else []
            setattr(block, name, nn.Sequential(getattr(block, name), activation(act), *extra))
        block.relu = nn.Identity()
    return len(blocks)


class _Copy(nn.Module):
    """A copy of its input. torchvision's blocks add the shortcut in place (``out += identity``);
    after the branch's last activation that would overwrite the activation's output, which the
    backward of Sigmoid, Tanh and ReLU needs, so the branch ends in a fresh tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def _check_input(name: str, input_shape: tuple, f: BlockFactory) -> None:
    if len(input_shape) != 3 or input_shape[0] != 3:
        raise ValueError(f"{name} takes RGB images (3, H, W); got input shape {tuple(input_shape)}")
    if f.dropout:
        raise ValueError(f"{name} has torchvision's own dropout; the dropout option is not "
                         "supported")


def _finish(model: nn.Module, f: BlockFactory, residual: str | None) -> nn.Module:
    swap_activations(model, f.act)
    if f.placement == "pre_linear":
        place_before_convs(model)
    if residual == "peng":
        peng_residual(model, f.act)
    if f.norm == "none":
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.BatchNorm2d):
                    setattr(module, name, nn.Identity())
        return model
    return norms.convert(model, f.norm)


@model("tv_resnet18", "He et al. 2016 (torchvision); Peng et al. Table 5", images_only=True,
       params={"residual": RESIDUAL, "head_norm": HEAD_NORM})
def tv_resnet18(f: BlockFactory, input_shape: tuple, num_classes: int, *,
                residual: str = "he", head_norm: bool = False) -> nn.Module:
    """torchvision ResNet-18 (He et al. 2016) with bnlab norms; Peng et al. Table 5."""
    return _tv_resnet("resnet18", f, input_shape, num_classes, residual, head_norm)


@model("tv_resnet50", "He et al. 2016 (torchvision); Peng et al. Table 5", images_only=True,
       params={"residual": RESIDUAL, "head_norm": HEAD_NORM})
def tv_resnet50(f: BlockFactory, input_shape: tuple, num_classes: int, *,
                residual: str = "he", head_norm: bool = False) -> nn.Module:
    """torchvision ResNet-50 (He et al. 2016) with bnlab norms; Peng et al. Table 5."""
    return _tv_resnet("resnet50", f, input_shape, num_classes, residual, head_norm)


def _tv_resnet(arch: str, f: BlockFactory, input_shape: tuple, num_classes: int,
               residual: str, head_norm: bool = False) -> nn.Module:
    check_choice("residual", residual, RESIDUAL_FORMS)
    _check_input(f"tv_{arch}", input_shape, f)
    model = getattr(torchvision_models(), arch)(weights=None, num_classes=num_classes)
    model = _finish(model, f, residual)
    if head_norm and f.norm != "none":
        model.fc = f.head(model.fc)
    return model


@model("tv_efficientnet_b0", "Tan & Le 2019 (torchvision); Peng et al. Table 5", images_only=True,
       default_activation="swish")
def tv_efficientnet_b0(f: BlockFactory, input_shape: tuple, num_classes: int) -> nn.Module:
    """torchvision EfficientNet-B0 (Tan & Le 2019) with bnlab norms; Peng et al. Table 5."""
    _check_input("tv_efficientnet_b0", input_shape, f)
    model = torchvision_models().efficientnet_b0(weights=None, num_classes=num_classes)
    return _finish(model, f, None)
