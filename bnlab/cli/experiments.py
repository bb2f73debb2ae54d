"""`bnlab experiments list`, `bnlab reproduce ID`, `bnlab report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from bnlab.jsonsafe import dumps, jsonable
from bnlab.report import write_report
from bnlab.store import StoreCorruptError, StoreVersionError

from bnlab.experiments.base import check_preset, get, load_catalogue
from bnlab.experiments.runner import reproduce

experiments_app = typer.Typer(help="The catalogue of the papers' figures and tables.",
                              no_args_is_help=True)


@experiments_app.command("list")
def list_experiments(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Every entry with its paper, figure/table, claim and preset costs."""
    entries = [e.describe() for e in load_catalogue().values()]
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    for e in entries:
        cost = "; ".join(f"{k}: {v}" for k, v in e["cost"].items())
        typer.echo(f"{e['id']:<24} {e['target']:<12} {e['title']}")
        typer.echo(f"{'':<24} claim: {e['claim']}")
        typer.echo(f"{'':<24} cost: {cost}")
        if e["resolution"]:
            r = e["resolution"]
            typer.echo(f"{'':<24} resolves: {r['resolvable']} (paper: {r['paper']}; "
                       f"from {r['pilot']})")


def reproduce_cmd(
    ids: List[str] = typer.Argument(..., help="entry ids (see `bnlab experiments list`), or 'all'"),
    preset: str = typer.Option("smoke",
                               help="smoke (CPU, minutes) or paper (the paper's setup, GPU)"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="store, checkpoints and report"),
    ray: Optional[str] = typer.Option(
        None, "--ray", help="run each training run as a Ray task: ADDRESS or 'local'"
    ),
    tiny: bool = typer.Option(False, "--tiny",
                              help="cut every run to a few steps (a wiring check)"),
    nproc: Optional[int] = typer.Option(None, "--nproc",
                                        help="train each run without probes data-parallel on N "
                                             "processes, norms synced (docs: distributed)"),
    as_json: bool = typer.Option(False, "--json", help="print the outcomes as JSON"),
) -> None:
    """Run catalogue entries end to end and (re)write the report."""
    try:
        check_preset(preset)
        if nproc is not None and nproc < 1:
            raise ValueError(f"--nproc must be a positive integer, got {nproc}")
        targets = sorted(load_catalogue()) if ids == ["all"] else [get(i).id for i in ids]
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    results = {}
    for experiment_id in targets:
        outcome = reproduce(experiment_id, preset, runs_dir=runs_dir, ray_address=ray, tiny=tiny,
                            report=False, nproc=nproc)
        results[experiment_id] = {"verdict": outcome.verdict, "summary": outcome.summary,
                                  "figures": [str(f) for f in outcome.figures],
                                  "table": outcome.table}
        if not as_json:
            typer.echo(f"{experiment_id}: {outcome.verdict} — {outcome.summary}")
    path = write_report(runs_dir)
    if as_json:
        typer.echo(dumps(jsonable(results, objects=True), indent=2))  # strict JSON: NaN as null
    else:
        typer.echo(f"report: {path}")


def report_cmd(runs_dir: Path = typer.Option(Path("runs"), "--runs-dir"),
               out: Optional[Path] = typer.Option(None, "--out", help="report folder (default "
                                                  "RUNS_DIR/report; needed when the runs dir is "
                                                  "read-only)")) -> None:
    """Write runs/report/index.html and index.md from the store (nothing is re-trained)."""
    if not (runs_dir / "bnlab.db").is_file():  # never create an empty report for a mistyped folder
        typer.echo(f"error: no run store at {runs_dir / 'bnlab.db'}; pass the --runs-dir that "
                   "`bnlab reproduce` or `bnlab train` wrote to", err=True)
        raise typer.Exit(2)
    try:
        typer.echo(str(write_report(runs_dir, out)))
    # read-only without --out; a
    except (PermissionError, StoreCorruptError, StoreVersionError) as err:
        # damaged or foreign store: one line saying what to do
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.add_typer(experiments_app, name="experiments")
    app.command("reproduce")(reproduce_cmd)
    app.command("report")(report_cmd)
