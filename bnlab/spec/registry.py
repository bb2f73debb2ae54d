"""Registries: name -> object, with typed parameters per name, looked up by spec string."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .grammar import format_value, parse
from .params import Param, signature_params
from .plugins import load_plugins

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
        """Decorator: ``@PROBES.register("grad_stats")`` next to a class or function (the name
        defaults to its ``name`` attribute, else its ``__name__``). Its options are its keyword
        parameters (minus ``skip``), typed from their annotations or defaults; ``params`` declare
        some of them more precisely (:func:`bnlab.spec.signature_params`, the rule every registry
        of bnlab follows)."""
        def decorate(target: T) -> T:
            key = name or getattr(target, "name", None) or target.__name__
            return self.add(key, target, self.options_of(target, params, skip))
        return decorate

    @staticmethod
    def options_of(target: Any, params: Mapping[str, Param] | None = None,
                   skip: tuple[str, ...] = ()) -> dict[str, Param]:
        """The typed options of ``target`` (a class: its ``__init__``'s keywords) by
        :func:`bnlab.spec.signature_params`."""
        fn = target.__init__ if inspect.isclass(target) else target
        return signature_params(fn, params, skip)

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
        if isinstance(key, str) and key not in self._entries and load_plugins():
            return self.entry(name)  # a plugin module ($BNLAB_PLUGINS) may register it
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
        """(name, default spec) of every entry, in registration order (plugins loaded first)."""
        load_plugins()
        return [(e.name, e.signature()) for e in self._entries.values()]
