"""Rewrite the catalogue's verdict tables (README.md and the paper pages) from a runs dir's results.

    python docs/build_readme.py --runs-dir runs          # after `make demo` or `bnlab reproduce`
    python docs/build_readme.py --runs-dir runs --check  # exit 1 if a table disagrees with the runs
    python docs/build_readme.py --from-snapshot          # re-render docs/verdicts.json's rows

Only the region between ``<!-- verdicts:start -->`` and ``<!-- verdicts:end -->`` changes in each
file; the rest is hand-written. The README's region holds one short row per stored entry: its
verdict, our number beside the paper's (``headline``), one short clause and a link to the entry's
anchor on its paper page, with the decision rule stated once under the table. Each paper page
(``PAGES``, found beside the README) holds a table of its own entries with the summary's first
clause (the primary comparison, ``first_clause``), then every entry's full summary under its anchor:
the full evidence lives there. The verdicts are not copied from anywhere: each stored catalogue
entry's outcome is read from the store where it is the analysis of the runs stored now by today's
code (``bnlab.experiments.outcomes``: its fingerprint matches), and analysed again from the store
where it is not (``bnlab.experiments.runner.iter_outcomes``, the same path as ``bnlab report``;
nothing is trained), so the tables say what the stored runs say today. The user guide itself is the
docs site (``mkdocs.yml``, pages in ``docs/readme/``).

Each rewrite also stores the rows it rendered in ``docs/verdicts.json`` (the store's verdicts, as
analysed then): the suite checks that every table is exactly what those rows render and that every
row names a catalogue entry, so neither a hand edit nor a renamed entry goes unnoticed where no
store is at hand (CI). ``--check`` compares the README and the pages with a live store instead;
``--from-snapshot`` renders the stored rows again (a change of layout needs no store).

Entries retrained into a store of their own join the snapshot with ``--merge``: that store's entries
(all, or those named by ``--only``) are analysed as above and replace their rows; the other rows are
kept. Each merged row names its store (``store``), and the notes and each entry's evidence say which
store a row comes from, so a snapshot drawn from several stores says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bnlab.experiments.base import PAPERS
from bnlab.experiments.runner import iter_outcomes
from bnlab.experiments.verdicts import RULE
from bnlab.report.headline import (  # noqa: F401 (the tests read them here too)
    CLAUSE_CHARS, SHORT_SUMMARY, first_clause, headline, shorten)
from bnlab.store import Store

START, END = "<!-- verdicts:start -->", "<!-- verdicts:end -->"
REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "docs" / "verdicts.json"
# The docs page that discusses each paper's entries (links in the table; paths relative to the
# README).
PAPER_PAGES = {
    "santurkar": "docs/readme/experiments-santurkar.md",
    "luo": "docs/readme/experiments-luo-mbn.md",
    "mbn": "docs/readme/experiments-luo-mbn.md",
    "peng": "docs/readme/experiments-peng-arora.md",
    "arora": "docs/readme/experiments-peng-arora.md",
}
# Entries discussed on a page other than their paper's: their rows (and links) go there.
ENTRY_PAGES = {
    "peng-table5": "docs/readme/experiments-peng-imagenet.md",
    "peng-fig6": "docs/readme/experiments-peng-imagenet.md",
}
# The pages that hold a generated table of their entries (paths relative to the README's folder).
PAGES = list(dict.fromkeys([*PAPER_PAGES.values(), *ENTRY_PAGES.values()]))


def collect_rows(runs_dir: Path, only: set[str] | None = None) -> list[dict]:
    """One row per stored (entry, preset): id, paper, target, preset, tiny, verdict, summary, date
    (with ``only``, the entries it names). An entry whose analysis fails is a row with verdict
    ``error`` (never dropped silently)."""
    if not (runs_dir / "bnlab.db").is_file():
        raise FileNotFoundError(f"no run store at {runs_dir / 'bnlab.db'}; run `make demo` or "
                                "`bnlab reproduce ID` first, or pass --runs-dir")
    store = Store(runs_dir / "bnlab.db")
    rows = []
    try:
        envs = [r.get("env") or {} for r in store.list_runs()]
        threads = sorted({env.get("threads") for env in envs} - {None})
        cpus = sorted({f"{env['cpu_model']} ({env['cpu_capability']})" for env in envs
                       if env.get("cpu_model") and env.get("cpu_capability")})
        # the README needs no figures: a stored outcome is read without them, and an entry
        # analysed again draws its figures here
        with tempfile.TemporaryDirectory() as figures:
            for experiment_id, preset, ctx, outcome in iter_outcomes(runs_dir, figures,
                                                                     figures=False):
                if only is not None and experiment_id not in only:
                    continue
                failed = isinstance(outcome, Exception)
                stored = store.load_entry(experiment_id, preset) or {}
                rows.append({
                    "id": experiment_id, "paper": ctx.experiment.paper,
                    "target": ctx.experiment.target,
                    "authors": PAPERS[ctx.experiment.paper].split(",")[0], "preset": preset,
                    "tiny": ctx.tiny, "verdict": "error" if failed else outcome.verdict,
                    "summary": f"analysis failed: {type(outcome).__name__}: {outcome}" if failed
                    else outcome.summary, "date": _date(stored.get("created")), "threads": threads,
                    "cpus": cpus,
                })
    finally:
        store.close()
    return sorted(rows, key=_order)


def _order(row: dict) -> tuple:
    """The tables' order: by paper (``PAPERS``), then entry id and preset."""
    order = list(PAPERS)
    return (order.index(row["paper"]) if row["paper"] in order else len(order), row["id"],
            row["preset"])


