"""`bnlab runs list|show|export|delete|plot`: the run history, readable.

Every command reads the store of ``--runs-dir`` (default ``runs/``); a folder this process cannot
write is opened read-only, so a shared results folder can be listed, shown, exported and plotted.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import sqlite3
from pathlib import Path
from typing import Any, Optional

import typer

from bnlab.plots import panels
from bnlab.store.run_files import RunDirError, RunLockedError, check_run_id, is_locked
from bnlab.spec import check_choice, read_pairs
from bnlab.jsonsafe import dumps
from bnlab.store import STATUSES, ReadOnlyStoreError, Store, StoreIntegrityError
from bnlab.train.checkpoint import repair_from_checkpoint
from bnlab.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, fail
from bnlab.formatting import fmt

runs_app = typer.Typer(help="The recorded runs: list, show, export, delete, plot.",
                       no_args_is_help=True)

PLOT_FORMATS = (".png", ".svg")
# the columns of `runs list`, in order: (key of the brief row, header)
LIST_COLUMNS = (
    ("id", "id"), ("status", "status"), ("steps", "steps"), ("date", "date"), ("model", "model"),
    ("norm", "norm"), ("activation", "activation"), ("seed", "seed"), ("data", "data"),
    ("lr", "lr"), ("nproc", "nproc"), ("test_accuracy", "test_acc"), ("train_loss", "train_loss"),
    ("entry", "entry"),
)


def _open_store(runs_dir: str):
    path = Path(runs_dir) / "bnlab.db"
    if not path.exists():
        fail(f"no run store at {path} (train something first, or pass --runs-dir)")
    try:
        return Store(path)
    except ValueError as err:  # StoreVersionError, StoreCorruptError: the message says what to do
        fail(str(err))
    except (sqlite3.Error, OSError) as err:  # locked for a minute, unreadable: one line
        fail(f"cannot open the run store {path}: {err}", EXIT_FAILED)


@contextlib.contextmanager
def _reading(store):
    """A query that meets damage the open's quick check missed: one line naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        fail(f"run store {store.path} is damaged ({err}); move it away and re-run the runs' "
              "configs (each run is rebuilt from its checkpoint)", EXIT_FAILED)


def _get(store, run_id: str, *, verify: bool = True) -> dict[str, Any]:
    try:
        with _reading(store):
            row = store.get_run(run_id, verify=verify)
    except ValueError as err:  # ambiguous prefix; a damaged record (StoreIntegrityError)
        fail(str(err), EXIT_FAILED if isinstance(err, StoreIntegrityError) else EXIT_BAD_INPUT)
    if row is None:
        fail(f"no run {run_id!r} in {store.path}; `bnlab runs list` shows the ids")
    return row


def _live_status(row: dict[str, Any], runs_dir: Path) -> str:
    """``running`` only while a process holds the run's lock; a run whose process died (killed,
    machine lost) without recording an end is ``stopped``: re-running its config resumes it."""
    if row.get("problem"):
        return "damaged"
    if row["status"] != "running":
        return row["status"]
    return "stopped" if is_locked(runs_dir, row["id"]) is False else "running"


def brief(row: dict[str, Any], entries: dict[str, str], runs_dir: Path) -> dict[str, Any]:
    """One run as `runs list` shows it: config keys people filter on, final metrics, its entry."""
    cfg = row["config"]
    metrics = (row.get("summary") or {}).get("metrics") or {}
    return {
        "id": row["id"],
        "status": _live_status(row, runs_dir),
        "steps": row.get("steps") or 0,
        "date": datetime.datetime.fromtimestamp(row["created"]).strftime("%Y-%m-%d %H:%M"),
        "model": cfg.get("model"),
        "norm": cfg.get("norm"),
        "activation": cfg.get("activation") or "default",
        "seed": cfg.get("seed"),
        "data": cfg.get("data"),
        "lr": cfg.get("lr"),
        "nproc": cfg.get("nproc") or 1,  # processes sharing each batch (--nproc)
        "test_accuracy": metrics.get("test_accuracy"),
        "train_loss": metrics.get("train_loss"),
        "entry": entries.get(row["id"]),
        "created": row["created"],
        "config": cfg,
    }


