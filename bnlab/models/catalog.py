"""The model catalogue: ``MODEL_INFO``, a :class:`bnlab.spec.Registry` filled by the :func:`model`
decorator that sits on each builder (``vgg.py``, ``resnet.py``, ``mlp.py``, ``vision.py``, or a
user's module) with its options as typed :class:`bnlab.spec.Param` s: declared, or read from the
builder's signature."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any

import torch.nn as nn

from bnlab.spec import Param, Registry, signature_params


@dataclass(frozen=True)
class ModelInfo:
    """Catalogue entry: how to build a model, where it comes from, its options and defaults."""

    name: str
    build: Callable[..., nn.Module]  # build(factory, input_shape, num_classes, **options)
    paper: str
    images_only: bool
    default_activation: str = "relu"

    @property
    def options(self) -> dict[str, Any]:
        return {k: p.default for k, p in MODEL_INFO.entry(self.name).params.items()}

    @property
    def summary(self) -> str:
        return (self.build.__doc__ or "").strip().splitlines()[0].replace("``", "")


# name -> ModelInfo; each model's options are the typed Params its @model decorator declares.
MODEL_INFO: Registry[ModelInfo] = Registry("model", names_label="models", key_label="option")


# The option kinds the builders share, declared once (type, range, help) for their decorators.
def depth(default: int) -> Param:
    return Param(default, int, minimum=2, help="linear layers, the output layer included")


def units(default: int) -> Param:
    return Param(default, int, minimum=1, help="units of each hidden layer")


def width(default: float = 1.0) -> Param:
    return Param(default, float, positive=True, help="multiplier of every layer's channels")


def flag(default: bool | None, help: str) -> Param:
    return Param(default, bool, nullable=default is None, help=help)


def model(name: str, paper: str, *, images_only: bool, params: Mapping[str, Param] | None = None,
          default_activation: str = "relu") -> Callable:
    """Decorator: register ``build(factory, input_shape, num_classes, **options)`` as model
    ``name``. Its options are the builder's keyword parameters, typed from their annotations or
    defaults; ``params`` declare some more precisely (same names and defaults, checked here, at
    import, so the declaration and the signature cannot drift: :func:`bnlab.spec.
    signature_params`)."""
    def decorate(build: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        info = ModelInfo(name, build, paper, images_only, default_activation)
        MODEL_INFO.add(name, info, signature_params(build, params))
        return build
    return decorate
