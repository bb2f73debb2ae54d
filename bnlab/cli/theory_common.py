"""What the `bnlab theory` commands share: number lists from the command line, the one-line error
exit (code 2), the result as a table or JSON, and the --json/--plot options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import typer

from bnlab.formatting import fmt
from bnlab.jsonsafe import jsonable

EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        _fail(f"{flag} expects comma-separated numbers, got {text!r}")
    return []


def parse_ints(text: str, flag: str) -> list[int]:
    values = parse_floats(text, flag)
    if any(v != int(v) for v in values):
        _fail(f"{flag} expects comma-separated integers, got {text!r}")
    return [int(v) for v in values]


def _table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    cells = [[fmt(r.get(c, ""), 6) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    typer.echo("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in cells:
        typer.echo("  ".join(x.rjust(w) for x, w in zip(row, widths)))


def emit_result(result: Any, rows: list[dict[str, Any]], as_json: bool,
                notes: list[str] | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(jsonable(result, nonfinite="string"), indent=2))
        return
    _table(rows)
    for note in notes or []:
        typer.echo(note)


def run_or_exit(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as exc:  # bad parameters: one line, exit 2
        _fail(str(exc))


def plot_written(path: Path) -> None:
    typer.echo(f"plot written to {path}", err=True)


JSON = typer.Option(False, "--json", help="Print the full result as JSON instead of a table.")
PLOT = typer.Option(None, "--plot", help="Draw the curves into this image file (PNG/PDF/SVG).")
