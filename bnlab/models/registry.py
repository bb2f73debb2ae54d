"""Model registry: ``MODELS`` (name → builder) and ``create(name, ...)``."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
import torch.nn as nn

import bnlab.norms as norms
from bnlab.spec import check_choice

# their @model decorators fill MODEL_INFO, in this order
from . import vgg, resnet, mlp, vision  # noqa: F401
from .blocks import ACTIVATIONS, INITS, BlockFactory
from .catalog import MODEL_INFO, ModelInfo

__all__ = ["MODELS", "MODEL_INFO", "ModelInfo", "create"]


def _check_shape(input_shape: Any, num_classes: Any) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = None
    if not shape or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1
                            for s in shape):
        raise ValueError("input_shape must be a non-empty tuple of positive integers, got "
                         f"{input_shape!r}")
    if (not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool)
            or num_classes < 1):
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return tuple(int(s) for s in shape)


def _make_builder(info: ModelInfo) -> Callable[..., nn.Module]:
    def builder(*, norm: str = "bn", activation: str | None = None,
                placement: str = "pre_activation", input_shape: tuple = (3, 32, 32),
                num_classes: int = 10, init: str = "glorot", seed: int | None = None,
                dropout: float = 0.0, **options: Any) -> nn.Module:
        norm = "none" if norm is None else norm
        norms.validate(norm)
        activation = info.default_activation if activation is None else activation
        check_choice("activation", activation, tuple(ACTIVATIONS))
        check_choice("placement", placement, norms.PLACEMENTS)
        check_choice("init", init, INITS)
        shape = _check_shape(input_shape, num_classes)
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real)
                or not 0 <= dropout < 1):
            raise ValueError(f"{info.name}: dropout must be a probability in [0, 1), got "
                             f"{dropout!r}")
        try:
            _, resolved = MODEL_INFO.resolve(info.name, options)
        except ValueError as err:
            note = (" (and norm, activation, placement, input_shape, num_classes, init, seed, "
                    "dropout)")
            raise ValueError(f"{err}{note if set(options) - set(info.options) else ''}") from None
        if seed is None:
            factory = BlockFactory(norm=norm, placement=placement, act=activation, init=init,
                                   dropout=float(dropout))
            model = info.build(factory, shape, int(num_classes), **resolved)
        else:
            generator = torch.Generator().manual_seed(int(seed))
            factory = BlockFactory(norm=norm, placement=placement, act=activation, init=init,
                                   generator=generator, dropout=float(dropout))
            # torch's layer constructors draw a default init from the global RNG before ours
            # replaces it; fork_rng keeps a seeded build from disturbing the caller's random stream.
            with torch.random.fork_rng(devices=[]):
                model = info.build(factory, shape, int(num_classes), **resolved)
            norms.seed_layers(model, int(seed))
        model.spec = dict(name=info.name, norm=norm, activation=activation, placement=placement,
                          input_shape=shape, num_classes=int(num_classes), init=init, seed=seed,
                          dropout=float(dropout), **resolved)
        return model

    builder.__name__ = builder.__qualname__ = info.name
    builder.info = info  # type: ignore[attr-defined]  (a name registered again is rebuilt)
    builder.__doc__ = (
        f"{inspect.getdoc(info.build)}\n\nBuilt with ``bnlab.models.create({info.name!r}, ...)``; "
        f"options: {', '.join(f'{k}={v!r}' for k, v in info.options.items()) or '(none)'}."
    )
    return builder


class Builders(Mapping[str, Callable[..., nn.Module]]):
    """Name → builder of every model in :data:`MODEL_INFO`, live: a model a user's module
    registers after ``bnlab.models`` was imported (``@model``, :mod:`bnlab.spec.plugins`) is here
    too. Looking up a name the catalogue lacks loads the plugins first."""

    def __init__(self) -> None:
        self._built: dict[str, Callable[..., nn.Module]] = {}

    def __getitem__(self, name: str) -> Callable[..., nn.Module]:
        try:
            info = MODEL_INFO.entry(name).target
        except ValueError:
            raise KeyError(name) from None
        if self._built.get(info.name) is None or self._built[info.name].info is not info:
            self._built[info.name] = _make_builder(info)
        return self._built[info.name]

    def __iter__(self) -> Iterator[str]:
        return iter(MODEL_INFO)

    def __len__(self) -> int:
        return len(MODEL_INFO)


MODELS: Mapping[str, Callable[..., nn.Module]] = Builders()


def create(name: str, *, norm: str = "bn", activation: str | None = None,
           placement: str = "pre_activation", input_shape: tuple = (3, 32, 32),
           num_classes: int = 10, **kw: Any) -> nn.Module:
    """Build model ``name`` with normalization ``norm`` (a :mod:`bnlab.norms` spec) at
    ``placement``.

    ``activation`` defaults to ``"relu"`` (``"identity"`` for ``dln``). ``input_shape`` is one
    sample's shape (``(C, H, W)`` for the conv nets, anything for the fully connected ones);
    ``num_classes`` the output size (for regression, the target dimension). Further keywords:
    ``init`` (``"glorot"`` — default — or ``"kaiming"``), ``dropout`` (probability of an
    ``nn.Dropout`` after each normalized block's activation; 0 = none), ``seed`` (draw the weights
    from a generator seeded with it instead of torch's global RNG, and seed noisy layers) and the
    model's own options (``width``, ``depth``, …; see ``bnlab models list``). Unknown names,
    activations, placements and options raise ``ValueError`` naming the valid choices; a bad norm
    spec raises :func:`bnlab.norms.validate`'s ``ValueError``. The model's ``spec`` attribute
    records every setting.
    """
    build = MODELS[MODEL_INFO.entry(name).name]
    return build(norm=norm, activation=activation, placement=placement, input_shape=input_shape,
                 num_classes=num_classes, **kw)
