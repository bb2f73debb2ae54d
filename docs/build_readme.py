"""Rewrite the catalogue's verdict table in README.md from a runs dir's stored results.

    python docs/build_readme.py --runs-dir runs          # after `make demo` or `bnlab reproduce`
    python docs/build_readme.py --runs-dir runs --check  # exit 1 if README disagrees with the store

Only the region between ``<!-- verdicts:start -->`` and ``<!-- verdicts:end -->`` changes; the rest
of the README is hand-written. The verdicts are not copied from anywhere: every stored catalogue
entry is analysed again from the store (``bnlab.experiments.runner.iter_outcomes``, the same path as
``bnlab report``; nothing is trained), so the table says what the stored runs say today. The user
guide itself is the docs site (``mkdocs.yml``, pages in ``docs/readme/``), no longer concatenated
here.

Each rewrite also stores the rows it rendered in ``docs/verdicts.json`` (the store's verdicts, as
analysed then): the suite checks that the README's table is exactly what those rows render and that
every row names a catalogue entry, so neither a hand edit nor a renamed entry goes unnoticed where
no store is at hand (CI). ``--check`` compares the README with a live store instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from bnlab.experiments.base import PAPERS
from bnlab.experiments.runner import iter_outcomes
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


def collect_rows(runs_dir: Path) -> list[dict]:
    """One row per stored (entry, preset): id, paper, target, preset, tiny, verdict, summary, date.
    An entry whose analysis fails is a row with verdict ``error`` (never dropped silently)."""
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
        # analyses draw figures; the README needs none
        with tempfile.TemporaryDirectory() as figures:
            for experiment_id, preset, ctx, outcome in iter_outcomes(runs_dir, figures):
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
    order = list(PAPERS)
    return sorted(rows, key=lambda r: (order.index(r["paper"]) if r["paper"] in order
                                       else len(order), r["id"], r["preset"]))


def _date(timestamp: float | None) -> str:
    if timestamp is None:
        return "—"
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%d")


def _cell(text: str) -> str:
    """Markdown table cells hold one line and no bare pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


def verdict_table(rows: list[dict], runs_dir: str) -> str:
    """The Markdown table (with a one-line provenance note) that goes between the markers."""
    if not rows:
        return (f"*No catalogue entry is stored in `{runs_dir}` yet: run `make demo`, "
                "then this script.*")
    threads = sorted({t for r in rows for t in r.get("threads", [])})
    per_run = (f" Every training run used {' or '.join(map(str, threads))} torch thread(s) (each "
               "run's recorded `env`), so the numbers do not depend on the machine's cores."
               if threads else "")
    cpus = sorted({c for r in rows for c in r.get("cpus", [])})
    if cpus:  # float32 kernels round differently on another CPU model or SIMD level
        per_run += (f" The runs that record their CPU ran on {' and '.join(cpus)}; on another CPU "
                    "the same runs end within their seed-to-seed scatter, not digit for digit, "
                    "and a verdict at the edge of its rule can move.")
    lines = [f"*Generated by `python docs/build_readme.py --runs-dir {runs_dir}` from "
             f"{len(rows)} stored "
             "entries (re-analysed from the store; smoke presets are small proxies of the papers' "
             f"experiments: a verdict is about the proxy, see each entry's page).{per_run}*", "",
             "| entry | paper | preset | verdict | what decided it | stored |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        page = PAPER_PAGES.get(r["paper"])
        cited = f"{r.get('authors', r['paper'])}, {r['target']}"
        paper = f"[{cited}]({page})" if page else cited
        preset = r["preset"] + (" (tiny: a wiring check)" if r["tiny"] else "")
        lines.append(f"| `{r['id']}` | {_cell(paper)} | {preset} | **{r['verdict']}** | "
                     f"{_cell(r['summary'])} | {r['date']} |")
    return "\n".join(lines)


def _markers(text: str) -> tuple[int, int]:
    """Where the table's region starts (after START) and ends (at END); exactly one of each."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0 or end < start or text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"README must hold exactly one {START} followed by one {END}")
    return start + len(START), end


def replace_region(text: str, table: str) -> str:
    """``text`` with everything between the markers replaced by ``table`` (markers kept)."""
    start, end = _markers(text)
    return text[:start] + "\n" + table + "\n" + text[end:]


def region(text: str) -> str:
    """What stands between the markers (stripped)."""
    start, end = _markers(text)
    return text[start:end].strip()


def check(readme: Path, table: str, source: str) -> int:
    """0 if the README's table is ``table``; else 1, naming the rows that differ."""
    have, want = region(readme.read_text()).splitlines(), table.strip().splitlines()
    if have == want:
        print(f"{readme}: the verdict table agrees with {source}")
        return 0
    print(f"{readme}: the verdict table disagrees with {source} "
          f"(regenerate: python docs/build_readme.py --runs-dir RUNS):", file=sys.stderr)
    for line in [f"- {x}" for x in have if x not in want] + [f"+ {x}" for x in want
                                                             if x not in have]:
        print(f"  {line[:160]}", file=sys.stderr)
    return 1


def load_snapshot(path: Path) -> tuple[list[dict], str]:
    data = json.loads(path.read_text())
    return data["rows"], data["runs_dir"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="the store to read (default: runs)")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="the file to rewrite")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT,
                        help="where the rendered rows are kept")
    parser.add_argument("--check", action="store_true",
                        help="compare only; exit 1 if the README disagrees")
    args = parser.parse_args(argv)
    try:
        rows = collect_rows(args.runs_dir)
        table = verdict_table(rows, str(args.runs_dir))
        if args.check:
            return check(args.readme, table, f"the store at {args.runs_dir}")
        text = replace_region(args.readme.read_text(), table)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.readme.write_text(text)
    args.snapshot.write_text(json.dumps({"runs_dir": str(args.runs_dir), "rows": rows}, indent=1,
                                        ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print(f"{args.readme}: {len(rows)} entries "
          f"({', '.join(f'{n} {v}' for v, n in counts.items()) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
