"""A run's identity: config, model architecture, training-changing callbacks, bnlab version; what
re-running says (resumed / stored), and --force."""

from __future__ import annotations

import json

import pytest
from torch import nn
from typer.testing import CliRunner

import bnlab
from bnlab.cli import app
from bnlab.store import Store
from bnlab.train import Callback, run
from bnlab.store.run_files import checkpoint_path

runner = CliRunner()
CONFIG = dict(model="mine", data="digits", steps=4, lr=0.05, batch_size=64, seed=3, log_every=1,
              checkpoint_every=2)


def small(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16), nn.ReLU(),
                         nn.Linear(16, classes))


def big(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 32), nn.ReLU(),
                         nn.Linear(32, classes))


def small_tanh(shape, classes):  # same shapes as `small`, another activation module
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16), nn.Tanh(),
                         nn.Linear(16, classes))


def small_leaky(slope):
    def build(shape, classes):  # same modules and shapes; a hyper-parameter differs
        return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16),
                             nn.LeakyReLU(slope), nn.Linear(16, classes))
    return build


def _cfg(tmp_path, **kw):
    return dict(CONFIG, runs_dir=str(tmp_path), **kw)


def test_another_model_factory_is_another_run(tmp_path):
    a = run(_cfg(tmp_path), model_factory=small, progress=False)
    b = run(_cfg(tmp_path), model_factory=big, progress=False)
    c = run(_cfg(tmp_path), model_factory=small_tanh, progress=False)
    d = run(_cfg(tmp_path), model_factory=small_leaky(0.1), progress=False)
    e = run(_cfg(tmp_path), model_factory=small_leaky(0.2), progress=False)
    assert len({a.id, b.id, c.id, d.id, e.id}) == 5
    assert all(r.origin == "trained" for r in (a, b, c, d, e))
    assert b.metrics != a.metrics  # trained, not answered from the store
    with Store(tmp_path / "bnlab.db") as store:
        assert len(store.list_runs()) == 5


class Clip(Callback):
    """Changes what the run computes (clips gradients): it must enter the run id."""

    changes_training = True

    def __init__(self, limit):
        self.limit = limit

    def state_dict(self):
        return {"limit": self.limit}


class Watch(Callback):
    """Only looks: it must not change the run id."""


def test_training_changing_callbacks_and_version_enter_the_id(tmp_path, monkeypatch):
    plain = run(_cfg(tmp_path), model_factory=small, progress=False)
    watched = run(_cfg(tmp_path), model_factory=small, callbacks=[Watch()], progress=False)
    assert watched.id == plain.id and watched.origin == "stored"
    clipped = run(_cfg(tmp_path), model_factory=small, callbacks=[Clip(1.0)], progress=False)
    clipped2 = run(_cfg(tmp_path), model_factory=small, callbacks=[Clip(2.0)], progress=False)
    assert len({plain.id, clipped.id, clipped2.id}) == 3
    monkeypatch.setattr(bnlab, "__version__", "999.0")
    newer = run(_cfg(tmp_path), model_factory=small, progress=False)
    assert newer.id != plain.id and newer.origin == "trained"


def test_rerun_says_stored_or_resuming(tmp_path, capsys):
    class Boom(Callback):
        def on_train_batch_end(self, loop):
            step = loop.step
            if step == 3:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(_cfg(tmp_path), model_factory=small, callbacks=[Boom()], progress=False)
    capsys.readouterr()
    resumed = run(_cfg(tmp_path), model_factory=small, progress="lines")
    err = capsys.readouterr().err
    assert resumed.origin == "resumed" and resumed.resumed_from == 2
    assert f"resuming {resumed.id} from step 2 of 4" in err
    again = run(_cfg(tmp_path), model_factory=small, progress="lines")
    err = capsys.readouterr().err
    assert again.origin == "stored" and again.metrics == resumed.metrics
    assert f"{again.id} already finished — stored result; --force to retrain" in err
    assert again.message in err


def test_force_deletes_and_retrains(tmp_path):
    steps = []

    class Count(Callback):
        def on_train_batch_end(self, loop):
            step = loop.step
            steps.append(step)

    first = run(_cfg(tmp_path), model_factory=small, callbacks=[Count()], progress=False)
    stored = run(_cfg(tmp_path), model_factory=small, callbacks=[Count()], progress=False)
    assert steps == [1, 2, 3, 4] and stored.origin == "stored"
    forced = run(_cfg(tmp_path), model_factory=small, callbacks=[Count()],
                 progress=False, force=True)
    assert steps == [1, 2, 3, 4, 1, 2, 3, 4] and forced.origin == "trained" \
        and forced.id == first.id
    assert forced.metrics == first.metrics  # same seed, same result
    with Store(tmp_path / "bnlab.db") as store:
        losses = store.metrics(first.id, "train_loss")["train_loss"]
    assert [s for s, _ in losses] == [1, 2, 3, 4]  # the old rows went with the old record


@pytest.mark.parametrize("extra", [[], ["--force"]])
def test_cli_force(tmp_path, extra):
    args = ["train", "--model", "mlp", "--data", "digits", "--steps", "2", "--runs-dir",
            str(tmp_path), "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, args + extra)
    assert second.exit_code == 0, second.output
    record = json.loads(second.stdout.strip().splitlines()[-1])
    assert record["origin"] == ("trained" if extra else "stored")
    if not extra:
        assert "already finished — stored result; --force to retrain" in second.stderr
    assert checkpoint_path(tmp_path, record["id"]).exists()
