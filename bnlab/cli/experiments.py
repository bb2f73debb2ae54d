"""`bnlab experiments list`, `bnlab reproduce ID`, `bnlab report`."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import List, Optional

import typer

from bnlab.jsonsafe import dumps, jsonable
from bnlab.report import write_report
from bnlab.report.headline import answer_lines
from bnlab.store import Store, StoreCorruptError, StoreVersionError

from bnlab.experiments import outcomes
from bnlab.experiments.base import check_preset, get, load_catalogue
from bnlab.experiments.runner import analysis_context, reproduce

experiments_app = typer.Typer(help="The catalogue of the papers' figures and tables.",
                              no_args_is_help=True)


TITLE_CHARS = 60  # the compact table's titles, cut at a word with "…" beyond this


@experiments_app.command("list")
def list_experiments(
    as_json: bool = typer.Option(False, "--json",
                                 help="every field of every entry, as JSON (with what is stored)"),
    long: bool = typer.Option(False, "--long",
                              help="every entry's claim, preset costs and what the smoke resolves"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir",
                                  help="the store whose entries are marked as stored"),
) -> None:
    """The catalogue: one line per entry (id, paper, figure/table, what is stored, title)."""
    entries = [e.describe() for e in load_catalogue().values()]
    stored = _stored(runs_dir)
    if as_json:
        typer.echo(json.dumps([{**e, "stored": stored.get(e["id"], [])} for e in entries],
                              indent=2, ensure_ascii=False))
    elif long:
        for e in entries:
            typer.echo(_long_text(e))
    else:
        typer.echo(_compact_table(entries, stored))


def _stored(runs_dir: Path) -> dict[str, list[dict]]:
    """``{id: [{"preset", "tiny", "date"}, …]}`` for the entries stored in ``runs_dir`` (read
    only; nothing when it holds no store)."""
    path = runs_dir / "bnlab.db"
    if not path.is_file():
        return {}
    out: dict[str, list[dict]] = {}
    try:
        with Store(path, readonly=True) as store:
            for experiment_id, preset in store.entries():
                entry = store.load_entry(experiment_id, preset) or {}
                created = entry.get("created")
                date = (datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
                        .strftime("%Y-%m-%d") if created else None)
                out.setdefault(experiment_id, []).append(
                    {"preset": preset, "tiny": bool(entry.get("tiny")), "date": date})
    except (StoreCorruptError, StoreVersionError) as err:
        typer.echo(f"warning: {path}: {err}", err=True)
    return out


def _compact_table(entries: list[dict], stored: dict[str, list[dict]]) -> str:
    def status(e: dict) -> str:
        return ", ".join(s["preset"] + (" (tiny)" if s["tiny"] else "") + f" {s['date'] or ''}"
                         for s in stored.get(e["id"], [])).strip() or "—"

    def title(text: str) -> str:
        if len(text) <= TITLE_CHARS:
            return text
        return text[:text.rfind(" ", 0, TITLE_CHARS - 1)].rstrip(" ,:;") + " …"

    rows = [("id", "paper", "target", "stored", "title")]
    rows += [(e["id"], e["paper"], e["target"], status(e), title(e["title"])) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(f"{cell:<{w}}" for cell, w in zip(r[:4], widths)) + "  " + r[4]
             for r in rows]
    return "\n".join(lines + [f"{len(entries)} entries; --long: claims, costs and resolution; "
                              "--json: every field"])


def _long_text(e: dict) -> str:
    cost = "; ".join(f"{k}: {v}" for k, v in e["cost"].items())
    lines = [f"{e['id']:<24} {e['target']:<12} {e['title']}",
             f"{'':<24} claim: {e['claim']}", f"{'':<24} cost: {cost}"]
    if e["resolution"]:
        r = e["resolution"]
        lines.append(f"{'':<24} resolves: {r['resolvable']} (paper: {r['paper']}; "
                     f"from {r['pilot']})")
    return "\n".join(lines)


@experiments_app.command("show")
def show_experiment(
    experiment_id: str = typer.Argument(..., help="an entry id (see `bnlab experiments list`)"),
    preset: str = typer.Option("smoke", help="the stored preset to show"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="the store to read"),
    as_json: bool = typer.Option(False, "--json", help="the entry and its verdict as JSON"),
) -> None:
    """One entry: what it claims and, when stored, its verdict as data (the primary comparison,
    our effect, interval, p, seeds per arm, resolvable effect, the paper's number, the rule) and
    its summary, read from the store (analysed only when the stored outcome is out of date)."""
    try:
        check_preset(preset)
        entry = get(experiment_id).describe()
        outcome = _stored_outcome(entry["id"], preset, runs_dir)
    except (ValueError, StoreCorruptError, StoreVersionError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    shown = {**entry, "preset": preset, "stored": outcome is not None}
    if outcome is not None:
        shown.update(verdict=outcome.record.to_dict(), summary=outcome.summary,
                     table=outcome.table)
    if as_json:
        typer.echo(dumps(jsonable(shown, objects=True), indent=2, ensure_ascii=False))
        return
    typer.echo(_long_text(entry))
    if outcome is None:
        typer.echo(f"{'':<24} not stored in {runs_dir} ({preset}): bnlab reproduce "
                   f"{entry['id']} --preset {preset}")
    else:
        typer.echo(f"{'':<24} verdict: {outcome.verdict}. {outcome.summary}")


def _stored_outcome(experiment_id: str, preset: str, runs_dir: Path):
    """The entry's stored outcome (:func:`bnlab.experiments.outcomes.analysed`), None when the
    store does not hold the entry."""
    path = runs_dir / "bnlab.db"
    if not path.is_file():
        return None
    with Store(path) as store:
        if store.load_entry(experiment_id, preset) is None:
            return None
        with analysis_context(experiment_id, preset, runs_dir=runs_dir, store=store,
                              report_dir=runs_dir / "report") as ctx:
            return outcomes.analysed(ctx, store, figures=False)


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
    results, outcomes = {}, []
    for experiment_id in targets:
        outcome = reproduce(experiment_id, preset, runs_dir=runs_dir, ray_address=ray, tiny=tiny,
                            report=False, nproc=nproc)
        outcomes.append((experiment_id, preset, outcome))
        results[experiment_id] = {"verdict": outcome.verdict, "summary": outcome.summary,
                                  "figures": [str(f) for f in outcome.figures],
                                  "table": outcome.table}
        if not as_json:  # progress on stderr; the answers come last, on stdout
            typer.echo(f"{experiment_id}: {outcome.verdict}", err=True)
    path = write_report(runs_dir)
    if as_json:
        typer.echo(dumps(jsonable(results, objects=True), indent=2))  # strict JSON: NaN as null
    else:
        typer.echo(f"report: {path}")
        for line in answer_lines(outcomes, path):
            typer.echo(line)


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
