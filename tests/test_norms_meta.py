"""Every layer on the meta device, as ``nn.BatchNorm`` works there: built under
``torch.device("meta")`` (large-model initialization: build without memory, then ``to_empty`` and
``reset_parameters``), and run on meta tensors (shape inference).

Before: a forward on meta failed for every variant ("unsupported scalarType": the layers switched
autocast off for the ``meta`` device type, which has none, and the fused path's statistics kernel
has no meta kernel), and ``noisy_bn`` could not even be built under a meta default device (its seed
was read with ``.item()`` from a meta tensor).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import bnlab.norms as N
from bnlab.norms.registry import REGISTRY

SPECS = sorted(name for name, info in REGISTRY.items()
               if info.kind == "channel" and name not in ("none", "si_bn", "wn")) + [
    "cbn(decouple=false)", "lp_bn(p=1)", "lp_bn(p=inf)"]


def create(spec: str, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return N.create(spec, 64, **kwargs)


@pytest.mark.parametrize("spec", SPECS)
def test_built_on_meta_then_materialized_equals_built_on_the_cpu(spec):
    torch.manual_seed(0)
    with torch.device("meta"):
        layer = create(spec)
    assert all(t.is_meta for t in [*layer.parameters(), *layer.buffers()])
    layer = layer.to_empty(device="cpu")
    layer.reset_parameters()
    torch.manual_seed(0)
    reference = create(spec)
    for (name, got), (_, want) in zip(layer.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(got, want), name
    if spec == "noisy_bn":  # the same seed from the global RNG, whatever the default device
        assert layer._seed == reference._seed


@pytest.mark.parametrize("shape", [(32, 64, 8, 8), (100, 64)], ids=["fused_size", "small"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("spec", SPECS)
def test_a_forward_on_meta_tensors_infers_the_shape(spec, training, shape):
    layer = create(spec, device="meta").train(training)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.empty(shape, device="meta", dtype=dtype, requires_grad=True)
        y = layer(x)
        assert y.is_meta and y.shape == x.shape and y.dtype == dtype
        if training:
            y.sum().backward()
            assert x.grad is not None and x.grad.shape == x.shape
