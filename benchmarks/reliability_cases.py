"""The categories of benchmarks/reliability.py: store damage SQLite does not report (caught
by the seals and the open checks), numerics that must not end ``finished``, hostile inputs, and
SIGTERM as a kill point. Each case returns True when bnlab did the right thing (refused with a clear
error, caught the damage, rebuilt the truth, or stopped cleanly), False when something was silently
wrong."""

from __future__ import annotations

import random
import shutil
import signal
import sqlite3
import struct
from pathlib import Path

import torch

from bnlab.callbacks import Callback
from bnlab.store.run_files import UnsafePathError
from bnlab.store import Store, StoreCorruptError, StoreIntegrityError, StoreVersionError
from bnlab.train import RunInterrupted, run
from bnlab.train.checkpoint import CheckpointCorruptError, load_checkpoint, save_checkpoint
from bnlab.store.run_files import checkpoint_path

SEALED_DAMAGES = {  # damages of a finished run's record, each a valid database afterwards
    "config digit": "UPDATE runs SET config = replace(config, '\"lr\": 0.05', '\"lr\": 0.07')",
    "rows deleted": "DELETE FROM metrics WHERE step % 3 = 0",
    "one row deleted": "DELETE FROM metrics WHERE rowid = 7",
    "row added": "INSERT INTO metrics SELECT run_id, step + 1000, name, value FROM metrics LIMIT 1",
    "summary metric": "UPDATE runs SET summary = replace(summary, '\"test_accuracy\": 0.', "
                      "'\"test_accuracy\": 1.')",
    "invalid JSON": "UPDATE runs SET config = substr(config, 1, 20)",
    "metrics table dropped": "DROP TABLE metrics",
}
OPEN_DAMAGES = {  # refused when the store is opened
    "insert-swallowing trigger": "CREATE TRIGGER t BEFORE INSERT ON metrics BEGIN SELECT "
                                 "RAISE(IGNORE); END",
    "NOT NULL column added": "ALTER TABLE metrics ADD COLUMN unit TEXT NOT NULL DEFAULT 'x'",
    "column renamed": "ALTER TABLE runs RENAME COLUMN steps TO step_count",
}


