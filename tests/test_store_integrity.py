"""Nothing silently wrong: an ended run's seal catches a changed value, config or row on
every read path and the final checkpoint rebuilds it; store damage SQLite itself does not report is
refused at open; finished means healthy; SIGTERM, repeated Ctrl-C, disk full and read-only folders
end cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.store.run_files import DiskFullError
from bnlab.store import (SCHEMA_VERSION, ReadOnlyStoreError, Store, StoreCorruptError,
                         StoreIntegrityError, StoreVersionError)
from bnlab.train.checkpoint import save_checkpoint
from bnlab.store.run_files import checkpoint_path

from .store_helpers import garble_an_index

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
CONFIG = dict(model="mlp", data="digits", steps=6, lr=0.05, batch_size=200, seed=3, log_every=1,
              model_options={"width": 8})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run (and its export, the truth) to damage in copies."""
    from bnlab.train import run

    runs_dir = tmp_path_factory.mktemp("trained")
    record = run(dict(CONFIG, runs_dir=str(runs_dir)), progress=False)
    with Store(runs_dir / "bnlab.db") as store:
        truth = store.export(record.id, "csv")
        assert store.get_run(record.id)["seal"]["rows_count"] == truth.count("\n") - 1
    return runs_dir, record.id, truth


def _sql(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


DAMAGES = {
    "flipped_value": "UPDATE metrics SET value = value * 2 WHERE rowid = 3",
    "config_digit": "UPDATE runs SET config = replace(config, '\"lr\": 0.05', '\"lr\": 0.07')",
    "rows_deleted": "DELETE FROM metrics WHERE step % 3 = 0",
    "summary_metric": "UPDATE runs SET summary = replace(summary, '\"test_accuracy\": 0.', "
                      "'\"test_accuracy\": 1.')",
    "invalid_json": "UPDATE runs SET config = substr(config, 1, 20)",
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damage_is_caught_on_every_read_path_and_rebuilt_from_the_final_checkpoint(
    trained, tmp_path, damage):
    from bnlab.train import run

    source, run_id, truth = trained
    runs_dir = tmp_path / "runs"
    shutil.copytree(source, runs_dir)
    with Store(runs_dir / "bnlab.db") as store:  # a second, intact run beside it
        store.create_run("other1", {"model": "mlp"})
        store.set_status("other1", "finished", steps=1)
    _sql(runs_dir / "bnlab.db", DAMAGES[damage])
    with Store(runs_dir / "bnlab.db") as store, pytest.raises(StoreIntegrityError, match=run_id):
        store.get_run(run_id)
    for command in (["show", run_id], ["export", run_id]):
        result = runner.invoke(app, ["runs", *command, "--runs-dir", str(runs_dir)])
        assert result.exit_code == 1 and "damaged" in result.output, result.output
        assert str(runs_dir / "bnlab.db") in result.output \
            and f"bnlab runs repair {run_id}" in result.output
    listed = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs_dir)])
    assert listed.exit_code == 0
    assert any(line.startswith(run_id) and "damaged" in line for line in listed.stdout.splitlines())
    assert any(line.startswith("other1") and "finished" in line
               for line in listed.stdout.splitlines())
    # `train` of the same config: not "already finished" on the damaged record -- rebuilt, then
    # answered
    record = run(dict(CONFIG, runs_dir=str(runs_dir)), progress=False)
    assert record.status == "finished" and record.config["lr"] == 0.05
    with Store(runs_dir / "bnlab.db") as store:
        assert store.export(run_id, "csv") == truth


