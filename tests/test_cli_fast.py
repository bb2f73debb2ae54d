"""`bnlab --help` answers without importing torch; the lazy commands are the commands themselves."""

from __future__ import annotations

import ast
import subprocess
import sys

import typer
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from bnlab import cli
from bnlab.cli.typer_app import plain_help

HELP_PATH = '''
import sys
from bnlab.cli import app
try:
    app({args!r}, prog_name="bnlab")
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules
               if m.partition(".")[0] in ("torch", "numpy", "scipy", "matplotlib"))
print("HEAVY", heavy)
print("BNLAB", sorted(m for m in sys.modules if m.startswith("bnlab")))
'''


def _run_help_path(args: list[str]) -> dict[str, str]:
    result = subprocess.run([sys.executable, "-c", HELP_PATH.format(args=args)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    marks = dict(line.split(" ", 1) for line in lines if line.startswith(("HEAVY ", "BNLAB ")))
    return {"help": "\n".join(line for line in lines
                              if not line.startswith(("HEAVY ", "BNLAB "))), **marks}


def test_help_imports_neither_torch_nor_any_command_module():
    for args in (["--help"], []):  # `bnlab` alone prints the same help
        out = _run_help_path(args)
        assert out["HEAVY"] == "[]"
        assert out["BNLAB"] == "['bnlab', 'bnlab.cli', 'bnlab.cli.commands', 'bnlab.cli.typer_app']"
        for name in cli.COMMANDS:
            assert f" {name} " in out["help"]


def test_a_command_imports_only_its_own_module():
    out = _run_help_path(["theory", "--help"])  # bnlab.cli.theory imports its calculators on use
    assert "luo-zeta" in out["help"]
    loaded = ast.literal_eval(out["BNLAB"])
    assert "bnlab.cli.theory" in loaded
    assert not [m for m in loaded
                if m.startswith(("bnlab.experiments", "bnlab.norms", "bnlab.train"))]


class _PlainGroup(TyperGroup):
    """A group shown as bnlab shows its commands (``plain_help``: no typer type labels)."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        plain_help(self)


def _eager_app() -> typer.Typer:
    """Every command registered up front, as bnlab.cli did before the lazy group."""
    eager = typer.Typer(cls=_PlainGroup, add_completion=False, no_args_is_help=True)
    for module in dict.fromkeys(command.module for command in cli.COMMANDS.values()):
        __import__(module, fromlist=["register"]).register(eager)
    return eager


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def test_listed_commands_and_help_lines_are_the_commands_own():
    eager = typer.main.get_group(_eager_app())
    assert set(eager.commands) == set(cli.COMMANDS), \
        "a command was added or removed: update bnlab.cli.COMMANDS"
    for name, command in cli.COMMANDS.items():
        own_help = _first_paragraph(eager.commands[name].help or "")
        assert command.help == own_help, f"bnlab.cli.COMMANDS[{name!r}].help should be {own_help!r}"
        assert cli.load_command(name).help == eager.commands[name].help


def test_each_command_help_is_unchanged_by_lazy_loading():
    eager = _eager_app()
    runner = CliRunner()
    for name in cli.COMMANDS:
        lazy_out = runner.invoke(cli.app, [name, "--help"], prog_name="bnlab")
        eager_out = runner.invoke(eager, [name, "--help"], prog_name="bnlab")
        assert lazy_out.exit_code == eager_out.exit_code == 0, (name, lazy_out.output)
        assert lazy_out.output == eager_out.output, name


def test_unknown_command_still_suggests_the_close_one():
    result = CliRunner().invoke(cli.app, ["trian"], prog_name="bnlab")
    assert result.exit_code == 2
    assert "No such command 'trian'" in result.output and "'train'" in result.output
