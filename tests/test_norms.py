"""Tests of bnlab.norms: each checks a formula against an independent computation."""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch
import torch.nn as nn
from torch.func import functional_call

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.registry import REGISTRY


@pytest.fixture(params=["fused", "plain"])
def path(request, monkeypatch):
    """Run a test through the fused kernel (forced even on tiny tensors) and through plain
    autograd."""
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0 if request.param == "fused" else 1 << 62)
    return request.param


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)

# every registered per-channel layer (a new one is tested without editing this list), plus variants
CHANNEL_SPECS = [name for name, info in REGISTRY.items()
                 if info.kind == "channel" and name != "none"] + [
    "lp_bn(p=1)", "lp_bn(p=inf)", "cbn(decouple=false, rho=2)", "cbn(center=false)"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def pure(layer: nn.Module):
    """f(x, weight, bias) that restores buffers and noise before every call (gradcheck calls it
    often)."""
    buffers = {k: v.clone() for k, v in layer.named_buffers()}
    seed = getattr(layer, "_seed", None)

    def f(x, w, b):
        if seed is not None:
            layer.reseed(seed)
        state = {"weight": w, "bias": b, **{k: v.clone() for k, v in buffers.items()}}
        return functional_call(layer, state, (x,))

    return f


# ---- gradients -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [s for s in CHANNEL_SPECS if s not in ("brn", "cbn")])
def test_gradcheck_training_mode(spec, path):
    layer = N.create(spec, 3).double().train()
    if spec == "mbn":  # λ > 0 so the moving statistics enter the forward pass
        N.set_progress(layer, epoch=3, epochs=5)
        layer.train_mean.copy_(torch.tensor([0.3, -0.2, 0.1]))
        layer.train_var.copy_(torch.tensor([1.5, 0.7, 2.0]))
        assert layer.current_lambda(6) > 0.1
    x = randn(6, 3, 2, 2, seed=1).requires_grad_()
    w = (1 + 0.1 * randn(3, seed=2)).requires_grad_()
    b = (0.1 * randn(3, seed=3)).requires_grad_()
    assert torch.autograd.gradcheck(pure(layer), (x, w, b), eps=1e-6, atol=1e-5)


def _cbn_reference(x, w, b, mean_a, second_a, rho, eps):
    """Eqs. 4-5 with moving statistics whose forward value is (mean_a, second_a) and whose gradient
    flows through the batch statistics: the stop-gradient constants are computed at the evaluation
    point and then held fixed, so finite differences of this function are the intended gradient."""
    dims = [0, 2, 3]
    with torch.no_grad():
        c_mean = mean_a - x.mean(dims)
        xp0 = x - x.mean(dims, keepdim=True) - c_mean.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)
        k = torch.sqrt(second_a + eps) / torch.sqrt(xp0.pow(2).mean(dims) + eps)

    def f(x, w, b):
        xp = x - x.mean(dims, keepdim=True) - c_mean.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)
        std_b = torch.sqrt(xp.pow(2).mean(dims) + eps)
        return (w / rho).view(1, -1, 1, 1) * xp / (std_b * k).view(1, -1, 1, 1)

    return f


def test_cbn_amat_gradient_flows_through_batch_statistics(path):
    layer = N.create("cbn(rho=2, omega=10)", 3).double().train()
    x0 = randn(8, 3, 2, 2, seed=4)
    layer(x0)  # first batch initializes the moving statistics
    N.set_progress(layer, lr=0.05)  # η = 1 − 10·0.05 = 0.5
    assert layer.current_eta() == pytest.approx(0.5)
    x = (randn(8, 3, 2, 2, seed=5) + 0.5).requires_grad_()
    w = (1 + 0.1 * randn(3, seed=6)).requires_grad_()
    b = (0.2 * randn(3, seed=7)).requires_grad_()
    old_mean, old_second = layer.amat_mean.clone(), layer.amat_var.clone()
    y = functional_call(layer, {"weight": w, "bias": b}, (x,))
    # expected moving values after folding in this batch
    mean_b = x.detach().mean([0, 2, 3])
    mean_a = 0.5 * old_mean + 0.5 * mean_b
    xp = x.detach() - mean_a.view(1, -1, 1, 1) + b.detach().view(1, -1, 1, 1)
    second_a = 0.5 * old_second + 0.5 * xp.pow(2).mean([0, 2, 3])
    ref = _cbn_reference(x.detach(), w.detach(), b.detach(), mean_a, second_a, 2.0, layer.eps)
    expected = (w.detach() / 2).view(1, -1, 1, 1) * xp / torch.sqrt(
        second_a + layer.eps).view(1, -1, 1, 1)
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(layer.amat_mean, mean_a)
    torch.testing.assert_close(layer.amat_var, second_a)
    g = randn(*y.shape, seed=8)
    got = torch.autograd.grad(y, (x, w, b), g)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    want = torch.autograd.grad(ref(xr, wr, br), (xr, wr, br), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-8)
    assert torch.autograd.gradcheck(ref, (xr, wr, br), eps=1e-6, atol=1e-5)


