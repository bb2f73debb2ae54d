"""Does today's code still produce the run store? Retrain stored entries into a scratch store and
compare the two, run by run, value by value.

    python scripts/recheck_store.py --runs-dir runs --scratch /tmp/recheck [--preset smoke]
        [--entries ID ...] [--max-seconds 300] [--resume] [--out results.json]

Without ``--entries``: every entry stored for the preset whose cost is at most ``--max-seconds``
of run time (wall time is about that over the worker count). The cost is the entry's stored
``seconds``, or its runs' durations where more: an entry saved over runs the store already held
records ~0 s for them. ``--entries`` names entries at any cost. They are retrained with
:func:`bnlab.experiments.runner.reproduce_many` (tiny if stored tiny; workers: env
``BNLAB_WORKERS``, default the free cores, one torch thread per run whatever the count) into
``--scratch``: never the store checked, which is only read; a scratch store holding runs is
refused unless ``--resume``, which reuses its finished runs.

A run id is a hash of what the run depends on (config, model architecture, bnlab version), so a
scratch run and a stored run with one id should be the same run. For each such pair the status,
steps, final metrics (the summary's ``metrics``) and every metric row are compared. *Identical*:
exactly equal, floats by ``==`` (bit for bit, but 0.0 == -0.0), NaN equal to NaN (stored as
NULL), the same rows at the same steps in the same order. An entry's computations (its ``data``
JSON: the whole result of an entry without runs) are compared alike.

Metric names that time the machine, not the computation (:data:`TIMING_METRICS`), are skipped:
they differ between any two runs of one config. A stored run whose seal no longer matches
(:mod:`bnlab.store.integrity`) is *damaged*, and still compared, which locates the change. A
scratch run the store lacks is *new* (what it depends on changed since the store was made); a run
of the stored entry that the retrained one lacks is *missing*; a run that failed before either
store held it (*unstored*) is identical when the stored entry records the same failure.

Exit status: 0 when every run compared is identical, the data too, and nothing is new, missing,
damaged or gone from the catalogue; 1 otherwise; 2 for a usage error.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bnlab.experiments import PRESETS, get
from bnlab.experiments import parallel
from bnlab.experiments.runner import reproduce_many
from bnlab.jsonsafe import jsonable
from bnlab.store import Store, StoreIntegrityError
from bnlab.train.record import cpu_model

# Metric names (fnmatch patterns) that measure wall time, skipped by the comparison: every probe
# logs its own duration as ``probe/<name>/seconds`` (bnlab/probes/base.py). These were the only
# timing names among the 1,747 distinct names of the project's store (smoke preset) when this was
# written; the summaries' final metrics hold none.
TIMING_METRICS = ("*/seconds",)
REPO = Path(__file__).resolve().parents[1]


class UsageError(Exception):
    """A bad command line: printed, exit status 2."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="recheck_store.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-dir", required=True, type=Path, help="the store to check (read only)")
    p.add_argument("--scratch", required=True, type=Path, help="runs dir to retrain into")
    p.add_argument("--preset", default="smoke", choices=PRESETS)
    p.add_argument("--entries", nargs="+", metavar="ID", help="entries to recheck (any cost)")
    p.add_argument("--max-seconds", type=float, default=300.0, help="cost limit (no --entries)")
    p.add_argument("--resume", action="store_true", help="reuse a scratch store's finished runs")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    return p.parse_args(argv)


def check_dirs(runs_dir: Path, scratch: Path, resume: bool) -> None:
    db = runs_dir / "bnlab.db"
    if not db.is_file():
        raise UsageError(f"no run store at {db}: pass the --runs-dir that holds bnlab.db")
    main_dir, scratch_dir = runs_dir.resolve(), scratch.resolve()
    if scratch_dir == main_dir or main_dir in scratch_dir.parents:
        raise UsageError(f"--scratch {scratch} is (inside) --runs-dir {runs_dir}: the recheck "
                         "would train into the store it checks; pass another folder")
    if (scratch / "bnlab.db").exists() and not resume:
        with Store(scratch / "bnlab.db", readonly=True) as held:
            if held.entries() or held.list_runs(limit=1):
                raise UsageError(f"{scratch / 'bnlab.db'} holds runs already: pass --resume to "
                                 "reuse them, or an empty --scratch folder")


def run_seconds(main: Store) -> dict[str, float]:
    """Each stored run's duration (created to finished, or to its last update)."""
    return {r["id"]: float((r["finished"] or r["updated"] or r["created"]) - r["created"])
            for r in main.list_runs()}


