"""How :class:`~bnlab.train.config.TrainConfig` declares its fields: each field's metadata carries
its command-line form (:class:`CliOption`, from which ``bnlab train``'s options are generated), and
:class:`FrozenMap` is the read-only mapping a frozen config holds its option dicts in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import field
from typing import Any, NamedTuple

from bnlab.spec import read_pairs


class CliOption(NamedTuple):
    """How a config key appears on ``bnlab train``'s command line.

    ``flag``: the option's declaration (``"--batch-size"``, ``"--augment/--no-augment"``); ``kind``:
    the type the command line parses (``bool`` for a flag that takes no value); ``to_config(value,
    current)``: the config value for what was given (``current``: the config file's value), or
    ``None`` when the option was not given."""

    name: str
    flag: str
    help: str
    kind: Any
    to_config: Callable[[Any, Any], Any]


def given_as_is(value: Any, current: Any) -> Any:
    return value


def key(name: str, help: str, default: Any = dataclasses.MISSING, *, flag: str | None = None,
         kind: Any = None, to_config: Callable[[Any, Any], Any] = given_as_is,
         factory: Any = dataclasses.MISSING) -> Any:
    """A config field with its command-line form in the field's metadata."""
    cli = {"flag": flag or "--" + name.replace("_", "-"), "help": help, "kind": kind,
           "to_config": to_config}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"cli": cli})
    return field(default=default, metadata={"cli": cli})


def pairs(flag: str) -> Callable[[Any, Any], Any]:
    """KEY=VALUE options (repeatable), added to the config file's mapping."""
    return lambda given, current: (
        {**(current or {}), **read_named_pairs(given, flag)} if given else None)


def read_named_pairs(given: list[str], flag: str) -> dict[str, Any]:
    """:func:`bnlab.spec.read_pairs`, an error naming the flag and the option it refused (a
    50,000-deep ``width=[[[...`` said only "value nested more than 32 brackets deep")."""
    out: dict[str, Any] = {}
    for pair in given:
        try:
            out.update(read_pairs([pair], flag))
        except ValueError as err:
            if str(err).startswith(flag):  # already names it (no KEY=VALUE form)
                raise
            raise ValueError(f"{flag} {pair.partition('=')[0].strip()[:40]}: {err}") from None
    return out


def listed(given: Any, current: Any) -> Any:
    return list(given) if given else None


def switch(value: bool) -> Callable[[Any, Any], Any]:
    """A flag without a value: ``value`` when given, else not given."""
    return lambda given, current: value if given else None


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping (a config's ``model_options``/``data_options``); pickles and compares as
    the dict it holds."""

    __slots__ = ("_data",)

    def __init__(self, values: Mapping[str, Any] = ()) -> None:  # type: ignore[assignment]
        self._data = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return dict(self._data) == (dict(other) if isinstance(other, Mapping) else other)

    def __hash__(self) -> int:
        return hash(json.dumps(self._data, sort_keys=True, default=repr))

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))