def test_cbn_with_eta_zero_is_decoupled_normalization_eq_4_5():
    x = randn(16, 4, 3, 3, seed=9) * 2 + 1
    for spec, lr in [("cbn(rho=3, amat=false)", None), ("cbn(rho=3)", 0.2)]:  # ω·lr ≥ 1 → η = 0
        layer = N.create(spec, 4).double()
        with torch.no_grad():
            layer.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.5]))
            layer.bias.copy_(torch.tensor([0.3, -0.4, 0.0, 1.0]))
        for _ in range(3):
            N.set_progress(layer, lr=lr)
            y = layer(x)
        b = layer.bias.detach().view(1, -1, 1, 1)
        xp = x - x.mean([0, 2, 3], keepdim=True) + b
        sigma = torch.sqrt(xp.pow(2).mean([0, 2, 3], keepdim=True) + layer.eps)
        expected = layer.weight.detach().view(1, -1, 1, 1) / 3 * xp / sigma
        torch.testing.assert_close(y, expected)


def test_cbn_not_decoupled_is_bn_divided_by_rho():
    x = randn(16, 4, 3, 3, seed=10)
    cbn = N.create("cbn(decouple=false, amat=false, rho=2)", 4).double()
    bn = N.create("bn", 4).double()
    with torch.no_grad():
        for m in (cbn, bn):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.5]))
            m.bias.copy_(torch.tensor([0.3, -0.4, 0.0, 1.0]))
    b = bn.bias.detach().view(1, -1, 1, 1)
    torch.testing.assert_close(cbn(x), (bn(x) - b) / 2 + b)


def test_brn_matches_renorm_formula_and_its_gradient(path):
    layer = N.create("brn(r_max=3, d_max=5, relax_from=0)", 3).double().train()  # no warm-up
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([0.2, -0.1, 0.4]))
        layer.running_var.copy_(torch.tensor([1.5, 0.8, 1.1]))
    rm, rv = layer.running_mean.clone(), layer.running_var.clone()
    x = randn(10, 3, 2, 2, seed=11).requires_grad_()
    y = layer(x)
    dims = [0, 2, 3]
    with torch.no_grad():
        mb, vb = x.mean(dims), x.var(dims, unbiased=False)
        r = (torch.sqrt(vb + 1e-5) / torch.sqrt(rv + 1e-5)).clamp(1 / 3, 3)
        d = ((mb - rm) / torch.sqrt(rv + 1e-5)).clamp(-5, 5)

    def ref(x):
        xb = (x - x.mean(dims, keepdim=True)) / torch.sqrt(
            x.var(dims, unbiased=False, keepdim=True) + 1e-5)
        return xb * r.view(1, -1, 1, 1) + d.view(1, -1, 1, 1)

    xr = x.detach().clone().requires_grad_()
    torch.testing.assert_close(y, ref(xr))
    g = randn(*y.shape, seed=12)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0],
                               torch.autograd.grad(ref(xr), xr, g)[0])
    assert torch.autograd.gradcheck(ref, (xr,), eps=1e-6, atol=1e-5)
    # when the clips are inactive the forward equals normalization with running statistics
    torch.testing.assert_close(
        y.detach(), (x.detach() - rm.view(1, -1, 1, 1)) / torch.sqrt(rv + 1e-5).view(1, -1, 1, 1))


