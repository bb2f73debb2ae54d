"""Layers entirely in float16/bfloat16, and empty batches of another dtype: torch's behaviour.

torch's CPU BatchNorm keeps the batch mean and 1/√(σ² + ε) of a layer whose parameters are half in
that half dtype, and computes output and gradients in float32 from the rounded values; bnlab's
layers in their BN limit (``mbn`` before its momentum starts, ``cbn`` without AMAT and decoupling)
kept float32 statistics and came out one half-precision rounding away from torch. A zero-size
batch of any floating dtype gives torch an empty output; bnlab raised "mixed dtype" for float64
into a float32 layer. Reference: ``nn.BatchNorm1d/2d`` itself.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N

BN_LIMITS = ["bn", "mbn", "cbn(amat=false,decouple=false)"]
HALF = [torch.float16, torch.bfloat16]
SHAPES = [(8, 3), (4, 3, 5, 5), (2, 3, 4, 4, 2)]


def _pair(spec: str, ndim: int, dtype: torch.dtype, g: torch.Generator):
    torch_bn = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[ndim](3)
    layer = N.create(spec, 3)
    with torch.no_grad():
        weight, bias = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
        for module in (torch_bn, layer):
            module.weight.copy_(weight)
            module.bias.copy_(bias)
    return torch_bn.to(dtype), layer.to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("spec", BN_LIMITS)
def test_a_layer_entirely_in_half_matches_torchs_half_batchnorm(spec, dtype, shape):
    g = torch.Generator().manual_seed(0)
    torch_bn, layer = _pair(spec, len(shape), dtype, g)
    x = (torch.randn(*shape, generator=g) * 3 + 1).to(dtype)
    grad = torch.randn(*shape, generator=g).to(dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mbn/cbn without progress: their BN limit
        ya, yb = torch_bn(xa), layer(xb)
    ya.backward(grad)
    yb.backward(grad)
    assert yb.dtype == dtype
    assert torch.equal(ya, yb)
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(torch_bn.weight.grad, layer.weight.grad)
    assert torch.equal(torch_bn.bias.grad, layer.bias.grad)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_float32_state_with_half_input_keeps_float32_statistics(dtype):
    """Autocast's case (float32 parameters): torch keeps float32 statistics, and so does bnlab."""
    g = torch.Generator().manual_seed(1)
    torch_bn, layer = _pair("mbn", 4, torch.float32, g)
    x = (torch.randn(4, 3, 5, 5, generator=g) * 3 + 1).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(torch_bn(x), layer(x))
    assert not layer.saves_half_statistics(x)


CHANNEL = ["bn", "mean_only_bn", "var_only_bn", "native_bn", "noisy_bn", "mbn", "cbn", "brn",
           "lp_bn", "lp_bn(p=1)", "lp_bn(p=inf)"]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("spec", CHANNEL)
def test_an_empty_float64_batch_into_a_float32_layer_is_empty_as_in_torch(spec, training):
    torch_bn, layer = nn.BatchNorm2d(3).train(training), N.create(spec, 3).train(training)
    x = torch.zeros(0, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    expected = torch_bn(x)
    y = layer(x)
    assert y.shape == expected.shape and y.dtype == expected.dtype
    y.sum().backward()
    assert torch.equal(layer.weight.grad, torch.zeros(3))
    with pytest.raises(RuntimeError, match="mixed dtype"):  # a non-empty one still raises
        layer(torch.zeros(2, 3, 4, 4, dtype=torch.float64))
