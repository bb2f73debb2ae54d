"""Constant channels — a dead ReLU's zeros, a saturated unit — where ``nn.BatchNorm`` stays finite.

A channel with σ²_B = 0 is routine in a real ReLU network. torch's BatchNorm adds ε inside its
square root, so its output and every gradient stay finite; ``lp_bn`` (p = 2, Hoffer et al.'s ε on
the scale √σ²_B) used to take √ of 0 with autograd, whose 0·∞ put NaN into the input gradient of the
whole batch, and so into every weight behind the layer.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from bnlab.norms.tools.bench import _layer
from bnlab.norms.registry import REGISTRY

SPECS = sorted(name for name, info in REGISTRY.items() if info.kind == "channel"
               and name != "none") + ["cbn(decouple=false)", "lp_bn(p=1)", "lp_bn(p=inf)"]


@pytest.mark.parametrize("shape", [(32, 64, 8, 8), (100, 16)], ids=["fused", "plain"])
@pytest.mark.parametrize("spec", SPECS)
def test_a_constant_channel_leaves_every_value_finite(spec, shape):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = _layer(spec, shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    x[:, 3], x[:, 5] = 0.0, 7.0  # a dead ReLU channel, a constant one
    for _ in range(3):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.square().sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(xi.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    assert all(torch.isfinite(b).all() for b in layer.buffers() if b.is_floating_point())
    assert torch.isfinite(layer.eval()(x)).all()


def test_rms_scale_is_sqrt_with_the_subgradient_zero_at_zero():
    """Against the reference it replaces (``var.sqrt()``) where that is differentiable, bit for bit,
    and against torch's own norm at 0 (gradient 0)."""
    from bnlab.norms.variants.lp import rms_scale

    var = torch.tensor([0.0, 1e-12, 0.25, 4.0, 1e6], dtype=torch.float64, requires_grad=True)
    ref = var.detach().clone().requires_grad_()
    rms_scale(var).backward(torch.ones(5, dtype=torch.float64))
    ref.sqrt().backward(torch.ones(5, dtype=torch.float64))
    assert torch.equal(rms_scale(var.detach()), var.detach().sqrt())
    assert torch.equal(var.grad[1:], ref.grad[1:]) and var.grad[0] == 0
    z = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    torch.linalg.vector_norm(z).backward()
    assert torch.equal(z.grad, torch.zeros(3, dtype=torch.float64))
