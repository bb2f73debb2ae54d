"""Typed spec parameters: :class:`Param` (type, default, constraints) and how a function's
keyword parameters become Params (:func:`params_from_signature`, :func:`declared`)."""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .grammar import FALSE_WORDS, NONE_WORDS, TRUE_WORDS, format_value, read_value

_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               tuple: "a list"}


@dataclass(frozen=True)
class Param:
    """One keyword of a spec: type, default and constraints.

    ``type`` None accepts any value (text is read by :func:`read_value`). ``item`` is the element
    type of a ``tuple`` parameter; ``minimum``/``maximum``/``positive``/``finite`` then apply to
    each element.
    """

    default: Any
    type: type | None = None
    choices: tuple | None = None
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    positive: bool = False
    help: str = ""
    nullable: bool = False  # accepts None / "none"
    # a number must be finite unless a parameter says otherwise: eps=inf or 1e400 (read as inf)
    # would be accepted and a run would train at chance, "finished"
    finite: bool = True
    item: type | None = None

    def convert(self, owner: str, key: str, raw: Any, text: bool = False) -> Any:
        """``raw`` (spec text when ``text``, else a Python/YAML value) as this parameter's value."""
        where = f"{owner}: {key}={raw!r}"
        is_none = raw is None or (isinstance(raw, str)
                                  and raw.strip().strip("'\"").lower() in NONE_WORDS)
        if is_none and (self.nullable or (self.type is None and (raw is None or text))):
            return None
        if self.type is None:
            return read_value(raw) if text and isinstance(raw, str) else raw
        if self.type is tuple:
            items = read_value(raw) if isinstance(raw, str) else raw
            if not isinstance(items, (list, tuple)):
                raise ValueError(f"{where}: expected a list")
            value = tuple(self._check(f"{owner}: {key}", _coerce(v, self.item, where), raw)
                          if self.item else v for v in items)
        else:
            value = self._check(f"{owner}: {key}", _coerce(raw, self.type, where), raw)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{where} is not allowed; valid values: "
                             f"{', '.join(map(format_value, self.choices))}")
        return value

    def _check(self, where: str, value: Any, raw: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.finite and not math.isfinite(value):
                raise ValueError(f"{where} must be finite, got {raw!r}")
            if self.positive and not value > 0:
                raise ValueError(f"{where} must be > 0, got {raw!r}")
            if self.minimum is not None and not value >= self.minimum:
                raise ValueError(f"{where} must be >= {format_value(self.minimum)}, got {raw!r}")
            if self.maximum is not None and not value <= self.maximum:
                raise ValueError(f"{where} must be <= {format_value(self.maximum)}, got {raw!r}")
        return value


def _coerce(raw: Any, typ: type, where: str) -> Any:
    expected = f"{where}: expected {_TYPE_WORDS.get(typ, typ.__name__)}"
    if isinstance(raw, str):
        text = raw.strip().strip("'\"")
        if typ is bool:
            if text.lower() in TRUE_WORDS + FALSE_WORDS:
                return text.lower() in TRUE_WORDS
            raise ValueError(f"{expected} ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)})")
        if typ is str:
            return text
        try:
            return typ(text)  # float("inf") works
        except ValueError:
            raise ValueError(expected) from None
    if typ is bool and isinstance(raw, bool):
        return raw
    if typ is int and isinstance(raw, numbers.Integral) and not isinstance(raw, bool):
        return int(raw)
    if typ is float and isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        return float(raw)
    if typ not in (bool, int, float) and isinstance(raw, typ):
        return raw
    raise ValueError(expected)


_ANNOTATION = re.compile(r"^\s*(bool|int|float|str)\s*(\|\s*None)?\s*$")


def params_from_signature(fn: Callable, skip: tuple[str, ...] = (),
                          overrides: Mapping[str, Param] | None = None) -> dict[str, Param]:
    """Params for the keyword parameters of ``fn``: the type from a plain annotation (``int``,
    ``bool | None``, ...) or else from the default's type; ``overrides`` replace single entries."""
    params: dict[str, Param] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.name == "self" or p.default is inspect.Parameter.empty:
            continue
        if overrides and p.name in overrides:
            params[p.name] = overrides[p.name]
            continue
        match = _ANNOTATION.match(p.annotation) if isinstance(p.annotation, str) else None
        if match:
            typ = {"bool": bool, "int": int, "float": float, "str": str}[match[1]]
            nullable = bool(match[2])
        elif isinstance(p.annotation, type) and p.annotation in (bool, int, float, str):
            typ, nullable = p.annotation, False
        else:
            typ = type(p.default) if type(p.default) in (bool, int, float, str) else None
            nullable = p.default is None
        params[p.name] = Param(p.default, typ, nullable=nullable or p.default is None)
    return params


def declared(fn: Callable, params: Mapping[str, Param],
             skip: tuple[str, ...] = ()) -> dict[str, Param]:
    """``params`` after checking that they are ``fn``'s keyword parameters (minus ``skip``) with the
    same defaults, so a declaration next to a function cannot drift from its signature."""
    keywords = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                if p.name not in skip and p.default is not inspect.Parameter.empty}
    given = {k: p.default for k, p in params.items()}
    if keywords != given:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)}: declared parameters {given} differ "
                        f"from its signature's {keywords}")
    return dict(params)
