"""``bnlab.norms.freeze``/``unfreeze``: frozen statistics and/or affine parameters for every layer,
against torchvision's ``FrozenBatchNorm2d`` and timm's ``freeze_batch_norm_2d`` (the real
libraries) and against the layer's own eval mode; unfreezing restores training bitwise."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm, import_torchvision

SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "lp_bn(p=inf)", "mbn", "cbn",
         "brn", "native_bn", "torch"]


def _layer(spec: str, c: int = 4) -> nn.Module:
    return nn.BatchNorm2d(c) if spec == "torch" else N.create(spec, c)


def _net(spec: str) -> nn.Sequential:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nn.Conv2d(3, 4, 3), _layer(spec), nn.ReLU(), nn.Conv2d(4, 2, 1))
        N.set_progress(model, lr=0.01, epoch=2, epochs=3)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):  # statistics and moving statistics away from their start values
            model(torch.randn(8, 3, 6, 6, generator=g) * 2 + 1)
    return model


def _x(seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 3, 6, 6, generator=g) * 2 + 1).requires_grad_()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("spec", SPECS)
def test_frozen_statistics_train_as_the_layer_evaluates(spec):
    model = _net(spec)
    reference = copy.deepcopy(model).eval()
    N.freeze(model)
    before = _state(model)
    x, x_ref = _x(), _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = model.train()(x)
        y_ref = reference(x_ref)
    assert torch.equal(y, y_ref) and model.training and model[1].training
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert torch.equal(x.grad, x_ref.grad)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, p_ref.grad), name  # γ, β still learn (affine=False)
    after = _state(model)
    assert all(torch.equal(after[k], v) for k, v in before.items())  # no buffer moved


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "torch"])
def test_frozen_affine_only_keeps_batch_statistics(spec):
    model, reference = _net(spec), _net(spec)
    N.freeze(model, stats=False, affine=True)
    assert [p.requires_grad for p in model[1].parameters()] == [False, False]
    assert model[0].weight.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(model(_x()), reference(_x()))
    assert all(torch.equal(a, b) for a, b in zip(_state(model).values(),
                                                 _state(reference).values()))


@pytest.mark.parametrize("spec", SPECS)
def test_unfreeze_restores_training_bitwise(spec):
    """A training step after freeze → (frozen steps) → unfreeze equals one on a never-frozen copy:
    same output, gradients, parameters and buffers (noisy_bn's noise draws included)."""
    model = _net(spec)
    model[1].weight.requires_grad_(False)  # a γ the user had frozen stays frozen after unfreeze
    never = copy.deepcopy(model)
    N.freeze(model, stats=True, affine=True)
    N.freeze(model, affine=True)  # again: adds nothing, forgets nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(_x(5)).sum().backward()  # a frozen training forward and backward
        model.zero_grad(set_to_none=True)
        N.unfreeze(model)
        assert N.frozen_layers(model) == {}
        assert [p.requires_grad for p in model[1].parameters()] == [False, True]
        outputs = []
        for net in (model, never):
            opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1,
                                  momentum=0.9)
            y = net(_x())
            y.square().mean().backward()
            opt.step()
            outputs.append((y.detach(), _state(net), [p.grad for p in net.parameters()]))
    (y, state, grads), (y_ref, state_ref, grads_ref) = outputs
    assert torch.equal(y, y_ref)
    assert all(torch.equal(state[k], v) for k, v in state_ref.items())
    assert all((g is None and r is None) or torch.equal(g, r) for g, r in zip(grads, grads_ref))


def test_torch_bn_frozen_is_torchvision_frozen_batchnorm():
    tv = import_torchvision()
    bn = _net("torch")[1]
    frozen = tv.ops.misc.FrozenBatchNorm2d(4, eps=bn.eps)
    frozen.load_state_dict(bn.state_dict(), strict=False)
    N.freeze(bn, affine=True)
    x, x_ref = _x().detach().repeat(1, 2, 1, 1)[:, :4].requires_grad_(), None
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = bn.train()(x), frozen.train()(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    assert not any(p.requires_grad for p in bn.parameters())


def test_freeze_on_a_converted_timm_resnet18_is_timms_freeze_batch_norm_2d():
    """timm's ``freeze_batch_norm_2d`` finds ``nn.BatchNorm2d`` by type: on a converted model it
    freezes nothing (the reason for ours); ``N.freeze(stats, affine)`` on the converted model
    computes what timm's computes on the original."""
    timm = import_timm()
    torch.manual_seed(0)
    original = timm.create_model("resnet18", num_classes=10, pretrained=False)
    g = torch.Generator().manual_seed(0)
    original.train()(torch.randn(4, 3, 32, 32, generator=g))  # statistics away from 0, 1
    converted = N.convert(copy.deepcopy(original), "bn")
    assert timm.layers.freeze_batch_norm_2d(copy.deepcopy(converted)).state_dict().keys() \
        == converted.state_dict().keys()
    theirs = timm.layers.freeze_batch_norm_2d(original).train()
    ours = N.freeze(converted, stats=True, affine=True).train()
    assert len(N.frozen_layers(ours)) == 20
    x = torch.randn(4, 3, 32, 32, generator=g)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    trainable = {n for n, p in theirs.named_parameters() if p.requires_grad}
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == trainable


def test_frozen_models_copy_pickle_and_fold():
    model = N.freeze(_net("cbn"), affine=True)
    x = _x().detach()
    expected = model(x)
    copied = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (copied, loaded):
        assert torch.equal(other.train()(x), expected) and N.frozen_layers(other)
    folded = N.fold(model)
    assert not any(isinstance(m, N.ChannelNorm) for m in folded.modules())
    torch.testing.assert_close(folded(x), expected, rtol=1e-5, atol=1e-5)


def test_recollection_leaves_frozen_layers_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), N.create("bn", 4), nn.Conv2d(4, 4, 1),
                          N.create("mbn", 4))
    N.freeze(model[1])
    before = _state(model[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.update_bn([_x().detach()], model)
    assert all(torch.equal(v, before[k]) for k, v in model[1].state_dict().items())
    assert int(model[3].num_batches_tracked) == 1


def test_freeze_refuses_what_it_cannot_do_by_name():
    with pytest.raises(ValueError, match="nothing to freeze"):
        N.freeze(_net("bn"), stats=False)
    with pytest.raises(ValueError, match="no BatchNorm-family layer"):
        N.freeze(nn.Linear(2, 2))
    model = nn.Sequential(N.create("bn", 4), N.create("bn(track_running_stats=false)", 4))
    with pytest.raises(ValueError, match=r"^freeze\(stats=True\): 1 keep no running statistics"):
        N.freeze(model)
    assert N.frozen_layers(model) == {}  # refused before anything changed
    N.freeze(model, stats=False, affine=True)
    assert N.frozen_layers(model)["1"] == {"stats": False, "affine": True}
