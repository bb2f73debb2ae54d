"""The Typer application behind ``bnlab`` (the lab extra): commands registered lazily.

:mod:`bnlab.cli` imports this module only when typer is installed; without it, ``bnlab --help``
and ``--version`` still answer (``bnlab.cli.light_main``) and commands name the extra in one line.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from bnlab.cli.commands import COMMANDS, LAB_INSTALL, LAB_MODULES, version_line

def load_command(name: str) -> Any:
    """The click command ``name`` as its module's ``register(app)`` builds it (imports that
    module)."""
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
            typer.echo(f"error: `bnlab {command}` needs {err.name}, which is not installed: "
                       f"{LAB_INSTALL}",
                       err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=LazyGroup,
    help="bnlab: batch-normalization layers, probes, theory and paper reproductions.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print bnlab's version and exit.")) -> None:
    # A callback makes typer build a group although every command comes from LazyGroup.
    pass


