"""The edges a practitioner hits (an independent reliability sweep): signals during set-up, a full
disk during a row flush, a file size limit, a refused option's name, noise on channels_last input
and callbacks that still define a removed hook."""

from __future__ import annotations

import os
import signal
import sqlite3

import pytest
import torch
from typer.testing import CliRunner

import bnlab.norms as N
import bnlab.train.loop as loop
from bnlab.callbacks import REMOVED_HOOKS, Callback
from bnlab.cli import app
from bnlab.store import Store
from bnlab.store.run_files import DiskFullError
from bnlab.train import run
from bnlab.train.interrupt import InterruptedBeforeTraining
from bnlab.train.loop import RunInterrupted

CONFIG = dict(model="mlp", data="digits", steps=4, lr=0.05, batch_size=200, seed=3, log_every=1,
              checkpoint_every=2)


def _signalling_prepare(monkeypatch, *signals: int) -> None:
    """prepare() (data, model, optimizer: seconds in a real run) receiving ``signals``."""
    original = loop.prepare

    def prepare(*args, **kwargs):
        for signum in signals:
            os.kill(os.getpid(), signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "prepare", prepare)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_set_up_stops_the_run_before_its_first_step_stored(tmp_path, monkeypatch,
                                                                           signum):
    """Before: the first ≈2 s of a run (building the optimizer) had no handler: no run record, no
    message, a torch traceback on a second Ctrl-C."""
    _signalling_prepare(monkeypatch, signum)
    with pytest.raises(RunInterrupted) as caught:
        run(dict(CONFIG, runs_dir=str(tmp_path)), progress=False)
    assert caught.value.step == 0 and caught.value.signum == signum
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
    assert row["status"] == "interrupted" and row["steps"] == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_second_signal_during_set_up_is_one_line_and_exit_130(tmp_path, monkeypatch):
    _signalling_prepare(monkeypatch, signal.SIGINT, signal.SIGINT)
    with pytest.raises(InterruptedBeforeTraining, match="during set-up.*nothing to resume"):
        run(dict(CONFIG, runs_dir=str(tmp_path)), progress=False)
    result = CliRunner().invoke(app, ["train", "--model", "mlp", "--data", "digits", "--steps",
                                      "2", "--runs-dir", str(tmp_path / "cli")])
    assert result.exit_code == 130, result.output
    assert "interrupted during set-up (SIGINT)" in result.output
    assert "Traceback" not in result.output


class _FullOnCheckpoint:
    """A connection whose WAL checkpoint (the rows' flush into the database file) finds no
    space."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql, *args):
        if "wal_checkpoint" in sql:
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_a_full_disk_during_the_row_flush_names_the_file_and_the_way_out(tmp_path):
    """Before: ``error: run failed: OperationalError: database or disk is full``."""
    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        store.log_rows("r1", [(1, "loss", 1.0)])
        real, store._conn = store._conn, _FullOnCheckpoint(store._conn)
        try:
            with pytest.raises(DiskFullError) as caught:
                store.sync_rows("r1", 1)
        finally:
            store._conn = real
    message = str(caught.value)
    assert str(tmp_path / "bnlab.db") in message and "re-run the same command" in message


def test_a_file_size_limit_in_the_store_is_not_called_no_space_left(tmp_path):
    import resource

    with Store(tmp_path / "bnlab.db") as store:
        store.create_run("r1", {})
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))  # Python ignores SIGXFSZ
        try:
            with pytest.raises(DiskFullError) as caught:
                store.log_rows("r1", [(s, "a_metric_name", float(s)) for s in range(20000)])
                store.sync_rows("r1", 20000)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(caught.value)
    assert "no space left" not in message and "ulimit -f: 200000 bytes" in message
    assert "the disk is not full" in message and str(tmp_path / "bnlab.db") in message


def test_a_deeply_nested_model_option_is_refused_naming_the_option(tmp_path):
    deep = "[" * 50_000 + "]" * 50_000
    result = CliRunner().invoke(app, ["train", "--model", "mlp", "--data", "digits",
                                      "--runs-dir", str(tmp_path), "--model-option",
                                      f"width={deep}"])
    assert result.exit_code == 2
    assert "--model-option width: value nested more than" in result.output


@pytest.mark.parametrize("shape", [(8, 4, 5, 5), (64, 4, 16, 16)], ids=["plain", "fused"])
def test_noisy_bn_draws_the_same_noise_on_channels_last_and_contiguous_input(shape):
    """Before: the noise followed memory order (max output difference 1.37)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    outputs, draws = [], []
    for layout in (torch.contiguous_format, torch.channels_last):
        layer = N.create("noisy_bn", 4)
        layer.reseed(7)
        a = x.to(memory_format=layout)
        draws.append(layer.draw_noise(a))
        layer.reseed(7)
        outputs.append(layer(a))
    for first, second in zip(*draws):
        assert torch.equal(first, second)
    assert outputs[1].is_contiguous(memory_format=torch.channels_last)  # the layout is kept
    torch.testing.assert_close(outputs[0], outputs[1])  # BN's kernel rounds per layout


@pytest.mark.parametrize("hook", sorted(REMOVED_HOOKS))
def test_a_callback_defining_a_removed_hook_is_refused_at_construction(hook):
    """Before: accepted, never called, and the run reported ``finished``."""
    Old = type("Old", (Callback,), {hook: lambda self, ctx: None})
    with pytest.raises(TypeError, match=f"Old defines {hook}.*rename {hook} -> "
                                        f"{REMOVED_HOOKS[hook]}"):
        Old()


def test_a_callback_with_current_hooks_and_its_own_init_constructs():
    class Current(Callback):
        def __init__(self, k):
            self.k = k

        def on_train_batch_end(self, loop):
            pass

    assert Current(3).k == 3
