"""The `bnlab` command.

Each sub-package contributes its commands through a ``register(app)`` function in its own ``cli``
module. Those modules import torch (seconds), so they are registered lazily: :data:`COMMANDS` names
every command, its module and the one-line help ``bnlab --help`` shows, and a command's module is
imported only when that command runs (or its own ``--help`` is asked for). ``bnlab --help`` thus
imports typer and nothing of bnlab's numerical stack; tests/test_cli_fast.py checks that the lines
here equal the commands' own help.

The CLI needs the ``lab`` extra (``pip install 'bnlab[lab]'``); without it, this module and any
command that meets a missing lab package say so in one line.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

LAB_INSTALL = "pip install 'bnlab[lab]'"
# Import names of the lab extra's packages (pyproject.toml, [project.optional-dependencies] lab), with
# typer's own dependencies: a command failing to import one of them means the extra is missing.
LAB_MODULES = frozenset({"scipy", "typer", "click", "rich", "matplotlib", "tqdm", "yaml", "PIL"})

try:
    import typer
    import typer.main
    from typer.core import TyperCommand, TyperGroup
except ModuleNotFoundError as err:  # `pip install bnlab` (layers and probes only) has no CLI
    raise ModuleNotFoundError(f"the bnlab command needs {err.name}, which is not installed: {LAB_INSTALL}",
                              name=err.name) from err


class Command(NamedTuple):
    module: str  # whose ``register(app)`` adds the command
    help: str  # the command's own one-line help (its docstring's or its Typer group's)


# Order is the order of `bnlab --help` (plain commands, then command groups, as typer lists them).
COMMANDS: dict[str, Command] = {
    "demo": Command("bnlab.demo", "Run the curated smoke entries of all five papers and write the report."),
    "reproduce": Command("bnlab.experiments.cli", "Run catalogue entries end to end and (re)write the report."),
    "report": Command("bnlab.experiments.cli",
                      "Write runs/report/index.html and index.md from the store (nothing is re-trained)."),
    "train": Command("bnlab.train.cli",
                     "Train a model and record the run; re-running the same command resumes it."),
    "norms": Command("bnlab.norms.cli", "Normalization layers: the catalogue and how to build them."),
    "experiments": Command("bnlab.experiments.cli", "The catalogue of the papers' figures and tables."),
    "models": Command("bnlab.models.cli", "The papers' networks: the catalogue and how to build them."),
    "runs": Command("bnlab.train.cli", "The recorded runs: list, show, export, delete, plot."),
    "theory": Command("bnlab.theory.cli", "The papers' closed forms and simulators (bnlab.theory)."),
}


def load_command(name: str) -> Any:
    """The click command ``name`` as its module's ``register(app)`` builds it (imports that module)."""
    module = importlib.import_module(COMMANDS[name].module)
    sub_app = typer.Typer()
    module.register(sub_app)
    return typer.main.get_group(sub_app).commands[name]


class LazyGroup(TyperGroup):
    """The root group: placeholders from :data:`COMMANDS` for listing, the real command on use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, command in COMMANDS.items():
            self.commands[name] = TyperCommand(name, help=command.help, add_help_option=False)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        # Only the command being run is imported; an unknown name falls through to typer's
        # "No such command" error with its suggestions.
        if args and args[0] in COMMANDS:
            ctx.meta["bnlab.command"] = args[0]
            self.commands[args[0]] = load_command(args[0])
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        # A lab package missing when a command's module is imported, or while it runs (some modules
        # import theirs on first use): one line naming the extra instead of a traceback.
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as err:
            if (err.name or "").partition(".")[0] not in LAB_MODULES:
                raise
            command = ctx.meta.get("bnlab.command", "")
            typer.echo(f"error: `bnlab {command}` needs {err.name}, which is not installed: {LAB_INSTALL}",
                       err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=LazyGroup,
    help="bnlab: batch-normalization layers, probes, theory and paper reproductions.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    # A callback makes typer build a group although every command comes from LazyGroup.
    pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
