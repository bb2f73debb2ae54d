"""The run store's reliability figures: interruptions survived, corruptions handled, malicious
inputs refused, metric rows lost.

    .venv/bin/python benchmarks/reliability.py            # about 2-4 minutes on one CPU core
    .venv/bin/python benchmarks/reliability.py --quick    # fewer trials

Setting: an MLP (width 16) with BN on the bundled digits, 40 steps of batch 200, a checkpoint every
5 steps, every metric logged every step; the reference is the same run uninterrupted.

* Interruptions: a child process trains and is killed with SIGKILL, either right after a random
  step or in the middle of a random checkpoint write (half the file written). Some trials then
  damage the store the way the issue did: the write-ahead log deleted, the log garbled, the metrics
  table dropped, rows deleted. The run is resumed in this process. *Survived* = it finishes with the
  reference's final weights (bitwise), final metrics and every one of the reference's metric rows,
  and no temporary checkpoint file is left. *Rows lost* = reference rows absent after the resume.
* Corruptions: single random bytes of a checkpoint flipped (anywhere in the file, then inside the
  bytes of a weight tensor). *Handled* = the load raises, or loads a state identical to the
  original (a byte the format does not use); *silently wrong* = loads different content, no error.
* Concurrent sweeps: two processes sweep the same three configs over one runs dir at once (two
  ``bnlab reproduce``); every record both return must be ``finished``, none ``failed``.
* Malicious inputs: a checkpoint whose pickle runs a shell command, a checkpoint of another run, a
  forged checkpoint format, a store of a newer schema, a foreign SQLite file as the store, a YAML
  config with a Python object tag, a run-id prefix of SQL wildcards. *Refused* = a clear error (or
  no match) and no side effect.

The categories (benchmarks/reliability_cases.py), totals printed per category:

* Kill points: the interruptions above, and SIGTERM at a step (exit 143, status ``interrupted``, a
  checkpoint at that step).
* Corruption: the checkpoint byte flips above, and store damage SQLite does not report -- single
  bits flipped in stored metric values, a config digit changed, rows deleted or added, a final
  metric changed, invalid JSON, the metrics table dropped (*handled* = caught by the run's seal and
  rebuilt from its final checkpoint by re-running its config, or read identical); a trigger that
  swallows inserts, an added NOT NULL column, a renamed column, a 0-byte file (*handled* = refused
  at open).
* Concurrency: the two sweeps above.
* Numerics: a run whose final evaluation blows up, a negative running variance (must end
  ``diverged``), non-finite spec and config numbers from specs and YAML (must be refused).
* Hostile inputs: the malicious inputs above, a run id ``../../victim`` through every ``runs``
  command, nesting 50,000 deep, someone else's database (left byte-identical), a checkpoint
  downgraded to format 1.

Results go to benchmarks/results/reliability.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import reliability_cases as cases  # noqa: E402  (the categories, beside this file)
from provenance import provenance  # noqa: E402
from bnlab.store import Store  # noqa: E402
from bnlab.train import load_model, run  # noqa: E402
from bnlab.train.checkpoint import load_checkpoint  # noqa: E402
from bnlab.store.run_files import checkpoint_path, orphaned_temporaries  # noqa: E402

CONFIG = dict(model="mlp", data="digits", steps=40, lr=0.05, batch_size=200, seed=5,
              checkpoint_every=5, log_every=1, model_options={"width": 16})
STORE_DAMAGES = ("none", "delete_wal", "garble_wal", "drop_metrics", "delete_rows")

CHILD = """
import os, signal, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {repo!r})
import bnlab.train.checkpoint as ck
from bnlab.train import run
from bnlab.train.callbacks import Callback
runs_dir, mode, at = {runs_dir!r}, {mode!r}, {at}
config = dict({config!r}, runs_dir=runs_dir)

class KillAfter(Callback):
    def on_train_batch_end(self, loop):
        step = loop.step
        if mode == "step" and step == at:
            os.kill(os.getpid(), signal.SIGKILL)

real_save = torch.save
def save_then_die(obj, f, *a, **k):  # half a checkpoint written, then killed
    if mode == "checkpoint" and obj.get("step", -1) >= at:
        import io
        buf = io.BytesIO(); real_save(obj, buf, *a, **k)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *a, **k)
