"""Fully connected models: MLP, Santurkar's deep linear network, Luo's single-layer perceptron.

They flatten whatever comes in, so ``input_shape`` may be ``(d,)`` or an image shape.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .blocks import BlockFactory
from .catalog import depth, flag, model, units


class FlatNet(nn.Module):
    """``layers`` applied to the flattened input."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.flatten(x, 1))


def flat_size(input_shape: tuple) -> int:
    return int(math.prod(input_shape))


def _stack(f: BlockFactory, in_features: int, depth: int, width: int, num_classes: int,
           bias: bool | None, logit_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers.append(f.linear_unit(in_features, width, bias=bias))
        in_features = width
    layers.append(f.classifier(in_features, num_classes, bias=True if bias is None else bias,
                               logit_norm=logit_norm))
    return nn.Sequential(*layers)


@model("mlp", "-", images_only=False,
       params={"depth": depth(3), "width": units(128), "logit_bn": flag(False, "BN on the logits")})
def mlp(f: BlockFactory, input_shape: tuple, num_classes: int, *, depth: int = 3, width: int = 128,
        logit_bn: bool = False) -> FlatNet:
    """Multilayer perceptron: ``depth`` linear layers (``depth − 1`` hidden blocks of ``width``
    units + output).

    ``logit_bn=True`` puts the model's norm on the logits as well (Arora et al. 2019, Eq. 2): every
    weight matrix is then scale-invariant.
    """
    return FlatNet(_stack(f, flat_size(input_shape), depth, width, num_classes, bias=None,
                          logit_norm=logit_bn))


@model("dln", "Santurkar et al. 2018, App. A.1", images_only=False, default_activation="identity",
       params={"depth": depth(25), "width": units(10),
               "bias": flag(False, "linear layers' biases")})
def dln(f: BlockFactory, input_shape: tuple, num_classes: int, *, depth: int = 25, width: int = 10,
        bias: bool = False) -> FlatNet:
    """Santurkar et al. 2018 App. A.1 deep linear network: ``depth`` (25) linear layers of ``width``
    (10).

    The paper minimizes ‖W_1⋯W_k x − Ax‖², so layers have no bias by default and the activation is
    the identity; with a norm, each of the first ``depth − 1`` layers is followed by it. The output
    dimension is ``num_classes`` (the regression target's dimension, 10 in the paper).
    """
    return FlatNet(_stack(f, flat_size(input_shape), depth, width, num_classes, bias=bias))


@model("perceptron", "Luo et al. 2019, §2-3, Fig. 1(a)", images_only=False,
       params={"bias": flag(None, "a bias (none: only without a norm)")})
def perceptron(f: BlockFactory, input_shape: tuple, num_classes: int, *,
               bias: bool | None = None) -> FlatNet:
    """Luo et al. 2019 §2, Fig. 1(a): single-layer perceptron ``y = g(BN(wᵀx))``, ``num_classes``
    units.

    The only layer carries the norm (the exception to "no norm on the output layer"): pass
    ``num_classes=1`` for Luo's single unit in the teacher–student setting. ``bias=None`` means
    "none when the norm removes the mean", as for every other block.
    """
    return FlatNet(nn.Sequential(f.linear_unit(flat_size(input_shape), num_classes, bias=bias)))
