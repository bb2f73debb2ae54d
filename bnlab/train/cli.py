"""`bnlab train ...` and `bnlab runs list|show|export`.

Configuration precedence: the defaults of :class:`~bnlab.train.config.TrainConfig`, then the keys
of ``--config run.yaml``, then the flags given on the command line. A configuration error is one
line on stderr and exit code 2; a diverged run is a result (exit 0); a failed run exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def register(app: typer.Typer) -> None:
    from bnlab.train.train_cli import train_command

    app.command("train")(train_command)
    from bnlab.train.runs_cli import register as register_runs  # `bnlab runs ...` (runs_cli.py)

    register_runs(app)