def test_runs_repair_rebuilds_and_without_a_final_checkpoint_names_the_way_out(trained, tmp_path):
    source, run_id, truth = trained
    runs_dir = tmp_path / "runs"
    shutil.copytree(source, runs_dir)
    _sql(runs_dir / "bnlab.db", "DROP TABLE metrics")
    repaired = runner.invoke(app, ["runs", "repair", run_id, "--runs-dir", str(runs_dir)])
    assert repaired.exit_code == 0 and f"repaired {run_id}" in repaired.output, repaired.output
    with Store(runs_dir / "bnlab.db") as store:
        assert store.export(run_id, "csv") == truth
    _sql(runs_dir / "bnlab.db", DAMAGES["flipped_value"])
    checkpoint_path(runs_dir, run_id).unlink()
    refused = runner.invoke(app, ["runs", "repair", run_id, "--runs-dir", str(runs_dir)])
    assert refused.exit_code == 1 and f"bnlab runs delete {run_id}" in refused.output
    # reachable
    deleted = runner.invoke(app, ["runs", "delete", run_id, "--runs-dir", str(runs_dir)])
    assert deleted.exit_code == 0, deleted.output


def test_a_store_that_swallows_inserts_cannot_seal_its_loss(tmp_path):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        store.log_rows("r1", [(1, "loss", 1.0)])
        store._conn.execute("CREATE TRIGGER swallow BEFORE INSERT ON metrics BEGIN SELECT "
                            "RAISE(IGNORE); END")
        kept = [(1, "loss", 1.0), (2, "loss", 0.5)]  # the trainer's rows, from memory
        with pytest.raises(StoreIntegrityError, match=r"does not keep the metric rows .* 0 of 2"):
            store.set_status("r1", "finished", rows=kept)
        assert store.get_run("r1")["status"] == "running"  # nothing sealed
    with pytest.raises(StoreVersionError, match="a trigger 'swallow' bnlab did not create"):
        Store(tmp_path / "bnlab.db")  # and such a store is refused at the next open


@pytest.mark.parametrize("alteration", ["ALTER TABLE runs RENAME COLUMN steps TO step_count",
                                        "ALTER TABLE metrics ADD COLUMN unit TEXT NOT "
                                        "NULL DEFAULT 'x'",
                                        "ALTER TABLE runs ADD COLUMN owner TEXT"])
def test_a_schema_altered_under_the_same_user_version_is_refused(tmp_path, alteration):
    Store(tmp_path / "bnlab.db").close()
    _sql(tmp_path / "bnlab.db", alteration)
    with pytest.raises(StoreVersionError,
                       match=f"schema version {SCHEMA_VERSION} but not its layout"):
        Store(tmp_path / "bnlab.db")


def test_a_damaged_page_or_index_is_refused_at_open_naming_the_file(tmp_path):
    db = tmp_path / "bnlab.db"
    with Store(db) as store:
        store.create_run("r1", {})
        store.log_rows("r1", [(s, "loss", float(s)) for s in range(3000)])  # several pages
    garble_an_index(db)
    with pytest.raises(StoreCorruptError, match=f"run store {db} is damaged"):
        Store(db)
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "damaged" in result.output and "Traceback" not in result.output


# -- finished means healthy ------------------------------------------------------------------------


def test_a_huge_final_test_loss_or_negative_variance_is_not_finished(tmp_path):
    from bnlab.callbacks import Callback
    from bnlab.train import run

    blown = run(dict(model="mlp", norm="none", data="digits", steps=1, lr=1e6,
                     runs_dir=str(tmp_path)),
                progress=False)
    assert blown.status == "diverged" and "final test loss" in blown.error

    class NegativeVariance(Callback):
        name = "negative_variance"

        def on_train_batch_end(self, loop):
            if loop.step == 3:
                next(m for m in loop.model.modules()
                     if hasattr(m, "running_var")).running_var[0] = -1.0

    broken = run(dict(CONFIG, steps=4, runs_dir=str(tmp_path)),
                 callbacks=[NegativeVariance()], progress=False)
    assert broken.status == "diverged" and "negative variance" in broken.error \
        and "running_var" in broken.error


# -- signals and resources -------------------------------------------------------------------------


