"""convert(): every BatchNorm a user has, torch's options carried over, norm-act layers, refusals.

torchvision and timm are imported through tests/vision_shim.py (see its docstring for why and how).
"""

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

import bnlab.norms as N
from tests.vision_shim import VISION_MODELS, build, import_or_skip


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", VISION_MODELS)
def test_convert_bn_keeps_eval_output_of_vision_models(name):
    model = build(name, gen(0))
    x = torch.randn(2, 3, 32, 32, generator=gen(1))
    with torch.no_grad():
        before = model(x)
        keys = list(model.state_dict())
        N.convert(model, "bn")
        after = model(x)
    assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    # checkpoints of the original model still load
    assert sorted(model.state_dict()) == sorted(keys)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_timm_norm_act_keeps_activation_and_drop_path():
    timm = import_or_skip("timm")
    layer = timm.layers.BatchNormAct2d(6, act_layer=nn.SiLU, drop_layer=lambda: nn.Dropout(0.5))
    with torch.no_grad():
        layer.running_mean.uniform_(-1, 1, generator=gen(2))
        layer.bias.uniform_(-1, 1, generator=gen(3))
    layer.eval()
    original_state = copy.deepcopy(layer.state_dict())
    x = torch.randn(4, 6, 5, 5, generator=gen(4))
    expected = layer(x)
    new = N.convert(layer, "bn")
    assert isinstance(new, N.NormAct) and isinstance(new.norm, N.BatchNorm)
    assert isinstance(new.act, nn.SiLU) and isinstance(new.drop, nn.Dropout)
    torch.testing.assert_close(new(x), expected)
    fresh = N.convert(timm.layers.BatchNormAct2d(6, act_layer=nn.SiLU), "bn")
    fresh.load_state_dict(original_state)  # strict: the same names as timm's layer
    torch.testing.assert_close(fresh.eval()(x), expected)
    new.train()
    torch.manual_seed(0)
    dropped = new(x)
    assert (dropped == 0).float().mean() > 0.3  # the drop path still acts in training


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.BatchNorm1d(5), (8, 5)),
    (lambda: nn.BatchNorm1d(5), (8, 5, 3)),
    (lambda: nn.BatchNorm2d(5), (8, 5, 3, 3)),
    (lambda: nn.BatchNorm3d(5), (8, 5, 2, 2, 2)),
    (lambda: nn.SyncBatchNorm(5), (8, 5, 3, 3)),
    (lambda: nn.LazyBatchNorm2d(), (8, 5, 3, 3)),
])
def test_every_torch_batchnorm_is_converted(make, shape):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Identity(), make())
    for seed in range(3):
        model(torch.randn(*shape, generator=gen(seed)) * 2 + 1)  # also initializes the lazy layer
    model.eval()
    x = torch.randn(*shape, generator=gen(7))
    expected = model(x)
    N.convert(model, "bn")
    assert isinstance(model[1], N.BatchNorm) and not model[1].training
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_uninitialized_lazy_batchnorm_is_refused():
    with pytest.raises(ValueError, match="uninitialized lazy BatchNorm.*forward pass"):
        N.convert(nn.Sequential(nn.LazyBatchNorm2d()), "bn")


class _ScaledBN(nn.BatchNorm2d):
    def forward(self, x):
        return 2 * super().forward(x)


class _DefaultsBN(nn.BatchNorm2d):
    """Only changes a default: BatchNorm's own forward, so convert keeps its behaviour."""

    def __init__(self, c):
        super().__init__(c, eps=1e-3, momentum=0.01)


def test_batchnorm_subclass_with_own_behaviour_is_refused_by_name():
    model = nn.Sequential(nn.BatchNorm2d(4), nn.Sequential(_ScaledBN(4)))
    with pytest.raises(ValueError, match=r"'1\.0'.*_ScaledBN.*own forward"):
        N.convert(model, "bn")
    assert isinstance(model[0], nn.BatchNorm2d)  # refused before anything changed
    timm = import_or_skip("timm")
    with pytest.raises(ValueError, match="SplitBatchNorm2d"):
        N.convert(nn.Sequential(timm.layers.SplitBatchNorm2d(4, num_splits=2)), "bn")


def test_subclass_that_only_changes_defaults_is_converted_with_them():
    layer = N.convert(nn.Sequential(_DefaultsBN(4)), "bn")[0]
    assert isinstance(layer, N.BatchNorm) and layer.eps == 1e-3 and layer.momentum == 0.01


@pytest.mark.parametrize("options", [dict(momentum=None), dict(track_running_stats=False),
                                     dict(affine=False), dict(eps=1e-2, momentum=0.3)])
