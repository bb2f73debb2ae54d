"""``head_norm``: the network's norm on the classifier's input (Peng et al. Fig. 1(c) read as
reaching the classifier too) for resnet20, vgg16 and torchvision's ResNets; checked against torch's
own batch norm and against the model built without it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bnlab.models as M
import bnlab.norms as N
from tests.vision_shim import import_or_skip

CASES = [("resnet20", {"width": 0.25, "residual": "peng"}, (3, 16, 16)),
         ("resnet20", {"width": 0.25, "residual": "he"}, (3, 16, 16)),
         ("vgg16", {"width": 0.125}, (3, 16, 16)),
         ("vgg16", {"width": 0.125, "fc_widths": (16,)}, (3, 16, 16))]


def final_linear(model: nn.Module) -> nn.Module:
    head = model.fc if hasattr(model, "fc") else model.classifier[-1]
    return head


def build(name, options, shape, **kw):
    return M.create(name, input_shape=shape, num_classes=7, seed=3, **options, **kw)


@pytest.mark.parametrize("name,options,shape", CASES)
def test_off_is_the_model_as_before(name, options, shape):
    default = build(name, options, shape, norm="bn")
    off = build(name, options, shape, norm="bn", head_norm=False)
    assert list(default.state_dict()) == list(off.state_dict())
    assert isinstance(final_linear(off), nn.Linear)
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(default(x), off(x))


@pytest.mark.parametrize("name,options,shape", CASES)
@pytest.mark.parametrize("norm,placement,kind", [
    ("bn", "pre_activation", N.BatchNorm),
    ("cbn(rho=0.5,amat=true)", "pre_linear", N.CompleteBatchNorm)])
def test_on_puts_the_configured_norm_in_front_of_the_classifier(name, options, shape, norm,
                                                                 placement, kind):
    off = build(name, options, shape, norm=norm, placement=placement, activation="sigmoid")
    on = build(name, options, shape, norm=norm, placement=placement, activation="sigmoid",
               head_norm=True)
    head = final_linear(on)
    assert isinstance(head, nn.Sequential) and len(head) == 2
    assert type(head[0]) is kind and isinstance(head[1], nn.Linear)
    assert head[0].num_features == head[1].in_features
    if kind is N.CompleteBatchNorm:
        assert head[0].rho == 0.5
    # every other weight is drawn as without the head norm; the classifier's too
    on_params = dict(on.named_parameters())
    for key, value in off.named_parameters():
        prefix, _, leaf = key.rpartition(".")
        renamed = key if key in on_params else f"{prefix}.1.{leaf}"
        assert torch.equal(on_params[renamed], value), key
    x = torch.randn(8, *shape, generator=torch.Generator().manual_seed(1))
    N.set_progress(on, lr=0.1)
    assert on(x).shape == (8, 7)


def test_bn_head_is_torch_batch_norm_on_the_pooled_features_in_train_and_eval():
    model = build("resnet20", {"width": 0.25}, (3, 16, 16), norm="bn", head_norm=True).train()
    pooled = {}
    model.fc[0].register_forward_hook(lambda m, inp, out: pooled.update(x=inp[0], y=out))
    x = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    logits = model(x)
    norm = model.fc[0]
    want = F.batch_norm(pooled["x"], None, None, norm.weight, norm.bias, training=True,
                        eps=norm.eps)
    torch.testing.assert_close(pooled["y"], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, model.fc[1](want), rtol=1e-5, atol=1e-5)
    # one step's running statistics: torch's update from the same pooled features
    ref_mean, ref_var = torch.zeros(norm.num_features), torch.ones(norm.num_features)
    F.batch_norm(pooled["x"], ref_mean, ref_var, training=True, momentum=norm.momentum)
    torch.testing.assert_close(norm.running_mean, ref_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.running_var, ref_var, rtol=1e-5, atol=1e-6)
    model.eval()
    model(x)
    want = F.batch_norm(pooled["x"], norm.running_mean, norm.running_var, norm.weight, norm.bias,
                        training=False, eps=norm.eps)
    torch.testing.assert_close(pooled["y"], want, rtol=1e-5, atol=1e-5)


def test_a_training_step_reaches_the_head_norm():
    model = build("resnet20", {"width": 0.25, "residual": "peng"}, (3, 16, 16),
                  norm="cbn(rho=0.5,amat=true)", placement="pre_linear", activation="sigmoid",
                  head_norm=True).train()
    N.set_progress(model, lr=0.1)
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    y = torch.arange(8) % 7
    F.cross_entropy(model(x), y).backward()
    assert model.fc[0].weight.grad.abs().sum() > 0 and model.fc[0].bias.grad.abs().sum() > 0
    assert int(model.fc[0].num_batches_tracked) == 1


def test_without_a_norm_or_with_a_wrapper():
    plain = build("resnet20", {"width": 0.25}, (3, 16, 16), norm="none", head_norm=True)
    assert isinstance(plain.fc, nn.Linear)
    with pytest.raises(ValueError, match="head_norm"):
        build("vgg16", {"width": 0.125}, (3, 16, 16), norm="wn", head_norm=True)


def test_torchvision_resnets_take_the_head_norm():
    import_or_skip("torchvision")
    off = M.create("tv_resnet18", norm="bn", input_shape=(3, 32, 32), num_classes=5, seed=0)
    on = M.create("tv_resnet18", norm="cbn(rho=2,amat=true)", placement="pre_linear",
                  input_shape=(3, 32, 32), num_classes=5, seed=0, head_norm=True)
    assert isinstance(off.fc, nn.Linear)
    assert type(on.fc[0]) is N.CompleteBatchNorm and on.fc[0].num_features == 512
    N.set_progress(on, lr=0.1)
    assert on(torch.randn(4, 3, 32, 32)).shape == (4, 5)
    assert "head_norm" in M.MODEL_INFO["tv_resnet50"].options
