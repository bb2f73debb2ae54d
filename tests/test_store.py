"""The SQLite run store: round trips, status transitions, exports, and concurrent writers."""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing as mp
import sqlite3

import pytest

from bnlab.store import Store

WRITERS = 4
ROWS_PER_WRITER = 400
ROWS_PER_BATCH = 5


def _writer(path: str, worker: int, barrier) -> None:
    store = Store(path)
    run_id = f"run{worker}"
    store.create_run(run_id, {"worker": worker})
    barrier.wait()  # start together so the transactions really contend for the lock
    for start in range(0, ROWS_PER_WRITER, ROWS_PER_BATCH):
        store.log_rows(
            run_id, [(step, "x", float(worker * 100_000 + step))
                     for step in range(start, start + ROWS_PER_BATCH)]
        )
        # and some traffic on a row every writer shares
        store.set_steps(run_id, start + ROWS_PER_BATCH)
    store.set_status(run_id, "finished", steps=ROWS_PER_WRITER)
    store.close()


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "bnlab.db")
    Store(path).close()
    ctx = mp.get_context("spawn")  # no sqlite connection or torch state crosses a fork
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(path, w, barrier)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    store = Store(path)
    assert store.count_metrics() == WRITERS * ROWS_PER_WRITER
    for w in range(WRITERS):
        rows = store.metrics(f"run{w}")["x"]
        assert [s for s, _ in rows] == list(range(ROWS_PER_WRITER))
        assert [v for _, v in rows] == [float(w * 100_000 + s) for s in range(ROWS_PER_WRITER)]
        run = store.get_run(f"run{w}")
        assert run["status"] == "finished" and run["steps"] == ROWS_PER_WRITER
    # WAL mode is what lets readers proceed while a writer holds the lock
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_run_round_trip_and_status(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    store.create_run("abc123", {"lr": 0.1, "model": "mlp"}, config_hash="h", env={"torch": "x"})
    # creating again keeps the original row (a resumed run must not reset its record)
    store.create_run("abc123", {"lr": 99.0})
    run = store.get_run("abc123")
    assert run["config"] == {"lr": 0.1, "model": "mlp"}
    assert run["config_hash"] == "h" and run["env"] == {"torch": "x"}
    assert run["status"] == "running" and run["finished"] is None
    store.set_status("abc123", "diverged", steps=7, summary={"metrics": {"train_loss": math.inf}})
    run = store.get_run("abc")  # unique prefix
    assert run["status"] == "diverged" and run["steps"] == 7 and run["finished"] is not None
    assert run["summary"] == {"metrics": {"train_loss": None}}  # strict JSON: inf -> null
    with pytest.raises(ValueError, match="valid: running, finished, diverged, failed, interrupted"):
        store.set_status("abc123", "exploded")
    with pytest.raises(KeyError):
        store.set_status("nope", "failed")
    assert store.get_run("zzz") is None
    store.create_run("abd000", {})
    with pytest.raises(ValueError, match="ambiguous"):
        store.get_run("ab")
    assert [r["id"] for r in store.list_runs(status="diverged")] == ["abc123"]
    assert {r["id"] for r in store.list_runs()} == {"abc123", "abd000"}


def test_metrics_filter_nonfinite_and_delete_after(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    store.create_run("r", {})
    store.log_metrics("r", 1, {"train_loss": 2.0, "train_accuracy": 0.5})
    store.log_metrics("r", 2, {"train_loss": math.nan})
    store.log_metrics("r", 3, {"train_loss": math.inf})
    m = store.metrics("r", names=["train_loss"])
    assert list(m) == ["train_loss"]
    steps, values = zip(*m["train_loss"])
    assert steps == (1, 2, 3) and values[0] == 2.0 and math.isnan(values[1]) \
        and values[2] == math.inf
    assert store.delete_metrics_after("r", 1) == 2
    assert store.metrics("r") == {"train_loss": [(1, 2.0)], "train_accuracy": [(1, 0.5)]}


def test_export_csv_and_json(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    store.create_run("r1", {"lr": 0.5})
    store.log_metrics("r1", 1, {"a": 1.5, "b": 2.0})
    store.log_metrics("r1", 2, {"a": 0.25})
    rows = list(csv.DictReader(io.StringIO(store.export("r1", "csv"))))
    assert [(r["step"], r["name"], float(r["value"])) for r in rows] == [
        ("1", "a", 1.5), ("1", "b", 2.0), ("2", "a", 0.25)
    ]
    doc = json.loads(store.export("r1", "json"))
    assert doc["config"] == {"lr": 0.5} and doc["metrics"]["a"] == [[1, 1.5], [2, 0.25]]
    with pytest.raises(ValueError, match="csv, json"):
        store.export("r1", "xml")


def test_delete_run_removes_rows_and_checkpoint_files_but_not_other_runs(tmp_path):
    import torch

    from bnlab.train.checkpoint import save_checkpoint
    from bnlab.store.run_files import RunLock, RunLockedError, checkpoint_path, lock_path

    store = Store(tmp_path / "bnlab.db")
    for run_id in ("keep", "gone"):
        store.create_run(run_id, {})
        store.log_metrics(run_id, 1, {"a": 1.0, "b": 2.0})
        save_checkpoint(checkpoint_path(tmp_path, run_id), {"run_id": run_id, "w": torch.ones(2)})
    orphan = checkpoint_path(tmp_path, "gone").parent / ".gone.pt.x1y2.tmp"
    orphan.write_bytes(b"half a checkpoint")
    with RunLock(lock_path(tmp_path, "gone")):
        with pytest.raises(RunLockedError):  # another process is training it: refuse
            store.delete_run("gone")
    assert store.get_run("gone") is not None

    result = store.delete_run("gone")
    assert result["metrics"] == 2 and str(checkpoint_path(tmp_path, "gone")) in result["files"]
    assert store.get_run("gone") is None and store.metrics("gone") == {}
    assert not checkpoint_path(tmp_path, "gone").exists() and not orphan.exists()
    assert store.metrics("keep") == {"a": [(1, 1.0)], "b": [(1, 2.0)]}
    assert checkpoint_path(tmp_path, "keep").exists()
    with pytest.raises(KeyError, match="no run"):
        store.delete_run("gone")