def _train_process(runs_dir: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "bnlab.cli", "train", "--model", "mlp", "--data",
            "digits", "--steps", "20000", "--batch-size", "64", "--checkpoint-every", "5",
            "--runs-dir", str(runs_dir)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not list((runs_dir / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_sigterm_ends_like_one_ctrl_c_with_a_checkpoint_at_that_step_and_exit_143(tmp_path):
    proc = _train_process(tmp_path)
    proc.send_signal(signal.SIGTERM)  # what `timeout`, `kill` and schedulers send
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
    assert row["status"] == "interrupted", (row, err)
    assert f"interrupted at step {row['steps']}" in err and "SIGTERM" in err \
        and "bnlab train --model mlp" in err
    state = torch.load(checkpoint_path(tmp_path, row["id"]), weights_only=True)
    assert state["step"] == row["steps"]  # stopped at a step boundary, checkpointed there


def test_repeated_ctrl_c_cannot_cut_the_ending_short(tmp_path, monkeypatch):
    """Ctrl-C, then two more while the run records how it ended: still one clean interrupted
    ending."""
    from bnlab.callbacks import Callback
    from bnlab.train import RunInterrupted, run

    class CtrlC(Callback):
        name = "ctrl_c"

        def on_train_batch_end(self, loop):
            if loop.step == 4:
                signal.raise_signal(signal.SIGINT)

        def on_train_end(self, loop, status):
            signal.raise_signal(signal.SIGINT)  # impatient user, during the ending
            signal.raise_signal(signal.SIGINT)

    # Python's, as in a fresh process
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(RunInterrupted) as caught:
            run(dict(CONFIG, steps=40, runs_dir=str(tmp_path)), callbacks=[CtrlC()], progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert caught.value.step == 4 and caught.value.signum == signal.SIGINT
    assert "interrupted at step 4" in str(caught.value)
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
    assert row["status"] == "interrupted" and row["steps"] == 4
    assert torch.load(checkpoint_path(tmp_path, row["id"]), weights_only=True)["step"] == 4


def test_a_file_size_limit_at_a_checkpoint_is_named_as_such_and_the_previous_one_survives(
        tmp_path):
    """``ulimit -f`` is not a full disk (it was reported as "no space left" beside 69 GB free)."""
    import resource

    path = checkpoint_path(tmp_path, "r1")
    save_checkpoint(path, {"run_id": "r1", "w": torch.ones(4)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # `ulimit -f`: Python gets EFBIG, not SIGXFSZ
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, hard))
    try:
        with pytest.raises(DiskFullError) as caught:
            save_checkpoint(path, {"run_id": "r1", "w": torch.ones(100000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(caught.value)
    assert message.startswith("the file size limit of this process (ulimit -f: 20000 bytes) "
                              f"stopped writing checkpoint {path}") \
        and "unexpected pos" not in message and "no space left" not in message
    assert "Raise the limit" in message
    assert "re-run the same command to resume" in message
    assert torch.load(path, weights_only=True)["w"].shape == (4,)  # the previous checkpoint intact
    assert not list(path.parent.glob(".*.tmp"))


def test_disk_full_in_the_store_is_one_line_naming_it(tmp_path):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        store._conn.execute("PRAGMA max_page_count = 8")  # SQLite's own SQLITE_FULL
        with pytest.raises(DiskFullError,
                           match=f"no space left to write the run store {tmp_path / 'bnlab.db'}"):
            store.log_rows("r1", [(s, "a_metric_name", float(s)) for s in range(20000)])
        assert store.count_metrics("r1") == 0  # the transaction rolled back whole


def test_training_in_a_read_only_runs_dir_names_another_runs_dir(tmp_path, monkeypatch):
    from bnlab.train import run

    Store(tmp_path / "bnlab.db").close()
    monkeypatch.setattr("bnlab.store.database.writable", lambda path: False)  # root ignores chmod
    with pytest.raises(ReadOnlyStoreError,
                       match=f"runs dir {tmp_path} is read-only.*another --runs-dir"):
        run(dict(CONFIG, runs_dir=str(tmp_path)), progress=False)
    assert not list(tmp_path.glob("checkpoints/*.lock"))


def test_the_catalogues_analysis_shows_a_damaged_run_as_damaged_and_the_others_as_stored(tmp_path):
    from bnlab.experiments.runner import analysis_context

    with Store(tmp_path / "bnlab.db") as store:
        for run_id in ("good1", "bad1"):
            store.create_run(run_id, {"model": "mlp"})
            store.log_rows(run_id, [(1, "train_loss", 0.5)])
            store.set_status(run_id, "finished", steps=1,
                             summary={"metrics": {"test_accuracy": 0.9}})
        runs = [{"label": "bn", "id": "good1"}, {"label": "cbn", "id": "bad1"}]
        store.save_entry("peng-fig2", "smoke", runs, {}, tiny=True, seconds=1.0)
        store.save_entry("peng-fig2", "../../../outside", runs, {}, tiny=True, seconds=1.0)
    _sql(tmp_path / "bnlab.db", "UPDATE metrics SET value = 0.25 WHERE run_id = 'bad1'")
    with analysis_context("peng-fig2", "smoke", runs_dir=tmp_path) as ctx:
        good, bad = ctx.run("bn"), ctx.run("cbn")
        assert good.status == "finished" and good.series("train_loss") == ([1], [0.5])
        assert bad.status == "damaged" and "bad1" in bad.record["error"] \
            and bad.series("train_loss") == ([], [])
    # a stored preset names a folder: refused
    with pytest.raises(ValueError, match="unknown preset"):
        analysis_context("peng-fig2", "../../../outside", runs_dir=tmp_path)


def test_a_damaged_catalogue_entry_is_named_and_never_hides_the_runs(tmp_path):
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("good1", {"model": "mlp"})
        store.save_entry("peng-fig2", "smoke", [{"label": "bn", "id": "good1"}], {},
                         tiny=True, seconds=1.0)
    _sql(tmp_path / "bnlab.db", "UPDATE experiments SET data = '{not json'")
    with Store(tmp_path / "bnlab.db") as store:
        with pytest.raises(StoreIntegrityError,
                           match=r"catalogue entry peng-fig2 \(smoke\) .* is damaged"):
            store.load_entry("peng-fig2", "smoke")
        assert store.entry_of_runs() == {}
    listed = runner.invoke(app, ["runs", "list", "--runs-dir", str(tmp_path)])
    assert listed.exit_code == 0 and "good1" in listed.stdout


@pytest.mark.parametrize("via", ["another connection", "the store's own connection"])
@pytest.mark.parametrize("damage", ["flipped_value", "rows_deleted"])
def test_rows_verified_once_are_verified_again_after_any_change(trained, tmp_path, via, damage):
    """An open store hashes a run's metric rows once while nothing changes (a report reads runs
    shared by entries more than once), and again after any write: damage done between two reads
    of one open store is caught on the second."""
    source, run_id, _ = trained
    runs_dir = tmp_path / "runs"
    shutil.copytree(source, runs_dir)
    with Store(runs_dir / "bnlab.db") as store:
        hashed: list[str] = []
        store._conn.set_trace_callback(
            lambda sql: hashed.append(sql) if sql.startswith("SELECT step, name, value") else None)
        store.get_run(run_id)
        store.get_run(run_id)
        store.list_runs()
        assert len(hashed) == 1, hashed
        if via == "another connection":
            _sql(runs_dir / "bnlab.db", DAMAGES[damage])
        else:
            store._conn.execute(DAMAGES[damage])
        with pytest.raises(StoreIntegrityError, match="metric rows"):
            store.get_run(run_id)
        assert len(hashed) == 2
        with pytest.raises(StoreIntegrityError, match="metric rows"):  # not remembered as good
            store.get_run(run_id)