def _lookup(item: dict[str, Any], key: str) -> tuple[bool, Any]:
    """A brief field, else a config key; dotted keys reach into dicts (``model_options.width``)."""
    if key in item and key != "config":
        return True, item[key]
    value: Any = item["config"]
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def matches(item: dict[str, Any], where: dict[str, Any]) -> bool:
    """``--where`` filters: equal values (numbers compared as numbers), shell globs for text."""
    for key, wanted in where.items():
        found, value = _lookup(item, key)
        if not found:
            return False
        if isinstance(wanted, str) and isinstance(value, str):
            if not fnmatch.fnmatchcase(value, wanted):
                return False
        elif (isinstance(wanted, (int, float)) and isinstance(value, (int, float))
              and not isinstance(value, bool)):
            if float(value) != float(wanted):
                return False
        elif value != wanted and str(value) != str(wanted):
            return False
    return True


def _where_keys(items: list[dict[str, Any]]) -> list[str]:
    keys = {k for k, _ in LIST_COLUMNS} | {"created"}
    for item in items:
        keys |= set(item["config"])
    return sorted(keys)


@runs_app.command("list")
def runs_list(
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
    where: Optional[list[str]] = typer.Option(
        None, "--where",
        help="KEY=VALUE filter on a column or config key (repeatable; globs: norm='cbn*').",
    ),
    status: Optional[str] = typer.Option(
        None, help="Only runs with this status (same as --where status=...)."
    ),
    limit: Optional[int] = typer.Option(None, help="At most this many (newest first)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print JSON (every column and the full config)."),
) -> None:
    """Runs in the store, newest first: full norm spec, activation, seed, catalogue entry, date,
    status.

    A running run's steps follow its training (they rise at every flush of its metrics); a run
    recorded as running whose process is gone (killed) shows as "stopped".
    """

    store = _open_store(runs_dir)
    try:
        filters = read_pairs(where, "--where")
        if status is not None:
            shown = (*STATUSES, "stopped", "damaged")
            filters["status"] = check_choice("status", status, shown, "statuses")
        with _reading(store):
            rows = store.list_runs()
            entries = store.entry_of_runs()
    except ValueError as err:
        fail(str(err))
    finally:
        store.close()
    for r in rows:  # listed as damaged, never hidden; what and how to recover on stderr
        if r.get("problem"):
            typer.echo(f"warning: {r['problem']}", err=True)
    items = [brief(r, entries, Path(runs_dir)) for r in rows]
    known = _where_keys(items)
    try:
        for key in filters if items else ():
            check_choice("--where key", key.split(".")[0], known, "keys")
    except ValueError as err:
        fail(str(err))
    items = [i for i in items if matches(i, filters)][:limit]
    if as_json:
        typer.echo(dumps(items, indent=2))
        return
    table = [[h for _, h in LIST_COLUMNS]] + [[fmt(i[k], 4) for k, _ in LIST_COLUMNS]
                                              for i in items]
    widths = [max(len(r[c]) for r in table) for c in range(len(LIST_COLUMNS))]
    numeric = {"steps", "seed", "lr", "nproc", "test_acc", "train_loss"}
    for r in table:
        cells = [cell.rjust(w) if table[0][c] in numeric else cell.ljust(w)
                 for c, (cell, w) in enumerate(zip(r, widths))]
        typer.echo("  ".join(cells).rstrip())


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A run's config, status, environment, final metrics and recorded metric series."""

    store = _open_store(runs_dir)
    row = _get(store, run_id)
    with _reading(store):
        series = store.metrics(row["id"])
        row["entry"] = store.entry_of_runs().get(row["id"])
    store.close()
    row["series"] = {
        name: {"points": len(rows), "last_step": rows[-1][0], "last": rows[-1][1]}
        for name, rows in series.items()
    }
    if as_json:
        typer.echo(dumps(row, indent=2, sort_keys=True))
        return
    typer.echo(f"run {row['id']}  status {row['status']}  steps {row['steps']}"
               + (f"  entry {row['entry']}" if row["entry"] else ""))
    if row.get("error"):
        typer.echo(f"error: {row['error']}")
    typer.echo("config:")
    for k, v in sorted(row["config"].items()):
        typer.echo(f"  {k}: {v}")
    summary = row.get("summary") or {}
    if summary.get("metrics"):
        typer.echo("final metrics:")
        for k, v in summary["metrics"].items():
            typer.echo(f"  {k}: {fmt(v, 4)}")
    if summary.get("scale_invariant") is not None:
        typer.echo("scale-invariant parameters: "
                   f"{', '.join(sorted(summary['scale_invariant'])) or 'none'}")
    typer.echo(
        "environment: " + ", ".join(f"{k}={v}" for k, v in sorted((row.get("env") or {}).items()))
    )
    typer.echo("metric series:")
    for name, info in sorted(row["series"].items()):
        typer.echo(f"  {name}: {info['points']} points, last {fmt(info['last'], 4)} at step "
                   f"{info['last_step']}")


