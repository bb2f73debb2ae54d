"""The spec grammars: ``name(key=value, ...)`` strings, ``KEY=VALUE`` flags, literal values, norm
``+`` joins and ``KIND:REST`` forms, the one choice validator, and how a value is written back.

Booleans: ``true/false/yes/no/on/off/1/0`` in any case (as YAML 1.1 reads ``yes``/``no``), so
``per_layer=no`` is ``False`` wherever it is written. Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

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
