"""The Typer application behind ``bnlab`` (the lab extra): commands registered lazily.

:mod:`bnlab.cli` imports this module only when typer is installed; without it, ``bnlab --help``
and ``--version`` still answer (``bnlab.cli.light_main``) and commands name the extra in one line.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
import typer.main
from typer._click import Context
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from bnlab.cli.commands import COMMANDS, LAB_INSTALL, LAB_MODULES, version_line

# What `--help` calls a value, as click names its types (typer writes ``<str>``, ``<list[str]>``).
_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": ""}


class _PlainArgument(TyperArgument):
    """An argument as click shows it: ``IDS...`` in the usage line (typer writes ``{ids}...``)
    and no type column (typer writes ``<list[str]>``)."""

    def display_type_rich(self, ctx: Any) -> str:
        return ""

    def _usage_display_name(self) -> str:
        return self.display_name_raw if self.required else f"[{self.display_name_raw}]"


class _PlainOption(TyperOption):
    """An option as click shows it: nothing after a flag (typer writes ``<bool>``), else its type
    in capitals (``TEXT``, ``INTEGER``, ``PATH``) or its choices."""

    def display_type_rich(self, ctx: Any) -> str:
        if self.metavar is not None:
            return self.metavar
        if self.is_bool_flag:
            return ""
        label = self.display_type(ctx).strip("<>").split(" range")[0]
        label = label.removeprefix("list[").removesuffix("]")
        return _TYPE_NAMES.get(label, label) + ("..." if self.nargs != 1 else "")


def plain_help(command: Any) -> Any:
    """``command`` and its subcommands with their parameters shown in ``--help`` as click shows
    them (:class:`_PlainArgument`, :class:`_PlainOption`: no ``<bool>``, ``{ids}...``); returns
    ``command``."""
    for param in command.params:
        if isinstance(param, TyperArgument):
            param.__class__ = _PlainArgument
            if param.metavar is None:
                param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
        elif isinstance(param, TyperOption):
            param.__class__ = _PlainOption
    help_option = command.get_help_option(Context(command, **(command.context_settings or {})))
    if help_option is not None:
        help_option.__class__ = _PlainOption
    for sub in (getattr(command, "commands", None) or {}).values():
        plain_help(sub)
    return command


def load_command(name: str) -> Any:
    """The click command ``name`` as its module's ``register(app)`` builds it (imports that
    module), its help plain (:func:`plain_help`)."""
    module = importlib.import_module(COMMANDS[name].module)
    sub_app = typer.Typer()
    module.register(sub_app)
    return plain_help(typer.main.get_group(sub_app).commands[name])


class LazyGroup(TyperGroup):
    """The root group: placeholders from :data:`COMMANDS` for listing, the real command on use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, command in COMMANDS.items():
            self.commands[name] = TyperCommand(name, help=command.help, add_help_option=False)
        plain_help(self)

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


