"""ResNet-20 for CIFAR (He et al. 2016, §4.2), as used by Peng et al. for CBN.

3×3 conv (16) → 3 stages × 3 basic blocks (16, 32, 64 channels; stages 2 and 3 start with stride 2)
→ global average pool → fc: 6·3 + 2 = 20 weight layers (19 conv + 1 fc). Shortcuts are He's option A
(identity, with subsampling and zero-padded extra channels where the shape changes), so they add no
weights and no norms; the well-known 0.27M parameters (269,722 with BN) follow.

Norm placement applies inside blocks. ``pre_activation`` is He's block,
``x → [conv, norm, act] → [conv, norm] (+ shortcut) → act``; ``pre_linear`` is Peng's Fig. 1(c),
``x → [norm, conv, act] → [norm, conv] (+ shortcut) → act``, so the first norm of a block sees the
block input (the shortcut does not pass through it).

``residual`` says where the block's last activation sits relative to the shortcut sum: ``"he"`` (He
et al. 2016): ``act(F(x) + shortcut(x))``; ``"peng"`` (Peng et al. Eq. 7, and Eq. 13 for the BN
block): ``x⁽ˡ⁺¹⁾ = 𝕀(SC)·x⁽ˡ⁾ + δ(y⁽ˡ⁾)``, the activation applied to the residual branch before the
sum, ``shortcut(x) + act(F(x))``. With a bounded activation (Sigmoid, Tanh) the two differ a lot:
He's form squashes the running sum at every block, Eq. 7's lets it grow. Module paths follow Peng's
Fig. 2 naming (``stage1.0.unit1`` is "layer#2": the first unit of block 0 of stage 1; ``stem`` is
layer #1).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bnlab.spec import Param, check_choice

from .blocks import BlockFactory, scaled
from .catalog import model, width
from .vgg import PADDING, image_shape, with_padding


class ZeroPadShortcut(nn.Module):
    """He et al.'s option-A shortcut: subsample by ``stride``, pad the new channels with zeros."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        extra = self.out_channels - self.in_channels
        if extra:
            x = F.pad(x, (0, 0, 0, 0, extra // 2, extra - extra // 2))
        return x

    def extra_repr(self) -> str:
        return f"{self.in_channels}->{self.out_channels}, stride={self.stride}"


RESIDUAL_FORMS = ("he", "peng")
RESIDUAL = Param("he", str, choices=RESIDUAL_FORMS, help="act after (he) or before (peng) the sum")
HEAD_NORM = Param(False, bool, help="the model's norm on the pooled features, before the fc")


class BasicBlock(nn.Module):
    """Two conv units and a shortcut; ``residual`` = ``"he"`` (act after the sum) or ``"peng"`` (Eq.
    7: before)."""

    def __init__(self, f: BlockFactory, in_channels: int, out_channels: int, stride: int,
                 residual: str = "he") -> None:
        super().__init__()
        check_choice("residual", residual, RESIDUAL_FORMS)
        self.residual = residual
        self.unit1 = f.conv_unit(in_channels, out_channels, stride=stride)
        # Eq. 7's activation belongs to the branch (inside unit2, so fold/probes see one unit)
        self.unit2 = f.conv_unit(out_channels, out_channels, with_activation=residual == "peng")
        if stride != 1 or in_channels != out_channels:
            self.shortcut = ZeroPadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()
        self.act = f.activation() if residual == "he" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.unit2(self.unit1(x)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, stem: nn.Module, stages: list[nn.Sequential], fc: nn.Linear) -> None:
        super().__init__()
        self.stem = stem
        for i, stage in enumerate(stages, start=1):
            self.add_module(f"stage{i}", stage)
        self.num_stages = len(stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(1, self.num_stages + 1):
            x = getattr(self, f"stage{i}")(x)
        return self.fc(torch.flatten(self.pool(x), 1))


@model("resnet20", "He et al. 2016 §4.2; Peng et al. (CBN)", images_only=True,
       params={"width": width(), "residual": RESIDUAL, "padding_mode": PADDING,
               "head_norm": HEAD_NORM})
def resnet20(f: BlockFactory, input_shape: tuple, num_classes: int, *, width: float = 1.0,
             residual: str = "he", padding_mode: str = "zeros", head_norm: bool = False) -> ResNet:
    """He et al. 2016 CIFAR ResNet-20 (3 stages × 3 basic blocks, 16/32/64 channels) as Peng et al.
    use.

    ``residual``: ``"he"`` (activation after the shortcut sum) or ``"peng"`` (Peng Eq. 7: before
    it). ``padding_mode``: the convs' padding, ``"zeros"`` (the paper's) or ``"replicate"``.
    ``head_norm``: the model's norm on the pooled features in front of ``fc`` (``fc`` becomes
    ``[norm, linear]``; Peng's Fig. 1(c) neither shows nor excludes it), off by default.
    """
    check_choice("residual", residual, RESIDUAL_FORMS)
    f = with_padding(f, padding_mode)
    channels = image_shape(input_shape, "resnet20")[0]
    widths = [scaled(c, width) for c in (16, 32, 64)]
    stem = f.conv_unit(channels, widths[0])
    stages, in_ch = [], widths[0]
    for index, out_ch in enumerate(widths):
        blocks = []
        for b in range(3):
            stride = 2 if (index > 0 and b == 0) else 1
            blocks.append(BasicBlock(f, in_ch, out_ch, stride, residual))
            in_ch = out_ch
        stages.append(nn.Sequential(*blocks))
    return ResNet(stem, stages, f.classifier(in_ch, num_classes, head_norm=head_norm))
