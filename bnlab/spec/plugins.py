"""User code that registers data sources, models, probes or layers, found by name.

A plugin is a module whose import registers entries with bnlab's decorators (``@source``,
``@model``, ``@norm``, ``@PROBES.register``). In a script, importing it is enough. For
``bnlab`` commands (and the processes a data-parallel run starts) name it in ``$BNLAB_PLUGINS``
(module names, separated by commas), or install it as a package with an entry point in the
``bnlab.plugins`` group. The modules are imported once, the first time a registry misses a name
or lists its entries, so a plugin's names work in every spec string and CLI flag.
"""

from __future__ import annotations

import functools
import importlib
import os
from importlib import metadata

PLUGINS_ENV = "BNLAB_PLUGINS"
ENTRY_POINT_GROUP = "bnlab.plugins"

_loaded: set[str] = set()


@functools.cache
def _entry_point_modules() -> tuple[str, ...]:
    # installed distributions do not change under a running process; scanning them costs ms
    try:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken installed distribution must not break every lookup
        return ()
    return tuple(p.value.split(":")[0] for p in points)


def plugin_modules() -> list[str]:
    """The modules named in ``$BNLAB_PLUGINS`` and by installed ``bnlab.plugins`` entry points."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    return names + list(_entry_point_modules())


def load_plugins() -> list[str]:
    """Import the plugin modules not imported yet; returns their names. A module that fails to
    import raises ``ImportError`` naming it and where it was listed."""
    new = [name for name in plugin_modules() if name not in _loaded]
    for name in new:
        _loaded.add(name)  # once, even if it fails: the error is reported, not retried per lookup
        try:
            importlib.import_module(name)
        except Exception as err:
            raise ImportError(f"bnlab plugin {name!r} (from ${PLUGINS_ENV} or the "
                              f"{ENTRY_POINT_GROUP!r} entry points) failed to import: "
                              f"{type(err).__name__}: {err}") from err
    return new
