"""The `bnlab` command.

Every command lives in this package, the top layer (nothing else in bnlab imports it): one module
per command or command group (``bnlab.cli.train``, ``bnlab.cli.runs``, ``bnlab.cli.norms``, ...),
each adding its commands through a ``register(app)`` function. Those modules import torch (seconds),
so they are registered lazily: :data:`COMMANDS` names every command, its module and the one-line
help ``bnlab --help`` shows, and a command's module is imported only when that command runs (or its
own ``--help`` is asked for). ``bnlab --help`` thus imports typer and nothing of bnlab's numerical
stack; tests/test_cli_fast.py checks that the lines here equal the commands' own help.

The commands need the ``lab`` extra (``pip install 'bnlab[lab]'``); without it (the light install:
torch and numpy), ``bnlab --help`` and ``bnlab --version`` still answer and every command says what
to install in one line (:func:`light_main`), as does a command that meets a missing lab package.
The Typer application lives in :mod:`bnlab.cli.typer_app`, the command table in
:mod:`bnlab.cli.commands`; ``python -m bnlab.cli`` runs :func:`main` (``__main__.py``).
"""

from __future__ import annotations

import sys
from typing import Any

from bnlab.cli.commands import (  # noqa: F401 (re-exported: bnlab.cli.COMMANDS, ...)
    COMMANDS, LAB_INSTALL, LAB_MODULES, Command, light_help, version_line)

try:
    import typer  # noqa: F401 (the lab extra's CLI library: is it there?)
# `pip install bnlab` (layers and probes only): --help/--version only
except ModuleNotFoundError as err:
    _MISSING: ModuleNotFoundError | None = err
else:
    _MISSING = None


def main(argv: list[str] | None = None) -> None:
    """``bnlab``: the Typer app, or, without the lab extra, ``--help``/``--version`` and one line
    naming the extra for any command."""
    if _MISSING is None:
        app(args=argv)
        return
    raise SystemExit(light_main(sys.argv[1:] if argv is None else argv))


def light_main(argv: list[str]) -> int:
    """The front door of the light install (torch and numpy only); returns the exit status."""
    if argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    if not argv or argv[0] in ("--help", "-h"):
        print(light_help())
        return 0
    name = argv[0] if argv[0] in COMMANDS else "COMMAND"
    missing = _MISSING.name if _MISSING else "typer"
    print(f"error: `bnlab {name}` needs {missing}, which is not installed: {LAB_INSTALL}",
          file=sys.stderr)
    return 1


def __getattr__(name: str) -> Any:
    if name in ("app", "LazyGroup", "load_command") and _MISSING is not None:
        raise ModuleNotFoundError(f"the bnlab command needs {_MISSING.name}, which is not "
                                  f"installed: {LAB_INSTALL}", name=_MISSING.name)
    raise AttributeError(f"module 'bnlab.cli' has no attribute {name!r}")


if _MISSING is None:  # the CLI proper (typer, the lab extra); it reads COMMANDS above
    from bnlab.cli.typer_app import LazyGroup, app, load_command  # noqa: F401

