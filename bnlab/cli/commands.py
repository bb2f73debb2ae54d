"""What ``bnlab`` knows without importing typer or torch: its commands, their one-line help, the
lab extra's install line, ``--version`` and the light install's ``--help`` (:mod:`bnlab.cli`)."""

from __future__ import annotations

from typing import NamedTuple

import bnlab

LAB_INSTALL = "pip install 'bnlab[lab]'"
# Import names of the lab extra's packages (pyproject.toml, [project.optional-dependencies] lab),
# with typer's own dependencies: a command failing to import one of them means the extra is missing.
LAB_MODULES = frozenset({"scipy", "typer", "click", "rich", "matplotlib", "tqdm", "yaml", "PIL"})


class Command(NamedTuple):
    module: str  # whose ``register(app)`` adds the command
    help: str  # the command's own one-line help (its docstring's or its Typer group's)


# Order is the order of `bnlab --help` (plain commands, then command groups, as typer lists them).
COMMANDS: dict[str, Command] = {
    "demo": Command("bnlab.cli.demo",
                    "Run the curated smoke entries of all five papers and write the report."),
    "reproduce": Command("bnlab.cli.experiments",
                         "Run catalogue entries end to end and (re)write the report."),
    "report": Command("bnlab.cli.experiments",
                      "Write runs/report/index.html and index.md from the store (nothing is "
                      "re-trained)."),
    "train": Command("bnlab.cli.train",
                     "Train a model and record the run; re-running the same command resumes it."),
    "doctor": Command("bnlab.cli.doctor",
                      "Train with the doctor watching and print what it finds (bnlab.doctor)."),
    "norms": Command("bnlab.cli.norms",
                     "Normalization layers: the catalogue and how to build them."),
    "experiments": Command("bnlab.cli.experiments",
                           "The catalogue of the papers' figures and tables."),
    "models": Command("bnlab.cli.models",
                      "The papers' networks: the catalogue and how to build them."),
    "runs": Command("bnlab.cli.runs", "The recorded runs: list, show, export, delete, plot."),
    "theory": Command("bnlab.cli.theory",
                      "The papers' closed forms and simulators (bnlab.theory)."),
}


def version_line() -> str:
    return f"bnlab {bnlab.__version__}"


def light_help() -> str:
    width = max(map(len, COMMANDS))
    lines = ["Usage: bnlab [--version] COMMAND [ARGS]...", "",
             "bnlab: batch-normalization layers, probes, theory and paper reproductions.", "",
             f"Commands (each needs the lab extra: {LAB_INSTALL}):"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "Installed: the layers (import bnlab.norms) and probes (import bnlab.probes)."]
    return "\n".join(lines)
