"""The one building block every model is made of: a linear/conv layer, its normalization, an
activation.

``placement="pre_activation"`` (the usual BN position, Peng et al. Fig. 1(b); Ioffe & Szegedy 2015):
``layer → norm → act``. ``placement="pre_linear"`` (CBN's position, Peng et al. Fig. 1(c)): the norm
sits in front of the layer, ``norm → layer → act``, so it normalizes the previous block's
activations; for the first block that is the raw network input, as in Peng's Fig. 1(c). Either way
every hidden layer owns exactly one norm and the final classifier layer none.

The layer and its norm are built by :func:`bnlab.norms.normalized`, which returns them as neighbours
inside one ``nn.Sequential``; the activation is appended to that same ``nn.Sequential``, so
``bnlab.norms.fold`` finds ``[layer, norm]`` (or ``[norm, layer]``) pairs and each norm has a
readable module path such as ``features.3.1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

import bnlab.norms as norms
from bnlab.norms.ops import spec_parts
from bnlab.norms.registry import lookup
from bnlab.spec import check_choice

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "selu": nn.SELU,
    "swish": nn.SiLU,  # swish with β = 1 (Ramachandran et al. 2017), x·sigmoid(x)
    "softplus": nn.Softplus,
    "identity": nn.Identity,
}

INITS = ("glorot", "xavier", "kaiming")


def activation(name: str) -> nn.Module:
    """A fresh activation module by name (see :data:`ACTIVATIONS`)."""
    check_choice("activation", name, tuple(ACTIVATIONS))
    return ACTIVATIONS[name]()


def scaled(channels: int, width: float) -> int:
    """A width multiplier applied to a channel/unit count; never below one unit."""
    return max(1, int(round(channels * width)))


@dataclass
class BlockFactory:
    """Builds the blocks of one model with one norm spec, placement, activation and initialization.

    ``init="glorot"`` (alias ``"xavier"``): Glorot & Bengio 2010 uniform, Var(w) =
    2/(fan_in+fan_out), what Arora et al. (App. D) and Peng et al. (App., remark on Eq. 30) use.
    ``init="kaiming"``: He et al. 2015 normal, Var(w) = 2/fan_in. Biases start at 0. Draws go
    through ``generator`` when given, else through torch's global RNG (so ``torch.manual_seed``
    fixes them).
    """

    norm: str = "bn"
    placement: str = "pre_activation"
    act: str = "relu"
    init: str = "glorot"
    generator: torch.Generator | None = None
    # Luo et al. Fig. 7: dropout after each normalized block (after its activation)
    dropout: float = 0.0
    # of every conv: "zeros" (the papers') or "replicate" (a proxy check, see padding_share)
    padding_mode: str = "zeros"

    # ---- layers ------------------------------------------------------------------------------
    def initialize(self, layer: nn.Module) -> nn.Module:
        # Before any wrapper (WN) is applied, so WN's g = ‖v‖ starts from the initialized weight.
        if self.init in ("glorot", "xavier"):
            nn.init.xavier_uniform_(layer.weight, generator=self.generator)
        else:
            nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu",
                                    generator=self.generator)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
        return layer

    def layer_bias(self) -> bool:
        # A mean-removing norm right after the layer makes its bias redundant, and without a bias
        # the weight is exactly scale-invariant (Arora et al. 2019, §2). In pre_linear placement the
        # activation sits between the layer and the next norm, so the bias matters.
        return self.placement == "pre_linear" or not norms.removes_mean(self.norm)

    def conv(self, in_channels: int, out_channels: int, *, kernel_size: int = 3, stride: int = 1,
             padding: int = 1, bias: bool | None = None) -> nn.Conv2d:
        bias = self.layer_bias() if bias is None else bias
        return self.initialize(nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                                         padding=padding, bias=bias,
                                         padding_mode=self.padding_mode))

    def linear(self, in_features: int, out_features: int, *, bias: bool | None = None) -> nn.Linear:
        bias = self.layer_bias() if bias is None else bias
        return self.initialize(nn.Linear(in_features, out_features, bias=bias))

    def classifier(self, in_features: int, out_features: int, *, bias: bool = True,
                   logit_norm: bool = False, head_norm: bool = False) -> nn.Module:
        """The final layer: no activation; no norm unless ``logit_norm`` or ``head_norm``.

        ``head_norm=True`` (Peng et al. Fig. 1(c), a CBN in front of the linear layer it feeds,
        read as reaching the classifier too): ``[norm, linear]``, the model's norm on the
        classifier's input features, whatever the placement of the hidden blocks. The linear layer
        keeps its bias (nothing after it removes a mean). With ``norm="none"`` it is the plain
        linear layer; a wrapper spec (``wn``, ``si_bn``) has no norm to place and is refused.

        ``logit_norm=True`` (Arora et al. 2019, Eq. 2 and App. D): the model's norm on the logits,
        ``norm(W x)``, so the classifier weight is scale-invariant like every other kernel and only
        that last norm's γ and β are scale-variant. The norm always follows the layer (Eq. 2),
        whatever the placement; the layer has no bias when the norm removes the mean. With
        ``norm="none"`` it is the plain linear layer.
        """
        if logit_norm and head_norm:
            raise ValueError("classifier: logit_norm and head_norm are exclusive")
        if head_norm and self.norm != "none":
            return self.head(self.initialize(nn.Linear(in_features, out_features, bias=bias)))
        if not logit_norm or self.norm == "none":
            return self.initialize(nn.Linear(in_features, out_features, bias=bias))
        layer = self.initialize(nn.Linear(in_features, out_features,
                                          bias=not norms.removes_mean(self.norm)))
        return norms.normalized(layer, self.norm, "pre_activation")

    def head(self, layer: nn.Module) -> nn.Sequential:
        """``[norm, layer]``: this factory's norm spec in front of ``layer`` (see
        :meth:`classifier`'s ``head_norm``); a ``ValueError`` for a wrapper spec."""
        if any(lookup(part)[0].kind == "wrapper" for part in spec_parts(self.norm)):
            raise ValueError(f"head_norm needs a normalization layer; {self.norm!r} wraps the "
                             "linear layer instead (use a norm such as bn or cbn, or "
                             "head_norm=false)")
        return norms.normalized(layer, self.norm, "pre_linear")

    # ---- blocks ------------------------------------------------------------------------------
    def unit(self, layer: nn.Module, *, with_activation: bool = True) -> nn.Sequential:
        """``[layer, norm, act]`` (pre_activation) or ``[norm, layer, act]`` (pre_linear) as one
        Sequential.

        ``with_activation=False`` leaves the activation to the caller (ResNet: after the residual
        sum).
        """
        block = norms.normalized(layer, self.norm, self.placement)
        if with_activation:
            block.append(activation(self.act))
            if self.dropout > 0:
                block.append(nn.Dropout(self.dropout))
        return block

    def conv_unit(self, in_channels: int, out_channels: int, **kw) -> nn.Sequential:
        with_activation = kw.pop("with_activation", True)
        return self.unit(self.conv(in_channels, out_channels, **kw),
                         with_activation=with_activation)

    def linear_unit(self, in_features: int, out_features: int, *, bias: bool | None = None,
                    with_activation: bool = True) -> nn.Sequential:
        return self.unit(self.linear(in_features, out_features, bias=bias),
                         with_activation=with_activation)

    def activation(self) -> nn.Module:
        return activation(self.act)
