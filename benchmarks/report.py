"""How long ``bnlab report`` takes on a store holding every catalogue entry.

    python benchmarks/report.py [--runs-dir DIR] [--passes 5] [--out benchmarks/results/report.json]

The store: ``--runs-dir`` as it is, or (without it, or with ``--build``) every catalogue entry it
does not hold yet reproduced there with ``tiny=True`` (the test suite's reduced form: the smoke
preset's runs, each cut to a few steps).
Then the report is written ``--passes`` times in this process (imports excluded), each pass in
three variants in a rotated order: today's code; without the store's once-per-open row
verification (every read re-hashes the run's metric rows); and with each run's record deep-copied
on its way into the entry's view (``RunRecord.to_dict()``'s default). The result is each variant's
median and the median of its per-pass ratio to today's. The first pass, which analyses entries
whose stored outcome is stale and stores it, is timed on its own.

Row counts and reads are counted beside (``runs``, ``reads``: ``Store.get_run`` calls per pass,
``rows``: metric rows in the store), and one read of a sealed run of 4,000 rows is timed with its
rows hashed (``verify_4000_rows_ms``), so a store with longer runs can be judged from these. Last,
``bnlab report`` is timed as a user runs it, a new process with its imports (``cli_s``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import bnlab
from bnlab.experiments.base import load_catalogue
from bnlab.experiments.runner import reproduce
from bnlab.report import write_report
from bnlab.store import Store
from bnlab.train import RunRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

REPO = Path(__file__).resolve().parents[1]


def build(runs_dir: Path) -> float:
    """Every catalogue entry not yet stored in ``runs_dir`` reproduced there tiny (an interrupted
    build goes on where it stopped); seconds taken."""
    start = time.perf_counter()
    stored = set()
    if (runs_dir / "bnlab.db").is_file():
        with Store(runs_dir / "bnlab.db") as store:
            stored = {entry for entry, _ in store.entries()}
    ids = [i for i in load_catalogue() if i not in stored]
    for i, experiment_id in enumerate(ids, 1):
        t0 = time.perf_counter()
        reproduce(experiment_id, "smoke", runs_dir=runs_dir, tiny=True, progress=False)
        print(f"[{i}/{len(ids)}] {experiment_id}: {time.perf_counter() - t0:.1f} s", flush=True)
    return time.perf_counter() - start


def _never_verified(self) -> object:
    """A store state that never repeats: each read re-hashes the run's metric rows."""
    return object()


# What each variant patches for the duration of a pass: today's code, and today's without one of
# its two savings (so the cost of each is measured beside it, in the same process)
VARIANTS = {
    "today": [],
    "rows re-hashed on every read": [(Store, "_state", _never_verified)],
    "run records deep-copied": [
        (RunRecord, "to_dict", lambda self, copy=True: dataclasses.asdict(self))],
}


def timed_report(runs_dir: Path, out: Path, variant: str = "today") -> tuple[float, int]:
    """Seconds for one ``write_report`` under ``variant`` (:data:`VARIANTS`) and the number of
    ``Store.get_run`` calls it made."""
    reads = [0]
    get_run = Store.get_run

    def counted(self, *args, **kwargs):
        reads[0] += 1
        return get_run(self, *args, **kwargs)

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(Store, "get_run", counted))
        for owner, name, fn in VARIANTS[variant]:
            patches.enter_context(mock.patch.object(owner, name, fn))
        start = time.perf_counter()
        write_report(runs_dir, out)
        return time.perf_counter() - start, reads[0]


def verify_cost(rows: int = 4000, repeats: int = 21) -> float:
    """Median seconds to read (and verify) one sealed run of ``rows`` metric rows, the rows
    re-hashed on every read: what each read of a long run costs without the once-per-open
    verification."""
    gen = random.Random(0)
    kept = [(step, name, gen.random()) for step in range(rows // 4)
            for name in ("train_loss", "train_accuracy", "lr", "grad_norm")]
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "bnlab.db") as store, \
            mock.patch.object(Store, "_state", _never_verified):
        store.create_run("long", {"model": "mlp"})
        store.set_status("long", "finished", steps=rows // 4, rows=kept)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            store.get_run("long")
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def cli_seconds(runs_dir: Path, repeats: int = 3) -> float:
    """Median wall seconds of ``bnlab report --runs-dir DIR`` as a user runs it (a new process:
    its imports, torch's among them, included)."""
    command = [sys.executable, "-m", "bnlab.cli", "report", "--runs-dir", str(runs_dir)]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=None)
    parser.add_argument("--build", action="store_true",
                        help="reproduce (tiny) the entries --runs-dir does not hold yet")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/report.json")
    args = parser.parse_args()
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="bnlab-report-"))
    built = build(runs_dir) if args.runs_dir is None or args.build else None
    with Store(runs_dir / "bnlab.db", readonly=True) as store:
        entries = store.entries()
        runs = len(store.list_runs())
        rows = store._conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    out = runs_dir / "report"
    first, reads = timed_report(runs_dir, out)
    names = list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.passes):  # each pass runs every variant, in a rotated order
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(timed_report(runs_dir, out, name)[0])
    result = {
        "what": "bnlab report, in process (imports excluded), on a store holding every catalogue "
                "entry (benchmarks/report.py)",
        **provenance(), "bnlab": bnlab.__version__,
        "machine": f"{os.cpu_count()}-core CPU, OMP_NUM_THREADS="
                   f"{os.environ.get('OMP_NUM_THREADS', 'unset')}",
        "store": {"entries": len(entries), "runs": runs, "metric_rows": rows,
                  "built_now_s": None if built is None else round(built, 1)},
        "reads_per_pass": reads,
        "first_pass_s": round(first, 3),
        "passes": args.passes,
        "median_s": {name: round(statistics.median(t), 3) for name, t in times.items()},
        "median_ratio_to_today": {
            name: round(statistics.median(x / y for x, y in zip(t, times["today"])), 3)
            for name, t in times.items() if name != "today"},
        "verify_4000_rows_ms": round(1e3 * verify_cost(4000), 2),
        "cli_s": round(cli_seconds(runs_dir), 2),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
