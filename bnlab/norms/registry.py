"""Spec strings -> normalization modules: the ``NORMS`` registry of :mod:`bnlab.spec`.

A spec is ``name`` or ``name(key=value, ...)``, e.g. ``"cbn(rho=2, amat=true)"`` or ``"lp_bn(p=inf)"``.
Every layer registers its parameters (type, default, allowed values; :class:`bnlab.spec.Param`) in
:mod:`.catalog`, so that a bad spec fails with a ``ValueError`` naming the valid choices and
``bnlab norms list`` can print the catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch.nn as nn

from bnlab.spec import Param, Registry, parse

__all__ = ["NORMS", "REGISTRY", "NormInfo", "Param", "lookup", "parse_spec", "register"]


@dataclass(frozen=True)
class NormInfo:
    """Catalogue entry of a layer: what it is, where it comes from, how to build it."""

    name: str
    factory: Callable[..., nn.Module]
    summary: str
    paper: str
    equation: str
    params: dict[str, Param] = field(default_factory=dict)
    # "channel": built from num_features and applied to (N, C, *) activations.
    # "wrapper": needs the weight of the linear/conv layer it normalizes (si_bn, wn).
    kind: str = "channel"
    removes_mean: bool = True  # whether a bias in the preceding layer is redundant

    def signature(self) -> str:
        return NORMS.entry(self.name).signature()


NORMS: Registry[NormInfo] = Registry("normalization", names_label="names", key_label="parameter",
                                     sort_names=True)
REGISTRY = NORMS  # name -> NormInfo (the historical name)


def register(info: NormInfo) -> NormInfo:
    return NORMS.add(info.name, info, info.params)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"name(k=v, ...)"`` into ``(name, {k: raw_value})`` without interpreting the values."""
    return parse(spec, "normalization spec")


def lookup(spec: str) -> tuple[NormInfo, dict[str, Any]]:
    """Resolve a spec to its catalogue entry and fully typed keyword arguments (defaults filled in)."""
    entry, kwargs = NORMS.lookup(spec)
    return entry.target, kwargs

