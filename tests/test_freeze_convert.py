"""``convert`` of torchvision's/timm's ``FrozenBatchNorm2d`` and timm's ``FrozenBatchNormAct2d``:
a frozen bnlab layer with the same outputs and input gradients as the real library's layer, the
original checkpoints still load, and ``fold`` folds it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm, import_torchvision


def _frozen_resnet18():
    """torchvision's resnet18 as detection backbones build it: ``norm_layer=FrozenBatchNorm2d``,
    with statistics and affine values away from 0, 1 (as a pretrained checkpoint has them)."""
    tv = import_torchvision()
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=10, norm_layer=tv.ops.misc.FrozenBatchNorm2d)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(torch.rand(b.shape, generator=g) * (0.5 if "mean" in name else 1) + 0.5)
    return model


@pytest.mark.parametrize("spec", ["bn", "mbn", "brn", "noisy_bn", "cbn(decouple=false)"])
def test_converted_frozen_resnet18_computes_torchvisions_outputs(spec):
    original = _frozen_resnet18().train()
    converted = N.convert(copy.deepcopy(original), spec).train()
    assert not any("Frozen" in type(m).__name__ for m in converted.modules())
    frozen = N.frozen_layers(converted)
    assert len(frozen) == 20 and all(v == {"stats": True, "affine": True} for v in frozen.values())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 32, 32, generator=g)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = converted(x1)
    y_ref = original(x2)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-4)
    norm_params = [p for m in converted.modules() if isinstance(m, N.ChannelNorm)
                   for p in m.parameters(recurse=False)]
    assert norm_params and not any(p.requires_grad for p in norm_params)
    converted.load_state_dict(original.state_dict())  # a FrozenBatchNorm2d checkpoint loads


def test_spec_whose_eval_map_differs_becomes_a_frozen_bn_and_says_so():
    tv = import_torchvision()
    layer = tv.ops.misc.FrozenBatchNorm2d(4)
    with torch.no_grad():
        layer.bias.fill_(0.5)  # cbn's β sits inside the normalized quantity
    model = nn.Sequential(layer)
    with pytest.warns(UserWarning, match=r"frozen '0' becomes a frozen 'bn' layer, not 'cbn'"):
        N.convert(model, "cbn")
    assert type(model[0]) is N.BatchNorm and N.frozen_layers(model)


def test_timm_frozen_norm_act_keeps_its_activation():
    timm = import_timm()
    layer = timm.layers.FrozenBatchNormAct2d(4, act_layer=nn.SiLU)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b in layer.buffers():
            b.copy_(torch.rand(4, generator=g) + 0.5)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), layer)
    reference = copy.deepcopy(model)
    N.convert(model, "mbn")
    assert isinstance(model[1], N.NormAct) and isinstance(model[1].act, nn.SiLU)
    x = torch.randn(2, 3, 6, 6, generator=g)
    torch.testing.assert_close(model.train()(x), reference.train()(x), rtol=1e-5, atol=1e-5)
    folded = N.fold(model)  # the frozen layer folds into the convolution, its SiLU stays
    assert not any(isinstance(m, N.ChannelNorm) for m in folded.modules())
    torch.testing.assert_close(folded(x), reference(x), rtol=1e-5, atol=1e-5)


def test_timm_freeze_then_convert_round_trip():
    """timm's ``freeze_batch_norm_2d`` on a torch model, then ``convert``: frozen bnlab layers with
    timm's outputs; ``unfreeze`` gives trainable ones."""
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10, pretrained=False)
    model.train()(torch.randn(4, 3, 32, 32))
    frozen = timm.layers.freeze_batch_norm_2d(model).train()
    converted = N.convert(copy.deepcopy(frozen), "bn").train()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(converted(x), frozen(x), rtol=1e-5, atol=1e-5)
    N.unfreeze(converted)
    assert all(p.requires_grad for p in converted.parameters())
