"""Typed spec parameters: :class:`Param` (type, default, constraints) and how a function's
keyword parameters become Params (:func:`signature_params`, the rule every registry uses;
:func:`params_from_signature`, :func:`declared`)."""

from __future__ import annotations

import inspect
import math
import numbers
import re
import types
import typing
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
_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


def _signature(fn: Callable) -> inspect.Signature:
    """``fn``'s signature with string annotations evaluated where they can be (``from __future__
    import annotations`` makes every annotation a string); as written where they cannot."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a name the module imports only for type checking, a syntax it lacks
        return inspect.signature(fn)


def _from_annotation(annotation: Any) -> tuple[type | None, bool, tuple | None, type | None] | None:
    """(type, nullable, choices, item type) an annotation states, None when it states none bnlab
    reads: ``int``, ``float | None``, ``Optional[str]``, ``Literal["a", "b"]``, ``tuple[int,
    ...]`` and the same written as strings."""
    if isinstance(annotation, str):
        match = _ANNOTATION.match(annotation)
        return (_SCALARS[match[1]], bool(match[2]), None, None) if match else None
    if annotation in (bool, int, float, str):
        return annotation, False, None, None
    if annotation is tuple:
        return tuple, False, None, None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        return (kinds.pop() if len(kinds) == 1 else None), False, tuple(args), None
    if origin is tuple:
        items = {a for a in args if a is not Ellipsis}
        item = items.pop() if len(items) == 1 and next(iter(items)) in _SCALARS.values() else None
        return tuple, False, None, item
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _from_annotation(rest[0]) if len(rest) == 1 else None
        if inner is None:
            return (None, True, None, None) if len(rest) < len(args) else None
        return inner[0], inner[1] or len(rest) < len(args), inner[2], inner[3]
    return None


def inferred_param(p: inspect.Parameter) -> Param:
    """A keyword parameter as a :class:`Param`: its default; its type, ``None`` allowed and
    choices from its annotation (:func:`_from_annotation`), else the type of its default (bool,
    int, float, str), else any value (a list default stays a list: read as written)."""
    stated = _from_annotation(p.annotation) if p.annotation is not inspect.Parameter.empty else None
    if stated is None:
        typ = type(p.default) if type(p.default) in (bool, int, float, str) else None
        stated = (typ, False, None, None)
    typ, nullable, choices, item = stated
    return Param(p.default, typ, choices=choices, nullable=nullable or p.default is None,
                 item=item)


def _keywords(sig: inspect.Signature, skip: tuple[str, ...]) -> dict[str, inspect.Parameter]:
    """The parameters a spec can set: those with a default, minus ``skip`` and ``self``."""
    return {p.name: p for p in sig.parameters.values()
            if p.name not in skip and p.name != "self" and p.default is not inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def params_from_signature(fn: Callable, skip: tuple[str, ...] = (),
                          overrides: Mapping[str, Param] | None = None) -> dict[str, Param]:
    """Params for the keyword parameters of ``fn`` (:func:`inferred_param`); ``overrides``
    replace single entries."""
    return {name: (overrides[name] if overrides and name in overrides else inferred_param(p))
            for name, p in _keywords(_signature(fn), skip).items()}


def signature_params(fn: Callable, params: Mapping[str, Param] | None = None,
                     skip: tuple[str, ...] = ()) -> dict[str, Param]:
    """The typed options of a registered function or class — the one rule of every registry.

    Every keyword parameter of ``fn`` (minus ``skip``) is an option: its name and default from the
    signature, its type from the annotation or the default (:func:`inferred_param`). ``params``
    declare options where more is needed (a range, choices, help): a declaration wins over the
    inferred option, but must name a keyword parameter with the same default (or one ``**kwargs``
    takes, which cannot be checked), so a declaration next to a function cannot drift from its
    signature. Declared options come first, in their order; the others follow in the signature's.
    """
    sig = _signature(fn)
    keywords = _keywords(sig, skip)
    takes_more = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    declared_ = dict(params or {})
    where = getattr(fn, "__qualname__", fn)
    unknown = [k for k in declared_ if k in skip or (k not in keywords and not takes_more)]
    if unknown:
        raise TypeError(f"{where}: declared parameters {', '.join(unknown)} are not keyword "
                        f"parameters of its signature; they are: {', '.join(keywords) or '(none)'}")
    given = {k: p.default for k, p in declared_.items() if k in keywords}
    expected = {k: keywords[k].default for k in given}
    if given != expected:
        raise TypeError(f"{where}: declared parameters {given} differ from its signature's "
                        f"{expected}")
    return {**declared_, **{name: inferred_param(p) for name, p in keywords.items()
                            if name not in declared_}}


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