def cost(entry: dict, durations: dict[str, float]) -> float:
    """An entry's cost in run time: its stored ``seconds``, or its runs' durations where these are
    more (an entry saved over runs the store already held counts them as ~0 s)."""
    ids = {r.get("id") for r in entry["runs"]}
    return max(float(entry["seconds"] or 0.0), sum(durations.get(i, 0.0) for i in ids if i))


def select_entries(main: Store, preset: str, wanted: list[str] | None, max_seconds: float
                   ) -> tuple[list[tuple[str, dict]], list[dict]]:
    """``[(id, stored entry)]`` to recheck (each with its ``cost``), and the entries left out with
    why (``problem``: a finding that makes the exit status 1, not a choice)."""
    stored = [i for i, p in main.entries() if p == preset]
    if wanted:
        unknown = [w for w in wanted if w not in stored]
        if unknown:
            raise UsageError(f"not stored in {main.path} for preset {preset}: "
                             f"{', '.join(unknown)}; stored entries: {', '.join(stored) or 'none'}")
    durations = run_seconds(main)
    selected, skipped = [], []
    for entry_id in list(dict.fromkeys(wanted)) if wanted else stored:
        try:
            get(entry_id)
            entry = main.load_entry(entry_id, preset)
        except (ValueError, StoreIntegrityError) as err:  # gone from the catalogue; damaged
            skipped.append({"entry": entry_id, "why": str(err), "problem": True})
            continue
        entry["cost"] = round(cost(entry, durations), 1)
        if not wanted and entry["cost"] > max_seconds:
            skipped.append({"entry": entry_id, "problem": False,
                            "why": f"cost {entry['cost']:.0f} s of run time > --max-seconds"})
            continue
        selected.append((entry_id, entry))
    return selected, skipped


def retrain(selected: list[tuple[str, dict]], preset: str, scratch: Path) -> dict[str, dict]:
    """Reproduce the entries into ``scratch`` (tiny ones tiny); per entry its verdict there and
    the seconds elapsed when it was done (the runs of all entries go to one sweep)."""
    counts = {i: len(get(i).plan(preset).runs) for i, _ in selected}
    total, workers = sum(e["cost"] for _, e in selected), parallel.free_cores()
    print(f"retraining {len(selected)} entries ({sum(counts.values())} runs, about {total:.0f} s "
          f"of run time; {workers} workers: ~{total / workers:.0f} s) into {scratch}", flush=True)
    start, done = time.perf_counter(), {}
    for tiny in sorted({bool(e["tiny"]) for _, e in selected}):
        ids = [i for i, e in selected if bool(e["tiny"]) == tiny]
        for entry_id, outcome in reproduce_many(ids, preset, runs_dir=scratch, tiny=tiny):
            elapsed = time.perf_counter() - start
            done[entry_id] = {"verdict": outcome.verdict, "elapsed": round(elapsed, 1)}
            print(f"[{len(done)}/{len(selected)}] {entry_id}: {counts[entry_id]} runs, "
                  f"{elapsed:.0f} s elapsed", flush=True)
    return done


# ---- comparing ---------------------------------------------------------------------------------

def is_timing(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in TIMING_METRICS)


def same_value(x: Any, y: Any) -> bool:
    """Exactly equal, NaN equal to NaN, and of one type (1 is not 1.0 in stored JSON)."""
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    return type(x) is type(y) and x == y


def difference(x: Any, y: Any) -> tuple[float, float]:
    """Absolute and relative (to the stored ``x``) difference; infinite when not numbers."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
        return math.inf, math.inf
    gap = abs(x - y)
    gap = math.inf if gap != gap else gap  # inf - inf, or a NaN on one side
    return gap, (gap / abs(x) if x else math.inf)


def compare_rows(old: dict[str, list], new: dict[str, list]) -> dict[str, Any]:
    """Every row of the two runs (``Store.metrics``: ``{name: [(step, value)]}``) paired by name
    and position; the first difference is the earliest ``(step, name)``."""
    out = {"values": 0, "values_identical": 0, "max_abs": 0.0, "max_rel": 0.0, "first_diff": None}
    first = None
    for name in sorted(set(old) | set(new)):
        if is_timing(name):
            continue
        left, right = old.get(name, []), new.get(name, [])
        for k in range(max(len(left), len(right))):
            out["values"] += 1
            if k < len(left) and k < len(right) and left[k][0] == right[k][0]:
                if same_value(left[k][1], right[k][1]):
                    out["values_identical"] += 1
                    continue
                gap, rel = difference(left[k][1], right[k][1])
                out["max_abs"], out["max_rel"] = max(out["max_abs"], gap), max(out["max_rel"], rel)
            step = (left[k] if k < len(left) else right[k])[0]  # a row on one side only
            first = min(first or (step, name), (step, name))
    out["first_diff"] = None if first is None else [first[1], first[0]]
    return out


def first_difference(a: Any, b: Any, path: str = "data") -> str | None:
    """Where two JSON values first differ (a dotted path), or None when identical."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key} (on one side only)"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for k, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{k}]")
            if found:
                return found
        return None
    return None if same_value(a, b) else path