ck.torch.save = save_then_die
run(config, callbacks=[KillAfter()], progress=False)
"""


def _all_rows(runs_dir: Path, run_id: str) -> list[tuple[int, str, float]]:
    with Store(runs_dir / "bnlab.db") as store:
        return sorted((s, n, v) for n, rows in store.metrics(run_id).items() for s, v in rows)


def _damage_store(runs_dir: Path, damage: str, rng: random.Random) -> None:
    db = runs_dir / "bnlab.db"
    wal = Path(f"{db}-wal")
    if damage == "delete_wal":
        wal.unlink(missing_ok=True)
    elif damage == "garble_wal" and wal.exists() and wal.stat().st_size > 64:
        raw = bytearray(wal.read_bytes())
        start = rng.randrange(32, len(raw) - 16)
        raw[start:start + 16] = bytes(rng.randrange(256) for _ in range(16))
        wal.write_bytes(bytes(raw))
    elif damage in ("drop_metrics", "delete_rows"):
        conn = sqlite3.connect(db)
        conn.execute("DROP TABLE metrics" if damage == "drop_metrics"
                     else "DELETE FROM metrics WHERE step % 3 = 0")
        conn.commit()
        conn.close()


def interruption_trials(trials: int, rng: random.Random, work: Path) -> dict:
    reference = run(dict(CONFIG, runs_dir=str(work / "reference")), progress=False)
    ref_rows = _all_rows(work / "reference", reference.id)
    ref_model = load_checkpoint(checkpoint_path(work / "reference", reference.id))["model"]
    results = []
    for trial in range(trials):
        mode = "step" if trial % 2 == 0 else "checkpoint"
        at = rng.randrange(6, 39) if mode == "step" else rng.choice(range(10, 40, 5))
        damage = STORE_DAMAGES[trial % len(STORE_DAMAGES)]
        runs_dir = work / f"trial{trial}"
        script = CHILD.format(repo=str(REPO), runs_dir=str(runs_dir), mode=mode,
                              at=at, config=CONFIG)
        child = subprocess.run([sys.executable, "-c", script], capture_output=True,
                               text=True, timeout=600)
        killed = child.returncode == -signal.SIGKILL
        orphans_before = len(orphaned_temporaries(checkpoint_path(runs_dir, reference.id)))
        _damage_store(runs_dir, damage, rng)
        resumed = run(dict(CONFIG, runs_dir=str(runs_dir)), progress=False)
        rows = _all_rows(runs_dir, resumed.id)
        model = load_checkpoint(checkpoint_path(runs_dir, resumed.id))["model"]
        lost = len(set(ref_rows) - set(rows))
        same = (resumed.status == reference.status and resumed.metrics == reference.metrics
                and all(torch.equal(model[k], ref_model[k]) for k in ref_model)
                and rows == ref_rows)
        orphans_after = len(orphaned_temporaries(checkpoint_path(runs_dir, resumed.id)))
        results.append({"mode": mode, "at": at, "damage": damage, "killed": killed,
                        "resumed_from": resumed.resumed_from, "orphans_before": orphans_before,
                        "orphans_after": orphans_after, "rows_lost": lost,
                        "survived": bool(killed and same and orphans_after == 0)})
        print(f"  interruption {trial}: {results[-1]}", flush=True)
    return {"trials": len(results), "survived": sum(r["survived"] for r in results),
            "rows_lost": sum(r["rows_lost"] for r in results), "reference_rows": len(ref_rows),
            "details": results}


def _states_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() \
            and all(_states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_states_equal(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def corruption_trials(trials: int, rng: random.Random, work: Path) -> dict:
    source = checkpoint_path(work / "reference", next(iter(_run_ids(work / "reference"))))
    original = load_checkpoint(source)
    raw = source.read_bytes()
    weight = next(v for v in original["model"].values() if v.dtype == torch.float32
                  and v.numel() >= 64)
    weight_at = raw.find(weight.numpy().tobytes())
    counts = {"anywhere": {"raised": 0, "identical": 0, "silently_wrong": 0},
              "in_weight": {"raised": 0, "identical": 0, "silently_wrong": 0}}
    target = work / "corrupt" / "checkpoints" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    for trial in range(trials):
        where = "anywhere" if trial % 2 == 0 else "in_weight"
        at = rng.randrange(len(raw)) if where == "anywhere" \
            else weight_at + rng.randrange(weight.numel() * 4)
        damaged = bytearray(raw)
        damaged[at] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(damaged))
        try:
            loaded = load_checkpoint(target)
        except Exception:  # any clear error counts; the point is "not silent"
            counts[where]["raised"] += 1
            continue
        # the per-entry digests only name a damaged entry; "all" covers the content, so compare
        # without them
        same = _states_equal({k: v for k, v in loaded.items() if k != "checksum"},
                             {k: v for k, v in original.items() if k != "checksum"})
        counts[where]["identical" if same else "silently_wrong"] += 1
    handled = sum(c["raised"] + c["identical"] for c in counts.values())
    return {"trials": trials, "handled": handled, **counts}


def _run_ids(runs_dir: Path) -> list[str]:
    with Store(runs_dir / "bnlab.db") as store:
        return [r["id"] for r in store.list_runs()]


def malicious_inputs(work: Path) -> dict:
    from bnlab.store import StoreVersionError
    from bnlab.train.config import load_config_file

    marker = work / "pwned"
    cases: dict[str, bool] = {}

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    def refused(name, fn, *errors):
        try:
            fn()
        except errors:
            cases[name] = not marker.exists()
        except Exception as err:  # an unexpected error type is not a clear refusal
            print(f"  {name}: unexpected {type(err).__name__}: {err}")
            cases[name] = False
        else:
            cases[name] = False

    ref_dir = work / "reference"
    run_id = _run_ids(ref_dir)[0]
    hostile = work / "hostile"
    shutil.copytree(ref_dir, hostile)
    ckpt = checkpoint_path(hostile, run_id)
    with open(ckpt, "wb") as f:
        import pickle

        torch.save({"format": 2, "model": Exploit()}, f, pickle_module=pickle)
    refused("checkpoint pickle that runs a command",
            lambda: load_model(run_id, hostile), ValueError)
    torch.save({"format": 99}, ckpt)
    refused("checkpoint of an unknown format", lambda: load_checkpoint(ckpt), ValueError)
    other = work / "other"
    shutil.copytree(ref_dir, other)
    with Store(other / "bnlab.db") as store:
        store.delete_run(run_id)  # keep the checkpoint file of another run under this run's name
    shutil.copy(checkpoint_path(ref_dir, run_id), checkpoint_path(other, run_id))
    state = load_checkpoint(checkpoint_path(other, run_id))
    state["run_id"] = "someoneelse"
    from bnlab.train.checkpoint import save_checkpoint

    save_checkpoint(checkpoint_path(other, run_id),
                    {k: v for k, v in state.items() if k not in ("format", "checksum")})
    refused("checkpoint of another run",
            lambda: run(dict(CONFIG, runs_dir=str(other)), progress=False), ValueError)
    newer = work / "newer" / "bnlab.db"
    Store(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()
    refused("store of a newer schema", lambda: Store(newer), StoreVersionError)
    foreign = work / "foreign" / "bnlab.db"
    foreign.parent.mkdir()
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE runs (who TEXT)")
    conn.commit()
    conn.close()
    refused("foreign SQLite file as the store", lambda: Store(foreign), StoreVersionError)
    yaml_file = work / "evil.yaml"
    yaml_file.write_text(f'lr: !!python/object/apply:os.system ["touch {marker}"]\n')
    refused("YAML config with a Python object tag", lambda: load_config_file(yaml_file), ValueError)
    with Store(ref_dir / "bnlab.db") as store:
        cases["run-id prefix of SQL wildcards"] = store.get_run("%") is None \
            and store.get_run("_") is None
    return {"tried": len(cases), "refused": sum(cases.values()), "cases": cases}


SWEEP_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {repo!r})
from bnlab.experiments.runner import run_sweep
records = run_sweep({configs!r}, progress=False)
print(json.dumps([[r["id"], r["status"], r.get("error")] for r in records]))
"""


