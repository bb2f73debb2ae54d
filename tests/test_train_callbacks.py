"""The one callback protocol (bnlab.callbacks) under bnlab train: hook order and arguments, state
saved in checkpoints keyed by name and restored on resume, probe values through on_log, the end
status, and a clear error for objects of the removed StepContext protocol."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bnlab.callbacks import Callback, CallbackList, Loop, callback_names
from bnlab.train import run
from bnlab.train.callbacks import TrainLoop, trainer_of
from bnlab.store.run_files import checkpoint_path


def mlp(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16), nn.ReLU(),
                         nn.Linear(16, classes))


CONFIG = dict(model="cb_mlp", data="digits", steps=6, lr=0.05, batch_size=128, seed=2, log_every=2,
              checkpoint_every=4)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_train_start(self, loop: Loop):
        assert loop.optimizer is not None and loop.model is not None and trainer_of(loop).run_id
        self.calls.append(("start", loop.step))

    def on_before_backward(self, loop: Loop):
        assert loop.loss is not None and loop.loss.requires_grad  # not yet backpropagated
        assert all(p.grad is None for p in loop.model.parameters())  # zeroed (set to None) before
        self.calls.append(("before_backward", loop.step))

    def on_after_backward(self, loop: Loop):
        assert all(p.grad is not None for p in loop.model.parameters())
        self.calls.append(("after_backward", loop.step))

    def on_before_optimizer_step(self, loop: Loop):
        # the update has not happened: the trainer has taken step - 1 steps
        assert trainer_of(loop).step == loop.step - 1
        self.calls.append(("before_optimizer_step", loop.step))

    def on_train_batch_end(self, loop: Loop):
        trainer = trainer_of(loop)
        assert trainer.step == loop.step
        assert torch.is_tensor(loop.loss) and not loop.loss.requires_grad
        assert loop.lr == trainer.config.lr and loop.batch is not None and len(loop.batch) == 2
        self.calls.append(("step", loop.step))

    def on_log(self, loop: Loop, step, metrics):
        self.calls.append(("log", step, tuple(sorted(metrics))))

    def on_train_epoch_end(self, loop: Loop, epoch):
        self.calls.append(("epoch", epoch))

    def on_train_end(self, loop: Loop, status):
        self.calls.append(("end", status, loop.step))


def test_hooks_in_order_with_logged_metrics(tmp_path):
    rec = Recorder()
    record = run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=mlp, callbacks=[rec],
                 progress=False)
    assert record.status == "finished"
    assert rec.calls[0] == ("start", 0) and rec.calls[-1] == ("end", "finished", 6)
    assert [c[1] for c in rec.calls if c[0] == "step"] == [1, 2, 3, 4, 5, 6]
    order = [c[0] for c in rec.calls if c[1] == 3 and c[0] != "log"]
    assert order == ["before_backward", "after_backward", "before_optimizer_step", "step"]
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

    def on_train_start(self, loop):
        self.seen_at_start = self.count

    def on_train_batch_end(self, loop):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


class Crash(Callback):
    def on_train_batch_end(self, loop):
        if loop.step == 5:
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
    class Plain(Callback):  # no name of its own
        pass

    assert callback_names([Counter(), Counter("mine"), Counter(), Plain(), Recorder()]) == [
        "Counter", "mine", "Counter#2", "Plain", "Recorder"]


def test_on_log_gets_each_probe_values_at_its_step(tmp_path):
    seen = []

    class Probes(Callback):
        def on_log(self, loop, step, metrics):
            names = sorted(k for k in metrics if k.startswith("probe/"))
            if names:
                seen.append((step, names))

    run(dict(CONFIG, probes=["grad_stats"], probe_every=3, runs_dir=str(tmp_path)),
        model_factory=mlp,
        callbacks=[Probes()], progress=False)
    assert [s for s, _ in seen] == [3, 6]
    assert all("probe/grad_stats/seconds" in names for _, names in seen)
    assert all(all(k.startswith("probe/grad_stats/") for k in names) for _, names in seen)


def test_the_removed_step_context_protocol_is_a_clear_error(tmp_path):
    class Old:  # the earlier duck-typed protocol
        def after_backward(self, ctx):
            pass

    replaced = r"after_backward\(ctx\) -> on_before_optimizer_step\(loop\)"
    with pytest.raises(TypeError, match=replaced):
        run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=mlp, callbacks=[Old()],
            progress=False)
    with pytest.raises(TypeError, match="must subclass bnlab.callbacks.Callback"):
        CallbackList([object()])


def test_failed_run_ends_with_status_failed(tmp_path):
    rec = Recorder()
    with pytest.raises(RuntimeError):
        run(dict(CONFIG, runs_dir=str(tmp_path)), model_factory=mlp, callbacks=[rec, Crash()],
            progress=False)
    assert rec.calls[-1] == ("end", "failed", 5)


def test_callback_list_skips_callbacks_without_a_hook():
    class OnlyEnd(Callback):
        def __init__(self):
            self.ended = None

        def on_train_end(self, loop, status):
            self.ended = status

    cb = OnlyEnd()
    hooks = CallbackList([cb, Callback()])
    assert not hooks.has("on_train_batch_end") and hooks.has("on_train_end")
    assert hooks._hooks["on_train_end"] == [cb.on_train_end]  # the base class's no-op is not called
    hooks.call("on_train_end", None, "finished")
    assert cb.ended == "finished"


def test_trainer_of_refuses_another_loop():
    from bnlab.probes import Lab

    lab = Lab(nn.Linear(2, 1), nn.MSELoss())
    with pytest.raises(TypeError, match="needs a bnlab train run"):
        trainer_of(lab)
    assert not isinstance(lab, TrainLoop)


def test_lab_runs_any_callback_through_the_same_hooks():
    from bnlab.probes import Lab

    class Mark(Callback):
        def __init__(self):
            self.calls = []

        def on_train_start(self, loop):
            self.calls.append(("start", loop.step))

        def on_after_backward(self, loop):
            self.calls.append(("after_backward", loop.step))

        def on_before_optimizer_step(self, loop):
            loop.log("grad_sq", sum(float((p.grad**2).sum()) for p in loop.model.parameters()))
            self.calls.append(("before_optimizer_step", loop.step))

        def on_train_batch_end(self, loop):
            self.calls.append(("batch_end", loop.step))

        def on_log(self, loop, step, metrics):
            self.calls.append(("log", step, sorted(metrics)))

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mark = Mark()
    lab = Lab(model, nn.MSELoss(), [mark], optimizer=opt)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    for step in (1, 2):
        opt.zero_grad()
        nn.MSELoss()(model(x), y).backward()
        expected = sum(float((p.grad**2).sum()) for p in model.parameters())
        assert lab.after_backward((x, y), step) == {"grad_sq": expected}
        opt.step()
        assert lab.after_step((x, y), step) == {}
    assert mark.calls[:5] == [("start", 1), ("after_backward", 1), ("before_optimizer_step", 1),
                              ("log", 1, ["grad_sq"]), ("batch_end", 1)]
    assert [s for s, n, _ in lab.records] == [1, 2]


def test_step_context_is_gone_from_the_public_api():
    import bnlab.train

    assert not hasattr(bnlab.train, "StepContext") and "StepContext" not in bnlab.train.__all__
    assert bnlab.train.Callback is Callback
