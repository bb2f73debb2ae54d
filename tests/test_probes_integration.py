"""Probes never change training (bitwise), and they plug into bnlab.train, the run store and plain
loops."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import bnlab.norms as norms
from bnlab.callbacks import Callback, CallbackList, Loop
import bnlab.probes as probes


def mixed_model():
    """Every kind of state a probe could disturb: BN buffers, CBN/MBN moving statistics, SI-BN,
    torch BN, a noisy_bn generator, dropout (global RNG)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 8, bias=False), norms.create("bn", 8), nn.ReLU(),
        norms.ScaleInvariantBN(nn.Linear(8, 8, bias=False)), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(8, 8, bias=False), norms.create("noisy_bn", 8), nn.Tanh(),
        norms.create("cbn", 8), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Linear(8, 8, bias=False), norms.create("mbn", 8), nn.ReLU(),
        nn.Linear(8, 3),
    )
    norms.seed_layers(model, 1)
    # MBN λ > 0 and CBN AMAT η > 0: buffers matter
    norms.set_progress(model, lr=0.1, epoch=2, epochs=3)
    return model


def train(probe_list, steps=3, extra_forward=False):
    model = mixed_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(24, 6, generator=g), torch.randint(0, 3, (24,), generator=g))
               for _ in range(steps)]
    heldout = torch.randn(200, 6, generator=g)
    lab = probes.Lab(model, loss_fn, probe_list(heldout), optimizer=opt)
    torch.manual_seed(5)
    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lab.after_backward((x, y), step)
        if extra_forward:
            model(x)  # what an unguarded measurement would do
        opt.step()
        lab.after_step((x, y), step)
    generators = [layer.generator.get_state() for _, layer in norms.stochastic_layers(model)]
    return model, opt, lab, torch.get_rng_state(), generators


def every_probe(heldout):
    options = {"batch_noise": {"heldout": heldout}, "bn_regularization": {"heldout": heldout}}
    return [probes.create(name, **options.get(name, {})) for name in probes.available()]


def assert_same_training(a, b):
    model_a, opt_a, _, rng_a, gen_a = a
    model_b, opt_b, _, rng_b, gen_b = b
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for key in sd_a:
        assert torch.equal(sd_a[key], sd_b[key]), key
    for p_a, p_b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(p_a.grad, p_b.grad)
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key]["momentum_buffer"], state_b[key]["momentum_buffer"])
    assert torch.equal(rng_a, rng_b)
    assert all(torch.equal(x, y) for x, y in zip(gen_a, gen_b))
    assert [m.training for m in model_a.modules()] == [m.training for m in model_b.modules()]


def test_every_probe_leaves_training_bitwise_unchanged():
    reference = train(lambda heldout: [])
    probed = train(every_probe)
    assert_same_training(reference, probed)
    names = {n.split("/")[1] for _, n, _ in probed[2].records}
    assert names == set(probes.available())  # every probe really ran
    # The comparison is sensitive: one unguarded forward pass per step already changes the run.
    disturbed = train(lambda heldout: [], extra_forward=True)
    with pytest.raises(AssertionError):
        assert_same_training(reference, disturbed)


def test_probe_restores_eval_mode_and_all_rng_streams():
    model = mixed_model().eval()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    model.train()
    nn.CrossEntropyLoss()(model(x), y).backward()
    model.eval()
    rng = torch.get_rng_state()
    lab = probes.Lab(model, nn.CrossEntropyLoss(), ["moments", "grad_stats"], lr=0.1)
    lab.after_backward((x, y), 0)
    assert not any(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)


class MinimalLoop:
    """The smallest bnlab.callbacks.Loop: what any training loop must provide for the probes."""

    def __init__(self, model, optimizer, loss_fn):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.batch, self.loss, self.step, self.lr = None, None, 0, None
        self.logged = []

    def log(self, name, value):
        self.logged.append((self.step, name, value))