def _sql(db: Path, statement: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute(statement)
    conn.commit()
    conn.close()


def _export(runs_dir: Path, run_id: str) -> str:
    with Store(runs_dir / "bnlab.db") as store:
        return store.export(run_id, "csv")


def _flip_a_metric_bit(db: Path, rng: random.Random) -> None:
    conn = sqlite3.connect(db)
    rowid, value = rng.choice(
        conn.execute("SELECT rowid, value FROM metrics WHERE value IS NOT NULL").fetchall())
    bits = bytearray(struct.pack("<d", value))
    bit = rng.randrange(64)
    bits[bit // 8] ^= 1 << (bit % 8)
    flipped = struct.unpack("<d", bytes(bits))[0]
    conn.execute("UPDATE metrics SET value = ? WHERE rowid = ?",
                 (None if flipped != flipped else flipped, rowid))
    conn.commit()
    conn.close()


def _zero_root_page(db: Path, name: str) -> None:
    """Zero the b-tree header of ``name``'s root page (what a torn or garbled page looks like)."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    start = (root - 1) * size + (100 if root == 1 else 0)
    raw[start:start + 64] = bytes(64)
    db.write_bytes(bytes(raw))


def _judge(runs_dir: Path, run_id: str, truth: str, config: dict) -> str:
    """caught (and rebuilt by re-running the config), identical, or silently wrong."""
    try:
        seen = _export(runs_dir, run_id)
    except (StoreIntegrityError, StoreCorruptError, StoreVersionError):
        # rebuilds from the checkpoint
        record = run(dict(config, runs_dir=str(runs_dir)), progress=False)
        return "caught+rebuilt" if record.status == "finished" \
            and _export(runs_dir, run_id) == truth else "caught"
    return "identical" if seen == truth else "silently wrong"


def store_damage_trials(reference: Path, run_id: str, config: dict, flips: int, rng: random.Random,
                        work: Path) -> dict:
    truth = _export(reference, run_id)
    outcomes: dict[str, str] = {}
    trials = [(name, lambda db, s=sql: _sql(db, s)) for name, sql in SEALED_DAMAGES.items()]
    trials += [(f"metric bit flip {i}", lambda db: _flip_a_metric_bit(db, rng))
               for i in range(flips)]
    for name, damage in trials:
        runs_dir = work / "damage" / name.replace(" ", "_")
        shutil.copytree(reference, runs_dir)
        damage(runs_dir / "bnlab.db")
        outcomes[name] = _judge(runs_dir, run_id, truth, config)
    for name, sql in OPEN_DAMAGES.items():
        runs_dir = work / "damage" / name.replace(" ", "_")
        shutil.copytree(reference, runs_dir)
        _sql(runs_dir / "bnlab.db", sql)
        outcomes[name] = _refused(lambda d=runs_dir: Store(d / "bnlab.db"), StoreVersionError)
    for name, table in (("index page zeroed", "metrics_by_run"), ("table page zeroed", "metrics")):
        runs_dir = work / "damage" / name.replace(" ", "_")
        shutil.copytree(reference, runs_dir)
        _zero_root_page(runs_dir / "bnlab.db", table)
        outcomes[name] = _refused(lambda d=runs_dir: Store(d / "bnlab.db"), StoreCorruptError)
    empty = work / "damage" / "empty" / "bnlab.db"
    empty.parent.mkdir(parents=True)
    empty.touch()
    outcomes["0-byte database"] = _refused(lambda: Store(empty), StoreCorruptError) \
        and empty.stat().st_size == 0
    outcomes = {k: (v if isinstance(v, str) else ("caught" if v else "silently wrong"))
                for k, v in outcomes.items()}
    wrong = sorted(k for k, v in outcomes.items() if v == "silently wrong")
    return {"trials": len(outcomes), "handled": len(outcomes) - len(wrong), "silently_wrong": wrong,
            "rebuilt": sum(v == "caught+rebuilt" for v in outcomes.values()), "outcomes": outcomes}


def _refused(fn, *errors) -> bool:
    try:
        fn()
    except errors:
        return True
    except Exception as err:  # an unexpected error type is not a clear refusal
        print(f"  unexpected {type(err).__name__}: {err}")
        return False
    return False


class _NegativeVariance(Callback):
    name = "negative_variance"

    def on_train_batch_end(self, loop):
        if loop.step == 3:  # of 4: the run ends with a negative (finite) running variance
            next(m for m in loop.model.modules() if hasattr(m, "running_var")).running_var[0] = -1.0


def numerics(work: Path, config: dict) -> dict:
    """Runs that must not end ``finished``, and numbers that must not enter."""
    from bnlab.norms import validate
    from bnlab.train.config import TrainConfig, load_config_file, validate_static

    cases: dict[str, bool] = {}
    blown = run(dict(model="mlp", norm="none", data="digits", steps=1, lr=1e6,
                     runs_dir=str(work / "num")),
                progress=False)
    cases["norm none, 1 step at lr 1e6"] = blown.status == "diverged"
    negative = run(dict(config, steps=4, runs_dir=str(work / "num")),
                   callbacks=[_NegativeVariance()], progress=False)
    cases["negative running_var"] = negative.status == "diverged"
    for spec in ("bn(eps=inf)", "bn(eps=1e400)", f"bn(eps={'1' * 100_000})", "cbn(rho=inf)",
                 "bn(eps=nan)", "bn(momentum=-inf)", "brn(r_max=inf)"):
        cases[f"spec {spec[:24]}"] = _refused(lambda s=spec: validate(s), ValueError)
    for key, value in (("lr", ".inf"), ("lr", "1e400"), ("momentum", ".nan"),
                       ("weight_decay", "-.inf"), ("divergence_factor", ".inf"),
                       ("seed", str(2**64)), ("norm", "'bn(eps=.inf)'")):
        path = work / f"num_{key}.yaml"
        path.write_text(f"{key}: {value}\nsteps: 1\n")
        cases[f"YAML {key}: {value}"] = _refused(
            lambda p=path: validate_static(TrainConfig.from_dict(load_config_file(p))), ValueError)
    return {"tried": len(cases), "refused_or_caught": sum(cases.values()), "cases": cases}


def hostile_inputs(work: Path, reference: Path, run_id: str) -> dict:
    """Hostile inputs beyond the malicious ones above."""
    from typer.testing import CliRunner

    from bnlab.cli import app
    from bnlab.spec import read_pairs
    from bnlab.train.config import load_config_file

    cases: dict[str, bool] = {}
    runs_dir = work / "hostile21" / "lab" / "runs"
    shutil.copytree(reference, runs_dir)
    _sql(runs_dir / "bnlab.db",
         "INSERT INTO runs(id, config, config_hash, status, created, updated) "
         "VALUES ('../../victim', '{}', 'h', 'finished', 1, 1)")
    victims = [runs_dir.parent / f"victim{s}" for s in (".pt", ".prev.pt", ".lock")]
    for victim in victims:
        victim.write_text("not yours")
    for command in ("delete", "show", "export", "repair"):
        result = CliRunner().invoke(
            app, ["runs", command, "../../victim", "--runs-dir", str(runs_dir)])
        cases[f"runs {command} ../../victim"] = result.exit_code != 0 \
            and all(v.exists() for v in victims)
    cases["create_run('../x')"] = _refused(
        lambda: Store(runs_dir / "bnlab.db").create_run("../x", {}), UnsafePathError)
    deep = "[" * 50_000 + "]" * 50_000
    cases["option nested 50,000 deep"] = _refused(
        lambda: read_pairs([f"w={deep}"], "--model-option"), ValueError)
    (work / "deep.yaml").write_text(f"model_options: {{w: {deep}}}\n")
    cases["YAML nested 50,000 deep"] = _refused(
        lambda: load_config_file(work / "deep.yaml"), ValueError)
    foreign = work / "hostile21" / "foreign" / "bnlab.db"
    foreign.parent.mkdir(parents=True)
    _sql(foreign, "CREATE TABLE invoices (n INTEGER)")
    before = foreign.read_bytes()
    cases["someone else's database"] = _refused(lambda: Store(foreign), StoreVersionError) and \
        foreign.read_bytes() == before
    ckpt = checkpoint_path(work / "hostile21" / "down", "r1")
    save_checkpoint(ckpt, {"run_id": "r1", "w": torch.ones(3)})
    state = torch.load(ckpt, weights_only=True)
    state["format"], state["w"] = 1, torch.full((3,), 9.0)
    torch.save(state, ckpt)
    cases["checkpoint downgraded to format 1"] = _refused(lambda: load_checkpoint(ckpt),
                                                          CheckpointCorruptError)
    return {"tried": len(cases), "refused": sum(cases.values()), "cases": cases}


SIGTERM_CHILD = """
import os, signal, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {repo!r})
from bnlab.callbacks import Callback
from bnlab.train import RunInterrupted, run

class TermAt(Callback):
    def on_train_batch_end(self, loop):
        if loop.step == {at}:
            os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` and schedulers send

try:
    run(dict({config!r}, runs_dir={runs_dir!r}), callbacks=[TermAt()], progress=False)
except RunInterrupted as err:
    print(err, file=sys.stderr)
    sys.exit(128 + err.signum)
"""


def sigterm_trial(repo: Path, config: dict, at: int, runs_dir: Path) -> dict:
    """A SIGTERM at step ``at``: exit 143, status interrupted, a checkpoint at that step."""
    import subprocess
    import sys

    script = SIGTERM_CHILD.format(repo=str(repo), at=at, config=config, runs_dir=str(runs_dir))
    child = subprocess.run([sys.executable, "-c", script], capture_output=True,
                           text=True, timeout=600)
    with Store(runs_dir / "bnlab.db") as store:
        (row,) = store.list_runs()
    step = load_checkpoint(checkpoint_path(runs_dir, row["id"]))["step"]
    clean = (child.returncode == 128 + signal.SIGTERM and row["status"] == "interrupted"
             and step == at and f"interrupted at step {at}" in child.stderr)
    return {"exit": child.returncode, "status": row["status"],
            "checkpoint_step": step, "clean": clean}


__all__ = ["RunInterrupted", "hostile_inputs", "numerics", "sigterm_trial", "store_damage_trials"]
