"""Eval paths that match training and torch's BatchNorm options.

Every layer trains a small digits MLP briefly; its eval-mode accuracy on held-out digits must be
close to its train-mode accuracy (batch statistics) on the same digits.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

import bnlab.norms as N

EVAL_SPECS = ["bn", "native_bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn(p=1)",
              "lp_bn(p=2)", "lp_bn(p=inf)", "mbn(ideal_batch=64)", "cbn(rho=2)",
              "cbn(eta=0.9, rho=2)", "cbn(center=false)", "cbn(decouple=false)", "brn", "si_bn",
              "wn"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    perm = torch.randperm(len(y), generator=gen(0))
    return x[perm[:1400]], y[perm[:1400]], x[perm[1400:]], y[perm[1400:]]


def mlp(spec: str) -> nn.Module:
    torch.manual_seed(0)
    if spec in ("si_bn", "wn"):
        hidden = N.normalized(nn.Linear(64, 32, bias=False), spec)
    else:
        hidden = nn.Sequential(nn.Linear(64, 32), N.create(spec, 32))
    return nn.Sequential(hidden, nn.Sigmoid(), nn.Linear(32, 10))


def accuracy(model, x, y, batch=32):
    with torch.no_grad():
        return float(torch.cat([model(x[i:i + batch]).argmax(1)
                                for i in range(0, len(y), batch)]).eq(y).float().mean())


@pytest.mark.parametrize("spec", EVAL_SPECS)
def test_eval_accuracy_is_close_to_train_mode_accuracy(spec, digits):
    xtr, ytr, xte, yte = digits
    model = mlp(spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    # AMAT η = 0.9, MBN λ > 0: moving statistics matter
    N.set_progress(model, lr=0.01, epoch=3, epochs=4)
    g = gen(1)
    for _ in range(150):
        idx = torch.randint(0, len(ytr), (32,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
    batch_stats = accuracy(copy.deepcopy(model).train(), xte, yte)  # a copy: its buffers may move
    eval_mode = accuracy(model.eval(), xte, yte)
    assert batch_stats > 0.8, spec
    assert abs(eval_mode - batch_stats) < 0.04, (spec, eval_mode, batch_stats)


def test_brn_running_sigma_is_an_ema_of_sigma_b_ioffe_2017():
    layer = N.create("brn(momentum=0.5)", 2).double()
    sigma = torch.ones(2, dtype=torch.float64) * (1 + layer.eps) ** 0.5
    for seed in range(3):
        x = torch.randn(10, 2, generator=gen(seed), dtype=torch.float64) * (seed + 1)
        layer(x)
        # Algorithm 1
        sigma = sigma + 0.5 * (torch.sqrt(x.var(0, unbiased=False) + layer.eps) - sigma)
    torch.testing.assert_close(torch.sqrt(layer.running_var + layer.eps), sigma)


def test_brn_warm_up_relaxes_r_max_and_d_max():
    layer = N.create("brn(r_max=3, d_max=5, relax_from=2, r_max_at=6, d_max_at=4)", 1)
    seen = []
    for step in range(8):
        r_max, d_max = layer.limits()
        seen.append((float(r_max), float(d_max)))
        layer(torch.randn(4, 1, generator=gen(step)) * 5 + 3)
    assert seen[:3] == [(1.0, 0.0)] * 3
    assert seen[4] == (2.0, 5.0) and seen[6] == (3.0, 5.0) and seen[7] == (3.0, 5.0)
    # before the relaxation: plain BN in the forward pass (r = 1, d = 0)
    fresh = N.create("brn(relax_from=2, r_max_at=6)", 1)
    x = torch.randn(8, 1, generator=gen(9)) * 4 + 2
    torch.testing.assert_close(fresh(x), nn.functional.batch_norm(x, None, None, training=True))


@pytest.mark.parametrize("p", ["1", "inf"])
def test_lp_bn_eval_divides_by_its_running_lp_scale(p):
    """Eval divides by the average of the batch ℓp scales training divided by (momentum=None: the
    cumulative mean), not by BN's running std — on heavy-tailed activations (x³) they differ by
    2×."""
    layer = N.create(f"lp_bn(p={p}, momentum=none, affine=false)", 3)
    scales, means = [], []
    for seed in range(20):
        x = torch.randn(64, 3, generator=gen(seed)).pow(3)
        layer(x)
        means.append(x.mean(0))
        scales.append(layer.batch_scale(x - x.mean(0)))
    mean_scale, mean_mean = torch.stack(scales).mean(0), torch.stack(means).mean(0)
    x = torch.randn(16, 3, generator=gen(99)).pow(3)
    want = (x - mean_mean) / (mean_scale + layer.eps)
    torch.testing.assert_close(layer.eval()(x), want, rtol=1e-4, atol=1e-5)


def test_cbn_eval_uses_the_amat_statistics_it_trained_with():
    """Eval must reproduce the training normalization (AMAT's moving second moment of x' = x − μ_A +
    β, biased, as training divides by it), not BN's running (unbiased) variance + β²: with batches
    of 4 the two differ by √(4/3)."""
    layer = N.create("cbn(eta=0.98, rho=2)", 3)
    for seed in range(400):
        layer(torch.randn(4, 3, generator=gen(seed)) * torch.tensor([1.0, 3.0, 0.3]) + 2)
    x = torch.randn(4, 3, generator=gen(999)) * torch.tensor([1.0, 3.0, 0.3]) + 2
    want = layer(x)
    torch.testing.assert_close(layer.eval()(x), want, atol=0.05, rtol=0.05)
    second = layer.running_var + layer.bias.detach() ** 2
    torch.testing.assert_close(second, layer.amat_var, rtol=0.05, atol=0.01)


@pytest.mark.parametrize(
    "spec", ["bn", "mean_only_bn", "var_only_bn", "lp_bn", "mbn", "cbn", "brn", "noisy_bn"])
def test_torch_options_have_torchs_semantics(spec):
    x = [torch.randn(16, 3, generator=gen(s)) * 2 + 1 for s in range(3)]
    # track_running_stats=False: no buffers, batch statistics in eval
    layer = N.create(f"{spec}(track_running_stats=false, affine=false)", 3)
    assert layer.running_mean is None and layer.weight is None
    for xi in x:
        layer(xi)
    out = layer.eval()(x[0])
    if spec in ("bn", "cbn", "brn", "mbn"):
        torch.testing.assert_close(out, nn.functional.batch_norm(x[0], None, None, training=True)
                                   / (1 if spec != "cbn" else 1))
    assert not torch.allclose(layer(x[0][:4]), out[:4])  # depends on the batch
    # momentum=None: cumulative average, as torch
    if spec in ("bn", "mean_only_bn", "var_only_bn"):
        ours, ref = N.create(f"{spec}(momentum=none)", 3), nn.BatchNorm1d(3, momentum=None)
        for xi in x:
            ours(xi), ref(xi)
        torch.testing.assert_close(ours.running_mean, ref.running_mean)


def test_moving_statistic_layers_warn_once_without_progress():
    for spec, hint in (("cbn", "lr"), ("mbn", "epoch")):
        layer = N.create(spec, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for seed in range(3):
                layer(torch.randn(8, 3, generator=gen(seed)))
        messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert len(messages) == 1 and "set_progress" in messages[0] \
            and "bnlab.norms.track" in messages[0]
        assert hint in messages[0]
        quiet = N.create(spec, 3)
        N.set_progress(quiet, lr=0.1, epoch=1, epochs=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet(torch.randn(8, 3, generator=gen(5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # nothing to set: no warning
        N.create("cbn(amat=false)", 3)(torch.randn(8, 3, generator=gen(6)))