def test_probes_are_callbacks_of_the_one_protocol():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), norms.create("bn", 6),
                          nn.ReLU(), nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loop: Loop = MinimalLoop(model, opt, nn.MSELoss())
    callbacks = CallbackList(
        [probes.create("gamma", every=2), probes.create("effective_lr", every=3)])
    assert all(isinstance(cb, Callback) for cb in callbacks.callbacks)
    callbacks.call("on_train_start", loop)
    for step in range(1, 7):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        loop.batch, loop.step = (x, y), step
        opt.zero_grad()
        loop.loss = loop.loss_fn(model(x), y)
        callbacks.call("on_before_backward", loop)
        loop.loss.backward()
        callbacks.call("on_after_backward", loop)
        callbacks.call("on_before_optimizer_step", loop)
        opt.step()
        callbacks.call("on_train_batch_end", loop)
    callbacks.call("on_train_end", loop, "finished")
    steps = lambda name: sorted({s for s, n, _ in loop.logged if n == name})  # noqa: E731
    assert steps("probe/gamma/abs_mean/1") == [2, 4, 6]
    assert steps("probe/gamma/seconds") == [2, 4, 6]
    assert steps("probe/effective_lr/residual/0.weight") == [3, 6]
    assert all(name.startswith("probe/") for _, name, _ in loop.logged)


def test_a_loop_without_loss_fn_is_a_clear_error():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    loop = MinimalLoop(model, None, None)
    loop.batch, loop.step, loop.lr = (torch.zeros(2, 3), torch.zeros(2, 1)), 1, 0.1
    with pytest.raises(ValueError, match="loss_fn"):
        probes.create("grad_stats").on_before_optimizer_step(loop)


def test_lab_records_into_run_store(tmp_path):
    from bnlab.store import Store

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5, bias=False), norms.create("bn", 5), nn.Linear(5, 1))
    with Store(tmp_path / "runs.db") as store:
        store.create_run("r1", {"probe": "test"})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        calls = []
        lab = probes.Lab(model, nn.MSELoss(),
                         [probes.create("gamma"), probes.create("ics", every=2)], optimizer=opt,
                         recorder=store, run_id="r1")
        lab2 = probes.Lab(model, nn.MSELoss(), ["gamma"],
                          recorder=lambda *row: calls.append(row), lr=0.1)
        for step in range(3):
            x, y = torch.randn(8, 3), torch.randn(8, 1)
            opt.zero_grad()
            nn.MSELoss()(model(x), y).backward()
            lab.after_backward((x, y), step)
            lab2.after_backward((x, y), step)
            opt.step()
        exported = json.loads(store.export("r1", "json"))
    metrics = exported["metrics"]
    assert [s for s, _ in metrics["probe/ics/l2/2"]] == [0, 2]
    assert len(metrics["probe/gamma/abs_mean/1"]) == 3
    assert {row[1] for row in calls} >= {"probe/gamma/abs_mean/1", "probe/gamma/seconds"}
    with pytest.raises(ValueError, match="run_id"):
        probes.Lab(model, nn.MSELoss(), [], recorder=store)


def test_bnlab_train_runs_probes_by_name(tmp_path):
    train_mod = pytest.importorskip("bnlab.train")
    if not hasattr(train_mod, "run"):
        pytest.skip("bnlab.train.run not available")
    from bnlab.store import Store

    config = {"model": "mlp", "model_options": {"depth": 2, "width": 8}, "norm": "bn",
              "data": "gaussian_regression", "data_options": {"n": 64}, "steps": 4,
              "batch_size": 16, "lr": 0.01, "probes": ["landscape", "gamma"], "probe_every": 2,
              "runs_dir": str(tmp_path)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = train_mod.run(config, progress=False)
    with Store(tmp_path / "bnlab.db") as store:
        metrics = json.loads(store.export(record.id, "json"))["metrics"]
    assert [s for s, _ in metrics["probe/landscape/beta_smoothness"]] == [2, 4]
    assert metrics["probe/landscape/batched"][0][1] == 1.0
    assert "probe/gamma/seconds" in metrics
