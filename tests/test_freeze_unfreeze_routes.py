"""Unfreezing by every route a user takes — bnlab's ``N.unfreeze``, ``bnlab.integrations.timm``'s
``unfreeze_batch_norm_2d`` and timm's own ``timm.layers.unfreeze_batch_norm_2d`` /
``timm.utils.unfreeze`` — after freezing by bnlab's or timm's route, on a converted timm resnet18
for every spec: training then behaves exactly as in a twin never frozen (buffers, ``requires_grad``,
train-mode output and gradients, the buffers written by the next step)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.integrations.timm as bt
import bnlab.norms as N

timm = bt.timm
SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "mbn", "cbn", "brn",
         "native_bn"]
FREEZE = {"bnlab": lambda m: N.freeze(m, stats=True, affine=True),
          "bnlab-stats": lambda m: N.freeze(m),
          "integration": bt.freeze_batch_norm_2d}
UNFREEZE = {"bnlab": N.unfreeze, "integration": bt.unfreeze_batch_norm_2d,
            "timm": lambda m: timm.layers.unfreeze_batch_norm_2d(m)}


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return timm.create_model("resnet18", num_classes=10, pretrained=False)


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _train_step(model: nn.Module, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.seed_layers(model, 7)
        model.zero_grad()
        y = model.train()(x)
        y.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return y.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_training(model: nn.Module, twin: nn.Module):
    assert N.frozen_layers(model) == {}
    assert not any("Frozen" in type(m).__name__ for m in model.modules())
    assert [type(m) for m in model.modules()] == [type(m) for m in twin.modules()]
    assert {n: p.requires_grad for n, p in model.named_parameters()} \
        == {n: p.requires_grad for n, p in twin.named_parameters()}
    for a, b in zip(_train_step(model, _x(1)), _train_step(twin, _x(1))):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                assert torch.equal(a[k], b[k]), k
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("freeze_by, unfreeze_by", [("integration", "timm"), ("bnlab", "timm"),
                                                     ("integration", "integration"),
                                                     ("bnlab-stats", "bnlab"),
                                                     ("integration", "bnlab")])
def test_unfreeze_restores_training_on_a_converted_resnet18(resnet18, spec, freeze_by,
                                                             unfreeze_by):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = N.convert(copy.deepcopy(resnet18), spec)
        N.set_progress(model, lr=0.01, epoch=1, epochs=3)
        model.train()(_x(0))  # statistics away from their start values
    twin = copy.deepcopy(model)
    model = FREEZE[freeze_by](model)
    assert len(N.frozen_layers(model)) == 20
    frozen_out = _train_step(model, _x(2))  # frozen steps write no buffer
    assert all(torch.equal(frozen_out[2][k], v) for k, v in twin.state_dict().items())
    model = UNFREEZE[unfreeze_by](model)
    _assert_same_training(model, twin)


def test_timm_utils_unfreeze_after_timm_utils_freeze_and_bnlab_freeze(resnet18):
    """timm's whole-model ``freeze``/``unfreeze`` (``requires_grad`` of every parameter and its
    BatchNorm freezing) round-trips a converted model frozen with ``N.freeze`` in between."""
    from timm.utils.model import freeze, unfreeze
    model = N.convert(copy.deepcopy(resnet18), "mbn")
    twin = copy.deepcopy(model)
    freeze(model)
    N.freeze(model, stats=True, affine=False)
    unfreeze(model)
    _assert_same_training(model, twin)


def test_timm_unfreeze_still_turns_its_own_frozen_layers_into_batchnorm(resnet18):
    model = timm.layers.freeze_batch_norm_2d(copy.deepcopy(resnet18))
    back = timm.layers.unfreeze_batch_norm_2d(model)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in back.modules()) == 20
    twin = copy.deepcopy(resnet18)
    for a, b in zip(back.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a.float(), b.float()) or a.numel() == 1  # num_batches_tracked
