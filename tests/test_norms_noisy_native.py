"""``noisy_bn`` is BN followed by Santurkar's Alg. 1 noise: its BN part runs torch's own kernel.

The goal: ``noisy_bn`` within 1.2× of "native BN + the same noise in plain PyTorch". Its BN
part is BN's training step unchanged (the noise acts on BN's output), so it takes the branch
``bn`` takes (:func:`bnlab.norms.variants.batchnorm.trains_as_torch_bn`) — otherwise only exactly
``BatchNorm`` would, and ``noisy_bn`` would pay the shared path's 20–80 operations for plain BN. The
reference here is torch's own ``nn.BatchNorm1d/2d`` plus Alg. 1's draws replayed from the layer's
generator.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.norms.variants.batchnorm import trains_as_torch_bn
from bnlab.norms.tools.opcount import count_ops


@pytest.mark.parametrize("shape", [(64, 5), (8, 5, 4, 3)])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_noisy_bn_equals_torch_batchnorm_plus_replayed_noise(shape, momentum):
    """Outputs, input and parameter gradients, running statistics and the step counter over three
    training steps: torch's module + the replayed draws."""
    layer = N.create("noisy_bn", shape[1], momentum=momentum)
    N.seed_layers(layer, 11)
    torch.manual_seed(0)
    ref = nn.BatchNorm1d(shape[1], momentum=momentum) if len(shape) == 2 else \
        nn.BatchNorm2d(shape[1], momentum=momentum)
    with torch.no_grad():
        for p, q in zip(layer.parameters(), ref.parameters()):
            q.copy_(torch.linspace(0.5, 1.5, shape[1]) if p is layer.weight else
                    torch.linspace(-0.3, 0.2, shape[1]))
            p.copy_(q)
    replay = torch.Generator().manual_seed(layer._seed)
    for step in range(3):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(step)) * 2 + 1
        grad = torch.randn(shape, generator=torch.Generator().manual_seed(10 + step))
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = layer(xa)
        s, m = _draw(replay, shape)
        want = s * ref(xb) + m
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        got = torch.autograd.grad(out, [xa, layer.weight, layer.bias], grad)
        exp = torch.autograd.grad(want, [xb, ref.weight, ref.bias], grad)
        for a, b in zip(got, exp):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.running_mean, ref.running_mean)
    torch.testing.assert_close(layer.running_var, ref.running_var)
    assert int(layer.num_batches_tracked) == int(ref.num_batches_tracked) == 3


def _draw(g: torch.Generator, shape, n_mu=0.5, n_sigma=1.25, r_mu=0.1, r_sigma=0.1):
    """One step's (s, m) from the replaying generator (Alg. 1's order: μ, σ, m, s)."""
    c, view = shape[1], (1, -1) + (1,) * (len(shape) - 2)
    mu = torch.empty(c).uniform_(-n_mu, n_mu, generator=g)
    sigma = torch.empty(c).uniform_(1.0, n_sigma, generator=g)
    m = torch.empty(shape).uniform_(-r_mu, r_mu, generator=g) + mu.view(view)
    s = torch.empty(shape).normal_(0.0, r_sigma, generator=g) + sigma.view(view)
    return s, m


def test_which_layers_train_as_torch_bn():
    """BN's training step kept → torch's kernel; a variant overriding its coefficients, statistics
    or buffer update → the shared path (mean_only_bn has its own forward)."""
    assert trains_as_torch_bn(N.BatchNorm) and trains_as_torch_bn(type(N.create("noisy_bn", 2)))
    for spec in ("var_only_bn", "lp_bn"):
        assert not trains_as_torch_bn(type(N.create(spec, 2))), spec

    class Scaled(N.BatchNorm):
        def coefficients(self, mean, var, gamma, beta):
            scale, shift = super().coefficients(mean, var, gamma, beta)
            return 2 * scale, 2 * shift

    class OwnStats(N.BatchNorm):
        def update_running_stats(self, mean, var, n, momentum=None):
            pass

    assert not trains_as_torch_bn(Scaled) and not trains_as_torch_bn(OwnStats)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    plain = N.BatchNorm(3)
    torch.testing.assert_close(Scaled(3)(x), 2 * plain(x), rtol=1e-5, atol=1e-5)
    names = count_ops(lambda: Scaled(3)(x.requires_grad_()).sum().backward()).by_name()
    assert "native_batch_norm" not in names, names


def test_a_coefficients_override_on_one_layer_or_patched_on_the_class_is_not_skipped(monkeypatch):
    """Setting ``layer.coefficients`` on one layer, or patching ``BatchNorm.coefficients`` after
    import, changes what the layer computes: torch's kernel (which knows nothing of it) must not
    run. Before, only the class's attributes were compared with BatchNorm's own, so both were
    silently ignored."""
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(2))
    expected = 2 * N.BatchNorm(3)(x)

    def doubled(mean, var, gamma, beta):
        scale = gamma * torch.rsqrt(var + 1e-5)
        return 2 * scale, 2 * (beta - mean * scale)

    layer = N.BatchNorm(3)
    layer.coefficients = doubled
    assert not trains_as_torch_bn(layer) and trains_as_torch_bn(N.BatchNorm(3))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)

    def doubled_method(self, mean, var, gamma, beta):
        return doubled(mean, var, gamma, beta)

    monkeypatch.setattr(N.BatchNorm, "coefficients", doubled_method)
    assert not trains_as_torch_bn(N.BatchNorm)
    torch.testing.assert_close(N.BatchNorm(3)(x), expected, rtol=1e-5, atol=1e-5)
