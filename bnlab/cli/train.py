"""`bnlab train ...`: train one run from flags and/or a YAML file, and print its record.

Configuration precedence: the defaults of :class:`~bnlab.train.config.TrainConfig`, then the keys
of ``--config run.yaml``, then the flags given on the command line. A configuration error is one
line on stderr and exit code 2; a diverged run is a result (exit 0); a failed run exits 1; Ctrl-C
stores the run ``interrupted``, says how to resume, and exits 130.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from bnlab.store.run_files import RunDirError
from bnlab.spec import read_pairs
from bnlab.jsonsafe import dumps
from bnlab.store import Store
from bnlab.cli.common import EXIT_FAILED, fail, fmt
from bnlab.train.config import TrainConfig, load_config_file, validate_static
from bnlab.train.launcher import train  # one process, --nproc N local ones, or a torchrun rank
from bnlab.train.loop import RunInterrupted, RunLockedError
from bnlab.train.record import RunRecord
from bnlab.train.trackers import parse_log_to  # --log-to

EXIT_INTERRUPTED = 130


# name -> (type, typer option), in the order `bnlab train --help` lists them
TRAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "config_file": (Optional[Path], typer.Option(None, "--config",
        help="YAML file of config keys; flags override it.")),
    "model": (Optional[str], typer.Option(None, help="Model name (bnlab.models.MODELS), e.g. mlp, resnet20.")),
    "norm": (Optional[str], typer.Option(None, help='Norm spec, e.g. bn, none, "cbn(rho=2)".')),
    "activation": (Optional[str], typer.Option(None, help="Activation, e.g. relu, sigmoid.")),
    "placement": (Optional[str], typer.Option(None, help="Norm placement: pre_activation or pre_linear.")),
    "model_option": (Optional[list[str]], typer.Option(None, "--model-option",
        help="KEY=VALUE for the model (repeatable).")),
    "data": (Optional[str], typer.Option(None, help="Data source: digits, cifar10, gaussian_regression, ...")),
    "data_option": (Optional[list[str]], typer.Option(None, "--data-option",
        help="KEY=VALUE for the data source (repeatable).")),
    "data_dir": (Optional[str], typer.Option(None, "--data-dir",
        help="Folder with data files (default $BNLAB_DATA).")),
    "no_verify": (bool, typer.Option(False, "--no-verify", help="Skip checksum verification of data files.")),
    "download": (bool, typer.Option(False, "--download", help="Download missing CIFAR files from the official URL.")),
    "epochs": (Optional[int], typer.Option(None, help="Epochs to train (or --steps).")),
    "steps": (Optional[int], typer.Option(None, help="Steps to train (instead of --epochs).")),
    "lr": (Optional[float], typer.Option(None, help="Learning rate (of the scale-variant parameters).")),
    "lr_scale_invariant": (Optional[float], typer.Option(None, "--lr-scale-invariant",
        help="Separate learning rate for scale-invariant weights (Arora D.1).")),
    "momentum": (Optional[float], typer.Option(None, help="SGD momentum.")),
    "weight_decay": (Optional[float], typer.Option(None, "--weight-decay", help="L2 weight decay.")),
    "batch_size": (Optional[str], typer.Option(None, "--batch-size",
        help="Batch size N, or 'full' for full-batch GD.")),
    "optimizer": (Optional[str], typer.Option(None, help="sgd or psgd (projected SGD, Arora App. D Setting 2).")),
    "schedule": (Optional[str], typer.Option(None, help="constant | step:60,100 | exp:0.9999")),
    "seed": (Optional[int], typer.Option(None, help="Seed for init, data order, augmentation and layer noise.")),
    "checkpoint_every": (Optional[int], typer.Option(None, "--checkpoint-every", help="Checkpoint every N steps.")),
    "eval_every": (Optional[int], typer.Option(None, "--eval-every", help="Evaluate the test split every N steps.")),
    "log_every": (Optional[int], typer.Option(None, "--log-every", help="Record train_loss every N steps.")),
    "augment": (Optional[bool], typer.Option(None, "--augment/--no-augment", help="CIFAR crop+flip augmentation.")),
    "device": (Optional[str], typer.Option(None, help="cpu, cuda, cuda:1, ...")),
    "scale_invariant": (Optional[list[str]], typer.Option(None, "--scale-invariant",
        help="Override detection: parameter name/pattern[:rows] (repeatable).")),
    "probe": (Optional[list[str]], typer.Option(None, "--probe", help="Probe to run during training (repeatable).")),
    "probe_every": (Optional[int], typer.Option(None, "--probe-every", help="Run probes every N steps.")),
    "runs_dir": (Optional[str], typer.Option(None, "--runs-dir",
        help="Folder of the run store and checkpoints (default runs/).")),
    "divergence_factor": (Optional[float], typer.Option(None, "--divergence-factor",
        help="Diverged when the loss exceeds this multiple of the first loss (default 1e6).")),
    "compile_step": (bool, typer.Option(False, "--compile",
        help="Compile the model's training step with torch.compile.")),
    "force": (bool, typer.Option(False, "--force", help="Delete a stored run of this identity and train it again.")),
    "log_to": (Optional[list[str]], typer.Option(None, "--log-to",
        help="Mirror the run to tensorboard:DIR or mlflow:URI (repeatable; pip install 'bnlab[track]').")),
    "nproc": (Optional[int], typer.Option(None, "--nproc",
        help="Processes sharing each batch (DDP via torch.distributed's launcher; gloo on CPU, nccl on CUDA).")),
    "sync_norms": (Optional[bool], typer.Option(None, "--sync-norms/--no-sync-norms",
        help="With --nproc > 1: norms' batch statistics over all processes (default) or per process.")),
    "as_json": (bool, typer.Option(False, "--json", help="Print the final record as one JSON object.")),
}


def train_command(**options: Any) -> None:
    """Train a model and record the run; re-running the same command resumes it."""
    config = None
    try:
        values: dict[str, Any] = load_config_file(options["config_file"]) if options["config_file"] is not None else {}
        flags = {key: options[key] for key in CONFIG_FLAGS}
        flags["scale_invariant"] = list(options["scale_invariant"]) if options["scale_invariant"] else None
        flags["probes"] = list(options["probe"]) if options["probe"] else None
        flags["compile"] = True if options["compile_step"] else None
        values = _merge(values, flags, options["model_option"], options["data_option"], no_verify=options["no_verify"],
                        download=options["download"])
        config = TrainConfig.from_dict(values)
        progress = "bar" if sys.stderr.isatty() else "lines"
        callbacks = [parse_log_to(s) for s in options["log_to"] or []]
        record = train(config, progress=progress, force=options["force"], callbacks=callbacks)
        if record is None:  # a rank > 0 of a torchrun launch: rank 0 reports
            return
    except RunInterrupted as err:  # Ctrl-C or SIGTERM: stored interrupted; exit 128 + the signal, as a shell
        typer.echo(str(err), err=True)
        raise typer.Exit(128 + err.signum) from None
    except RunDirError as err:  # disk full, read-only runs dir, a lock file we cannot open: one line
        fail(str(err), EXIT_FAILED)
        return
    except ValueError as err:  # configuration, data files, checkpoints: all before training
        fail(str(err))
        return
    except RunLockedError as err:
        fail(str(err), EXIT_FAILED)
        return
    except Exception as err:  # noqa: BLE001 - the run is marked failed in the store
        typer.echo(f"error: run failed: {type(err).__name__}: {err}", err=True)
        if options["as_json"]:
            typer.echo(_failed_record_json(config, err))
        raise typer.Exit(EXIT_FAILED) from None
    if options["as_json"]:
        typer.echo(record.to_json())
    else:
        typer.echo(_summary_line(record))
    if record.status == "failed":
        raise typer.Exit(EXIT_FAILED)


# the config keys that are flags of the same name (None: not given); the others are mapped in train_command
CONFIG_FLAGS = ("model", "norm", "activation", "placement", "data", "data_dir", "epochs", "steps", "lr",
                "lr_scale_invariant", "momentum", "weight_decay", "batch_size", "optimizer", "schedule", "seed",
                "checkpoint_every", "eval_every", "log_every", "augment", "device", "probe_every", "runs_dir",
                "divergence_factor", "nproc", "sync_norms")
# typer reads the command's options from its signature
train_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
     for name, (kind, option) in TRAIN_OPTIONS.items()])


def _merge(values: dict[str, Any], flags: dict[str, Any], model_option, data_option, *, no_verify: bool,
           download: bool) -> dict[str, Any]:
    """The file's keys overridden by the flags given (``None``: not given)."""
    given = {k: v for k, v in flags.items() if v is not None}
    # --steps on the command line replaces epochs from the file, and vice versa
    if "steps" in given:
        values.pop("epochs", None)
    if "epochs" in given:
        values.pop("steps", None)
    values.update(given)
    if model_option:
        values["model_options"] = {**values.get("model_options", {}), **read_pairs(model_option, "--model-option")}
    if data_option:
        values["data_options"] = {**values.get("data_options", {}), **read_pairs(data_option, "--data-option")}
    if no_verify:
        values["verify"] = False
    if download:
        values["download"] = True
    if "epochs" not in values and "steps" not in values:
        values["epochs"] = 1
    return values


def _failed_record_json(config, err: Exception) -> str:
    """The stored record of a run that raised (status failed), or a minimal one if none was stored."""
    try:
        cfg = validate_static(config)
        with Store(Path(cfg.runs_dir) / "bnlab.db") as store:
            run_id = getattr(err, "bnlab_run_id", None)  # set by bnlab.train.loop.run once the run is stored
            row = store.get_run(run_id) if run_id is not None else None
        if row is not None:
            return RunRecord.from_store(row).to_json()
    except Exception:  # noqa: BLE001 - reporting must not mask the original error
        pass
    return dumps({"status": "failed", "error": f"{type(err).__name__}: {err}"})


def _summary_line(record) -> str:
    metrics = ", ".join(
        f"{k} {fmt(record.metrics[k])}"
        for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "diverged_step")
        if k in record.metrics
    )
    runs_dir = record.config.get("runs_dir", "runs")
    return f"run {record.id} {record.status} after {record.steps} steps: {metrics} (store {runs_dir}/bnlab.db)"


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