@runs_app.command("export")
def runs_export(
    run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
    fmt: str = typer.Option("csv", "--format", help="csv or json."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Write to this file instead of stdout."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
) -> None:
    """A run's metrics as CSV rows (run_id, step, name, value) or one JSON document."""
    store = _open_store(runs_dir)
    row = _get(store, run_id)
    try:
        with _reading(store):
            text = store.export(row["id"], fmt)
    except ValueError as err:
        fail(str(err))
    finally:
        store.close()
    if output is not None:
        output.write_text(text)
    else:
        typer.echo(text, nl=False)


@runs_app.command("delete")
def runs_delete(
    run_ids: list[str] = typer.Argument(..., help="Run ids (unique prefixes are enough)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
) -> None:
    """Delete runs: their records, metric rows and checkpoints (refused while a run trains)."""

    store = _open_store(runs_dir)
    try:
        # all resolved (and their ids checked) before anything is deleted; damaged runs too
        ids = [_get(store, r, verify=False)["id"] for r in run_ids]
        for bad in ids:
            try:
                check_run_id(bad, str(store.path))
            except ValueError as err:
                fail(str(err))
        for run_id in dict.fromkeys(ids):
            try:
                done = store.delete_run(run_id)
            except ReadOnlyStoreError as err:
                fail(str(err))
            except (RunLockedError, RunDirError) as err:  # RunDirError: disk full, a foreign lock
                fail(str(err), EXIT_FAILED)
            typer.echo(f"deleted {run_id}: {done['metrics']} metric rows, {len(done['files'])} "
                       "checkpoint files")
    finally:
        store.close()


@runs_app.command("repair")
def runs_repair(
    run_ids: list[str] = typer.Argument(..., help="Run ids (unique prefixes are enough)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
) -> None:
    """Re-create damaged finished runs' config, final metrics and rows from their final
    checkpoints."""
    store = _open_store(runs_dir)
    try:
        for given in run_ids:
            row = _get(store, given, verify=False)
            if not row.get("problem"):
                typer.echo(f"{row['id']}: intact, nothing to repair")
                continue
            try:
                with _reading(store):
                    fixed = repair_from_checkpoint(store, runs_dir, row["id"])
            except (ValueError, RunDirError) as err:
                fail(str(err), EXIT_FAILED)
            count = fixed["seal"]["rows_count"]
            typer.echo(f"repaired {fixed['id']}: config, summary and {count} metric rows from its "
                       "final checkpoint")
    finally:
        store.close()


@runs_app.command("plot")
def runs_plot(
    run_ids: list[str] = typer.Argument(..., help="Run ids (unique prefixes) to overlay."),
    metric: str = typer.Option(..., "--metric",
                               help="A recorded series: train_loss, test_accuracy, probe/..."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="PNG or SVG file (default ./<metric>.png)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Folder of the run store."),
    logy: bool = typer.Option(False, "--logy", help="Logarithmic y axis."),
) -> None:
    """Draw one recorded metric or probe series of one or several runs, overlaid, against step."""
    out = out or Path(metric.replace("/", "_") + ".png")
    try:
        check_choice("image format", out.suffix.lower(), PLOT_FORMATS)
    except ValueError as err:
        fail(f"--out {out}: {err}")
    store = _open_store(runs_dir)
    series = {}
    try:
        for given in run_ids:
            row = _get(store, given)
            with _reading(store):
                rows = store.metrics(row["id"], [metric]).get(metric)
            if not rows:
                names = store.metric_names(row["id"])
                fail(f"run {row['id']} has no series {metric!r}; it has: "
                     f"{', '.join(names) or 'none'}")
            label = f"{row['id']} {row['config'].get('norm', '')}".strip()
            series[label] = ([s for s, _ in rows], [v for _, v in rows])
    finally:
        store.close()

    panels(out, [{"series": series, "xlabel": "step", "ylabel": metric, "logy": logy}])
    typer.echo(str(out))


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
