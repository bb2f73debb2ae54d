"""One spec mechanism: ``name(key=value, ...)`` strings, typed parameters and registries.

Every catalogue of bnlab (normalization layers, probes, models, data sources) is a :class:`Registry`
of entries, each with typed :class:`Param` s. A spec string such as ``"cbn(rho=2, amat=no)"`` or
``"landscape(num=8, every=50)"`` is resolved by :meth:`Registry.lookup` into the entry and typed
keyword arguments; a mistake fails with a ``ValueError`` that names the valid choices (names,
keys, allowed values or the expected type). The CLI's ``KEY=VALUE`` flags go through
:func:`read_pairs`, which reads values with the same literal rules (:func:`read_value`).

Booleans: ``true/false/yes/no/on/off/1/0`` in any case (as YAML 1.1 reads ``yes``/``no``), so
``per_layer=no`` is ``False`` wherever it is written. The package imports nothing beyond the
standard library. Its modules: :mod:`.grammar` (the string grammars, :func:`check_choice`,
:func:`format_value`), :mod:`.params` (:class:`Param`, parameters from signatures) and
:mod:`.registry` (:class:`Registry`, :class:`Entry`) and :mod:`.plugins` (user modules that
register entries, found by name: ``$BNLAB_PLUGINS``).
"""

from .grammar import (
    FALSE_WORDS, MAX_DEPTH, NONE_WORDS, TRUE_WORDS, check_choice, format_value, parse, read_pairs,
    read_value, split_joined, split_tagged, split_top_level,
)
from .params import Param, declared, inferred_param, params_from_signature, signature_params
from .plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, load_plugins
from .registry import Entry, Registry

__all__ = [
    "ENTRY_POINT_GROUP", "FALSE_WORDS", "MAX_DEPTH", "NONE_WORDS", "PLUGINS_ENV", "TRUE_WORDS",
    "Entry", "Param", "Registry", "check_choice", "declared", "format_value", "inferred_param",
    "load_plugins", "params_from_signature", "parse", "read_pairs", "read_value",
    "signature_params", "split_joined", "split_tagged", "split_top_level",
]
