"""`bnlab models ...` commands."""

from __future__ import annotations

import json

import typer

from bnlab.models.registry import MODEL_INFO

models_app = typer.Typer(help="The papers' networks: the catalogue and how to build them.",
                         no_args_is_help=True)


@models_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json",
                                             help="print JSON instead of a table")) -> None:
    """Every model with its paper, input kind, default activation and options (with defaults)."""
    rows = [
        {
            "name": info.name,
            "summary": info.summary,
            "paper": info.paper,
            "input": "image (C, H, W)" if info.images_only else "any shape (flattened)",
            "activation": info.default_activation,
            "options": {k: v for k, v in info.options.items()},
        }
        for info in MODEL_INFO.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        options = ", ".join(f"{k}={v!r}" for k, v in row["options"].items()) or "-"
        typer.echo(f"{row['name']:<14} {row['summary']}")
        typer.echo(f"{'':<14} paper: {row['paper']} — input: {row['input']}")
        typer.echo(f"{'':<14} options: {options}; activation default: {row['activation']}")
    typer.echo("\nCommon: norm (any `bnlab norms list` spec), activation, placement "
               "(pre_activation | pre_linear), input_shape, num_classes, init (glorot | kaiming), "
               "seed.")


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
