"""One spec mechanism: ``name(key=value, ...)`` strings, typed parameters and registries.

Every catalogue of bnlab (normalization layers, probes, models, data sources) is a :class:`Registry`
of entries, each with typed :class:`Param` s. A spec string such as ``"cbn(rho=2, amat=no)"`` or
``"landscape(num=8, every=50)"`` is resolved by :meth:`Registry.lookup` into the entry and typed
keyword arguments; a mistake fails with a ``ValueError`` that names the valid choices (names,
keys, allowed values or the expected type). The CLI's ``KEY=VALUE`` flags go through
:func:`read_pairs`, which reads values with the same literal rules (:func:`read_value`).

Booleans: ``true/false/yes/no/on/off/1/0`` in any case (as YAML 1.1 reads ``yes``/``no``), so
``per_layer=no`` is ``False`` wherever it is written. This module imports nothing beyond the
standard library.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NONE_WORDS = ("none", "null", "~")

MAX_DEPTH = 32  # brackets nested deeper than this are refused (a 50,000-deep value is an attack)
_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.S)


# ----------------------------------------------------------------------------------------- parsing

def parse(spec: str, what: str = "spec") -> tuple[str, dict[str, str]]:
    """Split ``"name(k=v, ...)"`` into ``(name, {k: raw_text})`` without interpreting the values.

    Commas inside brackets or quotes do not split, so values may be tuples or quoted strings.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a {what} must be a string, got {type(spec).__name__}")
    match = _NAME.match(spec)
    if not match:
        raise ValueError(f"cannot parse {what} {spec!r}; expected 'name' or 'name(key=value, ...)'")
    name, inner = match.group(1), match.group(2)
    raw: dict[str, str] = {}
    if inner and inner.strip():
        for item in split_top_level(inner):
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key.isidentifier():
                raise ValueError(f"in {what} {spec!r}: {item.strip()!r} is not of the form "
                                 "key=value")
            if key in raw:
                raise ValueError(f"in {what} {spec!r}: {key!r} given twice")
            raw[key] = text.strip()
    return name, raw


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` (a comma; ``+`` for joined norm specs) outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
            if depth > MAX_DEPTH:  # one scan refuses a 50,000-deep value (no recursion into it)
                raise ValueError(f"value nested more than {MAX_DEPTH} brackets deep: "
                                 f"{text[:40]}...")
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ValueError(f"unbalanced brackets or quotes in {text!r}")
    parts.append(text[start:])
    return parts


def read_value(text: str, _depth: int = 0) -> Any:
    """A value written without a declared type: bool words, none, int, float (``inf``), a quoted
    string, ``[a, b]`` (list) or ``(a, b)`` (tuple) of such values; anything else is the bare
    string."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"value nested more than {MAX_DEPTH} brackets deep: {text[:40]}...")
    text = text.strip()
    low = text.lower()
    if low in TRUE_WORDS[:3] or low in FALSE_WORDS[:3]:
        return low in TRUE_WORDS
    if low in NONE_WORDS or text == "":
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if len(text) >= 2 and (text[0], text[-1]) in (("[", "]"), ("(", ")")):
        inner = text[1:-1]
        items = [read_value(p, _depth + 1) for p in split_top_level(inner)] if inner.strip() else []
        if items and text[0] == "(" and split_top_level(inner)[-1].strip() == "":
            items = items[:-1]  # "(1,)": the trailing comma of a one-element tuple
        return items if text[0] == "[" else tuple(items)
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def read_pairs(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` command-line flags -> ``{key: read_value(value)}`` (the one KEY=VALUE
    parser)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = read_value(value)
    return out


def split_joined(spec: str, what: str = "spec") -> list[str]:
    """``"wn+mean_only_bn"`` -> ``["wn", "mean_only_bn"]``: the one parser of ``+`` joins; a ``+``
    inside brackets (``lp_bn(p=1e+3)``) does not split."""
    if not isinstance(spec, str):
        raise ValueError(f"a {what} must be a string, got {type(spec).__name__}")
    parts = [p.strip() for p in split_top_level(spec, "+")]
    if not all(parts):
        raise ValueError(f"empty part in {what} {spec!r}; expected 'name' or 'name+name'")
    return parts


def split_tagged(text: Any, what: str, forms: Mapping[str, str]) -> tuple[str, str]:
    """``KIND:REST`` -> ``(kind, rest)``, the grammar of schedules (``step:60,100``) and
    ``--log-to`` (``tensorboard:DIR``). ``forms`` maps each kind to how it is written
    (``"exp:GAMMA"``; a form without ``:`` takes no rest); errors name the valid forms."""
    valid = f"valid forms: {' | '.join(forms.values())}"
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string ({valid}), got {text!r}")
    kind, sep, rest = text.strip().partition(":")
    if kind not in forms:
        raise ValueError(f"unknown {what} {kind if sep else text!r}; {valid}")
    if (":" in forms[kind]) != bool(sep and rest):
        raise ValueError(f"bad {what} {text!r}; expected {forms[kind]}")
    return kind, rest