@pytest.mark.parametrize("spec", ["bn", "native_bn"])
def test_torch_options_keep_torch_semantics(spec, options):
    """After 4 training batches and in eval, the converted layer equals torch's with the same
    options."""
    torch_bn = nn.BatchNorm2d(3, **options)
    ours = N.convert(copy.deepcopy(torch_bn), spec)
    for key, value in options.items():
        assert getattr(ours, key) == value
    assert (ours.weight is None) == (not torch_bn.affine)
    assert (ours.running_mean is None) == (not torch_bn.track_running_stats)
    for seed in range(4):
        x = torch.randn(6, 3, 4, 4, generator=gen(seed)) * 3 + seed
        torch.testing.assert_close(ours(x), torch_bn(x), atol=1e-5, rtol=1e-5)
    ours.eval(), torch_bn.eval()
    x = torch.randn(6, 3, 4, 4, generator=gen(9)) + 2
    torch.testing.assert_close(ours(x), torch_bn(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "spec", ["mean_only_bn", "var_only_bn", "mbn", "cbn", "brn", "lp_bn", "noisy_bn"])
def test_options_reach_every_layer(spec):
    source = nn.Sequential(nn.BatchNorm2d(3, momentum=None, affine=False, eps=1e-3))
    layer = N.convert(source, spec)[0]
    assert layer.momentum is None and layer.weight is None and layer.eps == 1e-3
    untracked = N.convert(nn.Sequential(nn.BatchNorm2d(3, track_running_stats=False)), spec)[0]
    assert untracked.track_running_stats is False and untracked.running_mean is None


def test_explicit_spec_values_win_over_the_torch_layer():
    layer = N.convert(nn.BatchNorm2d(3, momentum=0.3, eps=1e-3), "bn(momentum=0.01)")
    assert layer.momentum == 0.01 and layer.eps == 1e-3


def test_convert_follows_dtype_and_rejects_combined_specs():
    layer = N.convert(nn.BatchNorm2d(3).double(), "bn")
    assert layer.weight.dtype == torch.float64
    with pytest.raises(ValueError, match="normalized"):
        N.convert(nn.BatchNorm2d(3), "wn+mean_only_bn")
    with pytest.raises(ValueError, match="valid names"):
        N.convert(nn.BatchNorm2d(3), "nope")


def test_sync_batchnorm_becomes_a_synchronized_layer():
    synced = N.convert(nn.Sequential(nn.SyncBatchNorm(4), nn.BatchNorm2d(4)), "cbn")
    assert synced[0].sync is True and synced[1].sync is False


def test_the_torchvision_placeholders_live_in_one_library_module():
    """Only bnlab/models/vision_compat.py (the public helper tests/vision_shim.py uses) may define
    placeholder torchvision operators, and only when asked: no other module imports it but the
    adapters whose import needs torchvision (Lightning's torchmetrics imports it)."""
    package = Path(N.__file__).resolve().parent.parent
    defines = [p.relative_to(package).as_posix() for p in package.rglob("*.py")
               if re.search(r"Library\(\s*[\"']torchvision", p.read_text())]
    assert defines == ["models/vision_compat.py"]
    importers = [p.relative_to(package).as_posix() for p in package.rglob("*.py")
                 if "vision_compat" in p.read_text()
                 and p.name not in ("vision_compat.py", "vision.py")]
    assert sorted(importers) == ["integrations/lightning.py", "integrations/timm.py"]


def test_frozen_batchnorm_becomes_a_frozen_bnlab_layer():
    """(tests/test_freeze_convert.py checks the outputs against torchvision's and timm's.)"""
    torchvision = import_or_skip("torchvision")
    model = nn.Sequential(torchvision.ops.misc.FrozenBatchNorm2d(4), nn.BatchNorm2d(4))
    N.convert(model, "bn")
    assert isinstance(model[0], N.BatchNorm) and isinstance(model[1], N.BatchNorm)
    assert N.frozen_layers(model) == {"0": {"stats": True, "affine": True}}


@pytest.mark.parametrize("spec", ["bn", "cbn", "mbn", "brn", "lp_bn", "native_bn"])
def test_convert_keeps_the_parameters_themselves_as_torch_convert_sync_does(spec):
    """Fine-tuning freezes BN's γ/β (``requires_grad_(False)``); torch's
    ``nn.SyncBatchNorm.convert_sync_batchnorm`` hands the new layer the same Parameter objects, so
    they stay frozen and an optimizer built before the conversion still updates them. ``convert``
    used to build fresh ones: a frozen γ silently trained again."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    bn.weight.requires_grad_(False)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), bn)
    reference = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    weight, bias = bn.weight, bn.bias
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = N.convert(model, spec)
    layer = converted[1]
    assert layer.weight is weight and layer.bias is bias
    assert [p.requires_grad for p in layer.parameters()] == [
        p.requires_grad for p in reference[1].parameters()] == [False, True]
    converted(torch.randn(4, 3, 8, 8)).square().sum().backward()
    before = bias.detach().clone()
    optimizer.step()
    assert not torch.equal(bias, before) and weight.grad is None
