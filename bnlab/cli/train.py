"""`bnlab train ...`: train one run from flags and/or a YAML file, and print its record.

Configuration precedence: the defaults of :class:`~bnlab.train.config.TrainConfig`, then the keys
of ``--config run.yaml``, then the flags given on the command line. A configuration error is one
line on stderr and exit code 2; a diverged run is a result (exit 0); a failed run exits 1; Ctrl-C
stores the run ``interrupted``, says how to resume, and exits 130.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from bnlab.store.run_files import RunDirError, RunLockedError
from bnlab.jsonsafe import dumps
from bnlab.store import Store
from bnlab.cli.common import EXIT_FAILED, fail
from bnlab.doctor import Doctor, Report
from bnlab.formatting import fmt
from bnlab.train.config import CliOption, TrainConfig, cli_options, load_config_file
from bnlab.train.launcher import train  # one process, --nproc N local ones, or a torchrun rank
from bnlab.train.loop import RunInterrupted
from bnlab.train.record import RunRecord
from bnlab.train.trackers import parse_log_to  # --log-to

EXIT_INTERRUPTED = 130


# Options that are not config keys: the config file, and what to do with the run.
_BEFORE: dict[str, tuple[Any, Any]] = {
    "config_file": (Optional[Path], typer.Option(
        None, "--config", help="YAML file of config keys; flags override it.")),
}
_AFTER: dict[str, tuple[Any, Any]] = {
    "force": (bool, typer.Option(False, "--force",
                                 help="Delete a stored run of this identity and train it again.")),
    "log_to": (Optional[list[str]], typer.Option(None, "--log-to", help=(
        "Mirror the run to tensorboard:DIR or mlflow:URI "
        "(repeatable; pip install 'bnlab[track]')."))),
    "as_json": (bool, typer.Option(False, "--json",
                                   help="Print the final record as one JSON object.")),
    "doctor": (bool, typer.Option(False, "--doctor", help=(
        "Watch the run with bnlab.doctor.Doctor and print its report (bnlab doctor: the "
        "report alone, --html)."))),
}


def _config_option(option: CliOption) -> tuple[Any, Any]:
    """A config key's typer option, from the field's metadata (bnlab.train.config.cli_options)."""
    default = False if option.kind is bool else None
    return option.kind, typer.Option(default, *option.flag.split(" "), help=option.help)


# name -> (type, typer option), in the order `bnlab train --help` lists them: generated from
# TrainConfig's fields, so a config key and its flag cannot drift apart
TRAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    **_BEFORE, **{o.name: _config_option(o) for o in cli_options()}, **_AFTER}


def train_command(**options: Any) -> None:
    """Train a model and record the run; re-running the same command resumes it."""
    config = doctor = None
    try:
        config = config_from_options(options)  # the one validation
        progress = "bar" if sys.stderr.isatty() else "lines"
        callbacks = [parse_log_to(s) for s in options["log_to"] or []]
        if options["doctor"]:
            doctor = watching(config)
            callbacks.append(doctor)
        record = train(config, progress=progress, force=options["force"], callbacks=callbacks)
        if record is None:  # a rank > 0 of a torchrun launch: rank 0 reports
            return
    # Ctrl-C or SIGTERM: stored interrupted; exit 128 + the signal, as a shell
    except RunInterrupted as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(128 + err.signum) from None
    except KeyboardInterrupt as err:  # a second signal during set-up: nothing stored
        typer.echo(f"error: {err or 'interrupted before the run was stored'}", err=True)
        raise typer.Exit(128 + getattr(err, "signum", signal.SIGINT)) from None
    # disk full, read-only runs dir, a lock file we cannot open: one line
    except RunDirError as err:
        fail(str(err), EXIT_FAILED)
        return
    except ValueError as err:  # configuration, data files, checkpoints: all before training
        fail(str(err))
        return
    except RunLockedError as err:
        fail(str(err), EXIT_FAILED)
        return
    except Exception as err:  # the run is marked failed in the store
        typer.echo(f"error: run failed: {type(err).__name__}: {err}", err=True)
        if options["as_json"]:
            typer.echo(_failed_record_json(config, err))
        raise typer.Exit(EXIT_FAILED) from None
    report = None if doctor is None else doctor_report(doctor)
    if options["as_json"]:
        typer.echo(record.to_json() if report is None else
                   dumps({**json.loads(record.to_json()), "doctor": report.to_dict()}))
    else:
        typer.echo(_summary_line(record))
        if doctor is not None:
            typer.echo(doctor_text(doctor, report))
    if record.status == "failed":
        raise typer.Exit(EXIT_FAILED)


# typer reads the command's options from its signature
train_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
     for name, (kind, option) in TRAIN_OPTIONS.items()])


def config_from_options(options: dict[str, Any]) -> TrainConfig:
    """The run's configuration from the command's options: the defaults, then ``--config``'s
    file, then the flags given (``bnlab train`` and ``bnlab doctor``)."""
    file = options["config_file"]
    values = load_config_file(file) if file is not None else {}
    return TrainConfig.from_dict(_merge(values, options))


def watching(config: TrainConfig, **options: Any) -> Doctor:
    """The doctor for a run of ``config`` (one process: it reads the model it watches);
    ``options`` go to :class:`bnlab.doctor.Doctor`."""
    if config.nproc > 1:
        raise ValueError(f"the doctor watches one process; nproc is {config.nproc}: use nproc 1")
    return Doctor(**options)


def doctor_report(doctor: Doctor) -> Report | None:
    """The doctor's report, ``None`` when no step was trained (nothing to report on)."""
    return doctor.report() if doctor.steps else None


def doctor_text(doctor: Doctor, report: Report | None) -> str:
    if report is None:
        return ("doctor: no step was trained (the run is already stored: --force trains it "
                "again)")
    return f"doctor ({doctor.steps} steps watched):\n{report}"


def _merge(values: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The config file's keys overridden by the flags given (each key's ``to_config`` says what
    was given: ``None`` for not given)."""
    given = {}
    for option in cli_options():
        value = option.to_config(options[option.name], values.get(option.name))
        if value is not None:
            given[option.name] = value
    # --steps on the command line replaces epochs from the file, and vice versa
    if "steps" in given:
        values.pop("epochs", None)
    if "epochs" in given:
        values.pop("steps", None)
    values.update(given)
    if "epochs" not in values and "steps" not in values:
        values["epochs"] = 1
    return values


def _failed_record_json(config, err: Exception) -> str:
    """The stored record of a run that raised (status failed), or a minimal one if none was
    stored."""
    try:
        cfg = TrainConfig.coerce(config)
        with Store(Path(cfg.runs_dir) / "bnlab.db") as store:
            # set by bnlab.train.loop.run once the run is stored
            run_id = getattr(err, "bnlab_run_id", None)
            row = store.get_run(run_id) if run_id is not None else None
        if row is not None:
            return RunRecord.from_store(row).to_json()
    except Exception:  # reporting must not mask the original error
        pass
    return dumps({"status": "failed", "error": f"{type(err).__name__}: {err}"})


def _summary_line(record) -> str:
    metrics = ", ".join(
        f"{k} {fmt(record.metrics[k], 4)}"
        for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "diverged_step")
        if k in record.metrics
    )
    runs_dir = record.config.get("runs_dir", "runs")
    return (f"run {record.id} {record.status} after {record.steps} steps: {metrics} "
            f"(store {runs_dir}/bnlab.db)")


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
