"""The one validator of :class:`~bnlab.train.config.TrainConfig` (its ``__post_init__``).

Checks every key that needs no data or model and normalises the values in place while the frozen
config is being built (numbers to float, ``"full"``, tuples for lists, :class:`FrozenMap` for the
option mappings); a bad value is ``ValueError`` naming the key and its valid values or range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

import bnlab.data
import bnlab.norms
from bnlab.train.schedules import parse_schedule

if TYPE_CHECKING:
    from bnlab.train.config import TrainConfig

OPTIMIZERS = ("sgd", "psgd")


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


@overload
def _positive_int(name: str, value: Any, *, allow_none: Literal[False]) -> int: ...
@overload
def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None: ...
def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _set(c: TrainConfig, name: str, value: Any) -> None:
    object.__setattr__(c, name, value)  # normalising a frozen dataclass while it is being built


def validate(c: TrainConfig) -> None:
    """Check and normalise every key that needs no data or model; raises ``ValueError``."""
    if (c.epochs is None) == (c.steps is None):
        raise ValueError("give exactly one of epochs or steps (e.g. epochs=10 or steps=1000)")
    _positive_int("epochs", c.epochs)
    _positive_int("steps", c.steps)
    _check_optimization(c)
    if isinstance(c.seed, bool) or not isinstance(c.seed, int) or not 0 <= c.seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {c.seed!r}")
    for name in ("checkpoint_every", "eval_every", "log_every"):
        _positive_int(name, getattr(c, name))
    _positive_int("probe_every", c.probe_every, allow_none=False)
    for name in ("model_options", "data_options"):
        if not isinstance(getattr(c, name), Mapping):
            raise ValueError("model_options and data_options must be mappings of keyword arguments")
        _set(c, name, FrozenMap({str(k): v for k, v in getattr(c, name).items()}))
    if c.scale_invariant is not None:
        names = c.scale_invariant
        if isinstance(names, str):
            names = [s for s in names.split(",") if s]
        if not isinstance(names, (list, tuple)) or not all(isinstance(s, str) for s in names):
            raise ValueError("scale_invariant must be a list of parameter names or patterns")
        _set(c, "scale_invariant", tuple(names))
    probes = [c.probes] if isinstance(c.probes, str) else c.probes
    if not isinstance(probes, (list, tuple)) or not all(isinstance(p, str) for p in probes):
        raise ValueError(f"probes must be a list of probe specs, got {c.probes!r}")
    _set(c, "probes", tuple(probes))
    if c.divergence_factor is not None:
        _set(c, "divergence_factor", _float("divergence_factor", c.divergence_factor))
        if c.divergence_factor <= 1:
            raise ValueError(f"divergence_factor must be > 1 (or null to disable), "
                             f"got {c.divergence_factor}")
    for flag in ("augment", "verify", "download", "compile", "sync_norms"):
        if getattr(c, flag) not in (True, False):
            raise ValueError(f"{flag} must be true or false, got {getattr(c, flag)!r}")
        _set(c, flag, bool(getattr(c, flag)))
    _set(c, "device", str(c.device))
    _check_data_parallel(c)
    _check_registries(c)


def _check_optimization(c: TrainConfig) -> None:
    """Check and normalise the optimization keys: learning rates, momentum, weight decay, batch
    size, optimizer and schedule."""
    _set(c, "lr", _float("lr", c.lr))
    if c.lr <= 0:
        raise ValueError(f"lr must be positive, got {c.lr}")
    if c.lr_scale_invariant is not None:
        _set(c, "lr_scale_invariant", _float("lr_scale_invariant", c.lr_scale_invariant))
        if c.lr_scale_invariant <= 0:
            raise ValueError(f"lr_scale_invariant must be positive, got {c.lr_scale_invariant}")
    _set(c, "momentum", _float("momentum", c.momentum))
    if not 0 <= c.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
    _set(c, "weight_decay", _float("weight_decay", c.weight_decay))
    if c.weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {c.weight_decay}")
    if isinstance(c.batch_size, str):
        if c.batch_size.strip().lower() == "full":
            _set(c, "batch_size", "full")
        else:
            try:
                _set(c, "batch_size", int(c.batch_size))
            except ValueError:
                raise ValueError(
                    f"batch_size must be a positive integer or 'full', got {c.batch_size!r}"
                ) from None
    if c.batch_size != "full":
        _positive_int("batch_size", c.batch_size, allow_none=False)
    if c.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {c.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    parse_schedule(c.schedule)  # raises with the valid forms


def _check_data_parallel(c: TrainConfig) -> None:
    """nproc and sync_norms (bnlab.train.distributed)."""
    _positive_int("nproc", c.nproc, allow_none=False)
    if c.nproc == 1 and not c.sync_norms:
        raise ValueError("sync_norms=false (--no-sync-norms) needs nproc > 1: one process has no "
                         "other ranks")
    if c.nproc > 1 and c.probes:
        raise ValueError(f"probes run in one process only; drop the probes or use nproc 1 "
                         f"(got nproc {c.nproc})")


def _check_registries(c: TrainConfig) -> None:
    """Names against the registries of ``bnlab.data`` and ``bnlab.norms`` (the model's name is
    checked by :func:`check_model_name` unless the run brings its own model factory)."""
    try:  # the registry's spelling rules, as in bnlab.data.load: case-insensitive, '-' for '_'
        bnlab.data.SOURCES.entry(c.data)
    except ValueError:
        raise ValueError(f"unknown data {c.data!r}; valid: "
                         f"{', '.join(sorted(bnlab.data.SOURCES))}") from None
    if c.placement not in bnlab.norms.PLACEMENTS:
        raise ValueError(f"unknown placement {c.placement!r}; valid: "
                         f"{', '.join(bnlab.norms.PLACEMENTS)}")
    try:
        bnlab.norms.validate(c.norm)
    except ValueError as err:
        raise ValueError(f"bad norm spec {c.norm!r}: {err}") from None
