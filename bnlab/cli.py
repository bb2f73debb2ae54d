"""The `bnlab` command.

Each sub-package contributes its commands through a ``register(app)`` function in its own
``cli`` module, so this file only lists them and stays short.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="bnlab: batch-normalization layers, probes, theory and paper reproductions.",
    no_args_is_help=True,
    add_completion=False,
)

# Modules whose ``register(app)`` adds commands; order is the order of `bnlab --help`.
COMMAND_MODULES = [
    "bnlab.norms.cli",
    "bnlab.demo",
    "bnlab.experiments.cli",
    "bnlab.models.cli",
    "bnlab.train.cli",
    "bnlab.theory.cli",
]


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
