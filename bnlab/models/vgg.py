"""VGG-style convolutional networks of the papers: Santurkar's, Arora's, Peng's VGG-16 and Luo's
CNN.

All convolutions are 3×3, stride 1, padding 1 (size-preserving); pooling is 2×2 max pooling with
stride 2. Small inputs (e.g. 1×8×8 digits) are handled by skipping a pooling stage once the feature
map is down to 1 pixel along a side, and the first fully connected layer is sized from the actual
flattened feature map (C·H·W), so a CIFAR input reproduces the papers' layer sizes exactly.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from bnlab.spec import Param, check_choice

from .blocks import BlockFactory, scaled
from .catalog import flag, model, width

PADDING_MODES = ("zeros", "replicate")
PADDING = Param("zeros", str, choices=PADDING_MODES, help="the convs' padding")
FC_WIDTHS = Param((), tuple, item=int, minimum=1, help="hidden fully connected widths")


def with_padding(f: BlockFactory, padding_mode: str) -> BlockFactory:
    """The factory with its convs' ``padding_mode`` set (one of :data:`PADDING_MODES`); same
    generator."""
    check_choice("padding_mode", padding_mode, PADDING_MODES)
    return (f if padding_mode == f.padding_mode
            else dataclasses.replace(f, padding_mode=padding_mode))

POOL = "M"

# Santurkar et al. 2018 (App. A.1) say only "a VGG-like network [Simonyan & Zisserman]" for
# CIFAR-10; we take VGG configuration A (VGG-11: 8 conv + 3 fc), the plainest member of the family.
SANTURKAR_CONVS = [64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL]
SANTURKAR_FCS = [512, 512]
# Arora et al. 2019, App. D: 2×conv64, pool, 3×conv128, pool, 3×conv256, pool, 3×conv512, pool,
# 3×conv512, pool, fc512, fc10; BN right before each ReLU, after every conv and fc layer.
ARORA_CONVS = [64, 64, POOL, 128, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512,
               512, 512, POOL]
ARORA_FCS = [512]
# VGG-16 (configuration D) in its usual CIFAR form (13 conv layers, then one classifier layer on the
# 512-d feature), the variant of the PyTorch CIFAR code bases Peng et al. build on.
VGG16_CONVS = [64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512, 512,
               512, POOL]
# Luo et al. 2019 §5 (after Salimans & Kingma 2016): conv(3,32)-conv(3,32)-conv(3,64)-conv(3,64)-
# pool(2,2)-fc(512)-fc(10).
LUO_CONVS = [32, 32, 64, 64, POOL]
LUO_FCS = [512]


class ConvNet(nn.Module):
    """``features`` (conv blocks and pools) → flatten → ``classifier`` (fc blocks, final linear
    layer)."""

    def __init__(self, features: nn.Sequential, classifier: nn.Sequential) -> None:
        super().__init__()
        self.features = features
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def image_shape(input_shape: tuple, model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"{model} needs image input of shape (C, H, W), got "
                         f"input_shape={tuple(input_shape)}")
    return tuple(input_shape)


def make_features(f: BlockFactory, cfg: list, input_shape: tuple,
                  width: float) -> tuple[nn.Sequential, int]:
    """Conv blocks and pools from a VGG config list; returns the module and the flattened output
    size."""
    channels, height, wide = input_shape
    layers: list[nn.Module] = []
    for item in cfg:
        if item == POOL:
            # A pool on a 1-pixel side would leave nothing; small inputs skip the late pooling
            # stages.
            if min(height, wide) >= 2:
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                height, wide = height // 2, wide // 2
            continue
        out = scaled(item, width)
        layers.append(f.conv_unit(channels, out))
        channels = out
    return nn.Sequential(*layers), channels * height * wide


def make_classifier(f: BlockFactory, in_features: int, hidden: list[int], num_classes: int,
                    width: float, logit_norm: bool = False,
                    head_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for units in hidden:
        out = scaled(units, width)
        layers.append(f.linear_unit(in_features, out))
        in_features = out
    layers.append(f.classifier(in_features, num_classes, logit_norm=logit_norm,
                               head_norm=head_norm))
    return nn.Sequential(*layers)


def vgg_net(f: BlockFactory, input_shape: tuple, num_classes: int, convs: list, fcs: list,
            width: float, model: str, logit_norm: bool = False,
            head_norm: bool = False) -> ConvNet:
    features, flat = make_features(f, convs, image_shape(input_shape, model), width)
    return ConvNet(features, make_classifier(f, flat, fcs, num_classes, width, logit_norm,
                                             head_norm))


@model("vgg_santurkar", "Santurkar et al. 2018, App. A.1", images_only=True,
       params={"width": width()})
def vgg_santurkar(f: BlockFactory, input_shape: tuple, num_classes: int, *,
                  width: float = 1.0) -> ConvNet:
    """Santurkar et al. 2018 App. A.1 VGG-like CIFAR net: VGG-A (8 conv) + fc512-fc512-fc."""
    return vgg_net(f, input_shape, num_classes, SANTURKAR_CONVS, SANTURKAR_FCS, width,
                   "vgg_santurkar")


@model("vgg_arora", "Arora, Li & Lyu 2019, App. D", images_only=True,
       params={"width": width(), "logit_bn": flag(True, "BN on the logits (App. D)")})
def vgg_arora(f: BlockFactory, input_shape: tuple, num_classes: int, *, width: float = 1.0,
              logit_bn: bool = True) -> ConvNet:
    """Arora et al. 2019 App. D: modified VGG, 14 conv (64×2,128×3,256×3,512×3,512×3) + fc512-fc-BN.

    The last BN sits on the logits (Eq. 2; App. D: "every kernel is scale-invariant ... only β and γ
    in the last BN are scale-variant"); ``logit_bn=False`` drops it.
    """
    return vgg_net(f, input_shape, num_classes, ARORA_CONVS, ARORA_FCS, width, "vgg_arora",
                   logit_bn)


@model("vgg16", "Simonyan & Zisserman 2015 (D); Peng et al. (CBN)", images_only=True,
       params={"width": width(), "fc_widths": FC_WIDTHS, "padding_mode": PADDING,
               "head_norm": flag(False, "the model's norm in front of the final linear layer")})
def vgg16(f: BlockFactory, input_shape: tuple, num_classes: int, *, width: float = 1.0,
          fc_widths: tuple = (), padding_mode: str = "zeros", head_norm: bool = False) -> ConvNet:
    """CIFAR VGG-16 as in Peng et al.: 13 conv (configuration D) + linear classifier on 512
    features.

    ``fc_widths=(512, 512)`` adds the two hidden fc blocks of the ImageNet-style 16-weight-layer
    variant. VGG has no shortcuts (𝕀(SC) = 0 in Peng's Eq. 7), so the residual forms coincide and
    there is no ``residual`` option. ``padding_mode``: ``"zeros"`` (the paper's) or ``"replicate"``.
    ``head_norm``: the model's norm in front of the final linear layer (the last classifier item
    becomes ``[norm, linear]``; Peng's Fig. 1(c) neither shows nor excludes it), off by default.
    """
    return vgg_net(with_padding(f, padding_mode), input_shape, num_classes, VGG16_CONVS,
                   list(fc_widths), width, "vgg16", head_norm=head_norm)


@model("luo_cnn", "Luo et al. 2019, §5", images_only=True, params={"width": width()})
def luo_cnn(f: BlockFactory, input_shape: tuple, num_classes: int, *,
            width: float = 1.0) -> ConvNet:
    """Luo et al. 2019 §5: conv32-conv32-conv64-conv64-pool-fc512-fc (3×3 convs, 2×2 max pool)."""
    return vgg_net(f, input_shape, num_classes, LUO_CONVS, LUO_FCS, width, "luo_cnn")
