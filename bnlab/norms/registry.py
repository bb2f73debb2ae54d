"""Spec strings -> normalization modules.

A spec is ``name`` or ``name(key=value, ...)``, e.g. ``"cbn(rho=2, amat=true)"`` or ``"lp_bn(p=inf)"``.
Every layer registers its parameters (type, default, allowed values) so that a bad spec fails with a
``ValueError`` naming the valid choices, and ``bnlab norms list`` can print the catalogue.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.nn as nn


@dataclass(frozen=True)
class Param:
    """One keyword of a spec: its type, default and (optionally) the allowed values or a range."""

    default: Any
    type: type
    choices: tuple | None = None
    minimum: float | None = None  # inclusive
    positive: bool = False
    help: str = ""
    nullable: bool = False  # accepts None / "none" (e.g. torch's momentum=None)

    def convert(self, name: str, key: str, raw: Any) -> Any:
        if self.nullable and (raw is None or (isinstance(raw, str) and raw.strip().strip("'\"").lower() == "none")):
            return None
        value = _coerce(raw, self.type, f"{name}({key}=...)")
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{name}: {key}={raw!r} is not allowed; valid values: {', '.join(map(_fmt, self.choices))}"
            )
        if self.positive and not value > 0:
            raise ValueError(f"{name}: {key} must be > 0, got {raw!r}")
        if self.minimum is not None and not value >= self.minimum:
            raise ValueError(f"{name}: {key} must be >= {self.minimum}, got {raw!r}")
        return value


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
        if not self.params:
            return self.name
        inner = ", ".join(f"{k}={_fmt(p.default)}" for k, p in self.params.items())
        return f"{self.name}({inner})"


REGISTRY: dict[str, NormInfo] = {}


def register(info: NormInfo) -> NormInfo:
    if info.name in REGISTRY:
        raise ValueError(f"normalization {info.name!r} registered twice")
    REGISTRY[info.name] = info
    return info


_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.S)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"name(k=v, ...)"`` into ``(name, {k: raw_value})`` without interpreting the values."""
    if not isinstance(spec, str):
        raise ValueError(f"a normalization spec must be a string, got {type(spec).__name__}")
    match = _SPEC.match(spec)
    if not match:
        raise ValueError(f"cannot parse normalization spec {spec!r}; expected 'name' or 'name(key=value, ...)'")
    name, inner = match.group(1), match.group(2)
    kwargs: dict[str, str] = {}
    if inner and inner.strip():
        for item in _split_top_level(inner):
            if "=" not in item:
                raise ValueError(f"in spec {spec!r}: {item.strip()!r} is not of the form key=value")
            key, raw = (s.strip() for s in item.split("=", 1))
            if key in kwargs:
                raise ValueError(f"in spec {spec!r}: {key!r} given twice")
            kwargs[key] = raw
    return name, kwargs


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and quotes, so values may be tuples or quoted strings."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def lookup(spec: str) -> tuple[NormInfo, dict[str, Any]]:
    """Resolve a spec to its catalogue entry and fully typed keyword arguments (defaults filled in)."""
    name, raw = parse_spec(spec)
    if name not in REGISTRY:
        raise ValueError(f"unknown normalization {name!r}; valid names: {', '.join(sorted(REGISTRY))}")
    info = REGISTRY[name]
    unknown = sorted(set(raw) - set(info.params))
    if unknown:
        valid = ", ".join(info.params) if info.params else "(none)"
        raise ValueError(f"{name}: unknown parameter(s) {', '.join(unknown)}; valid parameters: {valid}")
    kwargs = {k: p.default for k, p in info.params.items()}
    for key, value in raw.items():
        kwargs[key] = info.params[key].convert(name, key, value)
    return info, kwargs


def _coerce(raw: Any, typ: type, where: str) -> Any:
    if not isinstance(raw, str):
        if typ is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, typ):
            return raw
        raise ValueError(f"{where}: expected {typ.__name__}, got {raw!r}")
    text = raw.strip().strip("'\"")
    if typ is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{where}: expected true or false, got {raw!r}")
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where}: expected an integer, got {raw!r}") from None
    if typ is float:
        try:
            return float(text)  # accepts "inf"
        except ValueError:
            raise ValueError(f"{where}: expected a number, got {raw!r}") from None
    if typ is str:
        return text
    raise TypeError(f"unsupported parameter type {typ}")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, str):
        return value
    return repr(value)
