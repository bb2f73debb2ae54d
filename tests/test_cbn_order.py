"""cbn's ``order`` option against a float64 hand computation of Peng et al.'s Algorithm 1.

Algorithm 1 (Re-Thinking the Effectiveness of Batch Normalization and Beyond, Peng, Yu & Yu) reads
μ_A,k and σ_A,k to normalize the k-th batch and folds the batch in afterwards (``order="literal"``);
bnlab's default folds it in first (``order="fold_first"``). Both use Eq. 9's σ²_A update and the
additive mean correction (the layer's docstring says why), with the ratios "treated as a constant".
"""

from __future__ import annotations

import pytest
import torch

import bnlab.norms as norms

EPS = 1e-5
C, N = 3, 16


def hand_step(x, gamma, beta, state, eta, order, rho=1.0):
    """One training step of Algorithm 1 in float64 for (N, C) inputs: (y, new state, ratios).

    ``state`` is None before the first batch (it initializes μ_A, σ²_A). The forward uses μ_A and
    σ_A, the backward μ_B and σ_B: ``μ = μ_B + sg(μ_A − μ_B)``, ``σ = σ_B · sg(σ_A / σ_B)``."""
    mu_b = x.mean(0)
    if state is None:
        mu_prev, var_prev, eta = None, None, 0.0
    else:
        mu_prev, var_prev = state
    if order == "fold_first" or state is None:
        mu_a = mu_b.detach() if state is None else eta * mu_prev + (1 - eta) * mu_b.detach()
    else:
        mu_a = mu_prev
    d = (mu_a - mu_b).detach()
    centred = x - (mu_b + d) + beta                    # x' of Eq. 4
    second_b = (centred ** 2).mean(0)                  # σ²_B of Eq. 5 (with the forward's μ)
    if order == "fold_first" or state is None:
        second_a = second_b.detach() if state is None else (
            eta * var_prev + (1 - eta) * second_b.detach())
    else:
        second_a = var_prev
    std_b = torch.sqrt(second_b + EPS)
    r = (torch.sqrt(second_a + EPS) / std_b).detach()
    y = gamma / rho * centred / (r * std_b)
    if order == "literal" and state is not None:       # fold this batch in after normalizing
        new = (eta * mu_prev + (1 - eta) * mu_b.detach(),
               eta * var_prev + (1 - eta) * second_b.detach())
    else:
        new = (mu_a.detach(), second_a.detach())
    return y, new, (d, r)


def make_layer(order: str, lr: float, dtype=torch.float64, **kw):
    layer = norms.create(f"cbn(amat=true,order={order})", C, **kw).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, C, dtype=dtype))
        layer.bias.copy_(torch.linspace(-0.4, 0.8, C, dtype=dtype))
    norms.set_progress(layer, lr=lr)
    return layer.train()


def batches(steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, C, generator=g, dtype=torch.float64) * 2.0 + 1.5 + 0.3 * k
            for k in range(steps)]


@pytest.mark.parametrize("order", ["fold_first", "literal"])
@pytest.mark.parametrize("lr", [0.1, 0.01, 0.001])  # η = 0, 0.9, 0.99 (ω = 10)
def test_forward_buffers_and_gradients_match_algorithm_1(order, lr):
    layer = make_layer(order, lr)
    eta = max(1 - 10 * lr, 0.0)
    state = None
    for x in batches(6):
        gamma = layer.weight.detach().clone().requires_grad_(True)
        beta = layer.bias.detach().clone().requires_grad_(True)
        xr = x.clone().requires_grad_(True)
        y_ref, state, _ = hand_step(xr, gamma, beta, state, eta, order)
        xl = x.clone().requires_grad_(True)
        y = layer(xl)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.amat_mean, state[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.amat_var, state[1], rtol=1e-12, atol=1e-12)
        w = torch.cos(torch.arange(N * C, dtype=torch.float64)).reshape(N, C)
        grads_ref = torch.autograd.grad((y_ref * w).sum(), (xr, gamma, beta))
        layer.zero_grad()
        (y * w).sum().backward()
        for got, want in zip((xl.grad, layer.weight.grad, layer.bias.grad), grads_ref):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_orders_differ_and_literal_uses_the_previous_statistics():
    """At η = 0 (lr 0.1) the default normalizes each batch by itself, the literal order by the
    previous batch's statistics: after the first step their outputs differ."""
    xs = batches(3)
    a, b = make_layer("fold_first", 0.1), make_layer("literal", 0.1)
    outs = [(a(x), b(x)) for x in xs]
    torch.testing.assert_close(outs[0][0], outs[0][1])      # the first batch initializes both
    assert not torch.allclose(outs[1][0], outs[1][1])
    # fold_first at η = 0 centres each batch on itself: y's channel means are γβ/(ρσ)
    mean_a = outs[1][0].mean(0)
    assert torch.all(torch.sign(mean_a) == torch.sign(a.bias * a.weight))
    # literal: the second batch (shifted by 0.3) is centred on the first batch's mean
    assert not torch.allclose(outs[1][1].mean(0), mean_a, atol=1e-3)


def test_hand_gradients_pass_gradcheck_with_the_ratios_held_constant():
    """The reference's backward is the derivative of Algorithm 1's forward with r_μ (here the
    additive d) and r_σ treated as constants (finite differences, float64)."""
    xs = batches(2)
    gamma = torch.linspace(0.5, 1.5, C, dtype=torch.float64, requires_grad=True)
    beta = torch.linspace(-0.4, 0.8, C, dtype=torch.float64, requires_grad=True)
    _, state, _ = hand_step(xs[0], gamma, beta, None, 0.9, "literal")
    x = xs[1].clone().requires_grad_(True)
    _, _, (d, r) = hand_step(x, gamma, beta, state, 0.9, "literal")

    def frozen(x, gamma, beta):
        mu_b = x.mean(0)
        centred = x - (mu_b + d) + beta
        return gamma * centred / (r * torch.sqrt((centred ** 2).mean(0) + EPS))

    assert torch.autograd.gradcheck(frozen, (x, gamma, beta))
    layer = make_layer("literal", 0.01)
    layer(xs[0])
    xl = xs[1].clone().requires_grad_(True)
    y = layer(xl)
    w = torch.sin(torch.arange(N * C, dtype=torch.float64)).reshape(N, C)
    (y * w).sum().backward()
    want = torch.autograd.grad((frozen(x, gamma, beta) * w).sum(), x)[0]
    torch.testing.assert_close(xl.grad, want, rtol=1e-10, atol=1e-12)


def test_default_is_fold_first_bit_identical_and_bad_order_names_the_choices():
    torch.manual_seed(0)
    x = torch.randn(8, C, 4, 4)
    a = norms.create("cbn(amat=true)", C)
    b = norms.create("cbn(amat=true,order=fold_first)", C)
    for layer in (a, b):
        norms.set_progress(layer, lr=0.01)
    for _ in range(3):
        assert torch.equal(a(x), b(x))
    assert torch.equal(a.amat_var, b.amat_var) and torch.equal(a.running_var, b.running_var)
    assert "order" not in repr(a) and "order=literal" in repr(norms.create("cbn(order=literal)", C))
    with pytest.raises(ValueError, match="fold_first"):
        norms.create("cbn(order=backwards)", C)
