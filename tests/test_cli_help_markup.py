"""`--help` of every command and subcommand is plain text: no typer type labels (``<bool>``,
``<list[str]>``), no ``{ids}...`` usage, no reST literals (````stopped````), no Markdown-escaped
pipes (``\\|``). typer 0.29 writes the first two itself; ``bnlab.cli.typer_app.plain_help``
shows the parameters as click does (``IDS...``, ``TEXT``, nothing after a flag)."""

import re

import pytest
import typer
from typer.testing import CliRunner

from bnlab.cli import COMMANDS, app, load_command
from bnlab.cli.typer_app import plain_help

DEBRIS = re.compile(r"<bool>|<(?:str|int|float|path|int range|list\[\w+\])>|\{|``|\\\|")
WIDE = {"COLUMNS": "250", "TERMINAL_WIDTH": "250"}  # no debris hidden by a line wrap


def _paths(command, path):
    yield path
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _paths(sub, [*path, name])


def every_command() -> list[list[str]]:
    return [[]] + [p for name in COMMANDS for p in _paths(load_command(name), [name])]


def test_every_command_is_walked():
    paths = [" ".join(p) for p in every_command()]
    assert {"", "reproduce", "experiments list", "runs list", "runs show", "theory"} <= set(paths)
    assert len(paths) > len(COMMANDS) + 5


@pytest.mark.parametrize("path", every_command(), ids=lambda p: " ".join(p) or "bnlab")
def test_help_has_no_markup_debris(path):
    result = CliRunner().invoke(app, [*path, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    found = [line.strip() for line in result.output.splitlines() if DEBRIS.search(line)]
    assert not found, found


def test_arguments_and_flags_read_as_click_writes_them():
    out = CliRunner().invoke(app, ["reproduce", "--help"], env=WIDE).output
    assert re.search(r"Usage: \S+ reproduce \[OPTIONS\] IDS\.\.\.", out), out
    assert re.search(r"--tiny +cut every run", out)  # a flag: no type
    assert re.search(r"--runs-dir +PATH +store", out) and re.search(r"--nproc +INTEGER", out)
    out = CliRunner().invoke(app, ["runs", "show", "--help"], env=WIDE).output
    assert re.search(r"Usage: .* RUN_ID\b", out), out


def _help(command, capsys) -> str:
    with pytest.raises(SystemExit):
        command.main(["go", "--help"], prog_name="demo")
    return capsys.readouterr().out


def test_plain_help_is_what_removes_typers_labels(capsys, monkeypatch):
    """The cause, shown on a fresh app: typer itself writes ``<bool>`` and ``{name}``."""
    for key, value in WIDE.items():
        monkeypatch.setenv(key, value)
    demo = typer.Typer()

    @demo.command()
    def go(names: list[str] = typer.Argument(...),
           fast: bool = typer.Option(False, "--fast")) -> None:
        """Go."""

    @demo.command()
    def stay() -> None:
        """Stay."""

    before = _help(typer.main.get_group(demo), capsys)
    assert "<bool>" in before and "{names}" in before
    after = _help(plain_help(typer.main.get_group(demo)), capsys)
    assert not DEBRIS.search(after), after
    assert "NAMES..." in after
