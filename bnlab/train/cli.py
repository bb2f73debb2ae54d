"""`bnlab train ...` and `bnlab runs list|show|export`.

Configuration precedence: the defaults of :class:`~bnlab.train.config.TrainConfig`, then the keys
of ``--config run.yaml``, then the flags given on the command line. A configuration error is one
line on stderr and exit code 2; a diverged run is a result (exit 0); a failed run exits 1.
"""

from __future__ import annotations

import typer

from bnlab.train.runs_cli import register as register_runs  # `bnlab runs ...` (runs_cli.py)
from bnlab.train.train_cli import train_command


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    register_runs(app)
