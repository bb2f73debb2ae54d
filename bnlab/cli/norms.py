"""`bnlab norms ...` commands."""

from __future__ import annotations

import json
from typing import Any

import typer

from bnlab.spec import format_value as _fmt

from bnlab.norms import describe

norms_app = typer.Typer(help="Normalization layers: the catalogue and how to build them.",
                        no_args_is_help=True)


@norms_app.command("list")
def list_norms(as_json: bool = typer.Option(False, "--json",
                                            help="print JSON instead of a table")) -> None:
    """Every layer with its paper, equation and parameters (with defaults)."""
    rows: list[dict[str, Any]] = [
        {
            "name": info.name,
            "summary": info.summary,
            "paper": info.paper,
            "equation": info.equation,
            "kind": info.kind,
            "params": {k: _fmt(p.default) for k, p in info.params.items()},
        }
        for info in describe()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        params = ", ".join(f"{k}={v}" for k, v in row["params"].items()) or "-"
        typer.echo(f"{row['name']:<13} {row['summary']}")
        typer.echo(f"{'':<13} paper: {row['paper']} — {row['equation']}")
        wraps = "   [wraps the linear/conv layer]" if row["kind"] == "wrapper" else ""
        typer.echo(f"{'':<13} params: {params}" + wraps)


def register(app: typer.Typer) -> None:
    app.add_typer(norms_app, name="norms")
