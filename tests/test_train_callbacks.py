"""The Callback protocol: hook order and arguments, state saved in checkpoints keyed by name and
restored on resume, probes reported through on_probe, the end status."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bnlab.train import Callback, run
from bnlab.train.callbacks import CallbackList, callback_names
from bnlab.train.checkpoint import checkpoint_path


def mlp(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16), nn.ReLU(), nn.Linear(16, classes))


CONFIG = dict(model="cb_mlp", data="digits", steps=6, lr=0.05, batch_size=128, seed=2, log_every=2,
              checkpoint_every=4)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_train_start(self, trainer):
        assert trainer.optimizer is not None and trainer.model is not None and trainer.run_id
        self.calls.append(("start", trainer.step))

    def on_step_end(self, trainer, step, metrics):
        assert trainer.step == step and torch.is_tensor(metrics["loss"]) and metrics["lr"] == trainer.config.lr
        self.calls.append(("step", step))

    def on_log(self, trainer, step, metrics):
        self.calls.append(("log", step, tuple(sorted(metrics))))

    def on_epoch_end(self, trainer, epoch):
        self.calls.append(("epoch", epoch))

    def on_train_end(self, trainer, status):
        self.calls.append(("end", status, trainer.step))


def test_hooks_in_order_with_logged_metrics(tmp_path):
    rec = Recorder()
    record = run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=mlp, callbacks=[rec], progress=False)
    assert record.status == "finished"
    assert rec.calls[0] == ("start", 0) and rec.calls[-1] == ("end", "finished", 6)
    assert [c[1] for c in rec.calls if c[0] == "step"] == [1, 2, 3, 4, 5, 6]
    logs: dict[int, set] = {}
    for c in rec.calls:
        if c[0] == "log":  # (the final evaluation of the last step arrives in a call of its own)
            logs.setdefault(c[1], set()).update(c[2])
    assert sorted(logs) == [1, 2, 4, 6]  # log_every 2, and step 1
    assert all({"train_loss", "train_accuracy"} <= set(names) for names in logs.values())
    assert {"test_loss", "test_accuracy"} <= set(logs[6])  # the final evaluation
    # 1438 digits at batch 128: 12 steps per epoch, so the only epoch end is the last step
    assert [c for c in rec.calls if c[0] == "epoch"] == [("epoch", 1)]


class Counter(Callback):
    """Counts steps; its count must survive a crash and resume through the checkpoint."""

    def __init__(self, name=None):
        self.count = 0
        self.seen_at_start = None
        if name:
            self.name = name

    @property
    def name(self):
        return getattr(self, "_name", "Counter")

    @name.setter
    def name(self, value):
        self._name = value

    def on_train_start(self, trainer):
        self.seen_at_start = self.count

    def on_step_end(self, trainer, step, metrics):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


class Crash(Callback):
    def on_step_end(self, trainer, step, metrics):
        if step == 5:
            raise RuntimeError("crash")


def test_state_is_saved_by_name_and_restored_on_resume(tmp_path):
    cfg = dict(CONFIG, runs_dir=str(tmp_path))
    first, second = Counter(), Counter()
    with pytest.raises(RuntimeError, match="crash"):
        run(cfg, model_factory=mlp, callbacks=[first, second, Crash()], progress=False)
    state = torch.load(checkpoint_path(tmp_path, _only_run(tmp_path)), weights_only=True)
    assert state["step"] == 4 and state["callbacks"]["Counter"] == {"count": 4}
    assert state["callbacks"]["Counter#2"] == {"count": 4} and state["callbacks"]["Crash"] == {}
    a, b = Counter(), Counter()
    b.count = 100  # restored from the checkpoint's "Counter#2", whatever it held before
    record = run(cfg, model_factory=mlp, callbacks=[a, b], progress=False)
    assert record.resumed_from == 4 and (a.seen_at_start, b.seen_at_start) == (4, 4)
    assert (a.count, b.count) == (6, 6)


def _only_run(tmp_path):
    from bnlab.store import Store

    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
    return row["id"]


def test_names_default_to_the_class_and_repeat_with_a_suffix():
    class Plain:  # duck-typed, no name attribute
        pass

    assert callback_names([Counter(), Counter("mine"), Counter(), Plain(), Recorder()]) == [
        "Counter", "mine", "Counter#2", "Plain", "Recorder"]


def test_on_probe_gets_each_probe_values(tmp_path):
    seen = []

    class Probes(Callback):
        def on_probe(self, trainer, step, name, values):
            seen.append((step, name, sorted(values)))

    run(dict(CONFIG, probes=["grad_stats"], probe_every=3, runs_dir=str(tmp_path)), model_factory=mlp,
        callbacks=[Probes()], progress=False)
    assert [(s, n) for s, n, _ in seen] == [(3, "grad_stats"), (6, "grad_stats")]
    assert all(names and all(k.startswith("probe/grad_stats/") for k in names) for _, _, names in seen)


def test_failed_run_ends_with_status_failed(tmp_path):
    rec = Recorder()
    with pytest.raises(RuntimeError):
        run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=mlp, callbacks=[rec, Crash()], progress=False)
    assert rec.calls[-1] == ("end", "failed", 5)


def test_callback_list_skips_callbacks_without_a_hook():
    class OnlyEnd:
        def __init__(self):
            self.ended = None

        def on_train_end(self, trainer, status):
            self.ended = status

    cb = OnlyEnd()
    hooks = CallbackList([cb, object()])
    assert not hooks.has("on_step_end") and hooks.has("on_train_end")
    hooks.call("on_train_end", None, "finished")
    assert cb.ended == "finished"