def compare_run(run_id: str, old: dict, new: dict, main: Store, scratch: Store) -> dict[str, Any]:
    """One run in both stores (rows as ``Store.get_run(verify=False)`` returns them)."""
    out: dict[str, Any] = {"id": run_id, "damaged": old["problem"] or new["problem"]}
    for key in ("status", "steps"):
        if old[key] != new[key]:
            out[key] = [old[key], new[key]]
    finals = [((r["summary"] or {}).get("metrics") or {}) for r in (old, new)]
    out["final_metrics_differ"] = sorted(
        k for k in set(finals[0]) | set(finals[1])
        if not is_timing(k) and (k not in finals[0] or k not in finals[1]
                                 or not same_value(finals[0][k], finals[1][k])))
    out.update(compare_rows(main.metrics(run_id), scratch.metrics(run_id)))
    out["identical"] = (not out["damaged"] and "status" not in out and "steps" not in out
                        and not out["final_metrics_differ"]
                        and out["values"] == out["values_identical"])
    return out


def held(store: Store, run_id: str | None) -> dict | None:
    """The run's row (``get_run`` also takes an id prefix: exact ids only), or None."""
    run = store.get_run(run_id, verify=False) if run_id else None
    return run if run is not None and run["id"] == run_id else None


def pair_run(run_id: str | None, fresh: dict, listed: dict | None, main: Store,
             scratch: Store) -> dict[str, Any]:
    """One run of the retrained entry (``fresh``: its record in the entry; ``listed``: the stored
    entry's record of that id) against the store: ``kind`` compared, new or unstored (failed
    before either store held a row: identical when the stored entry lists the same failure)."""
    old, new = held(main, run_id), held(scratch, run_id)
    base = {"id": run_id, "label": fresh["label"], "status": fresh.get("status"),
            "error": fresh.get("error")}
    if old is None and new is None:
        same = listed is not None and all(listed.get(k) == fresh.get(k)
                                          for k in ("status", "error"))
        return {**base, "kind": "unstored", "identical": same}
    if old is None:
        return {**base, "kind": "new", "identical": False, "stored": listed}
    if new is None:  # the retrained run failed before it was stored
        return {**base, **compare_rows({}, {}), "kind": "compared", "identical": False,
                "damaged": old["problem"], "status": [old["status"], fresh.get("status")],
                "env": old["env"]}
    diff = compare_run(str(run_id), old, new, main, scratch)
    return {**diff, "label": fresh["label"], "kind": "compared", "env": old["env"]}


def compare_entry(entry_id: str, preset: str, stored: dict, main: Store, scratch: Store
                  ) -> dict[str, Any]:
    """Every distinct run id of the retrained entry, and its computations' data."""
    fresh = scratch.load_entry(entry_id, preset) or {"runs": [], "data": None}
    records: dict[str, dict] = {}
    for r in fresh["runs"]:  # an entry may list one run under several labels
        records.setdefault(r.get("id") or f"(no id) {r['label']}", r)
    listed = {r["id"]: r for r in stored["runs"] if r.get("id")}
    out: dict[str, Any] = {
        "entry": entry_id, "runs": len(records), "labels": len(fresh["runs"]), "compared": 0,
        "identical": 0, "new": [], "unstored": [], "missing": sorted(set(listed) - set(records)),
        "damaged": [], "values": 0, "values_identical": 0, "max_abs": 0.0, "max_rel": 0.0,
        "first_diff": None, "differing_runs": [], "_envs": [],
        "data_diff": first_difference(stored["data"], fresh["data"])}
    for key, r in records.items():
        diff = pair_run(r.get("id"), r, listed.get(key), main, scratch)
        if diff["kind"] == "new":
            out["new"].append(diff)
            continue
        out["compared"] += 1
        out["identical"] += diff["identical"]
        if diff["kind"] == "unstored":
            out["unstored"].append(diff)
            continue
        out["_envs"].append(diff.pop("env"))
        out["values"] += diff["values"]
        out["values_identical"] += diff["values_identical"]
        if diff["damaged"]:
            out["damaged"].append(key)
        if not diff["identical"]:
            out["max_abs"] = max(out["max_abs"], diff["max_abs"])
            out["max_rel"] = max(out["max_rel"], diff["max_rel"])
            out["first_diff"] = out["first_diff"] or [key, *(diff["first_diff"] or [])]
            out["differing_runs"].append(diff)
    out["ok"] = (out["compared"] == out["identical"] and not out["new"] and not out["missing"]
                 and out["data_diff"] is None)
    return out


