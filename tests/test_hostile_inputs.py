"""Hostile inputs: ids that climb out of the runs dir, numbers that are not numbers,
nesting that exhausts the stack, databases and checkpoints that are not what they claim. Each is
refused with one clear message, and nothing outside its root is read, written or deleted."""

from __future__ import annotations

import math
import os
import sqlite3

import pytest
import torch
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.store.run_files import UnsafePathError, check_run_id, checkpoint_path, lock_path
from bnlab.store import SCHEMA_VERSION, Store, StoreCorruptError, StoreVersionError
from bnlab.train.checkpoint import CheckpointCorruptError, load_checkpoint, save_checkpoint

runner = CliRunner()
TRAVERSAL = "../../victim"


@pytest.fixture
def hostile_store(tmp_path):
    """A runs dir whose store holds a run id that climbs out of it, and victim files where that id
    points."""
    runs_dir = tmp_path / "lab" / "runs"
    with Store(runs_dir / "bnlab.db") as store:
        store.create_run("good1", {"model": "mlp"})
    # written behind bnlab's back: create_run refuses it
    conn = sqlite3.connect(runs_dir / "bnlab.db")
    conn.execute("INSERT INTO runs(id, config, config_hash, status, created, updated) "
                  "VALUES (?, '{}', 'h', 'finished', 1, 1)", (TRAVERSAL,))
    conn.execute("INSERT INTO metrics VALUES (?, 1, 'train_loss', 0.5)", (TRAVERSAL,))
    conn.commit()
    conn.close()
    # where checkpoints/../../victim.* would land: <tmp>/lab/victim.*
    victims = [tmp_path / "lab" / f"victim{suffix}" for suffix in (".pt", ".prev.pt", ".lock")]
    for victim in victims:
        victim.write_text("someone else's file")
    return runs_dir, victims


@pytest.mark.parametrize("command", [
    ["runs", "delete", TRAVERSAL], ["runs", "show", TRAVERSAL], ["runs", "export", TRAVERSAL],
    ["runs", "repair", TRAVERSAL], ["runs", "plot", TRAVERSAL, "--metric", "train_loss"],
])
def test_every_command_taking_a_run_id_refuses_traversal(hostile_store, command, tmp_path):
    runs_dir, victims = hostile_store
    extra = ["-o", str(tmp_path / "x.png")] if command[1] == "plot" else []
    result = runner.invoke(app, [*command, *extra, "--runs-dir", str(runs_dir)])
    assert result.exit_code != 0, result.output
    assert "invalid run id" in result.output or "damaged" in result.output, result.output
    assert "Traceback" not in result.output
    assert all(v.read_text() == "someone else's file" for v in victims)  # nothing outside touched
    with Store(runs_dir / "bnlab.db") as store:  # and the store still holds both runs
        assert {r["id"] for r in store.list_runs()} == {"good1", TRAVERSAL}


def test_runs_list_shows_the_bad_id_as_damaged_and_the_others_as_they_are(hostile_store):
    runs_dir, _ = hostile_store
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith("good1") and ("running" in line or "stopped" in line)
               for line in lines)
    assert any(line.startswith(TRAVERSAL) and "damaged" in line for line in lines)
    assert "not a valid run id" in result.stderr


@pytest.mark.parametrize(
    "bad", [TRAVERSAL, "/etc/passwd", "a/b", "..", ".hidden", "x" * 200, "a\x00b", "", "a*"])
def test_ids_are_validated_at_creation_and_every_use(tmp_path, bad):
    with pytest.raises(UnsafePathError, match="invalid run id"):
        check_run_id(bad)
    for use in (checkpoint_path, lock_path):
        with pytest.raises(UnsafePathError):
            use(tmp_path, bad)
    with Store(tmp_path / "bnlab.db") as store, pytest.raises(UnsafePathError):
        store.create_run(bad, {})


def test_load_model_and_a_symlinked_checkpoint_cannot_reach_outside(tmp_path):
    from bnlab.train import load_model

    with pytest.raises(UnsafePathError):
        load_model(TRAVERSAL, tmp_path)
    outside = tmp_path / "outside.pt"
    save_checkpoint(outside, {"run_id": "r1", "w": torch.ones(2)})
    link = checkpoint_path(tmp_path, "r1")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    with pytest.raises(UnsafePathError, match="outside"):
        checkpoint_path(tmp_path, "r1")


# -- numbers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["bn(eps=inf)", "bn(eps=1e400)", f"bn(eps={'1' * 100_000})",
                                  "cbn(rho=inf)", "bn(eps=nan)", "bn(momentum=-inf)"])