def test_wrappers_gradcheck(path):
    torch.manual_seed(0)
    for make in (lambda layer: N.ScaleInvariantBN(layer),
                 lambda layer: N.WeightNorm(layer, zeta=0.1)):
        module = make(nn.Conv2d(2, 3, 2, bias=False)).double().train()
        buffers = {k: v.clone() for k, v in module.named_buffers()}
        params = dict(module.named_parameters())
        names = list(params)

        def f(x, *ps):
            return functional_call(module, {**dict(zip(names, ps)),
                                            **{k: v.clone() for k, v in buffers.items()}}, (x,))

        x = randn(3, 2, 3, 3, seed=13).requires_grad_()
        ps = tuple(p.detach().clone().requires_grad_() for p in params.values())
        assert torch.autograd.gradcheck(f, (x, *ps), eps=1e-6, atol=1e-5)


# ---- equality with torch's BatchNorm -------------------------------------------------------------

@pytest.mark.parametrize("shape,ref_cls", [((32, 5), nn.BatchNorm1d), ((16, 5, 7), nn.BatchNorm1d),
                                           ((8, 5, 4, 4), nn.BatchNorm2d),
                                           ((4, 5, 2, 3, 3), nn.BatchNorm3d)])
def test_bn_equals_torch_batchnorm(shape, ref_cls):
    torch.manual_seed(0)
    ref, mine = ref_cls(5), N.create("bn", 5)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2)
        ref.bias.uniform_(-1, 1)
    mine.load_state_dict(ref.state_dict())
    for step in range(3):
        x = torch.randn(*shape, generator=gen(step)) * 3 + 1
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ref(xa), mine(xb)
        g = torch.randn(*shape, generator=gen(100 + step))
        ga = torch.autograd.grad(ya, [xa, ref.weight, ref.bias], g)
        gb = torch.autograd.grad(yb, [xb, mine.weight, mine.bias], g)
        torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)
        for a, b in zip(ga, gb):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(mine.state_dict()[key], value, atol=1e-6, rtol=1e-5)
    ref.eval(), mine.eval()
    x = torch.randn(*shape, generator=gen(7))
    torch.testing.assert_close(mine(x), ref(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn(rho=2)",
                                  "cbn(center=false)", "brn", "lp_bn(p=1)", "noisy_bn"])
def test_eval_mode_uses_running_statistics(spec):
    layer = N.create(spec, 3)
    for seed in range(4):
        layer(torch.randn(16, 3, 2, 2, generator=gen(seed)) * 2 + 1)
    layer.eval()
    x = torch.randn(8, 3, 2, 2, generator=gen(9))
    full = layer(x)
    # no batch statistics in eval: each sample's output does not depend on the rest of the batch
    torch.testing.assert_close(layer(x[:1]), full[:1])
    scale, shift = layer.inference_affine()
    torch.testing.assert_close(full, x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1))
    assert int(layer.num_batches_tracked) == 4


def test_running_statistics_follow_pytorch_conventions_for_variants():
    # (brn, cbn and lp_bn track what their own normalization uses: tests/test_norms_eval.py)
    x = torch.randn(20, 3, generator=gen(1)) * 2 + 1
    for spec in ["bn", "var_only_bn", "mbn(tau0=0.9, ideal_batch=20)"]:
        layer = N.create(spec, 3)
        layer(x)
        torch.testing.assert_close(layer.running_mean, 0.1 * x.mean(0))
        torch.testing.assert_close(layer.running_var, 0.9 + 0.1 * x.var(0, unbiased=True))


# ---- state dicts, convert, fold ---------------------------------------------------------------

def test_state_dict_round_trip_and_batchnorm_interchange():
    for spec in CHANNEL_SPECS:
        a = N.create(spec, 4)
        for seed in range(2):
            a(torch.randn(8, 4, generator=gen(seed)))
        b = N.create(spec, 4)
        b.load_state_dict(a.state_dict())
        a.eval(), b.eval()
        x = torch.randn(5, 4, generator=gen(3))
        torch.testing.assert_close(a(x), b(x))
    torch_bn = nn.BatchNorm1d(4)
    torch_bn(torch.randn(8, 4, generator=gen(4)))
    for spec in ["bn", "native_bn", "mean_only_bn", "var_only_bn", "brn", "lp_bn"]:
        N.create(spec, 4).load_state_dict(torch_bn.state_dict())  # same names: loads strictly


