"""`bnlab train ...` and `bnlab runs list|show|export`.

Configuration precedence: the defaults of :class:`~bnlab.train.config.TrainConfig`, then the keys
of ``--config run.yaml``, then the flags given on the command line. A configuration error is one
line on stderr and exit code 2; a diverged run is a result (exit 0); a failed run exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

runs_app = typer.Typer(help="Inspect recorded runs: list, show, export.", no_args_is_help=True)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _parse_pairs(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` flags; the value is read as YAML so numbers and booleans keep their type."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def train_command(
    config_file: Optional[Path] = typer.Option(None, "--config", help="YAML file of config keys; flags override it."),
    model: Optional[str] = typer.Option(None, help="Model name (bnlab.models.MODELS), e.g. mlp, resnet20."),
    norm: Optional[str] = typer.Option(None, help='Norm spec, e.g. bn, none, "cbn(rho=2)".'),
    activation: Optional[str] = typer.Option(None, help="Activation, e.g. relu, sigmoid."),
    placement: Optional[str] = typer.Option(None, help="Norm placement: pre_activation or pre_linear."),
    model_option: Optional[list[str]] = typer.Option(None, "--model-option", help="KEY=VALUE for the model (repeatable)."),
    data: Optional[str] = typer.Option(None, help="Data source: digits, cifar10, gaussian_regression, ..."),
    data_option: Optional[list[str]] = typer.Option(None, "--data-option", help="KEY=VALUE for the data source (repeatable)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Folder with data files (default $BNLAB_DATA)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip checksum verification of data files."),
    download: bool = typer.Option(False, "--download", help="Download missing CIFAR files from the official URL."),
    epochs: Optional[int] = typer.Option(None, help="Epochs to train (or --steps)."),
    steps: Optional[int] = typer.Option(None, help="Steps to train (instead of --epochs)."),
    lr: Optional[float] = typer.Option(None, help="Learning rate (of the scale-variant parameters)."),
    lr_scale_invariant: Optional[float] = typer.Option(
        None, "--lr-scale-invariant", help="Separate learning rate for scale-invariant weights (Arora D.1)."
    ),
    momentum: Optional[float] = typer.Option(None, help="SGD momentum."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="L2 weight decay."),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", help="Batch size N, or 'full' for full-batch GD."),
    optimizer: Optional[str] = typer.Option(None, help="sgd or psgd (projected SGD, Arora App. D Setting 2)."),
    schedule: Optional[str] = typer.Option(None, help="constant | step:60,100 | exp:0.9999"),
    seed: Optional[int] = typer.Option(None, help="Seed for init, data order, augmentation and layer noise."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Checkpoint every N steps."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Evaluate the test split every N steps."),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Record train_loss every N steps."),
    augment: Optional[bool] = typer.Option(None, "--augment/--no-augment", help="CIFAR crop+flip augmentation."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda, cuda:1, ..."),
    scale_invariant: Optional[list[str]] = typer.Option(
        None, "--scale-invariant", help="Override detection: parameter name/pattern[:rows] (repeatable)."
    ),
    probe: Optional[list[str]] = typer.Option(None, "--probe", help="Probe to run during training (repeatable)."),
    probe_every: Optional[int] = typer.Option(None, "--probe-every", help="Run probes every N steps."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", help="Folder of the run store and checkpoints (default runs/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the final record as one JSON object."),
) -> None:
    """Train a model and record the run; re-running the same command resumes it."""
    from bnlab.train.config import TrainConfig, load_config_file
    from bnlab.train.loop import RunLockedError, run

    config = None
    try:
        values: dict[str, Any] = load_config_file(config_file) if config_file is not None else {}
        flags = {
            "model": model,
            "norm": norm,
            "activation": activation,
            "placement": placement,
            "data": data,
            "data_dir": data_dir,
            "epochs": epochs,
            "steps": steps,
            "lr": lr,
            "lr_scale_invariant": lr_scale_invariant,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "batch_size": batch_size,
            "optimizer": optimizer,
            "schedule": schedule,
            "seed": seed,
            "checkpoint_every": checkpoint_every,
            "eval_every": eval_every,
            "log_every": log_every,
            "augment": augment,
            "device": device,
            "probe_every": probe_every,
            "runs_dir": runs_dir,
            "scale_invariant": list(scale_invariant) if scale_invariant else None,
            "probes": list(probe) if probe else None,
        }
        given = {k: v for k, v in flags.items() if v is not None}
        # --steps on the command line replaces epochs from the file, and vice versa
        if "steps" in given:
            values.pop("epochs", None)
        if "epochs" in given:
            values.pop("steps", None)
        values.update(given)
        if model_option:
            values["model_options"] = {**values.get("model_options", {}), **_parse_pairs(model_option, "--model-option")}
        if data_option:
            values["data_options"] = {**values.get("data_options", {}), **_parse_pairs(data_option, "--data-option")}
        if no_verify:
            values["verify"] = False
        if download:
            values["download"] = True
        if "epochs" not in values and "steps" not in values:
            values["epochs"] = 1
        config = TrainConfig.from_dict(values)
        progress = "bar" if sys.stderr.isatty() else "lines"
        record = run(config, progress=progress)
    except ValueError as err:  # configuration, data files, checkpoints: all before training
        _fail(str(err))
        return
    except RunLockedError as err:
        _fail(str(err), EXIT_FAILED)
        return
    except Exception as err:  # noqa: BLE001 - the run is marked failed in the store
        typer.echo(f"error: run failed: {type(err).__name__}: {err}", err=True)
        if as_json:
            typer.echo(_failed_record_json(config, err))
        raise typer.Exit(EXIT_FAILED) from None
    if as_json:
        typer.echo(record.to_json())
    else:
        typer.echo(_summary_line(record))
    if record.status == "failed":
        raise typer.Exit(EXIT_FAILED)


def _failed_record_json(config, err: Exception) -> str:
    """The stored record of a run that raised (status failed), or a minimal one if none was stored."""
    from bnlab.store import Store, dumps
    from bnlab.train.config import validate_static
    from bnlab.train.loop import RunRecord

    try:
        cfg = validate_static(config)
        with Store(Path(cfg.runs_dir) / "bnlab.db") as store:
            row = store.get_run(cfg.run_id())
        if row is not None:
            return RunRecord.from_store(row).to_json()
    except Exception:  # noqa: BLE001 - reporting must not mask the original error
        pass
    return dumps({"status": "failed", "error": f"{type(err).__name__}: {err}"})


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _summary_line(record) -> str:
    metrics = ", ".join(
        f"{k} {_fmt(record.metrics[k])}"
        for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "diverged_step")
        if k in record.metrics
    )
    runs_dir = record.config.get("runs_dir", "runs")
    return f"run {record.id} {record.status} after {record.steps} steps: {metrics} (store {runs_dir}/bnlab.db)"


def _open_store(runs_dir: str):
    from bnlab.store import Store

    path = Path(runs_dir) / "bnlab.db"
    if not path.exists():
        _fail(f"no run store at {path} (train something first, or pass --runs-dir)")
    return Store(path)


def _get(store, run_id: str) -> dict[str, Any]:
    try:
        row = store.get_run(run_id)
    except ValueError as err:
        _fail(str(err))
    if row is None:
        _fail(f"no run {run_id!r} in {store.path}; `bnlab runs list` shows the ids")
    return row


@runs_app.command("list")
def runs_list(
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
    status: Optional[str] = typer.Option(None, help="Only runs with this status."),
    limit: Optional[int] = typer.Option(None, help="At most this many (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Runs in the store, newest first."""
    from bnlab.store import dumps

    store = _open_store(runs_dir)
    try:
        rows = store.list_runs(status=status, limit=limit)
    except ValueError as err:
        _fail(str(err))
    if as_json:
        typer.echo(dumps([_brief(r) for r in rows], indent=2))
        return
    header = f"{'id':<12}  {'status':<9} {'steps':>7}  {'model':<14} {'norm':<16} {'data':<20} {'lr':>8}  {'test_acc':>8}  {'train_loss':>10}"
    typer.echo(header)
    for r in rows:
        b = _brief(r)
        typer.echo(
            f"{b['id']:<12}  {b['status']:<9} {b['steps']:>7}  {str(b['model']):<14.14} {str(b['norm']):<16.16} "
            f"{str(b['data']):<20.20} {_fmt(b['lr']):>8}  {_fmt(b['test_accuracy']):>8}  {_fmt(b['train_loss']):>10}"
        )


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    cfg = row["config"]
    metrics = (row.get("summary") or {}).get("metrics") or {}
    return {
        "id": row["id"],
        "status": row["status"],
        "steps": row["steps"],
        "model": cfg.get("model"),
        "norm": cfg.get("norm"),
        "data": cfg.get("data"),
        "lr": cfg.get("lr"),
        "test_accuracy": metrics.get("test_accuracy"),
        "train_loss": metrics.get("train_loss"),
        "created": row["created"],
    }


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A run's config, status, environment, final metrics and recorded metric series."""
    from bnlab.store import dumps

    store = _open_store(runs_dir)
    row = _get(store, run_id)
    series = store.metrics(row["id"])
    row["series"] = {
        name: {"points": len(rows), "last_step": rows[-1][0], "last": rows[-1][1]} for name, rows in series.items()
    }
    if as_json:
        typer.echo(dumps(row, indent=2, sort_keys=True))
        return
    typer.echo(f"run {row['id']}  status {row['status']}  steps {row['steps']}")
    if row.get("error"):
        typer.echo(f"error: {row['error']}")
    typer.echo("config:")
    for k, v in sorted(row["config"].items()):
        typer.echo(f"  {k}: {v}")
    summary = row.get("summary") or {}
    if summary.get("metrics"):
        typer.echo("final metrics:")
        for k, v in summary["metrics"].items():
            typer.echo(f"  {k}: {_fmt(v)}")
    if summary.get("scale_invariant") is not None:
        typer.echo(f"scale-invariant parameters: {', '.join(sorted(summary['scale_invariant'])) or 'none'}")
    typer.echo("environment: " + ", ".join(f"{k}={v}" for k, v in sorted(row["env"].items())))
    typer.echo("metric series:")
    for name, info in sorted(row["series"].items()):
        typer.echo(f"  {name}: {info['points']} points, last {_fmt(info['last'])} at step {info['last_step']}")


@runs_app.command("export")
def runs_export(
    run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
    fmt: str = typer.Option("csv", "--format", help="csv or json."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
) -> None:
    """A run's metrics as CSV rows (run_id, step, name, value) or one JSON document."""
    store = _open_store(runs_dir)
    row = _get(store, run_id)
    try:
        text = store.export(row["id"], fmt)
    except ValueError as err:
        _fail(str(err))
    if output is not None:
        output.write_text(text)
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.add_typer(runs_app, name="runs")
