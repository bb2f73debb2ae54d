"""`bnlab runs list|show|export|delete|plot` on a store written directly (no training needed)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.store import Store
from bnlab.train.checkpoint import save_checkpoint
from bnlab.store.run_files import checkpoint_path

runner = CliRunner()
LONG_NORM = "cbn(decouple=false, rho=2)"


@pytest.fixture
def runs_dir(tmp_path):
    """Three finished runs (two of a catalogue entry), one running, with series and checkpoints."""
    with Store(tmp_path / "bnlab.db") as store:
        specs = [("aaa111", LONG_NORM, 0, "relu"), ("bbb222", "bn", 1, "sigmoid"),
                 ("ccc333", "bn", 0, None)]
        for run_id, norm, seed, act in specs:
            config = {"model": "mlp", "norm": norm, "seed": seed, "activation": act,
                      "data": "digits", "lr": 0.1, "model_options": {"width": 32}}
            store.create_run(run_id, config)
            store.log_rows(run_id, [(s, "train_loss", 2.0 / s + seed) for s in range(1, 6)])
            store.log_rows(run_id, [(5, "probe/grad_norm/layer0", 0.5)])
            store.set_status(run_id, "finished", steps=5,
                             summary={"metrics": {"test_accuracy": 0.9}})
            save_checkpoint(checkpoint_path(tmp_path, run_id),
                            {"run_id": run_id, "w": torch.ones(3)})
        store.create_run("ddd444", {"model": "mlp", "norm": "bn", "seed": 2})
        # still training
        store.log_rows("ddd444", [(1, "train_loss", 1.0), (40, "train_loss", 0.5)])
        store.save_entry("peng-fig2", "smoke",
                         [{"label": "cbn", "id": "aaa111"}, {"label": "bn", "id": "bbb222"}], {},
                         tiny=False, seconds=1.0)
    return tmp_path


def _invoke(*args):
    return runner.invoke(app, [*args])


def test_list_shows_full_specs_entry_date_and_live_steps(runs_dir):
    result = _invoke("runs", "list", "--runs-dir", str(runs_dir))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header == ["id", "status", "steps", "date", "model", "norm", "activation", "seed",
                      "data", "lr", "nproc", "test_acc", "train_loss", "entry"]
    row = next(line for line in lines if line.startswith("aaa111"))
    assert LONG_NORM in row and "relu" in row and "peng-fig2/smoke:cbn" in row
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", row)
    dead = next(line for line in lines if line.startswith("ddd444"))
    assert re.search(r"stopped\s+40\b", dead)  # recorded running, but no process holds its lock
    from bnlab.store.run_files import RunLock, lock_path

    # a process training it: running, with its progress
    with RunLock(lock_path(runs_dir, "ddd444")):
        live = _invoke("runs", "list", "--runs-dir", str(runs_dir), "--status",
                       "running").stdout.splitlines()
    assert len(live) == 2 and re.search(r"^ddd444\s+running\s+40\b", live[1])
    # activation unset
    assert "default" in next(line for line in lines if line.startswith("ccc333"))


def test_list_where_filters_and_json(runs_dir):
    def ids(*where):
        args = [x for w in where for x in ("--where", w)]
        result = _invoke("runs", "list", "--runs-dir", str(runs_dir), "--json", *args)
        assert result.exit_code == 0, result.output
        return sorted(item["id"] for item in json.loads(result.stdout))

    assert ids("norm=bn") == ["bbb222", "ccc333", "ddd444"]
    assert ids("norm=cbn*") == ["aaa111"]
    assert ids("seed=0", "status=finished") == ["aaa111", "ccc333"]
    assert ids("lr=0.1", "activation=sigmoid") == ["bbb222"]
    assert ids("model_options.width=32", "entry=peng-fig2*") == ["aaa111", "bbb222"]
    doc = json.loads(_invoke("runs", "list", "--runs-dir", str(runs_dir), "--json").stdout)
    first = next(d for d in doc if d["id"] == "aaa111")
    assert first["norm"] == LONG_NORM and first["entry"] == "peng-fig2/smoke:cbn" \
        and first["config"]["seed"] == 0
    bad = _invoke("runs", "list", "--runs-dir", str(runs_dir), "--where", "colour=red")
    assert bad.exit_code == 2 and "unknown --where key 'colour'; valid keys:" in bad.output \
        and "norm" in bad.output


def test_delete_removes_runs_and_checkpoints(runs_dir):
    result = _invoke("runs", "delete", "aaa", "bbb222", "--runs-dir", str(runs_dir))
    assert result.exit_code == 0, result.output
    assert "deleted aaa111: 6 metric rows, 1 checkpoint files" in result.stdout
    with Store(runs_dir / "bnlab.db") as store:
        assert sorted(r["id"] for r in store.list_runs()) == ["ccc333", "ddd444"]
    assert not checkpoint_path(runs_dir, "aaa111").exists() \
        and checkpoint_path(runs_dir, "ccc333").exists()
    missing = _invoke("runs", "delete", "zzz", "--runs-dir", str(runs_dir))
    assert missing.exit_code == 2 and "no run 'zzz'" in missing.output


def test_plot_overlays_runs_as_png_and_svg(runs_dir, tmp_path):
    svg = tmp_path / "loss.svg"
    result = _invoke("runs", "plot", "aaa111", "bbb222", "--metric", "train_loss", "--out",
                     str(svg), "--runs-dir", str(runs_dir))
    assert result.exit_code == 0, result.output
    text = svg.read_text()
    assert "aaa111" in text and "bbb222" in text  # one legend entry per run
    png = tmp_path / "probe.png"
    result = _invoke("runs", "plot", "ccc", "--metric", "probe/grad_norm/layer0", "-o", str(png),
                     "--runs-dir", str(runs_dir))
    assert result.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = _invoke("runs", "plot", "aaa111", "--metric", "nope", "--out", str(png),
                      "--runs-dir", str(runs_dir))
    assert missing.exit_code == 2 \
        and "has no series 'nope'; it has: probe/grad_norm/layer0, train_loss" in missing.output
    bad = _invoke("runs", "plot", "aaa111", "--metric", "train_loss", "--out", "x.gif",
                  "--runs-dir", str(runs_dir))
    assert bad.exit_code == 2 and "valid image formats: .png, .svg" in bad.output


def test_read_only_runs_dir_lists_shows_exports_and_plots(runs_dir, tmp_path, monkeypatch):
    from bnlab.store import database as store_mod

    before = {p.name: p.read_bytes() for p in runs_dir.iterdir() if p.is_file()}
    # as root chmod blocks nothing, so stand in for an unwritable folder at the permission check
    monkeypatch.setattr(store_mod, "writable", lambda p: False)
    assert _invoke("runs", "list", "--runs-dir", str(runs_dir)).exit_code == 0
    assert _invoke("runs", "show", "aaa111", "--runs-dir", str(runs_dir)).exit_code == 0
    exported = _invoke("runs", "export", "aaa111", "--runs-dir", str(runs_dir))
    assert exported.exit_code == 0 and "aaa111,5,train_loss," in exported.stdout
    out = runs_dir.parent / f"{runs_dir.name}-ro.png"  # outside the read-only folder
    assert _invoke("runs", "plot", "aaa111", "--metric", "train_loss", "-o", str(out),
                   "--runs-dir", str(runs_dir)).exit_code == 0
    refused = _invoke("runs", "delete", "aaa111", "--runs-dir", str(runs_dir))
    assert refused.exit_code == 2 and "read-only" in refused.output
    assert {p.name: p.read_bytes() for p in runs_dir.iterdir() if p.is_file()} == before


def test_a_store_of_a_newer_bnlab_is_a_clear_error(runs_dir):
    import sqlite3

    conn = sqlite3.connect(runs_dir / "bnlab.db")
    conn.execute("PRAGMA user_version=7")
    conn.commit()
    conn.close()
    result = _invoke("runs", "list", "--runs-dir", str(runs_dir))
    assert result.exit_code == 2 \
        and "schema version 7, newer than this bnlab reads" in result.output


def test_list_shows_how_many_processes_shared_each_batch(runs_dir):
    """A --nproc 2 run and a one-process run no longer look identical."""
    with Store(runs_dir / "bnlab.db") as store:
        store.create_run(
            "eee555", {"model": "mlp", "norm": "bn", "seed": 0, "nproc": 2, "sync_norms": True})
    result = _invoke("runs", "list", "--runs-dir", str(runs_dir))
    header = result.stdout.splitlines()[0].split()
    column = header.index("nproc")
    cells = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    # the date column holds a space: count from the right, where every later column is one word
    offset = len(header) - column
    assert cells["eee555"][-offset] == "2" and cells["aaa111"][-offset] == "1"
    shown = json.loads(
        _invoke("runs", "list", "--runs-dir", str(runs_dir), "--json", "--where", "nproc=2").stdout)
    assert [r["id"] for r in shown] == ["eee555"]