class _TorchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                                      nn.Sequential(nn.Conv2d(6, 4, 3), nn.BatchNorm2d(4)),
                                      nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 8),
                                  nn.BatchNorm1d(8), nn.Linear(8, 2))

    def forward(self, x):
        return self.head(self.features(x))


def test_convert_replaces_every_batchnorm_and_keeps_values():
    torch.manual_seed(0)
    net = _TorchNet()
    for seed in range(3):
        net(torch.randn(8, 3, 6, 6, generator=gen(seed)))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    net.eval()
    x = torch.randn(4, 3, 6, 6, generator=gen(5))
    before = net(x)
    N.convert(net, "bn")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert sum(isinstance(m, N.BatchNorm) for m in net.modules()) == 3
    torch.testing.assert_close(net(x), before, atol=1e-5, rtol=1e-5)
    N.convert(_TorchNet(), "cbn(rho=2)")  # any spec
    with pytest.raises(ValueError, match="valid names"):
        N.convert(_TorchNet(), "nope")


@pytest.mark.parametrize("spec", ["bn", "native_bn", "mbn", "cbn(rho=2)", "cbn(decouple=false)",
                                  "brn", "mean_only_bn", "var_only_bn"])
def test_fold_matches_unfolded_outputs(spec):
    torch.manual_seed(0)
    post = nn.Sequential(*N.normalized(nn.Conv2d(3, 5, 3, padding=1), spec), nn.ReLU(),
                         nn.Flatten(), *N.normalized(nn.Linear(5 * 4 * 4, 6), spec, "pre_linear"))
    for m in post.modules():
        if isinstance(m, N.ChannelNorm | nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    for seed in range(3):
        post(torch.randn(8, 3, 4, 4, generator=gen(seed)))
    post.eval()
    folded = N.fold(post)
    assert not any(isinstance(m, N.ChannelNorm | nn.modules.batchnorm._BatchNorm)
                   for m in folded.modules())
    x = torch.randn(6, 3, 4, 4, generator=gen(9))
    torch.testing.assert_close(folded(x), post(x), atol=1e-5, rtol=1e-5)


def test_fold_scale_invariant_and_weightnorm():
    torch.manual_seed(1)
    model = nn.Sequential(*N.normalized(nn.Linear(4, 5, bias=False), "si_bn"), nn.Tanh(),
                          *N.normalized(nn.Linear(5, 3), "wn+mean_only_bn"))
    for seed in range(3):
        model(torch.randn(10, 4, generator=gen(seed)))
    model.eval()
    folded = N.fold(model)
    x = torch.randn(7, 4, generator=gen(4))
    torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)
    assert not any(isinstance(m, N.ScaleInvariantBN | N.ChannelNorm) for m in folded.modules())


# ---- individual layers ----------------------------------------------------------------------

def test_noisy_bn_noise_distribution_matches_algorithm_1():
    """Per channel, E[out] = μ_j ~ U(−n_μ, n_μ) and Var[out] = σ_j² + r_σ² + r_μ²/3 with σ_j ~ U(1,
    n_σ)."""
    channels, batch = 400, 4000
    layer = N.create("noisy_bn", channels)
    N.seed_layers(layer, 123)
    x = torch.randn(batch, channels, generator=gen(1)) * 3 + 2
    with torch.no_grad():
        out = layer(x)
    mean, var = out.mean(0).double(), out.var(0).double()
    sigma = torch.sqrt((var - 0.1**2 - 0.1**2 / 3).clamp_min(0))
    # sampling error of the per-channel mean ≈ 1.2/√4000 ≈ 0.02, small against the U(−.5,.5) width
    assert scipy.stats.kstest(mean.numpy(), scipy.stats.uniform(-0.5, 1.0).cdf).pvalue > 1e-3
    assert scipy.stats.kstest(sigma.numpy(), scipy.stats.uniform(1.0, 0.25).cdf).pvalue > 1e-4
    assert mean.abs().max() < 0.6 and sigma.min() > 0.9 and sigma.max() < 1.35
    # time-varying: the next step draws new (μ_j, σ_j)
    with torch.no_grad():
        again = layer(x)
    assert (again.mean(0) - out.mean(0)).abs().mean() > 0.1
    # reproducible from the seed; no noise in eval
    N.seed_layers(layer, 123)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), out)
    layer.eval()
    bn = N.create("bn", channels)
    bn.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x), bn.eval()(x))


