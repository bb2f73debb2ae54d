"""`bnlab doctor [the train command's flags]`: train with the doctor watching and print its report.

The flags are ``bnlab train``'s (generated from :class:`~bnlab.train.config.TrainConfig`'s fields
by :mod:`bnlab.cli.train`, so the two commands cannot drift apart), with ``--steps N`` to train
only N steps of the run; ``--json FILE`` and ``--html FILE`` write the report (a JSON object; one
self-contained HTML page) and ``--every N`` sets the watched cadence. The run goes to a temporary
store, deleted afterwards, unless ``--runs-dir`` is given (then it is kept, and a stored run of
the same identity needs ``--force`` to be trained again). Output: one line for the run, then one
line per finding, most severe first (``no warnings`` when none). Exit 0 when the run trained
(whatever the findings), 1 when it failed, 2 for a configuration error.
"""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from bnlab.cli.common import EXIT_FAILED, fail
from bnlab.cli.train import TRAIN_OPTIONS, config_from_options, doctor_report, watching
from bnlab.doctor.watcher import EVERY
from bnlab.store.run_files import RunDirError, RunLockedError
from bnlab.train.launcher import train
from bnlab.train.loop import RunInterrupted
from bnlab.train.trackers import parse_log_to

# bnlab train's options but its --json (the record on stdout) and --doctor (always on here)
DOCTOR_OPTIONS: dict[str, tuple[Any, Any]] = {
    **{name: option for name, option in TRAIN_OPTIONS.items() if name not in ("as_json", "doctor")},
    "json_file": (Optional[Path], typer.Option(
        None, "--json", help="Write the report as JSON to FILE.", metavar="FILE")),
    "html_file": (Optional[Path], typer.Option(
        None, "--html", help="Write the report as one self-contained HTML page to FILE.",
        metavar="FILE")),
    "every": (int, typer.Option(EVERY, "--every", help="Watch one step in N.", min=1)),
}


def doctor_command(**options: Any) -> None:
    """Train with the doctor watching and print what it finds (bnlab.doctor)."""
    with tempfile.TemporaryDirectory(prefix="bnlab-doctor-") as scratch:
        record, doctor = _train(options, scratch)
    if doctor.steps == 0:
        fail("no step was trained: a run of this identity is stored in --runs-dir (--force "
             "trains it again)", EXIT_FAILED)
    report = doctor_report(doctor)
    assert report is not None
    typer.echo(f"run {record.id} {record.status} after {record.steps} steps; the doctor saw "
               f"{doctor.steps} of them and read one in {doctor.every}")
    typer.echo(str(report))
    if options["json_file"] is not None:
        report.to_json(options["json_file"])
        typer.echo(f"report: {options['json_file']}")
    if options["html_file"] is not None:
        report.to_html(options["html_file"])
        typer.echo(f"page: {options['html_file']}")
    if record.status == "failed":
        raise typer.Exit(EXIT_FAILED)


def _train(options: dict[str, Any], scratch: str):
    try:
        config = config_from_options(options)
        if options["runs_dir"] is None:
            config = dataclasses.replace(config, runs_dir=scratch)
        doctor = watching(config, every=options["every"])
        callbacks = [*(parse_log_to(s) for s in options["log_to"] or []), doctor]
        record = train(config, progress=False, force=options["force"], callbacks=callbacks)
    except RunInterrupted as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(128 + err.signum) from None
    except (RunDirError, RunLockedError) as err:
        fail(str(err), EXIT_FAILED)
    except ValueError as err:  # configuration, data files: all before training
        fail(str(err))
    except Exception as err:
        typer.echo(f"error: run failed: {type(err).__name__}: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    return record, doctor


doctor_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
     for name, (kind, option) in DOCTOR_OPTIONS.items()])


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