def concurrent_sweeps(work: Path) -> dict:
    """Two processes sweep the same configs over one runs dir at once (two `bnlab reproduce`)."""
    runs_dir = work / "sweeps"
    configs = [dict(CONFIG, seed=s, runs_dir=str(runs_dir)) for s in (11, 12, 13)]
    script = SWEEP_CHILD.format(repo=str(REPO), configs=configs)
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=900) for child in children]
    records = [rec for out, _ in outputs for rec in json.loads(out.strip().splitlines()[-1])]
    with Store(runs_dir / "bnlab.db") as store:
        stored = {r["id"]: r["status"] for r in store.list_runs()}
    return {"processes": 2, "configs": len(configs), "records": len(records),
            # runs met while the other trained them
            "waits": sum(err.count("waiting: ") for _, err in outputs),
            "finished": sum(status == "finished" for _, status, _ in records),
            "failed": [[run_id, error] for run_id, status, error in records
                       if status != "finished"],
            "stored": stored}


def categories(interruptions: dict, sigterms: list, corruptions: dict, damage: dict, sweeps: dict,
               numbers: dict, malicious: dict, hostile: dict) -> dict:
    """Totals per category: (passed, tried)."""
    return {
        "kill points": (interruptions["survived"] + sum(t["clean"] for t in sigterms),
                        interruptions["trials"] + len(sigterms)),
        "corruption": (corruptions["handled"] + damage["handled"],
                       corruptions["trials"] + damage["trials"]),
        "concurrency": (sweeps["finished"], sweeps["records"]),
        "numerics": (numbers["refused_or_caught"], numbers["tried"]),
        "hostile inputs": (malicious["refused"] + hostile["refused"],
                           malicious["tried"] + hostile["tried"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reliability.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bnlab-reliability-"))
    try:
        interruptions = interruption_trials(5 if args.quick else 10, rng, work)
        sigterms = [cases.sigterm_trial(REPO, CONFIG, at, work / f"sigterm{at}") for at in (7, 23)]
        corruptions = corruption_trials(40 if args.quick else 200, rng, work)
        ref_id = _run_ids(work / "reference")[0]
        damage = cases.store_damage_trials(work / "reference", ref_id, CONFIG,
                                           10 if args.quick else 40, rng, work)
        malicious = malicious_inputs(work)
        hostile = cases.hostile_inputs(work, work / "reference", ref_id)
        numbers = cases.numerics(work, CONFIG)
        sweeps = concurrent_sweeps(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    totals = categories(interruptions, sigterms, corruptions, damage, sweeps, numbers,
                        malicious, hostile)
    result = {**provenance(), "config": CONFIG, "seed": args.seed,
              "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__,
              "python": sys.version.split()[0],
              "totals": {k: {"passed": p, "tried": t} for k, (p, t) in totals.items()},
              "interruptions": interruptions, "sigterm": sigterms, "corruptions": corruptions,
              "store_damage": damage, "malicious": malicious, "hostile_inputs": hostile,
              "numerics": numbers, "concurrent_sweeps": sweeps}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    silently_wrong = (corruptions["anywhere"]["silently_wrong"]
                      + corruptions["in_weight"]["silently_wrong"])
    print(f"interruptions survived {interruptions['survived']}/{interruptions['trials']}, "
          f"rows lost {interruptions['rows_lost']}; corruptions handled "
          f"{corruptions['handled']}/{corruptions['trials']} (silently wrong: {silently_wrong}); "
          f"malicious inputs refused {malicious['refused']}/{malicious['tried']}; "
          f"two concurrent sweeps: {sweeps['finished']}/{sweeps['records']} records finished; "
          f"{result['seconds']} s -> {args.out}")
    for name, (passed, tried) in totals.items():
        print(f"  {name:15s} {passed:4d}/{tried:<4d}")
    print(f"  {'total':15s} "
          f"{sum(p for p, _ in totals.values()):4d}/{sum(t for _, t in totals.values()):<4d}"
          f"  (silently wrong store damage: {len(damage['silently_wrong'])})")


if __name__ == "__main__":
    main()