def check_choice(what: str, value: Any, choices: Iterable[Any], plural: str | None = None) -> Any:
    """``value`` if it is one of ``choices``, else the one "valid choices" error of bnlab:
    ``ValueError("unknown activation 'x'; valid activations: relu, tanh")``."""
    choices = tuple(choices)
    if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
        plural = plural or (what + "es" if what.endswith(("s", "x", "sh", "ch")) else what + "s")
        raise ValueError(f"unknown {what} {value!r}; valid {plural}: "
                         f"{', '.join(map(format_value, choices))}")
    return value


def format_value(value: Any) -> str:
    """How a value is written in a spec (``true``, ``inf``, ``none``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return repr(value)


# ----------------------------------------------------------------------------------- parameters

_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               tuple: "a list"}


@dataclass(frozen=True)
class Param:
    """One keyword of a spec: type, default and constraints.

    ``type`` None accepts any value (text is read by :func:`read_value`). ``item`` is the element
    type of a ``tuple`` parameter; ``minimum``/``positive``/``finite`` then apply to each element.
    """

    default: Any
    type: type | None = None
    choices: tuple | None = None
    minimum: float | None = None  # inclusive
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


# ------------------------------------------------------------------------------------- registry

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered name: the object it stands for and its typed parameters."""

    name: str
    target: T
    params: dict[str, Param] = field(default_factory=dict)

    def signature(self) -> str:
        """The default spec, e.g. ``grad_stats(every=1, k=8, per_layer=false)``."""
        if not self.params:
            return self.name
        defaults = ", ".join(f"{k}={format_value(p.default)}" for k, p in self.params.items())
        return f"{self.name}({defaults})"


class Registry(Mapping[str, T]):
    """Name -> object, with typed parameters per name (a ``Mapping`` of the registered objects).

    ``kind`` words the errors: ``Registry("probe", names_label="probes", key_label="option")``
    says "unknown probe 'x'; valid probes: ..." and "unknown option(s) y; valid options: ...".
    ``normalize`` maps a given name to its registered spelling (e.g. case-insensitive names).
    """

    def __init__(self, kind: str, *, names_label: str = "names", key_label: str = "parameter",
                 normalize: Callable[[str], str] | None = None, sort_names: bool = False) -> None:
        self.kind, self.names_label, self.key_label = kind, names_label, key_label
        # errors list the names alphabetically instead of as registered
        self._sort_names = sort_names
        self._normalize = normalize
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, target: T, params: Mapping[str, Param] | None = None) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = Entry(name, target, dict(params or {}))
        return target

    def remove(self, name: str) -> T:
        """Unregister ``name`` (a test's temporary entry); returns its object."""
        return self._entries.pop(self.entry(name).name).target

    def sort(self, key: Callable[[Entry[T]], Any]) -> None:
        """Reorder the entries by ``key`` (stable), e.g. into a declared catalogue order."""
        self._entries = dict(sorted(self._entries.items(), key=lambda item: key(item[1])))

    def register(self, name: str | None = None, params: Mapping[str, Param] | None = None, *,
                 skip: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator: ``@PROBES.register("grad_stats")`` next to a class or function. ``params``
        declare its keyword parameters (minus ``skip``; checked against its signature by
        :func:`declared`); without them they are read from the signature's annotations."""
        def decorate(target: T) -> T:
            key = name or getattr(target, "name", None) or target.__name__
            fn = target.__init__ if inspect.isclass(target) else target
            typed = (params_from_signature(fn, skip) if params is None
                     else declared(fn, params, skip + ("self",)))
            return self.add(key, target, typed)
        return decorate

    # Mapping protocol: registry[name] is the registered object.
    def __getitem__(self, name: str) -> T:
        return self._entries[name].target

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: Any) -> Entry[T]:
        """The entry of ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
        key = self._normalize(name) if self._normalize and isinstance(name, str) else name
        if not isinstance(key, str) or key not in self._entries:
            names = sorted(self._entries) if self._sort_names else self._entries
            raise ValueError(f"unknown {self.kind} {name!r}; valid {self.names_label}: "
                             f"{', '.join(names)}")
        return self._entries[key]

    def resolve(self, name: str, options: Mapping[str, Any], *, defaults: bool = True,
                text: bool = False) -> tuple[Entry[T], dict[str, Any]]:
        """Typed keyword arguments for ``name`` from ``options`` (Python values, or spec text when
        ``text``); with ``defaults`` every parameter not given gets its default."""
        entry = self.entry(name)
        unknown = sorted(set(options) - set(entry.params))
        if unknown:
            valid = ", ".join(entry.params) or "(none)"
            raise ValueError(f"{entry.name}: unknown {self.key_label}(s) {', '.join(unknown)}; "
                             f"valid {self.key_label}s: {valid}")
        kwargs = {k: p.default for k, p in entry.params.items()} if defaults else {}
        for key, value in options.items():
            kwargs[key] = entry.params[key].convert(entry.name, key, value, text=text)
        return entry, kwargs

    def lookup(self, spec: str, *, defaults: bool = True) -> tuple[Entry[T], dict[str, Any]]:
        """``"name(key=value, ...)"`` -> (entry, typed keyword arguments)."""
        name, raw = parse(spec, f"{self.kind} spec")
        return self.resolve(name, raw, defaults=defaults, text=True)

    def describe(self) -> list[tuple[str, str]]:
        """(name, default spec) of every entry, in registration order."""
        return [(e.name, e.signature()) for e in self._entries.values()]
