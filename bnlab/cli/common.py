"""What the commands share: exit codes and the one-line error exit (table cells are
:func:`bnlab.formatting.fmt`'s)."""

from __future__ import annotations

import typer

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
