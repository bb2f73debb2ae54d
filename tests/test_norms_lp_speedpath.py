"""The eager fast paths of ``lp_bn(p=1)``, ``lp_bn(p=inf)`` (bnlab.norms.engine.lp_fused) and
``noisy_bn``'s draws.

The fused ℓp function is checked against finite differences (gradcheck, float64) and against the
plain autograd path (float32, 1e-5: outputs, input/γ/β gradients, running buffers); the ℓ∞ top-k
search against a brute-force sort on inputs built to defeat it. Speed itself is measured in
benchmarks/ (never in tests); here the number of full-size passes of a training step is pinned,
counted at the dispatcher.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine.lp_fused import linf_top_entries

LP_SPECS = ["lp_bn(p=1)", "lp_bn(p=inf)", "lp_bn(p=inf, topk=3)", "lp_bn(p=inf, topk=50)"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)


def plain_and_fused(monkeypatch, spec, x, seed=0, steps=2, layer_kwargs=None):
    """Outputs, input/γ/β gradients and buffers after ``steps`` training steps, plain then fused
    path."""
    results = []
    for min_numel in (1 << 62, 0):
        monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", min_numel)
        layer = N.create(spec, x.shape[1]).to(x.dtype)
        if layer.affine:
            with torch.no_grad():
                layer.weight.copy_(1 + 0.3 * torch.randn(x.shape[1], generator=gen(seed + 1)))
                layer.bias.copy_(0.3 * torch.randn(x.shape[1], generator=gen(seed + 2)))
        out = []
        for step in range(steps):
            xi = (x * (1 + step)).detach().requires_grad_()
            y = layer(xi)
            fused_ran = type(y.grad_fn).__name__.startswith("_LpNormalize")
            g = torch.randn(y.shape, generator=gen(seed + 10 + step), dtype=y.dtype)
            params = [p for p in layer.parameters()]
            grads = torch.autograd.grad(y, [xi, *params], g)
            out.append((y.detach(), *grads, fused_ran))
        buffers = [b.clone() for b in layer.buffers()]
        results.append((out, buffers))
    return results


@pytest.mark.parametrize("spec", LP_SPECS)
@pytest.mark.parametrize("shape", [(6, 3, 2, 2), (10, 3), (2, 3, 5), (3, 2, 3, 2, 2)])
def test_fused_lp_gradcheck(spec, shape, fused):
    layer = N.create(spec, shape[1]).double().train()
    x = torch.randn(shape, generator=gen(1), dtype=torch.float64).requires_grad_()
    w = (1 + 0.1 * torch.randn(shape[1], generator=gen(2), dtype=torch.float64)).requires_grad_()
    b = (0.1 * torch.randn(shape[1], generator=gen(3), dtype=torch.float64)).requires_grad_()
    buffers = {k: v.clone() for k, v in layer.named_buffers()}

    def f(x, w, b):
        return functional_call(
            layer, {"weight": w, "bias": b, **{k: v.clone() for k, v in buffers.items()}}, (x,))

    # the fused function is what is checked
    assert type(f(x, w, b).grad_fn).__name__.startswith("_LpNormalize")
    assert torch.autograd.gradcheck(f, (x, w, b), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec", LP_SPECS
                         + ["lp_bn(p=1, affine=false)", "lp_bn(p=inf, momentum=none)"])
@pytest.mark.parametrize("shape", [(16, 4, 5, 5), (64, 3), (4, 3, 7)])
def test_fused_lp_equals_plain_path_float32(spec, shape, monkeypatch):
    x = torch.randn(shape, generator=gen(4)) * torch.linspace(0.5, 3, shape[1]).view(
        1, -1, *[1] * (len(shape) - 2))
    # means up to 40σ/3
    x = x + torch.linspace(-2, 40, shape[1]).view(1, -1, *[1] * (len(shape) - 2))
    (plain, plain_buffers), (fused, fused_buffers) = plain_and_fused(monkeypatch, spec, x)
    for p_step, f_step in zip(plain, fused):
        assert not p_step[-1] and f_step[-1]
        for a, b in zip(f_step[:-1], p_step[:-1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_buffers, plain_buffers):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fused_lp_handles_channels_last_input(monkeypatch):
    x = torch.randn(12, 3, 4, 5, generator=gen(5)).contiguous(memory_format=torch.channels_last)
    for spec in ["lp_bn(p=1)", "lp_bn(p=inf)"]:
        (plain, _), (fused, _) = plain_and_fused(monkeypatch, spec, x, steps=1)
        assert fused[0][-1]
        for a, b in zip(fused[0][:-1], plain[0][:-1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_linf_top_entries_match_a_full_sort_when_one_sample_holds_them_all():
    """The search looks at the k samples with the largest peaks: inputs where one sample holds every
    top entry of a channel, where they are spread, and k larger than the channel."""
    x = torch.randn(40, 3, 6, 6, generator=gen(6))
    x[7, 0] += 50 * torch.rand(6, 6, generator=gen(7))  # channel 0: all top entries in sample 7
    x[:, 1, 2, 3] -= 30  # channel 1: one per sample (sign −)
    mean = x.mean((0, 2, 3))
    centred = (x - mean.view(1, -1, 1, 1)).transpose(0, 1).reshape(3, -1)
    for k in (1, 10, 37):
        values, index, signs = linf_top_entries(x, mean, k)
        want = centred.abs().sort(dim=1, descending=True).values[:, :k]
        torch.testing.assert_close(values, want, rtol=0, atol=0)
        picked = x[index] - mean[:, None]  # (C, k) entries the indices point at
        torch.testing.assert_close(picked.abs(), values, rtol=0, atol=0)
        torch.testing.assert_close(picked.sign(), signs, rtol=0, atol=0)
    x2 = torch.randn(5, 2, generator=gen(8))  # n = 5 < k: every entry
    values, _, _ = linf_top_entries(x2, x2.mean(0), 10)
    torch.testing.assert_close(
        values, (x2 - x2.mean(0)).abs().t().sort(dim=1, descending=True).values)


def test_fused_lp_backward_twice_and_refuses_double_backward(fused):
    layer = N.create("lp_bn(p=1)", 3)
    x = torch.randn(8, 3, 2, 2, generator=gen(9)).requires_grad_()
    y = layer(x)
    g = torch.randn(y.shape, generator=gen(10))
    first = torch.autograd.grad(y, x, g, retain_graph=True)[0]
    # the sign buffer became the first gradient: recomputed
    second = torch.autograd.grad(y, x, g)[0]
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="plain_autograd"):
        torch.autograd.grad(layer(x), x, g, create_graph=True)
    with N.plain_autograd():
        (gx,) = torch.autograd.grad(layer(x), x, g, create_graph=True)
    assert gx.requires_grad


def test_autocast_half_inputs_take_the_fused_path_too(fused):
    """Half inputs (as autocast hands them on) take the fused function, computed in float32 and
    rounded once: what the plain path gives, to an ulp (tests/test_norms_half_fused.py: against a
    float64 run, and the operation counts)."""
    x = torch.randn(8, 3, 2, 2, generator=gen(11)).bfloat16()
    g = torch.randn(8, 3, 2, 2, generator=gen(12)).bfloat16()
    results = []
    for plain in (False, True):
        layer, xi = N.create("lp_bn(p=1)", 3), x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16), \
                (N.plain_autograd() if plain else contextlib.nullcontext()):
            y = layer(xi)
        y.backward(g)
        results.append((y, xi.grad, type(y.grad_fn).__name__))
    (y, gx, node), (y_plain, gx_plain, node_plain) = results
    assert y.dtype == torch.bfloat16 and node == "_LpNormalizeBackward" != node_plain
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in [(y, y_plain), (gx, gx_plain)]:
        torch.testing.assert_close(got.float(), want.float(), rtol=eps,
                                   atol=eps * want.abs().max().item())


class FullSizeOps(TorchDispatchMode):
    """Names of the aten ops, forward and backward, that write a tensor as large as the input."""

    FREE = {"empty", "empty_like", "empty_strided", "detach", "view", "_unsafe_view", "alias", "t",
            "transpose", "expand", "slice", "select", "reshape", "unsqueeze", "as_strided"}

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in self.FREE and any(isinstance(t, torch.Tensor) and t.numel() == self.numel
                                         for t in tree_leaves(out)):
            self.ops.append(name)
        return out


@pytest.mark.parametrize("spec, most", [("lp_bn(p=1)", 6), ("lp_bn(p=inf)", 3), ("noisy_bn", 9)])
def test_training_step_makes_few_full_size_passes(spec, most, fused):
    """Pinned counts of full-size writes in one forward + backward, a proxy for speed that
    timing-free tests can hold (native BN: 2 kernels; before the fused path ℓ1 BN made 15, ℓ∞ 17,
    and noisy BN 12, with draws scaled and shifted out of place and torch's two-product addcmul
    backward)."""
    layer = N.create(spec, 4)
    x = torch.randn(64, 4, 6, 6, generator=gen(12)).requires_grad_()
    g = torch.randn(x.shape, generator=gen(13))
    with FullSizeOps(x.numel()) as counted:
        layer(x).backward(g)
    assert len(counted.ops) <= most, counted.ops


def test_noisy_bn_draws_algorithm_1_noise_from_its_generator():
    """out = s·a + m with, from the layer's generator in this order: μ_j ~ U(−n_μ, n_μ), σ_j ~ U(1,
    n_σ) (C each), m_ij − μ_j ~ U(−r_μ, r_μ) and s_ij − σ_j ~ N(0, r_σ²) (one per sample and
    position)."""
    layer = N.create("noisy_bn(n_mu=0.4, n_sigma=1.5, r_mu=0.2, r_sigma=0.3)", 3)
    N.seed_layers(layer, 5)
    x = torch.randn(6, 3, 4, 4, generator=gen(14))
    xi = x.clone().requires_grad_()
    out = layer(xi)
    bn = N.create("bn", 3)
    xb = x.clone().requires_grad_()
    a = bn(xb)
    g = torch.Generator().manual_seed(layer._seed)
    mu = torch.rand(3, generator=g) * 0.8 - 0.4
    sigma = 1 + torch.rand(3, generator=g) * 0.5
    m = mu.view(1, -1, 1, 1) + (torch.rand(x.shape, generator=g) * 0.4 - 0.2)
    s = sigma.view(1, -1, 1, 1) + 0.3 * torch.randn(x.shape, generator=g)
    torch.testing.assert_close(out, s * a + m, rtol=1e-6, atol=1e-6)
    grad = torch.randn(x.shape, generator=gen(15))
    torch.testing.assert_close(torch.autograd.grad(out, xi, grad)[0],
                               torch.autograd.grad(a, xb, grad * s)[0], rtol=1e-5, atol=1e-6)


def test_plain_linf_scale_equals_a_full_sort_with_its_gradient():
    """The plain (compiled, autocast) ℓ∞ path searches only the peak samples' rows: its scale and
    gradient equal the full per-channel top-k's (float64), on a batch whose largest entries crowd
    into one sample."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(12, 3, 4, 4, generator=gen, dtype=torch.float64)
    x[5] *= 4  # sample 5 holds most of every channel's top entries
    layer = N.create("lp_bn(p=inf, topk=5)", 3).double()
    xi = x.clone().requires_grad_()
    centred = xi - xi.mean(dim=(0, 2, 3)).view(1, -1, 1, 1)
    scale = layer.batch_scale(centred)
    full = centred.transpose(0, 1).reshape(3, -1).abs().topk(5, dim=1).values.mean(1)
    want = N.hoffer_linf_constant(12 * 16) * full
    torch.testing.assert_close(scale, want, rtol=1e-12, atol=0)
    w = torch.randn(3, generator=gen, dtype=torch.float64)
    got_grad = torch.autograd.grad((scale * w).sum(), xi, retain_graph=True)[0]
    want_grad = torch.autograd.grad((want * w).sum(), xi)[0]
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-14)