def test_noisy_bn_counts_conv_positions_as_batch():
    layer = N.create("noisy_bn(r_mu=0, r_sigma=0)", 2)
    N.seed_layers(layer, 0)
    x = torch.randn(4, 2, 5, 5, generator=gen(2))
    with torch.no_grad():
        out = layer(x)
    bn_out = N.create("bn", 2)(x)
    # without per-sample spread the noise is one affine map per channel: out = σ_j·bn + μ_j
    ratio = ((out - out.mean((0, 2, 3), keepdim=True))
             / (bn_out - bn_out.mean((0, 2, 3), keepdim=True)))
    assert torch.allclose(ratio, ratio[:1, :, :1, :1].expand_as(ratio), atol=1e-4)


def test_mbn_lambda_schedule_values():
    T, m, m0 = 10, 8, 32
    rho = 0.25 ** (1 / 10)
    assert N.mbn_lambda(1, T, m, m0) == pytest.approx(0.0, abs=1e-12)
    assert N.mbn_lambda(T, T, m, m0) == pytest.approx(1 - 8 / 32)
    assert N.mbn_lambda(5, T, m, m0) == pytest.approx(rho ** (10 / 9 * 5) - rho**10)
    assert N.mbn_lambda(5, T, m, m0) == pytest.approx(0.25 ** (5 / 9) - 0.25)
    values = [N.mbn_lambda(t, T, m, m0) for t in range(1, T + 1)]
    assert all(a < b for a, b in zip(values, values[1:]))
    # batch ≥ ideal: plain BN
    assert all(N.mbn_lambda(t, T, 64, 32) == 0.0 for t in range(1, T + 1))
    with pytest.raises(ValueError):
        N.mbn_lambda(0, T, m, m0)


def test_mbn_forward_with_moving_statistics_and_inference_ema():
    layer = N.create("mbn(ideal_batch=32, tau0=0.9)", 3).double()
    model = nn.Sequential(nn.Identity(), nn.Sequential(layer))
    N.set_progress(model, epoch=4, epochs=6)  # reaches the nested layer
    lam = N.mbn_lambda(4, 6, 8, 32)
    x1, x2 = randn(8, 3, seed=1) + 1, randn(8, 3, seed=2) * 2
    layer(x1)
    mean1, var1 = (1 - lam) * x1.mean(0), lam + (1 - lam) * x1.var(0, unbiased=False)
    y = layer(x2)
    mean2 = lam * mean1 + (1 - lam) * x2.mean(0)
    var2 = lam * var1 + (1 - lam) * x2.var(0, unbiased=False)
    torch.testing.assert_close(y, (x2 - mean2) / torch.sqrt(var2 + 1e-5))
    tau = 0.9 ** (8 / 32)
    rm = (1 - tau) * x1.mean(0)
    rm = tau * rm + (1 - tau) * x2.mean(0)
    torch.testing.assert_close(layer.running_mean, rm)


def test_si_bn_keeps_weight_scale_invariant_lemma_2_4():
    torch.manual_seed(0)
    x, target = randn(16, 5, seed=1), randn(16, 2, seed=2)

    def radial_ratio(first):
        model = nn.Sequential(first, nn.Tanh(), nn.Linear(4, 2)).double()
        loss = nn.functional.mse_loss(model(x), target)
        w = model[0].layer.weight if isinstance(model[0], N.ScaleInvariantBN) \
            else model[0][0].weight
        (grad,) = torch.autograd.grad(loss, w)
        return float((w.detach() * grad).sum().abs() / (w.detach().norm() * grad.norm())), model, w

    r_si, model, w = radial_ratio(N.ScaleInvariantBN(nn.Linear(5, 4, bias=False), eps=0.1))
    assert r_si < 1e-12
    r_bn, *_ = radial_ratio(nn.Sequential(nn.Linear(5, 4, bias=False), N.create("bn(eps=0.1)", 4)))
    assert r_bn > 1e-6
    # the function itself is unchanged by w → 3w
    before = model(x)
    with torch.no_grad():
        w.mul_(3)
    torch.testing.assert_close(model(x), before)


