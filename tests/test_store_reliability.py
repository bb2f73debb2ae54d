"""Nothing lost, nothing silently wrong: checkpoint checksums, the previous checkpoint, orphaned
temporaries, the store's schema version, read-only stores, durability, re-created rows and live
progress."""

from __future__ import annotations

import os
import pickle
import sqlite3

import pytest
import torch

from bnlab.callbacks import Callback
from bnlab.store import (SCHEMA_VERSION, ReadOnlyStoreError, Store, StoreIntegrityError,
                         StoreVersionError)
from bnlab.train.checkpoint import CheckpointCorruptError, load_checkpoint, save_checkpoint
from bnlab.store.run_files import checkpoint_path, orphaned_temporaries, previous_path

# -- checkpoints ---------------------------------------------------------------------------------


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"run_id": "r1", "step": step,
            "model": {"w": torch.randn(64, generator=g), "n": torch.tensor(step)},
            "accumulators": {"loss_sum": 1.5 * step, "batches": step}}


def _flip_byte_of(path, tensor: torch.Tensor, offset: int = 5) -> None:
    raw = bytearray(path.read_bytes())
    at = bytes(raw).find(tensor.numpy().tobytes())
    assert at >= 0, "the tensor's bytes are stored verbatim in the zip archive"
    raw[at + offset] ^= 0x10
    path.write_bytes(bytes(raw))


def test_flipped_byte_in_a_weight_is_a_clear_error_with_the_previous_checkpoint_as_recovery(
    tmp_path):
    path = checkpoint_path(tmp_path, "r1")
    save_checkpoint(path, _state(4))
    save_checkpoint(path, _state(8))
    assert load_checkpoint(previous_path(path))["step"] == 4  # the one before is kept
    loaded = load_checkpoint(path)
    assert loaded["step"] == 8 and torch.equal(loaded["model"]["w"], _state(8)["model"]["w"])

    _flip_byte_of(path, _state(8)["model"]["w"])
    with pytest.raises(CheckpointCorruptError,
                       match=r"damaged: model .*nothing was resumed") as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "previous checkpoint (step 4)" in message \
        and f"mv {previous_path(path)} {path}" in message
    assert "runs delete r1" in message
    os.replace(previous_path(path), path)  # the documented recovery
    assert load_checkpoint(path)["step"] == 4


def test_malicious_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = checkpoint_path(tmp_path, "r1")
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        torch.save({"format": 2, "model": Exploit()}, f, pickle_module=pickle)
    with pytest.raises(CheckpointCorruptError, match="cannot be read"):
        load_checkpoint(path)
    assert not marker.exists()
    # a payload that unpickles but whose format is unknown is refused too, naming what it reads
    torch.save({"format": 99}, path)
    with pytest.raises(ValueError, match=r"format 99; this bnlab reads \(1, 2\)"):
        load_checkpoint(path)


def test_orphaned_temporary_files_are_removed_by_the_next_save(tmp_path):
    path = checkpoint_path(tmp_path, "r1")
    save_checkpoint(path, _state(1))
    orphans = [path.parent / f".{path.name}.k{i}.tmp" for i in range(3)]
    for orphan in orphans:
        orphan.write_bytes(b"killed mid-write")
    other = checkpoint_path(tmp_path, "r2").parent / ".r2.pt.zz.tmp"  # another run's: left alone
    other.write_bytes(b"x")
    assert orphaned_temporaries(path) == sorted(orphans)
    save_checkpoint(path, _state(2))
    assert orphaned_temporaries(path) == [] and other.exists()
    assert load_checkpoint(path)["step"] == 2


# -- schema version ------------------------------------------------------------------------------

_OLDER_LAYOUT = """
CREATE TABLE runs (id TEXT PRIMARY KEY, config TEXT NOT NULL, config_hash TEXT NOT NULL,
                   status TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
                   steps INTEGER);
CREATE TABLE metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, value REAL);
INSERT INTO runs VALUES ('old1', '{"lr": 0.1}', 'h', 'finished', 1.0, 2.0, 12);
INSERT INTO metrics VALUES ('old1', 12, 'train_loss', 0.5);
"""