# ---- reporting ---------------------------------------------------------------------------------

def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "workers": parallel.free_cores(), "cpu_model": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "git": git("rev-parse", "HEAD") or None,
            "git_dirty": None if status is None else bool(status)}


def stored_envs(entries: list[dict]) -> dict[str, dict]:
    """What the compared stored runs recorded: counts of each git commit, torch, CPU, threads."""
    envs = [env or {} for e in entries for env in e.pop("_envs", [])]
    return {key: dict(Counter(str(env.get(key)) for env in envs))
            for key in ("git", "torch", "cpu_model", "cpu_capability", "threads")}


def short(x: float) -> str:
    return "-" if x == 0 else ("inf" if x == math.inf else f"{x:.2e}")


def table(entries: list[dict]) -> str:
    head = (f"{'entry':<18}{'runs':>5}{'same':>5}{'new':>4}{'miss':>5}{'dmg':>4}"
            f"{'values':>10}{'same':>10}{'max abs':>9}{'max rel':>9}  data  first diff")
    lines = [head, "-" * len(head)]
    for e in entries:
        first = e["first_diff"]
        where = "-" if not first else f"{first[0]} {'@'.join(map(str, first[1:]))}"
        data = "same" if e["data_diff"] is None else "DIFF"
        lines.append(f"{e['entry']:<18}{e['runs']:>5}{e['identical']:>5}{len(e['new']):>4}"
                     f"{len(e['missing']):>5}{len(e['damaged']):>4}{e['values']:>10}"
                     f"{e['values_identical']:>10}{short(e['max_abs']):>9}"
                     f"{short(e['max_rel']):>9}  {data:<4}  {where}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_dirs(args.runs_dir, args.scratch, args.resume)
    with Store(args.runs_dir / "bnlab.db", readonly=True) as main:
        selected, skipped = select_entries(main, args.preset, args.entries, args.max_seconds)
    for s in skipped:
        print(f"skipped {s['entry']}: {s['why']}", file=sys.stderr if s["problem"] else sys.stdout)
    start = time.perf_counter()
    done = retrain(selected, args.preset, args.scratch) if selected else {}
    entries = []
    if selected:
        with Store(args.runs_dir / "bnlab.db", readonly=True) as main, \
                Store(args.scratch / "bnlab.db", readonly=True) as scratch:
            for entry_id, stored in selected:
                entries.append({**compare_entry(entry_id, args.preset, stored, main, scratch),
                                **done.get(entry_id, {}), "cost": stored["cost"]})
    identical = all(e["ok"] for e in entries) and not any(s["problem"] for s in skipped)
    results = {"runs_dir": str(args.runs_dir), "scratch": str(args.scratch),
               "preset": args.preset, "identical": identical, "environment": environment(),
               "stored_run_env": stored_envs(entries), "timing_metrics": list(TIMING_METRICS),
               "seconds": round(time.perf_counter() - start, 1), "entries": entries,
               "skipped": skipped}
    print(table(entries))
    print(f"{'identical' if identical else 'DIFFERENT'}: {sum(e['identical'] for e in entries)}"
          f" of {sum(e['compared'] for e in entries)} runs compared are identical"
          + ("" if entries else " (nothing was compared)"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(jsonable(results, nonfinite="string"), indent=1) + "\n")
    return 0 if identical else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # argparse printed the usage error (2) or the help (0)
        return int(stop.code or 0)
    try:
        return run(args)
    except UsageError as err:
        print(f"recheck_store: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
