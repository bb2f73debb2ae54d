"""Model-level operations: build layers from specs, place them next to a linear layer, seeds,
regularizers.

Converting torch models lives in :mod:`.convert`, folding for inference in :mod:`.fold`, training
progress (learning rate, epoch) in :mod:`.progress`.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

from bnlab.spec import check_choice, split_joined

from .variants.noisy import StochasticLayer
from .registry import REGISTRY, NormInfo, lookup
from .variants.wrappers import ScaleInvariantBN, WeightNorm, out_features_of


def spec_parts(spec: str) -> list[str]:
    """The parts of a ``+``-joined spec (bnlab.spec.split_joined, the one parser of joins)."""
    return split_joined(spec, "normalization spec") if isinstance(spec, str) else [spec]


def validate(spec: str) -> None:
    """Raise ``ValueError`` (naming valid choices) if ``spec`` is not a valid (possibly '+'-joined)
    spec."""
    parts = spec_parts(spec)
    for i, part in enumerate(parts):
        info, _ = lookup(part)
        if info.kind == "wrapper" and i > 0:
            raise ValueError(f"in {spec!r}: {info.name} wraps the linear layer and must come first")


def create(spec: str, num_features: int, **options) -> nn.Module:
    """Build the per-channel normalization layer described by ``spec`` for ``num_features``
    channels.

    ``options`` are constructor keywords the spec string cannot express (``momentum=None``) or that
    :func:`bnlab.norms.convert` carries over from a torch layer; they override the spec's defaults.

    >>> create("cbn(rho=2, amat=true)", 64)
    """
    info, kwargs = lookup(spec)
    if info.kind == "wrapper":
        raise ValueError(
            f"{info.name} needs the weight of the layer it normalizes; use "
            f"bnlab.norms.normalized(layer, {spec!r}) (or {info.factory.__name__}(layer)) instead "
            "of create()"
        )
    return info.factory(num_features, **{**kwargs, **options})


def removes_mean(spec: str) -> bool:
    """True if the spec's normalization subtracts a mean, which makes a preceding bias redundant."""
    return any(lookup(p)[0].removes_mean for p in spec_parts(spec))


def normalized(layer: nn.Module, spec: str, placement: str = "pre_activation") -> nn.Module:
    """``layer`` (Linear/Conv) combined with the normalization ``spec`` at ``placement``.

    * ``"pre_activation"`` (the usual BN position): ``norm(layer(x))``; wrappers (``si_bn``, ``wn``)
      replace the layer, and ``"wn+mean_only_bn"`` applies mean-only BN after WN (Luo §5).
    * ``"pre_linear"`` (CBN's position, after the previous activation): ``layer(norm(x))``.

    Returns an ``nn.Sequential`` so :func:`fold` sees the layer and its norm as neighbours.
    """
    check_choice("placement", placement, PLACEMENTS)
    validate(spec)
    parts = spec_parts(spec)
    first, kwargs = lookup(parts[0])
    if first.kind == "wrapper":
        if placement == "pre_linear" and first.name == "si_bn":
            raise ValueError("si_bn normalizes the output of its layer; it cannot be placed "
                             "pre_linear")
        layer = first.factory(layer, **kwargs)
        parts = parts[1:]
    if placement == "pre_activation":
        width = out_features_of(layer.layer if isinstance(layer, (ScaleInvariantBN,
                                                                  WeightNorm)) else layer)
        return nn.Sequential(layer, *(create(p, width) for p in parts))
    inner = layer.layer if isinstance(layer, (ScaleInvariantBN, WeightNorm)) else layer
    # a conv
    width = inner.in_features if isinstance(inner, nn.Linear) else cast(int, inner.in_channels)
    return nn.Sequential(*(create(p, width) for p in parts), layer)


PLACEMENTS = ("pre_activation", "pre_linear")


def seed_layers(model: nn.Module, seed: int) -> None:
    """Give every stochastic layer (noisy_bn) its own generator seeded from ``seed``, in module
    order."""
    for index, module in enumerate(m for m in model.modules() if isinstance(m, StochasticLayer)):
        module.reseed(int(seed) * 1_000_003 + index)


def stochastic_layers(model: nn.Module) -> list[tuple[str, StochasticLayer]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, StochasticLayer)]


def regularization_loss(model: nn.Module) -> torch.Tensor | float:
    """Sum of the explicit regularizers that layers expose (WN's γ-decay ζ Σγ², Luo Eq. 15)."""
    terms = [m.regularization_loss() for m in model.modules() if isinstance(m, WeightNorm)
             and m.zeta > 0]
    return sum(terms) if terms else 0.0


def describe() -> list[NormInfo]:
    return list(REGISTRY.values())
