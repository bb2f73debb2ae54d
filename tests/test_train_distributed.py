"""Data-parallel training (bnlab.train.distributed): a 2-process CPU run (gloo) equals the 1-process
run with the same global batch, and a run killed mid-way resumes from rank 0's checkpoint.

One launch is killed at step 5 (rank 0 exits hard after the step-4 checkpoint); ``bnlab train
--nproc 2`` then resumes it. The resumed run's whole loss curve, from the store that rank 0 alone
wrote, must equal the one-process curve (1e-5): that checks the split batch, the gradient of the
gathered loss, synchronized norms, rank 0's checkpoint reaching rank 1, and the replay after resume.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch.distributed as dist
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.store import Store
from bnlab.train import distributed, launcher, run
from bnlab.train.callbacks import Callback
from bnlab.train.config import TrainConfig

runner = CliRunner()
BASE = {"model": "mlp", "norm": "bn", "data": "digits", "steps": 8, "batch_size": 75, "lr": 0.1,
        "log_every": 1, "checkpoint_every": 2, "seed": 3}
TOL = 1e-5


class KillRankZeroAt(Callback):
    """Rank 0 exits like a killed process (no cleanup, no status update) at the end of a step."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, loop):
        step = loop.step
        if step == self.step and dist.get_rank() == 0:
            os._exit(17)


def _losses(runs_dir, run_id) -> list[tuple[int, float]]:
    with Store(runs_dir / "bnlab.db") as store:
        return store.metrics(run_id)["train_loss"]


def test_two_processes_equal_one_and_a_killed_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over loopback only
    config = {**BASE, "runs_dir": str(tmp_path)}
    one = run(config, progress=False)
    assert one.status == "finished"

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Exception, match="(?i)fail"):  # torch's ChildFailedError names the exit code
        launcher.launch(TrainConfig.from_dict({**config, "nproc": 2}),
                        callbacks=[KillRankZeroAt(5)], progress=False)
    # the elastic agent's signal handlers must not outlive the launch (a later Ctrl-C raised its
    # SignalException in unrelated code)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    with Store(tmp_path / "bnlab.db") as store:
        killed = [r for r in store.list_runs() if r["config"].get("nproc") == 2]
    assert len(killed) == 1 and killed[0]["status"] == "running"  # died without a word

    args = ["train", "--model", "mlp", "--norm", "bn", "--data", "digits", "--steps", "8",
            "--batch-size", "75", "--lr", "0.1", "--log-every", "1", "--checkpoint-every", "2",
            "--seed", "3", "--runs-dir", str(tmp_path), "--nproc", "2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["id"] == killed[0]["id"] and record["status"] == "finished" \
        and record["resumed_from"] == 4

    one_curve, two_curve = _losses(tmp_path, one.id), _losses(tmp_path, record["id"])
    assert [s for s, _ in two_curve] == [s for s, _ in one_curve] == list(range(1, 9))
    assert max(abs(a - b) for (_, a), (_, b) in zip(one_curve, two_curve)) < TOL
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert abs(record["metrics"][key] - one.metrics[key]) < TOL, key


@pytest.mark.parametrize(("values", "message"), [
    ({"nproc": 0}, "nproc must be a positive integer"),
    ({"sync_norms": False}, "needs nproc > 1"),
    ({"nproc": 2, "probes": ["grad_norm"]}, "probes run in one process"),
])
def test_data_parallel_config_errors(values, message):
    from bnlab.train.config import validate_static

    with pytest.raises(ValueError, match=message):
        validate_static(TrainConfig.from_dict({**BASE, **values}))


def test_split_sizes_cover_the_batch_in_rank_order():
    assert distributed.split_sizes(75, 2) == [38, 37]
    assert distributed.split_sizes(7, 3) == [3, 2, 2]
    assert distributed.split_sizes(2, 3) == [1, 1, 0]
    assert all(sum(distributed.split_sizes(n, w)) == n for n in range(20) for w in range(1, 5))


def test_torchrun_world_size_must_match_nproc(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    assert launcher._with_world_size(TrainConfig.from_dict(BASE)).nproc == 4
    with pytest.raises(ValueError, match="WORLD_SIZE 4"):
        launcher._with_world_size(TrainConfig.from_dict({**BASE, "nproc": 2}))


def test_reproduce_nproc_reaches_every_run_without_probes(tmp_path):
    from bnlab.experiments.runner import _prepare_config

    assert _prepare_config(dict(BASE), tmp_path, False, 2)["nproc"] == 2
    assert "nproc" not in _prepare_config({**BASE, "probes": ["grad_norm"]}, tmp_path, False, 2)
    # an arm's own nproc wins
    assert _prepare_config({**BASE, "nproc": 3}, tmp_path, False, 2)["nproc"] == 3
    assert "nproc" not in _prepare_config(dict(BASE), tmp_path, False, None)
