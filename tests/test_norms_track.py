"""track(): progress (lr, epoch) reaches CBN's AMAT and MBN's λ automatically, exactly as by
hand."""

import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N

EPOCHS, STEPS, BATCH = 3, 4, 8


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), N.create("cbn", 6), nn.Tanh(), nn.Linear(6, 6),
                         N.create("mbn", 6), nn.Tanh(), nn.Linear(6, 2))


def batches():
    g = gen(1)
    return [(torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 2, generator=g))
            for _ in range(STEPS)]


def train(progress: str, per_step_schedule: bool):
    """progress: 'manual' (set_progress before every forward), 'track', 'track_steps' or 'none'."""
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = (torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s)) if per_step_schedule
             else torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    tracker = None
    if progress == "track":
        tracker = N.track(model, opt, epochs=EPOCHS)
    elif progress == "track_steps":
        tracker = N.track(model, opt, epochs=EPOCHS, steps_per_epoch=STEPS)
    for epoch in range(EPOCHS):
        for x, y in batches():
            if progress == "manual":
                N.set_progress(model, lr=opt.param_groups[0]["lr"], epoch=epoch + 1, epochs=EPOCHS)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if per_step_schedule:
                sched.step()
        if not per_step_schedule:
            sched.step()
        if progress == "track":
            tracker.epoch_end()
    return model, tracker


@pytest.mark.parametrize("per_step_schedule", [False, True])
@pytest.mark.parametrize("progress", ["track", "track_steps"])
def test_track_equals_set_progress_by_hand(progress, per_step_schedule):
    expected, _ = train("manual", per_step_schedule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, tracker = train(progress, per_step_schedule)
    # cbn/mbn were told: nothing to warn about
    assert not [w for w in caught if "progress" in str(w.message)]
    assert tracker.epoch == 1 + EPOCHS and tracker.steps == EPOCHS * STEPS
    for (name, a), b in zip(expected.state_dict().items(), got.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert got[1].lr == pytest.approx(expected[1].lr) and got[4].epoch == EPOCHS


def test_progress_changes_training_so_the_comparison_means_something():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        untold, _ = train("none", per_step_schedule=False)
    told, _ = train("manual", per_step_schedule=False)
    assert not torch.equal(untold[1].amat_mean, told[1].amat_mean)  # AMAT's η > 0 only with an lr
    assert not torch.equal(untold[4].train_var, told[4].train_var)  # MBN's λ > 0 only with an epoch


def test_remove_eval_and_state_dict():
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tracker = N.track(model, opt, epochs=EPOCHS)
    model.eval()
    model(torch.randn(2, 5, generator=gen(2)))
    assert model[1].lr is None  # eval passes do not need, and do not get, progress
    model.train()
    model(torch.randn(4, 5, generator=gen(3)))
    assert model[1].lr == 0.05 and model[4].epoch == 1 and model[4].epochs == EPOCHS
    tracker.epoch_end()
    state = tracker.state_dict()
    tracker.remove()
    opt.param_groups[0]["lr"] = 0.01
    model(torch.randn(4, 5, generator=gen(4)))
    assert model[1].lr == 0.05 and model[4].epoch == 1  # hooks gone
    resumed = N.track(model, opt, epochs=EPOCHS)
    resumed.load_state_dict(state)
    model(torch.randn(4, 5, generator=gen(5)))
    assert model[1].lr == 0.01 and model[4].epoch == 2


def test_track_rejects_bad_arguments():
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        N.track(model, opt, epochs=0)
    with pytest.raises(ValueError, match="group=1 but the optimizer has 1 param group"):
        N.track(model, opt, epochs=2, group=1)
    tracker = N.track(model, opt, epochs=2, steps_per_epoch=3)
    with pytest.raises(RuntimeError, match="steps_per_epoch"):
        tracker.epoch_end()


def test_track_under_torch_compile_keeps_one_graph_and_matches_eager():
    """The hook's epoch/step counters must not become dynamo guards (a recompile every epoch)."""
    import torch._dynamo as dynamo

    def train(compiled: bool) -> tuple[torch.Tensor, int]:
        dynamo.reset()
        dynamo.utils.counters.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), N.create("cbn(rho=2, amat=true)", 8),
                              nn.Linear(8, 2), N.create("mbn", 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        N.track(model, opt, epochs=6, steps_per_epoch=2)
        forward = torch.compile(model, backend="aot_eager") if compiled else model
        gen = torch.Generator().manual_seed(1)
        for _ in range(10):
            opt.zero_grad()
            forward(torch.randn(16, 8, generator=gen)).square().mean().backward()
            opt.step()
        graphs = dynamo.utils.counters["stats"].get("unique_graphs", 0)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), graphs

    eager, _ = train(False)
    compiled, graphs = train(True)
    assert graphs == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
