"""Model registry: ``MODELS`` (name → builder) and ``create(name, ...)``."""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

import bnlab.norms as norms
from bnlab.spec import Param, Registry

from . import mlp as _mlp
from . import resnet as _resnet
from . import vgg as _vgg
from . import vision as _vision
from .blocks import ACTIVATIONS, INITS, BlockFactory, check_choice


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


def _add(info: ModelInfo) -> None:
    sig = inspect.signature(info.build).parameters.values()
    params = {p.name: _option_param(p.name, p.default) for p in sig if p.kind is inspect.Parameter.KEYWORD_ONLY}
    MODEL_INFO.add(info.name, info, params)


# name -> ModelInfo; each model's options are typed bnlab.spec Params read from its builder's signature.
MODEL_INFO: Registry[ModelInfo] = Registry("model", names_label="models", key_label="option")
for _info in (
    ModelInfo("vgg_santurkar", _vgg.vgg_santurkar, "Santurkar et al. 2018, App. A.1", True),
    ModelInfo("vgg_arora", _vgg.vgg_arora, "Arora, Li & Lyu 2019, App. D", True),
    ModelInfo("luo_cnn", _vgg.luo_cnn, "Luo et al. 2019, §5", True),
    ModelInfo("resnet20", _resnet.resnet20, "He et al. 2016 §4.2; Peng et al. (CBN)", True),
    ModelInfo("vgg16", _vgg.vgg16, "Simonyan & Zisserman 2015 (D); Peng et al. (CBN)", True),
    ModelInfo("dln", _mlp.dln, "Santurkar et al. 2018, App. A.1", False, default_activation="identity"),
    ModelInfo("mlp", _mlp.mlp, "-", False),
    ModelInfo("perceptron", _mlp.perceptron, "Luo et al. 2019, §2-3, Fig. 1(a)", False),
    # torchvision's ImageNet networks (imported only when built): Peng et al. Table 5 / Fig. 6
    ModelInfo("tv_resnet18", _vision.tv_resnet18, "He et al. 2016 (torchvision); Peng et al. Table 5", True),
    ModelInfo("tv_resnet50", _vision.tv_resnet50, "He et al. 2016 (torchvision); Peng et al. Table 5", True),
    ModelInfo("tv_efficientnet_b0", _vision.tv_efficientnet_b0, "Tan & Le 2019 (torchvision); Peng et al. Table 5",
              True, default_activation="swish"),
):
    _add(_info)


def _check_shape(input_shape: Any, num_classes: Any) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = None
    if not shape or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive integers, got {input_shape!r}")
    if not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return tuple(int(s) for s in shape)


def _make_builder(info: ModelInfo) -> Callable[..., nn.Module]:
    def builder(*, norm: str = "bn", activation: str | None = None, placement: str = "pre_activation",
                input_shape: tuple = (3, 32, 32), num_classes: int = 10, init: str = "glorot",
                seed: int | None = None, dropout: float = 0.0, **options: Any) -> nn.Module:
        norm = "none" if norm is None else norm
        norms.validate(norm)
        activation = info.default_activation if activation is None else activation
        check_choice("activation", activation, tuple(ACTIVATIONS))
        check_choice("placement", placement, norms.PLACEMENTS)
        check_choice("init", init, INITS)
        shape = _check_shape(input_shape, num_classes)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
            raise ValueError(f"{info.name}: dropout must be a probability in [0, 1), got {dropout!r}")
        try:
            _, resolved = MODEL_INFO.resolve(info.name, options)
        except ValueError as err:
            note = " (and norm, activation, placement, input_shape, num_classes, init, seed, dropout)"
            raise ValueError(f"{err}{note if set(options) - set(info.options) else ''}") from None
        if seed is None:
            factory = BlockFactory(norm=norm, placement=placement, act=activation, init=init, dropout=float(dropout))
            model = info.build(factory, shape, int(num_classes), **resolved)
        else:
            generator = torch.Generator().manual_seed(int(seed))
            factory = BlockFactory(norm=norm, placement=placement, act=activation, init=init, generator=generator,
                                   dropout=float(dropout))
            # torch's layer constructors draw a default init from the global RNG before ours replaces
            # it; fork_rng keeps a seeded build from disturbing the caller's random stream.
            with torch.random.fork_rng(devices=[]):
                model = info.build(factory, shape, int(num_classes), **resolved)
            norms.seed_layers(model, int(seed))
        model.spec = dict(name=info.name, norm=norm, activation=activation, placement=placement,
                          input_shape=shape, num_classes=int(num_classes), init=init, seed=seed,
                          dropout=float(dropout), **resolved)
        return model

    builder.__name__ = builder.__qualname__ = info.name
    builder.__doc__ = (
        f"{inspect.getdoc(info.build)}\n\nBuilt with ``bnlab.models.create({info.name!r}, ...)``; "
        f"options: {', '.join(f'{k}={v!r}' for k, v in info.options.items()) or '(none)'}."
    )
    return builder


MODELS: dict[str, Callable[..., nn.Module]] = {name: _make_builder(info) for name, info in MODEL_INFO.items()}


def create(name: str, *, norm: str = "bn", activation: str | None = None, placement: str = "pre_activation",
           input_shape: tuple = (3, 32, 32), num_classes: int = 10, **kw: Any) -> nn.Module:
    """Build model ``name`` with normalization ``norm`` (a :mod:`bnlab.norms` spec) at ``placement``.

    ``activation`` defaults to ``"relu"`` (``"identity"`` for ``dln``). ``input_shape`` is one sample's
    shape (``(C, H, W)`` for the conv nets, anything for the fully connected ones); ``num_classes`` the
    output size (for regression, the target dimension). Further keywords: ``init`` (``"glorot"`` —
    default — or ``"kaiming"``), ``dropout`` (probability of an ``nn.Dropout`` after each normalized
    block's activation; 0 = none), ``seed`` (draw the weights from a generator seeded with it instead of
    torch's global RNG, and seed noisy layers) and the model's own options (``width``, ``depth``, …;
    see ``bnlab models list``). Unknown names, activations, placements and options raise ``ValueError``
    naming the valid choices; a bad norm spec raises :func:`bnlab.norms.validate`'s ``ValueError``.
    The model's ``spec`` attribute records every setting.
    """
    return MODELS[MODEL_INFO.entry(name).name](norm=norm, activation=activation, placement=placement, input_shape=input_shape,
                        num_classes=num_classes, **kw)
