"""Divergence as data: non-finite buffers (BN running statistics) and a loss far above its start
count as diverged, with the step and the loss recorded; and the engine syncs with the host only at
its checks, not every step."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bnlab.store import Store
from bnlab.train import Callback, run
from bnlab.train.config import DIVERGENCE_FACTOR


def bn_mlp(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16, bias=False),
                         nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, classes))


CONFIG = dict(model="bn_mlp", data="digits", steps=8, lr=0.05, batch_size=64, seed=1, log_every=1)


class Poison(Callback):
    """Test-only: after step ``at``, break a BN running variance (overflow), as lr 50 does."""

    changes_training = True

    def __init__(self, at):
        self.at = at

    def state_dict(self):
        return {"at": self.at}

    def on_train_batch_end(self, loop):
        step = loop.step
        if step == self.at:
            loop.model[2].running_var[3] = math.inf


def test_non_finite_running_statistics_diverge(tmp_path):
    record = run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=bn_mlp,
                 callbacks=[Poison(3)], progress=False)
    assert record.status == "diverged", record
    # log_every 1: checked every step
    assert record.metrics["diverged_step"] == 3 and record.steps == 3
    assert "2.running_var" in record.error
    assert math.isfinite(record.metrics["diverged_loss"])  # the loss itself was fine


class Spike(Callback):
    """Test-only: scale the output layer by ``k`` after step ``at`` and back after the next step, so
    one step's loss is ~k times larger (cross-entropy grows linearly in the logits) and the run then
    recovers (the issue's 'loss 1e21 that comes back')."""

    changes_training = True

    def __init__(self, at, k=1e8):
        self.at, self.k = at, k

    def state_dict(self):
        return {"at": self.at, "k": self.k}

    def on_train_batch_end(self, loop):
        step = loop.step
        if step in (self.at, self.at + 1):
            with torch.no_grad():
                loop.model[-1].weight.mul_(self.k if step == self.at else 1 / self.k)
                loop.model[-1].bias.mul_(self.k if step == self.at else 1 / self.k)


def test_loss_far_above_its_start_diverges_and_records_step_and_loss(tmp_path):
    record = run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=bn_mlp,
                 callbacks=[Spike(4)], progress=False)
    assert record.status == "diverged"
    assert record.metrics["diverged_step"] == 5  # the step after the scaling sees the huge loss
    with Store(tmp_path / "bnlab.db") as store:
        losses = dict(store.metrics(record.id, "train_loss")["train_loss"])
        row = store.get_run(record.id)
    assert record.metrics["diverged_loss"] == pytest.approx(losses[5])
    assert losses[5] > DIVERGENCE_FACTOR * losses[1] and math.isfinite(losses[5])
    assert row["status"] == "diverged" and "divergence_factor" in row["error"]
    with Store(tmp_path / "bnlab.db") as store:
        assert [v for _, v in store.metrics(record.id, "diverged_step")["diverged_step"]] == [5]


@pytest.mark.parametrize("factor", [None, 1e12])
def test_divergence_factor_is_configurable(tmp_path, factor):
    record = run(dict(CONFIG, runs_dir=str(tmp_path), divergence_factor=factor),
                 model_factory=bn_mlp, callbacks=[Spike(4)], progress=False)
    assert record.status == "finished" and record.steps == 8  # spiked, came back, not diverged


def test_divergence_factor_must_exceed_one(tmp_path):
    with pytest.raises(ValueError, match="divergence_factor must be > 1"):
        run(dict(CONFIG, runs_dir=str(tmp_path), divergence_factor=0.5),
            model_factory=bn_mlp, progress=False)
    assert not (tmp_path / "bnlab.db").exists()


def test_bn_with_a_huge_learning_rate_is_diverged_not_finished(tmp_path):
    """The issue's case: mlp + bn at lr 50 on digits overflowed the running variances to inf while
    loss and parameters stayed finite, and the run was stored 'finished' with test loss NaN."""
    record = run(dict(model="mlp", norm="bn", data="digits", epochs=1, lr=50.0,
                      runs_dir=str(tmp_path)),
                 progress=False)
    assert record.status == "diverged", (record.status, record.metrics)


def test_no_host_sync_per_step(tmp_path, monkeypatch):
    """Reads of device values (tolist/item/float/int/bool of a tensor) happen at the checks
    (every log_every steps) and at the end, not every step."""
    counts = {"n": 0}
    for name in ("tolist", "item", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            counts["n"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    steps = {}

    class Mark(Callback):
        def on_train_batch_end(self, loop):
            step = loop.step
            steps[step] = counts["n"]

    run(dict(CONFIG, steps=60, log_every=20, eval_every=1000, runs_dir=str(tmp_path)),
        model_factory=bn_mlp, callbacks=[Mark()], progress=False)
    # steps 3..60: three checks (20, 40, 60)... the 60th after on_train_batch_end
    reads = steps[60] - steps[2]
    assert reads <= 2 * 6, reads  # at most a few reads per check, never ~1 per step
