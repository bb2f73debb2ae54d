"""The `hessian` probe against a brute-force Hessian of a small train-mode BN network (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bnlab.norms as norms
import bnlab.probes as probes


def bn_net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, bias=False), norms.create("bn", 4), nn.Tanh(),
                          nn.Linear(4, 4, bias=False), norms.create("bn", 4),
                          nn.Tanh(), nn.Linear(4, 2))
    return model.double().train()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, generator=g, dtype=torch.float64), \
        torch.randint(0, 2, (16,), generator=g)


def brute_force_hessian(model, x, y):
    """∇²L by torch.autograd.functional.hessian on the flattened parameters, BN in train mode."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(flat):
        params, i = {}, 0
        for name, shape in zip(names, shapes):
            params[name] = flat[i:i + shape.numel()].view(shape)
            i += shape.numel()
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    with norms.plain_autograd():
        return torch.autograd.functional.hessian(loss, flat0)


def probe_values(model, x, y, lr=0.1, momentum=0.0, **options):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    lab = probes.Lab(model, nn.CrossEntropyLoss(),
                     [probes.create("hessian", **options)], optimizer=opt)
    return {name.split("/")[-1]: v for name, v in lab.after_backward((x, y), 0).items()}


def test_top_eigenvalue_and_trace_match_brute_force_hessian():
    model = bn_net()
    x, y = batch()
    hessian = brute_force_hessian(model, x, y)
    spectrum = torch.linalg.eigvalsh(hessian)
    dim = hessian.shape[0]
    # Lanczos over the whole space: the spectrum
    exact = probe_values(model, x, y, iters=dim, samples=2)
    assert exact["top_eigenvalue"] == pytest.approx(float(spectrum[-1]), rel=1e-8)
    assert exact["bottom_eigenvalue"] == pytest.approx(float(spectrum[0]), rel=1e-6, abs=1e-8)
    # 15 products: top eigenvalue already converged
    few = probe_values(model, x, y, iters=15, samples=400)
    assert few["top_eigenvalue"] == pytest.approx(float(spectrum[-1]), rel=1e-3)
    # Ritz values bound it from below
    assert few["top_eigenvalue"] <= float(spectrum[-1]) * (1 + 1e-9)
    trace = float(hessian.diagonal().sum())
    assert abs(few["trace"] - trace) < 4 * few["trace_se"]  # Hutchinson is unbiased
    assert few["trace_se"] < 0.1 * abs(trace)
    assert few["threshold"] == pytest.approx(2 / 0.1)
    assert probe_values(model, x, y, momentum=0.9, iters=2,
                        samples=0)["threshold"] == pytest.approx(3.8 / 0.1)


def test_hessian_is_the_train_mode_one_not_eval_mode():
    """With running statistics (eval mode, PyHessian's setting) the curvature differs: the probe
    must not use it."""
    model = bn_net()
    x, y = batch()
    train_top = float(torch.linalg.eigvalsh(brute_force_hessian(model, x, y))[-1])
    model.eval()
    eval_top = float(torch.linalg.eigvalsh(brute_force_hessian(model, x, y))[-1])
    model.eval()  # the probe switches to train mode itself and restores eval mode afterwards
    got = probe_values(model, x, y, iters=40, samples=0)["top_eigenvalue"]
    assert got == pytest.approx(train_top, rel=1e-8)
    assert abs(eval_top - train_top) > 0.05 * abs(train_top)
    assert not any(m.training for m in model.modules())


def test_seeded_and_checks_options():
    model = bn_net()
    x, y = batch()
    a = probe_values(model, x, y, iters=3, samples=3, seed=4)
    b = probe_values(model, x, y, iters=3, samples=3, seed=4)
    assert a["trace"] == b["trace"] and a["top_eigenvalue"] == b["top_eigenvalue"]
    with pytest.raises(ValueError, match="iters must be an integer >= 1"):
        probes.create("hessian", iters=0)


def test_runs_on_bnlab_fused_conv_bn_which_refuses_double_backward_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 64, 3, padding=1, bias=False),
                          norms.create("mean_only_bn", 64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(64, 3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 2, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    loss = nn.functional.cross_entropy(model(x), y)  # ≥ 65k elements: the fused kernel
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    values = probe_values(model, x, y, iters=5, samples=2)
    assert values["top_eigenvalue"] > 0 and values["trace"] == values["trace"]


def test_probe_spec_in_a_training_run(tmp_path):
    from bnlab.store import Store
    from bnlab.train import run

    record = run(dict(model="mlp", model_options={"depth": 2, "width": 8}, data="digits", steps=5,
                      batch_size=32, lr=0.05, probes=["hessian(iters=4, samples=2, every=2)"],
                      runs_dir=str(tmp_path)),
                 progress=False)
    with Store(tmp_path / "bnlab.db") as store:
        series = store.metrics(record.id)
    assert {s for s, _ in series["probe/hessian/top_eigenvalue"]} == {2, 4}
    assert all(v == pytest.approx(2 / 0.05) for _, v in series["probe/hessian/threshold"])
