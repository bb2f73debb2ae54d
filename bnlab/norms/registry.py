"""Spec strings -> normalization modules: the ``NORMS`` registry of :mod:`bnlab.spec`.

A spec is ``name`` or ``name(key=value, ...)``, e.g. ``"cbn(rho=2, amat=true)"`` or
``"lp_bn(p=inf)"``. Every layer registers its parameters (type, default, allowed values;
:class:`bnlab.spec.Param`) in :mod:`.catalog`, so that a bad spec fails with a ``ValueError`` naming
the valid choices and ``bnlab norms list`` can print the catalogue.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import torch.nn as nn

from bnlab.spec import Param, Registry, parse

from .engine.compiled_step import ROUTED_SPECS, route

__all__ = ["BN_OPTIONS", "NORMS", "REGISTRY", "NormInfo", "Param", "lookup", "norm", "parse_spec",
           "register"]


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
    # "sample": built from num_features, but normalizes each sample on its own (gn): no batch
    # statistics, so none of the BN family's batch/running-statistics contract applies.
    kind: str = "channel"
    removes_mean: bool = True  # whether a bias in the preceding layer is redundant

    def signature(self) -> str:
        return NORMS.entry(self.name).signature()


NORMS: Registry[NormInfo] = Registry("normalization", names_label="names", key_label="parameter",
                                     sort_names=True)
REGISTRY = NORMS  # name -> NormInfo (the historical name)


# constructor keywords that are not spec options: where the layer's tensors live
FACTORY_ARGUMENTS = ("device", "dtype")


def register(info: NormInfo) -> NormInfo:
    return NORMS.add(info.name, info, info.params)


def norm(name: str, summary: str, paper: str, equation: str, params: dict[str, Param] | None = None,
         *, kind: str = "channel", removes_mean: bool = True) -> Callable:
    """Decorator next to a layer class: register it as spec ``name`` with its paper, equation and
    typed parameters (``kind="wrapper"``: it wraps the linear/conv layer it normalizes). The
    parameters are the constructor's keywords (minus :data:`FACTORY_ARGUMENTS`), typed from their
    annotations or defaults; ``params`` declare some more precisely, or ones ``**kwargs`` passes
    on (:func:`bnlab.spec.signature_params`, the rule of every bnlab registry). The class
    docstring gets a closing ``Paper: <paper>, <equation>.`` line from these same words, so
    ``help()`` and the API pages name the source of every layer."""
    def decorate(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        options = NORMS.options_of(factory, params, skip=FACTORY_ARGUMENTS)
        register(NormInfo(name, factory, summary, paper, equation, options, kind, removes_mean))
        if name in ROUTED_SPECS:  # opt-in compiled training steps (a wrapper: its normalization)
            route(cast(type, getattr(factory, "normalization", factory)), list(params or {}))
        if isinstance(factory, type) and paper.strip("- "):  # a user's layer may cite none
            reference = f"Paper: {paper}, {equation}."
            doc = inspect.cleandoc(factory.__doc__ or "")
            factory.__doc__ = doc if reference in doc else f"{doc}\n\n{reference}".lstrip()
        return factory
    return decorate


BN_OPTIONS = {  # torch.nn.BatchNorm2d's options, with torch's names and semantics
    "eps": Param(1e-5, float, positive=True, help="added to the variance"),
    "momentum": Param(0.1, float, minimum=0.0, nullable=True,
                      help="running-statistics update weight; none = cumulative moving average"),
    "affine": Param(True, bool, help="learnable γ (weight) and β (bias)"),
    "bias": Param(True, bool, help="false: γ only, no β (torch's bias=False)"),
    "track_running_stats": Param(True, bool, help="false: no running statistics, batch statistics "
                                                  "in eval"),
    "sync": Param(False, bool, help="batch statistics over all ranks of torch.distributed "
                                    "(bnlab.norms.engine.sync)"),
}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"name(k=v, ...)"`` into ``(name, {k: raw_value})`` without interpreting the
    values."""
    return parse(spec, "normalization spec")


def lookup(spec: str) -> tuple[NormInfo, dict[str, Any]]:
    """Resolve a spec to its catalogue entry and fully typed keyword arguments (defaults filled
    in)."""
    entry, kwargs = NORMS.lookup(spec)
    return entry.target, kwargs