def test_lp_scales_estimate_the_gaussian_std():
    x = torch.randn(20000, 3, generator=gen(3)) * torch.tensor([0.5, 1.0, 4.0])
    for p in ["1", "2"]:
        layer = N.create(f"lp_bn(p={p}, affine=false)", 3)
        centred = x - x.mean(0)
        scale = layer.batch_scale(centred)
        torch.testing.assert_close(scale, torch.tensor([0.5, 1.0, 4.0]), rtol=0.03, atol=0)
    layer = N.create("lp_bn(p=inf, topk=10)", 3)
    centred = x - x.mean(0)
    brute = torch.stack([centred[:, c].abs().sort().values[-10:].mean() for c in range(3)])
    torch.testing.assert_close(layer.batch_scale(centred), N.hoffer_linf_constant(20000) * brute)
    assert N.hoffer_linf_constant(1024) == pytest.approx(
        0.5 * (1 + math.sqrt(math.pi * math.log(4))) / math.sqrt(2 * math.log(1024)))
    # p=2 is BatchNorm up to where ε enters (scale vs variance)
    lp2, bn = N.create("lp_bn(p=2, eps=1e-12)", 3), N.create("bn(eps=1e-12)", 3)
    torch.testing.assert_close(lp2(x), bn(x), atol=1e-4, rtol=1e-4)


def test_weight_norm_and_gamma_decay():
    torch.manual_seed(0)
    wn = N.WeightNorm(nn.Linear(4, 3), zeta=0.25)
    v = wn.layer.parametrizations.weight.original1
    g = wn.gamma
    torch.testing.assert_close(wn.layer.weight, g.view(-1, 1) * v / v.norm(dim=1, keepdim=True))
    torch.testing.assert_close(N.regularization_loss(nn.Sequential(wn)), 0.25 * g.pow(2).sum())
    assert N.regularization_loss(nn.Sequential(nn.Linear(2, 2))) == 0.0


# ---- specs and errors -----------------------------------------------------------------------

def test_specs_parse_with_types_and_defaults():
    layer = N.create("cbn(rho=2, amat=false)", 7)
    assert (layer.rho, layer.amat, layer.omega, layer.decouple) == (2.0, False, 10.0, True)
    assert N.create("lp_bn(p=inf)", 3).p == "inf"
    assert N.create(" mbn( ideal_batch = 16 ) ", 3).ideal_batch == 16
    assert isinstance(N.create("none", 3), nn.Identity)
    assert N.removes_mean("bn") and not N.removes_mean("var_only_bn") \
        and N.removes_mean("wn+mean_only_bn")


