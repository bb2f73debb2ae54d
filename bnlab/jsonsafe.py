"""The one JSON sanitizer: numbers, arrays and tensors as plain JSON values.

Every JSON the lab writes (the run store's columns and exports, the catalogue's stored results,
``bnlab theory --json``) goes through :func:`jsonable`, so a diverged loss, a numpy scalar or a
tensor is written the same way everywhere. Needs only numpy; torch is recognised without importing
it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np


NONFINITE = ("null", "string", "keep")


def jsonable(value: Any, *, nonfinite: str = "null", objects: bool = False) -> Any:
    """A copy of ``value`` that :func:`json.dumps` accepts with ``allow_nan=False``.

    Mappings (keys as ``str``), lists and tuples are walked; numpy arrays, numpy scalars and torch
    tensors become lists and Python numbers. A non-finite float (JSON has no NaN/inf) becomes
    ``None`` (``nonfinite="null"``), its name (``"string"``: ``"nan"``, ``"inf"``, ``"-inf"``, the
    sign kept for a reader) or stays a float (``"keep"``: Python's ``json`` writes ``NaN``, which
    only Python reads back; the catalogue's stored results rely on it). With ``objects`` a dataclass
    or plain object becomes its fields and anything else its ``str``; without, such values are left
    for ``json.dumps`` to refuse.
    """
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {', '.join(NONFINITE)}, got {nonfinite!r}")
    walk = lambda v: jsonable(v, nonfinite=nonfinite, objects=objects)  # noqa: E731
    if isinstance(value, Mapping):
        return {str(k): walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [walk(v) for v in value]
    torch = sys.modules.get("torch")  # a tensor means torch is loaded already
    if torch is not None and isinstance(value, torch.Tensor):
        return walk(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return walk(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isfinite(number) or nonfinite == "keep":
            return number
        return str(number) if nonfinite == "string" else None
    if value is None or isinstance(value, str) or not objects:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return walk(dataclasses.asdict(value))
    return walk(vars(value)) if hasattr(value, "__dict__") else str(value)


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON of :func:`jsonable` ``(value)`` (non-finite floats as ``null``)."""
    return json.dumps(jsonable(value), allow_nan=False, **kwargs)
