"""A pretrained BatchNorm checkpoint loads strictly into a network of any bnlab layer.

Fine-tuning a torchvision or timm model with another normalization (timm's
``create_model(..., pretrained=True, norm_layer=...)`` loads with ``strict=True``) needs torch's
BatchNorm state_dict to load into the new layers. ``mbn`` and ``cbn`` keep moving statistics
torch's BN has no names for, and failed with "Missing key(s)". Now a checkpoint without any of them
loads, and they keep their values (as torch keeps ``num_batches_tracked`` for a version-1
checkpoint); one holding some but not all still fails.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.norms.registry import REGISTRY
from tests.vision_shim import build

SPECS = sorted(name for name, info in REGISTRY.items()
               if info.kind == "channel" and name not in ("none", "si_bn", "wn"))


def torch_bn() -> nn.BatchNorm2d:
    gen = torch.Generator().manual_seed(0)
    bn = nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1, generator=gen)
        bn.running_var.uniform_(0.5, 2, generator=gen)
        bn.weight.uniform_(0.5, 1.5, generator=gen)
        bn.bias.uniform_(-0.5, 0.5, generator=gen)
        bn.num_batches_tracked.fill_(7)
    return bn


def create(spec: str, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return N.create(spec, 8, **kwargs)


@pytest.mark.parametrize("spec", SPECS)
def test_torch_batchnorm_state_dict_loads_strictly(spec):
    source = torch_bn().state_dict()
    layer = create(spec)
    moving = getattr(layer, "moving_buffers", dict)()  # native_bn: torch's class, none
    own = {name: getattr(layer, name).clone() for name in moving}
    layer.load_state_dict(source, strict=True)
    loaded = layer.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.items())
    assert all(torch.equal(loaded[k], v) for k, v in own.items())
    # on the meta device (assign=True), the moving statistics take their initial values
    meta = create(spec, device="meta")
    meta.load_state_dict(source, assign=True)
    for name, initial in moving.items():
        assert torch.equal(getattr(meta, name), initial)
    meta(torch.randn(4, 8, 3, 3))


@pytest.mark.parametrize("spec", ["mbn", "cbn"])
def test_a_checkpoint_missing_some_moving_statistics_still_fails(spec):
    layer = create(spec)
    first = {"mbn": "train_mean", "cbn": "amat_mean"}[spec]
    with pytest.raises(RuntimeError, match="Missing key"):
        layer.load_state_dict({**torch_bn().state_dict(), first: torch.zeros(8)})


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn"])
def test_a_timm_resnet_checkpoint_loads_into_the_converted_network(spec):
    """The real case: timm's resnet18 with BatchNorm, its state_dict loaded strictly into the same
    network converted to ``spec``; with ``bn`` the converted network predicts what timm's does."""
    source = build("timm.resnet18", torch.Generator().manual_seed(0))
    target = N.convert(build("timm.resnet18", torch.Generator().manual_seed(1)), spec)
    target.load_state_dict(source.state_dict(), strict=True)
    if spec == "bn":
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(target.eval()(x), source.eval()(x))


@pytest.mark.parametrize("spec", ["mbn", "cbn"])
def test_loading_inside_a_meta_device_block_gives_real_buffers(spec):
    """Large-model initialization builds AND loads inside ``with torch.device("meta")``: the
    initial values of the moving statistics (and of the non-persistent buffers) were then built
    on meta themselves ("Cannot copy out of meta tensor")."""
    source = torch_bn().state_dict()  # a real checkpoint, loaded from outside the block
    with torch.device("meta"):
        layer = create(spec)
        layer.load_state_dict(source, assign=True)
    assert not any(t.is_meta for t in [*layer.parameters(), *layer.buffers()])
    for name, initial in layer.moving_buffers().items():
        assert torch.equal(getattr(layer, name), initial)
    assert torch.isfinite(layer(torch.randn(4, 8, 3, 3))).all()