@pytest.mark.parametrize("spec,message", [
    ("batchnorm", "valid names: bn, brn, cbn"),
    ("cbn(rhoo=2)", "valid parameters: rho, amat, omega, decouple"),
    ("lp_bn(p=3)", "valid values: 1, 2, inf"),
    ("cbn(rho=abc)", "expected a number"),
    ("cbn(rho=-1)", "must be > 0"),
    ("cbn(amat=maybe)", "expected true or false"),
    ("bn(eps)", "key=value"),
    ("si_bn", "needs the weight"),
])
def test_bad_specs_raise_value_errors_naming_choices(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        N.create(spec, 4)


def test_bad_inputs_raise_clear_errors():
    layer = N.create("bn", 4)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(torch.randn(1, 4))
    with pytest.raises(ValueError, match="built for 4 channels"):
        layer(torch.randn(8, 3))
    with pytest.raises(ValueError, match="floating-point"):
        layer(torch.ones(8, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        N.create("native_bn", 4)(torch.randn(1, 4))
    layer.eval()
    assert layer(torch.randn(1, 4)).shape == (1, 4)  # one sample is fine at inference
    with pytest.raises(ValueError, match="valid placements"):
        N.normalized(nn.Linear(2, 2), "bn", placement="after")
    with pytest.raises(ValueError, match="pre_linear"):
        N.normalized(nn.Linear(2, 2), "si_bn", placement="pre_linear")


@pytest.mark.parametrize("spec", ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn(rho=2)",
                                  "cbn(decouple=false)", "cbn(center=false)", "brn", "lp_bn(p=2)"])
def test_fused_path_equals_plain_autograd(spec, fused):
    """The fused kernel (stats → per-channel coefficients → addcmul) equals autograd on the plain
    ops."""
    results = []
    for plain in (False, True):
        torch.manual_seed(0)
        layer = N.create(spec, 3).double()
        N.set_progress(layer, lr=0.05, epoch=2, epochs=4)
        layer(randn(8, 3, 2, 2, seed=1) + 1)  # a first step so moving statistics are in play
        x = (randn(8, 3, 2, 2, seed=2) * 2).requires_grad_()
        with N.plain_autograd() if plain else torch.enable_grad():
            y = layer(x)
        grads = torch.autograd.grad(y, [x, layer.weight, layer.bias], randn(8, 3, 2, 2, seed=3))
        results.append((y.detach(), *grads, *(b.clone() for b in layer.buffers())))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_double_backward_needs_plain_autograd(fused):
    layer = N.create("mean_only_bn", 3).double()
    x = randn(8, 3, seed=4).requires_grad_()
    with pytest.raises(RuntimeError, match="plain_autograd"):
        torch.autograd.grad(layer(x).pow(3).sum(), x, create_graph=True)
    with N.plain_autograd():
        (g,) = torch.autograd.grad(layer(x).pow(3).sum(), x, create_graph=True)
    # (Σ_i g_i is identically 0 for BN — shift invariance — so differentiate ‖g‖² instead.)
    (h,) = torch.autograd.grad(g.pow(2).sum(), x)
    eps = 1e-6
    bump = torch.zeros_like(x)
    bump[0, 0] = eps

    def grad_sq(z):
        z = z.detach().requires_grad_()
        with N.plain_autograd():
            (gz,) = torch.autograd.grad(layer(z).pow(3).sum(), z)
        return gz.pow(2).sum()

    fd = (grad_sq(x + bump) - grad_sq(x - bump)) / (2 * eps)
    assert float(h[0, 0]) == pytest.approx(float(fd), rel=1e-5)


def test_cbn_without_centering_is_eq5_alone_in_training_and_eval():
    """center=false: x'' = (γ/ρ)(x+β)/√(mean((x+β)²)+ε) — Peng Table 6's "ℓ2 normalization"
    ablation."""
    layer = N.create("cbn(center=false, amat=false, rho=2)", 3).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        layer.bias.copy_(torch.tensor([0.3, -0.4, 0.1]))
    x = randn(16, 3, 2, 2, seed=21) + 2
    g, b = layer.weight.detach().view(1, -1, 1, 1), layer.bias.detach().view(1, -1, 1, 1)
    xp = x + b
    expected = g / 2 * xp / torch.sqrt(xp.pow(2).mean([0, 2, 3], keepdim=True) + layer.eps)
    torch.testing.assert_close(layer(x), expected)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -1.0, 0.5]))
        layer.running_var.copy_(torch.tensor([2.0, 0.5, 1.0]))
    layer.eval()
    rm, rv = layer.running_mean.view(1, -1, 1, 1), layer.running_var.view(1, -1, 1, 1)
    # E[(x+β)²] = Var x + (E x + β)² from the running statistics
    torch.testing.assert_close(layer(x), g / 2 * xp / torch.sqrt(rv + (rm + b) ** 2 + layer.eps))
    plain = N.create("cbn(center=false, decouple=false, amat=false)", 3).double().eval()
    plain.running_mean.copy_(rm.flatten()), plain.running_var.copy_(rv.flatten())
    torch.testing.assert_close(plain(x), x / torch.sqrt(rv + rm**2 + plain.eps))


def test_cbn_fixed_eta_ignores_the_learning_rate():
    layer = N.create("cbn(eta=0.9, amat=false)", 3).double()
    x1, x2 = randn(16, 3, seed=31) + 1, randn(16, 3, seed=32) - 1
    layer(x1)
    for lr in (1.0, 0.001):  # AMAT's rule would give η = 0 and 0.99
        N.set_progress(layer, lr=lr)
        assert layer.current_eta() == 0.9
    layer(x2)
    torch.testing.assert_close(layer.amat_mean, 0.9 * x1.mean(0) + 0.1 * x2.mean(0))
    with pytest.raises(ValueError, match=r"eta must be in \[0, 1\)"):
        N.create("cbn(eta=1)", 3)
