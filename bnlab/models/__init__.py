"""The papers' networks, built from one block (linear/conv + any bnlab.norms spec + activation).

``create(name, norm=..., activation=..., placement=..., input_shape=..., num_classes=...)`` builds
any of :data:`MODELS`; ``bnlab models list`` prints the catalogue. See ``docs/readme/models.md``.
"""

from .registry import MODEL_INFO, MODELS, ModelInfo, create  # first: it fixes the catalogue's order
from .blocks import ACTIVATIONS, INITS, BlockFactory, activation
from .mlp import FlatNet
from .padding import padding_share, padding_share_by_size, position_share
from .resnet import BasicBlock, ResNet, ZeroPadShortcut
from .vgg import ConvNet

__all__ = [
    "ACTIVATIONS", "BasicBlock", "BlockFactory", "ConvNet", "FlatNet", "INITS", "MODELS",
    "MODEL_INFO", "ModelInfo", "ResNet", "ZeroPadShortcut", "activation", "create", "padding_share",
    "padding_share_by_size", "position_share",
]