def test_non_finite_spec_numbers_are_refused_from_the_spec_the_cli_and_yaml(spec, tmp_path):
    from bnlab.norms import validate
    from bnlab.train.config import TrainConfig, load_config_file, validate_static

    with pytest.raises(ValueError, match="finite|>= |> 0"):
        validate(spec)
    with pytest.raises(ValueError, match="bad norm spec"):
        validate_static(TrainConfig(norm=spec, steps=1))
    config = tmp_path / "run.yaml"
    config.write_text(f"norm: '{spec}'\nsteps: 1\n")
    with pytest.raises(ValueError, match="bad norm spec"):
        validate_static(TrainConfig.from_dict(load_config_file(config)))


@pytest.mark.parametrize("key, value", [("lr", ".inf"), ("lr", "1e400"), ("momentum", ".nan"),
                                        ("divergence_factor", ".inf"), ("seed", str(2**64))])
def test_non_finite_or_out_of_range_config_numbers_from_yaml_are_refused(tmp_path, key, value):
    from bnlab.train.config import TrainConfig, load_config_file, validate_static

    config = tmp_path / "run.yaml"
    config.write_text(f"{key}: {value}\nsteps: 1\n")
    with pytest.raises(ValueError, match=key):
        validate_static(TrainConfig.from_dict(load_config_file(config)))


def test_nesting_50000_deep_is_one_clear_error_not_a_recursion_error(tmp_path):
    from bnlab.spec import read_pairs
    from bnlab.train.config import load_config_file

    deep = "[" * 50_000 + "]" * 50_000
    with pytest.raises(ValueError, match="nested more than"):
        read_pairs([f"width={deep}"], "--model-option")
    config = tmp_path / "deep.yaml"
    config.write_text(f"model_options: {{width: {deep}}}\n")
    with pytest.raises(ValueError, match="deep"):
        load_config_file(config)
    digits = tmp_path / "digits.yaml"
    digits.write_text(f"seed: {'9' * 100_000}\n")
    with pytest.raises(ValueError, match="digits.yaml"):
        load_config_file(digits)


# -- files that are not what they claim ------------------------------------------------------------


def test_a_foreign_database_is_refused_and_left_unchanged(tmp_path):
    foreign = tmp_path / "bnlab.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE invoices (number INTEGER, total REAL)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    for readonly in (None, True):
        with pytest.raises(StoreVersionError,
                           match=f"{foreign} is not a bnlab run store.*invoices"):
            Store(foreign, readonly=readonly)
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not a bnlab run store" in result.output
    assert foreign.read_bytes() == before  # no table added to it


def test_an_empty_database_file_is_refused_not_taken_for_a_new_store(tmp_path):
    empty = tmp_path / "bnlab.db"
    empty.touch()
    with pytest.raises(StoreCorruptError, match=r"empty \(0-byte\) file"):
        Store(empty)
    assert empty.stat().st_size == 0
    with Store(tmp_path / "new" / "bnlab.db") as store:  # a new store is created complete
        assert store.list_runs() == []
    assert sqlite3.connect(tmp_path / "new" / "bnlab.db").execute(
        "PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_checkpoint_downgraded_to_format_1_with_its_checksum_is_refused(tmp_path):
    path = checkpoint_path(tmp_path, "r1")
    save_checkpoint(path, {"run_id": "r1", "model": {"w": torch.ones(4)}})
    state = torch.load(path, weights_only=True)
    state["format"] = 1
    # altered weights that format 1 would load unverified
    state["model"]["w"] = torch.full((4,), 7.0)
    torch.save(state, path)
    with pytest.raises(CheckpointCorruptError, match="says format 1 .* carries a checksum"):
        load_checkpoint(path)
    del state["checksum"]  # a genuine format-1 checkpoint still loads, with its warning
    torch.save(state, path)
    with pytest.warns(UserWarning, match="without a checksum"):
        assert math.isclose(float(load_checkpoint(path)["model"]["w"][0]), 7.0)


def test_a_lock_file_that_cannot_be_opened_is_one_line_naming_it(tmp_path):
    from bnlab.store.run_files import RunDirError, RunLock

    path = lock_path(tmp_path, "r1")
    # not a file: neither writable nor readable as one (root ignores chmod)
    path.mkdir(parents=True)
    with pytest.raises(RunDirError, match=f"cannot open the run's lock file {path}"):
        with RunLock(path):
            pass
    assert os.path.isdir(path)


def test_a_decompression_bomb_image_is_refused_naming_the_file(tmp_path, monkeypatch):
    from PIL import Image

    from bnlab.data.imagefolder import decode

    path = tmp_path / "bomb.png"
    Image.new("RGB", (64, 64)).save(path)
    # 64 x 64 is then > 2x the limit: PIL's bomb error
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ValueError, match=f"cannot decode {path}: .*decompression bomb"):
        decode(path, 32, 32)
