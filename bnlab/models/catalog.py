"""The model catalogue: ``MODEL_INFO``, a :class:`bnlab.spec.Registry` filled by the :func:`model`
decorator that sits on each builder (``vgg.py``, ``resnet.py``, ``mlp.py``, ``vision.py``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch.nn as nn

from bnlab.spec import Param, Registry


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


# name -> ModelInfo; each model's options are typed Params read from its builder's signature.
MODEL_INFO: Registry[ModelInfo] = Registry("model", names_label="models", key_label="option")


def _option_param(key: str, default: Any) -> Param:
    """A model option's type and range, from its default: counts >= 1 (depth >= 2), widths > 0 and
    finite, layer-width lists of counts >= 1; ``bias`` is true/false (None: automatic)."""
    if key == "bias" or isinstance(default, bool):
        return Param(default, bool, nullable=default is None)
    if isinstance(default, int):
        return Param(default, int, minimum=2 if key == "depth" else 1)
    if isinstance(default, float):
        return Param(default, float, positive=True, finite=True)
    if isinstance(default, tuple):
        return Param(default, tuple, item=int, minimum=1)
    return Param(default, None if default is None else type(default), nullable=default is None)


def model(name: str, paper: str, *, images_only: bool, default_activation: str = "relu") -> Callable:
    """Decorator: register ``build(factory, input_shape, num_classes, **options)`` as model ``name``;
    its keyword-only parameters are the model's options (types and ranges by :func:`_option_param`)."""
    def decorate(build: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        sig = inspect.signature(build).parameters.values()
        params = {p.name: _option_param(p.name, p.default) for p in sig if p.kind is inspect.Parameter.KEYWORD_ONLY}
        MODEL_INFO.add(name, ModelInfo(name, build, paper, images_only, default_activation), params)
        return build
    return decorate