def merge_rows(rows: list[dict], new: list[dict], store: str, runs_dir: str) -> list[dict]:
    """``rows`` with each (entry, preset) of ``new`` replaced by (or added as) its ``new`` row,
    which names ``store`` when that is not the snapshot's ``runs_dir``."""
    tagged = [{**r, "store": store} if store != runs_dir else
              {k: v for k, v in r.items() if k != "store"} for r in new]
    fresh = {(r["id"], r["preset"]) for r in tagged}
    return sorted([r for r in rows if (r["id"], r["preset"]) not in fresh] + tagged, key=_order)


def store_of(row: dict, runs_dir: str) -> str:
    """The store a row was analysed from (``runs_dir`` unless the row was merged from another)."""
    return row.get("store", runs_dir)


def stores_note(rows: list[dict], runs_dir: str) -> str:
    """A sentence counting the rows per store when they come from more than one (else empty)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[store_of(r, runs_dir)] = counts.get(store_of(r, runs_dir), 0) + 1
    if set(counts) <= {runs_dir}:
        return ""
    order = [runs_dir] * (runs_dir in counts) + sorted(set(counts) - {runs_dir})
    per_store = ", ".join(f"{counts[s]} from `{s}`" for s in order)
    return (f" Rows by store: {per_store} (the others merged with `--merge --runs-dir STORE`; "
            "each entry's evidence names its store).")


def _date(timestamp: float | None) -> str:
    if timestamp is None:
        return "—"
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%d")


def _cell(text: str) -> str:
    """Markdown table cells hold one line and no bare pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


def page_of(row: dict) -> str | None:
    """The docs page that discusses the row's entry (``ENTRY_PAGES``, else its paper's page)."""
    return ENTRY_PAGES.get(row["id"], PAPER_PAGES.get(row["paper"]))


def _preset(row: dict) -> str:
    return row["preset"] + (" (tiny: a wiring check)" if row["tiny"] else "")


def anchor(row: dict) -> str:
    """The entry's anchor on its page (its full evidence, ``page_table``): the entry id."""
    return row["id"]


def entry_link(row: dict) -> str:
    """The README's link to the entry's full evidence (``page_of`` + ``#`` + ``anchor``)."""
    page = page_of(row)
    return f"[`{row['id']}`]({page}#{anchor(row)})" if page else f"`{row['id']}`"


def _verdict(row: dict) -> str:
    """The verdict, with the preset when it is not the plain smoke one."""
    plain = row["preset"] == "smoke" and not row["tiny"]
    return f"**{row['verdict']}**" + ("" if plain else f" ({_preset(row)})")


Column = tuple[str, Callable[[dict], str]]
_ENTRY: Column = ("entry", lambda r: f"`{r['id']}`")
_VERDICT: Column = ("verdict", lambda r: f"**{r['verdict']}**")
_STORED: Column = ("stored", lambda r: r["date"])
README_COLUMNS: tuple[Column, ...] = (
    ("entry", entry_link), ("paper", lambda r: f"{r.get('authors', r['paper'])}, {r['target']}"),
    ("verdict", _verdict), ("ours", lambda r: headline(r["summary"])["ours"]),
    ("paper's", lambda r: headline(r["summary"])["paper"]),
    ("what decided it", lambda r: headline(r["summary"])["clause"]))