def test_an_older_unversioned_store_is_migrated_and_read(tmp_path):
    path = tmp_path / "bnlab.db"
    conn = sqlite3.connect(path)
    conn.executescript(_OLDER_LAYOUT)  # no env/error/summary/finished columns, no version
    conn.close()
    with Store(path) as store:
        run = store.get_run("old1")
        assert run["config"] == {"lr": 0.1} and run["status"] == "finished" \
            and run["summary"] is None
        assert store.metrics("old1") == {"train_loss": [(12, 0.5)]}
        store.set_status("old1", "finished", summary={"metrics": {"x": 1.0}})  # a migrated column
        assert store.get_run("old1")["summary"] == {"metrics": {"x": 1.0}}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_newer_or_unknown_store_is_refused_with_a_message(tmp_path):
    newer = tmp_path / "newer.db"
    Store(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    for readonly in (False, True):
        with pytest.raises(StoreVersionError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
            Store(newer, readonly=readonly)

    unknown = tmp_path / "unknown.db"
    conn = sqlite3.connect(unknown)
    conn.execute("CREATE TABLE runs (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError,
                       match="unknown layout .*lacks id, config, status, created"):
        Store(unknown)


# -- read-only stores ----------------------------------------------------------------------------


def test_read_only_store_lists_and_exports_and_writes_nothing(tmp_path):
    path = tmp_path / "bnlab.db"
    with Store(path) as store:
        store.create_run("r1", {"lr": 0.1})
        store.log_metrics("r1", 1, {"train_loss": 2.0})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with Store(path, readonly=True) as ro:
        assert ro.readonly and [r["id"] for r in ro.list_runs()] == ["r1"]
        assert ro.metrics("r1") == {"train_loss": [(1, 2.0)]}
        assert '"lr": 0.1' in ro.export("r1", "json")
        with pytest.raises(ReadOnlyStoreError, match="read-only .*another --runs-dir"):
            ro.create_run("r2", {})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(FileNotFoundError, match="no run store"):
        Store(tmp_path / "missing.db", readonly=True)


def test_unwritable_folder_opens_read_only_by_itself(tmp_path, monkeypatch):
    from bnlab.store import database as store_mod

    path = tmp_path / "bnlab.db"
    with Store(path) as store:
        store.create_run("r1", {})
    # tests may run as root, where chmod blocks nothing: stand in for the permission check
    monkeypatch.setattr(store_mod, "writable", lambda p: False)
    with Store(path) as ro:
        assert ro.readonly and ro.get_run("r1") is not None


# -- durability, lost rows, progress ---------------------------------------------------------------


def _rows(n: int) -> list[tuple[int, str, float]]:
    return [(s, name, float(s) * k) for s in range(1, n + 1) for k, name in ((1, "a"), (2, "b"))]


@pytest.mark.parametrize("damage", ["delete_wal", "drop_table", "delete_rows"])
def test_rows_lost_by_the_store_are_recreated_from_the_checkpoint(tmp_path, damage):
    path = tmp_path / "bnlab.db"
    store = Store(path)
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.create_run("r1", {})
    store.log_rows("r1", _rows(10))
    carried = store.sync_rows("r1", 8)  # what a checkpoint at step 8 carries
    assert carried == [r for r in _rows(10) if r[0] <= 8]
    store.log_rows("r1", [(9, "late", 1.0)])
    holder = sqlite3.connect(path)  # keeps the WAL from being folded in at close
    holder.execute("SELECT 1 FROM runs").fetchone()
    store.close()
    if damage == "delete_wal":
        os.unlink(f"{path}-wal")
    elif damage == "drop_table":
        holder.execute("DROP TABLE metrics")
        holder.commit()
    else:
        holder.execute("DELETE FROM metrics WHERE step BETWEEN 3 AND 5")
        holder.commit()
    holder.close()

    store = Store(path)
    missing = store.check_rows_up_to("r1", 8, carried)
    expected_missing = [3, 4, 5] if damage == "delete_rows" else list(range(1, 9))
    if damage == "delete_wal":  # sync_rows folded the WAL into the file: nothing up to 8 is lost
        expected_missing = []
    assert missing == expected_missing
    got = store.metrics("r1")
    assert [s for s, _ in got["a"] if s <= 8] == list(range(1, 9))
    assert [v for s, v in got["b"] if s <= 8] == [2.0 * s for s in range(1, 9)]
    assert store.check_rows_up_to("r1", 8, carried) == []  # now complete
    store.close()


def test_check_rows_without_carried_rows_reports_an_empty_store(tmp_path):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        assert store.check_rows_up_to("r1", 5) == [5]
        store.log_rows("r1", [(1, "a", 1.0)])
        assert store.check_rows_up_to("r1", 5) == []


def test_running_runs_show_progress_as_rows_are_flushed(tmp_path):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        store.log_rows("r1", [(1, "a", 1.0), (7, "a", 1.0)])
        assert store.get_run("r1")["steps"] == 7
        store.log_rows("r1", [(3, "probe", 1.0)])  # a late row never moves progress back
        assert store.get_run("r1")["steps"] == 7
        store.set_status("r1", "finished", steps=10)
        store.log_rows("r1", [(12, "a", 1.0)])  # a finished run's step count is its own
        assert store.get_run("r1", verify=False)["steps"] == 10
        # ... and a row added after its end breaks its seal: read as damaged, never as truth
        with pytest.raises(StoreIntegrityError, match="metric rows number 4, 3 were sealed"):
            store.get_run("r1")


# -- end to end: a resumed run with a damaged store or checkpoint ----------------------------------

E2E = dict(model="mlp", data="digits", steps=12, lr=0.05, batch_size=200, seed=3,
           checkpoint_every=4, log_every=1, model_options={"width": 16})


class FailOnceAt(Callback):
    """Raises at a step the first time (an interrupted attempt that left a checkpoint)."""

    name = "FailOnceAt"

    def __init__(self, step):
        self.at, self.fired = step, False

    def on_train_batch_end(self, loop):
        if loop.step == self.at and not self.fired:
            self.fired = True
            raise RuntimeError("crash")


def _failed_attempt(runs_dir):
    from bnlab.train import run

    with pytest.raises(RuntimeError, match="crash"):
        run(dict(E2E, runs_dir=str(runs_dir)), callbacks=[FailOnceAt(10)], progress=False)
    with Store(runs_dir / "bnlab.db") as store:
        (row,) = store.list_runs()
    return row["id"]


@pytest.mark.parametrize("damage", ["drop_table", "delete_rows"])
def test_resume_recreates_rows_the_store_lost(tmp_path, damage, capsys):
    from bnlab.train import run

    clean = run(dict(E2E, runs_dir=str(tmp_path / "clean")), progress=False)
    run_id = _failed_attempt(tmp_path / "hurt")
    conn = sqlite3.connect(tmp_path / "hurt" / "bnlab.db")
    conn.execute("DROP TABLE metrics" if damage == "drop_table"
                 else "DELETE FROM metrics WHERE step IN (2, 5)")
    conn.commit()
    conn.close()
    resumed = run(dict(E2E, runs_dir=str(tmp_path / "hurt")), progress=None)
    assert resumed.id == run_id == clean.id and resumed.resumed_from == 8 \
        and resumed.status == "finished"
    lost = "8 steps up to the checkpoint (1..8)" if damage == "drop_table" \
        else "2 steps up to the checkpoint (2..5)"
    assert lost in capsys.readouterr().err
    with Store(tmp_path / "hurt" / "bnlab.db") as a, Store(tmp_path / "clean" / "bnlab.db") as b:
        assert a.metrics(run_id) == b.metrics(clean.id)  # not one row lost


def test_resume_from_a_corrupted_checkpoint_is_refused_never_finished(tmp_path):
    from bnlab.train import run

    run_id = _failed_attempt(tmp_path)
    path = checkpoint_path(tmp_path, run_id)
    weight = load_checkpoint(path)["model"]
    name = next(k for k, v in weight.items() if v.dtype == torch.float32 and v.numel() > 16)
    _flip_byte_of(path, weight[name])
    with pytest.raises(CheckpointCorruptError, match="damaged: model"):
        run(dict(E2E, runs_dir=str(tmp_path)), progress=False)
    with Store(tmp_path / "bnlab.db") as store:
        assert store.get_run(run_id)["status"] != "finished"
    os.replace(previous_path(path), path)  # the documented recovery: the checkpoint before it
    resumed = run(dict(E2E, runs_dir=str(tmp_path)), progress=False)
    assert resumed.status == "finished" and resumed.resumed_from == 4


# -- two sweeps on one runs dir, reports of read-only or missing runs dirs -------------------------


def test_a_sweep_waits_for_a_run_another_process_holds_instead_of_recording_it_failed(
    tmp_path, monkeypatch):
    import threading

    from bnlab.experiments import runner
    from bnlab.train import run
    from bnlab.store.run_files import RunLock, lock_path

    config = dict(E2E, runs_dir=str(tmp_path))
    run_id = run(config, progress=False).id  # learn the id, then forget the run
    with Store(tmp_path / "bnlab.db") as store:
        store.delete_run(run_id)
    monkeypatch.setattr(runner, "LOCK_POLL_SECONDS", 0.05)
    lock = RunLock(lock_path(tmp_path, run_id)).__enter__()  # "another sweep" is training it
    timer = threading.Timer(0.5, lock.__exit__, args=(None, None, None))
    timer.start()
    try:
        record = runner._train_one(config)
    finally:
        timer.cancel()
        lock.__exit__(None, None, None)
    assert record["status"] == "finished" and record["id"] == run_id, record.get("error")


def test_report_of_a_read_only_runs_dir_goes_elsewhere_and_writes_nothing_there(
    tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from bnlab.store import database as store_mod
    from bnlab.cli import app
    from bnlab.report import write_report

    runs_dir = tmp_path / "shared"
    with Store(runs_dir / "bnlab.db") as store:
        store.create_run("r1", {"norm": "bn"})
        store.log_rows("r1", [(1, "train_loss", 1.0)])
        store.save_entry("no-such-entry", "smoke", [{"label": "a", "id": "r1"}], {},
                         tiny=False, seconds=0.1)
    before = {p.name: p.read_bytes() for p in runs_dir.iterdir()}
    monkeypatch.setattr(store_mod, "writable", lambda p: False)  # root ignores chmod: stand in
    result = CliRunner().invoke(
        app, ["report", "--runs-dir", str(runs_dir), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "index.html").exists()
    assert {p.name: p.read_bytes() for p in runs_dir.iterdir()} == before
    with pytest.raises(FileNotFoundError, match="no run store at"):
        write_report(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_a_finished_run_is_returned_from_a_read_only_runs_dir(tmp_path, monkeypatch):
    from bnlab.store import database as store_mod
    from bnlab.train import run

    first = run(dict(E2E, steps=4, runs_dir=str(tmp_path)), progress=False)
    before = (tmp_path / "bnlab.db").read_bytes()
    monkeypatch.setattr(store_mod, "writable", lambda p: False)  # root ignores chmod: stand in
    again = run(dict(E2E, steps=4, runs_dir=str(tmp_path)), progress=False)
    assert again.status == "finished" and again.id == first.id and again.metrics == first.metrics
    assert (tmp_path / "bnlab.db").read_bytes() == before


def test_a_flipped_byte_in_an_entry_name_is_caught(tmp_path):
    """The pickle stores each key once, shared by the state and its per-entry digests: renaming it
    renames both, so only the digest over all entries and their names can tell."""
    path = checkpoint_path(tmp_path, "r1")
    save_checkpoint(path, _state(3))
    raw = path.read_bytes()
    assert raw.count(b"accumulators") == 1
    path.write_bytes(raw.replace(b"accumulators", b"accumulatorz"))
    with pytest.raises(CheckpointCorruptError, match="damaged: its entry names"):
        load_checkpoint(path)


def test_a_garbled_store_file_is_a_clear_error_and_runs_are_rebuilt_from_their_checkpoints(
    tmp_path):
    from bnlab.store import StoreCorruptError
    from bnlab.train import run

    first = run(dict(E2E, runs_dir=str(tmp_path)), progress=False)
    with Store(tmp_path / "bnlab.db") as store:
        rows = store.metrics(first.id)
    db = tmp_path / "bnlab.db"
    db.write_bytes(b"\x00garbage" * 512)
    with pytest.raises(StoreCorruptError, match="is damaged .*move the file away and re-run"):
        Store(db)
    db.unlink()  # the documented recovery
    again = run(dict(E2E, runs_dir=str(tmp_path)), progress=False)
    assert again.status == "finished" and again.metrics == first.metrics \
        and again.resumed_from == 12
    with Store(db) as store:
        assert store.metrics(first.id) == rows


def test_checkpoints_are_readable_like_any_file_the_process_creates(tmp_path):
    """A shared results folder: mkstemp's private 0600 would hide checkpoints from other users."""
    import stat

    path = checkpoint_path(tmp_path, "r1")
    old = os.umask(0o027)
    try:
        save_checkpoint(path, _state(1))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