PAGE_COLUMNS: tuple[Column, ...] = (_ENTRY, ("target", lambda r: r["target"]),
                                    ("preset", _preset), _VERDICT,
                                    ("primary comparison", lambda r: first_clause(r["summary"])),
                                    _STORED)


def render_table(rows: list[dict], note: str, columns: tuple[Column, ...]) -> str:
    """``note`` (one line), then a Markdown table: one row per ``rows``, one cell per column."""
    lines = [note, "", "| " + " | ".join(name for name, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(cell(r)) for _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)


def _run_facts(rows: list[dict]) -> tuple[list, list]:
    """The torch thread counts and CPUs the rows' runs recorded (the store's, on every row)."""
    threads = sorted({t for r in rows for t in r.get("threads", [])})
    return threads, sorted({c for r in rows for c in r.get("cpus", [])})


def verdict_table(rows: list[dict], runs_dir: str) -> str:
    """The README's region: a one-line provenance note, one short row per entry (``headline``,
    linked to its full evidence) and the decision rule, stated once under the table."""
    if not rows:
        return (f"*No catalogue entry is stored in `{runs_dir}` yet: run `make demo`, "
                "then this script.*")
    threads, cpus = _run_facts(rows)
    dates = sorted({r["date"] for r in rows})
    stored = dates[0] + (f" to {dates[-1]}" if len(dates) > 1 else "")
    per_run = (f" Each run used {' or '.join(map(str, threads))} torch thread(s)" if threads
               else "")
    per_run += (f", on {' and '.join(cpus)}" if cpus else "") + ("." if per_run else "")
    note = (f"*Generated by `python docs/build_readme.py --runs-dir {runs_dir}` from {len(rows)} "
            f"stored entries (smoke preset unless the verdict says otherwise; stored {stored})."
            f"{per_run}{stores_note(rows, runs_dir)} Each entry links to its full evidence; — : "
            "several numbers decide it, see there.*")
    rule = (f"*The rule: {RULE}. Smoke presets are small proxies of the papers' experiments: a "
            "verdict is about the proxy.*")
    return render_table(rows, note, README_COLUMNS) + "\n\n" + rule


def _evidence(row: dict) -> str:
    """An entry's full summary under its anchor (the README's rows link here)."""
    where = f" in `{row['store']}`" if "store" in row else ""
    return (f'<a id="{anchor(row)}"></a>**`{row["id"]}`** ({_cell(row["target"])}, '
            f"{_preset(row)}, stored {row['date']}{where}): **{row['verdict']}**. "
            f"{' '.join(str(row['summary']).split())}")


def page_table(rows: list[dict], runs_dir: str, page: str) -> str:
    """A paper page's region: a one-line provenance note, the page's rows (``page_of``) with their
    primary comparison (``first_clause``), then each entry's full summary under its anchor."""
    mine = [r for r in rows if page_of(r) == page]
    command = f"`python docs/build_readme.py --runs-dir {runs_dir}`"
    if not mine:
        return f"*No entry of this page is stored in `{runs_dir}` yet: run `bnlab reproduce ID`, " \
               f"then {command}.*"
    threads, cpus = _run_facts(rows)
    runs = (f"; the runs used {' or '.join(map(str, threads))} torch thread(s)" if threads else "")
    runs += f", on {' and '.join(cpus)}" if cpus else ""
    note = (f"*Generated by {command} from the store's {len(mine)} entries of this page "
            f"({len(rows)} in all), each re-analysed from its stored runs{runs}."
            f"{stores_note(rows, runs_dir)} Primary "
            "comparison: the summary's first clause (each entry's whole summary follows the "
            "table); smoke presets are small proxies of the paper's experiments.*")
    evidence = "\n\n".join(_evidence(r) for r in mine)
    return (render_table(mine, note, PAGE_COLUMNS) + "\n\n### Full evidence, entry by entry\n\n"
            + evidence)


def tables(rows: list[dict], runs_dir: str, readme: Path) -> dict[Path, str]:
    """Every file's region: the README's, and each of ``PAGES`` found beside the README."""
    out = {readme: verdict_table(rows, runs_dir)}
    for page in PAGES:
        if (readme.parent / page).is_file():
            out[readme.parent / page] = page_table(rows, runs_dir, page)
    return out


def _markers(text: str) -> tuple[int, int]:
    """Where the table's region starts (after START) and ends (at END); exactly one of each."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0 or end < start or text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"must hold exactly one {START} followed by one {END}")
    return start + len(START), end


def replace_region(text: str, table: str) -> str:
    """``text`` with everything between the markers replaced by ``table`` (markers kept)."""
    start, end = _markers(text)
    return text[:start] + "\n" + table + "\n" + text[end:]


def region(text: str) -> str:
    """What stands between the markers (stripped)."""
    start, end = _markers(text)
    return text[start:end].strip()


def check(path: Path, table: str, source: str) -> int:
    """0 if the file's table is ``table``; else 1, naming the rows that differ."""
    try:
        have, want = region(path.read_text()).splitlines(), table.strip().splitlines()
    except ValueError as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 1
    if have == want:
        print(f"{path}: the verdict table agrees with {source}")
        return 0
    print(f"{path}: the verdict table disagrees with {source} "
          f"(regenerate: python docs/build_readme.py --runs-dir RUNS):", file=sys.stderr)
    for line in [f"- {x}" for x in have if x not in want] + [f"+ {x}" for x in want
                                                             if x not in have]:
        print(f"  {line[:160]}", file=sys.stderr)
    return 1


def rewrite(targets: dict[Path, str]) -> dict[Path, str]:
    """Each file's new text (nothing written: a file without its markers fails them all)."""
    out = {}
    for path, table in targets.items():
        try:
            out[path] = replace_region(path.read_text(), table)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return out


def load_snapshot(path: Path) -> tuple[list[dict], str]:
    data = json.loads(path.read_text())
    return data["rows"], data["runs_dir"]


def _rows(args: argparse.Namespace) -> tuple[list[dict], str]:
    """The rows to render and the snapshot's runs dir, as the command line asks."""
    if args.only and not args.merge:
        raise ValueError("--only needs --merge (it names the entries merged into the snapshot)")
    if args.from_snapshot and args.merge:
        raise ValueError("--from-snapshot reads no store; --merge reads --runs-dir: choose one")
    if args.from_snapshot:
        return load_snapshot(args.snapshot)
    if not args.merge:
        return collect_rows(args.runs_dir), str(args.runs_dir)
    rows, runs_dir = load_snapshot(args.snapshot)
    new = collect_rows(args.runs_dir, set(args.only) if args.only else None)
    missing = sorted(set(args.only or ()) - {r["id"] for r in new})
    if missing:
        raise ValueError(f"not stored in {args.runs_dir}: {', '.join(missing)}")
    return merge_rows(rows, new, str(args.runs_dir), runs_dir), runs_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="the store to read (default: runs)")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="the README to rewrite (the paper pages are found beside it)")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT,
                        help="where the rendered rows are kept")
    parser.add_argument("--check", action="store_true",
                        help="compare only; exit 1 if the README or a page disagrees")
    parser.add_argument("--from-snapshot", action="store_true",
                        help="render the rows kept in --snapshot again (no store is read)")
    parser.add_argument("--merge", action="store_true",
                        help="replace only the rows of --runs-dir's entries in --snapshot's rows")
    parser.add_argument("--only", action="append", metavar="ID",
                        help="with --merge: only this entry (repeat for several)")
    args = parser.parse_args(argv)
    try:
        rows, runs_dir = _rows(args)
        targets = tables(rows, runs_dir, args.readme)
        if args.check:
            source = f"the store at {args.runs_dir}" + (" merged into the snapshot's rows"
                                                        if args.merge else "")
            return max([check(path, table, source) for path, table in targets.items()])
        texts = rewrite(targets)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path, text in texts.items():
        path.write_text(text)
    args.snapshot.write_text(json.dumps({"runs_dir": runs_dir, "rows": rows}, indent=1,
                                        ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print(f"{args.readme}: {len(rows)} entries "
          f"({', '.join(f'{n} {v}' for v, n in counts.items()) or 'none'}); "
          f"{len(texts) - 1} paper page(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
