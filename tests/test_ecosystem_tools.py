"""The ``_BatchNorm``-keyed tools of torch, torch.ao and timm on bnlab's layers, tool by tool
(docs/readme/tools.md has the table): what each does, and bnlab's equivalent checked against the
tool on torch's own BatchNorm."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.fx.experimental.optimization as fx_optimization
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import fusion

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm

SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "lp_bn(p=inf)", "mbn", "cbn",
         "cbn(decouple=false)", "cbn(center=false)", "brn", "native_bn"]


@pytest.fixture(scope="module")
def resnet18():
    timm = import_timm()
    torch.manual_seed(0)
    return timm.create_model("resnet18", num_classes=10, pretrained=False)


def _trained(layer: nn.Module, c: int = 4) -> nn.Module:
    """Statistics, moving statistics and β away from their start values."""
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(layer, lr=0.01, epoch=2, epochs=3)
        for _ in range(3):
            layer.train()(torch.randn(8, c, 5, 5, generator=g) * 2 + 3)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5, generator=g)
        layer.bias.uniform_(-1, 1, generator=g)
    return layer.eval()


def test_bnlab_layers_are_not_torch_batchnorm_and_the_predicate_finds_them():
    for spec in SPECS:
        layer = N.create(spec, 4)
        assert N.is_batch_norm(layer) and isinstance(layer, N.BATCH_NORMS)
        assert isinstance(layer, _BatchNorm) == (spec == "native_bn")  # torch's BN itself
    assert N.is_batch_norm(nn.BatchNorm1d(3)) and not N.is_batch_norm(nn.LayerNorm(3))


def _names(model: nn.Module, groups: list[dict]) -> list[set[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in g["params"]} for g in groups]


def _typical_rule(model: nn.Module, is_norm) -> list[dict]:
    """The rule as users write it: no weight decay on BatchNorm's parameters."""
    decay, no_decay = [], []
    for m in model.modules():
        (no_decay if is_norm(m) else decay).extend(m.parameters(recurse=False))
    return [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}]


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "brn"])
def test_no_decay_groups_on_a_converted_resnet18_are_the_torch_models(resnet18, spec):
    converted = N.convert(copy.deepcopy(resnet18), spec)
    reference = _names(resnet18, _typical_rule(resnet18, lambda m: isinstance(m, nn.BatchNorm2d)))
    # the rule written with nn.BatchNorm2d exempts nothing once converted: the reason for ours
    missed = _names(converted, _typical_rule(converted, lambda m: isinstance(m, nn.BatchNorm2d)))
    assert missed[1] == set() and len(reference[1]) == 40
    groups = N.param_groups_no_decay(converted, 5e-4)
    assert _names(converted, groups) == reference
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.0]
    torch.optim.SGD(groups, lr=0.1)  # accepted as is


def test_timm_param_groups_weight_decay_sees_bnlab_layers_as_torch_bn(resnet18):
    """timm's rule is by shape (1-D parameters and biases), so it needs no equivalent."""
    from timm.optim import param_groups_weight_decay
    converted = N.convert(copy.deepcopy(resnet18), "cbn")
    assert _names(converted, param_groups_weight_decay(converted, 1e-4)) \
        == _names(resnet18, param_groups_weight_decay(resnet18, 1e-4))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("transpose", [False, True])
def test_fuse_conv_bn_eval_for_every_layer(spec, transpose):
    torch.manual_seed(0)
    conv = (nn.ConvTranspose2d(3, 4, 3) if transpose else nn.Conv2d(3, 4, 3)).eval()
    norm = _trained(N.create(spec, 4))
    x = torch.randn(2, 3, 5, 5)
    fused = N.fuse_conv_bn_eval(conv, norm, transpose=transpose)
    torch.testing.assert_close(fused(x), norm(conv(x)), rtol=1e-5, atol=1e-5)
    assert type(fused) is type(conv) and conv.weight is not fused.weight


def test_fuse_conv_bn_eval_equals_torchs_on_torch_bn_and_torchs_formula_is_wrong_on_cbn():
    """torch's own formula (``__wrapped__``: the function before bnlab extends it) is wrong on cbn:
    the reason torch's ``fuse_conv_bn_eval`` passes bnlab's layers to bnlab's."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3).eval()
    bn = _trained(nn.BatchNorm2d(4))
    for a, b in zip((lambda f: (f.weight, f.bias))(N.fuse_conv_bn_eval(conv, bn)),
                    (lambda f: (f.weight, f.bias))(fusion.fuse_conv_bn_eval(conv, bn))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    cbn = _trained(N.create("cbn", 4))
    x = torch.randn(2, 3, 5, 5)
    off = (fusion.fuse_conv_bn_eval.__wrapped__(conv, cbn)(x) - cbn(conv(x))).abs().max()
    assert off > 0.1  # torch's formula reads running_mean/running_var as plain BN's
    torch.testing.assert_close(fusion.fuse_conv_bn_eval(conv, cbn)(x), cbn(conv(x)), rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(N.fuse_conv_bn_eval(conv, cbn)(x), cbn(conv(x)), rtol=1e-5,
                               atol=1e-5)


def test_fuse_linear_bn_eval_and_refusals():
    torch.manual_seed(0)
    linear, norm = nn.Linear(3, 4).eval(), _trained(N.create("mbn", 4), c=4)
    x = torch.randn(5, 3)
    torch.testing.assert_close(N.fuse_linear_bn_eval(linear, norm)(x), norm(linear(x)),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fusion only for eval"):
        N.fuse_linear_bn_eval(linear, norm.train())
    batch_only = N.create("bn(track_running_stats=false)", 4).eval()
    with pytest.raises(ValueError, match="cannot be fused: uses batch statistics in eval"):
        N.fuse_conv_bn_eval(nn.Conv2d(3, 4, 1).eval(), batch_only)


def test_torch_ao_and_fx_fusion_never_apply_bn_to_a_variant():
    """torch.ao's ``fuse_modules`` folds a bnlab layer with its own eval map
    (tests/test_ecosystem_fusion.py has every spec); fx's ``fuse`` and torch.ao's ``fuse_fx`` leave
    it unfused (correct outputs, no fusion): ``N.fold`` is the whole-model fusion."""
    from torch.ao.quantization.quantize_fx import fuse_fx
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _trained(N.create("cbn", 4)), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    fused = torch.ao.quantization.fuse_modules(copy.deepcopy(model), [["0", "1", "2"]])
    assert not any(isinstance(m, N.CompleteBatchNorm) for m in fused.modules())
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
    for fused in (fx_optimization.fuse(copy.deepcopy(model)), fuse_fx(copy.deepcopy(model))):
        assert any(isinstance(m, N.CompleteBatchNorm) for m in fused.modules())
        torch.testing.assert_close(fused(x), model(x))
    folded = N.fold(model)
    assert not any(isinstance(m, N.ChannelNorm) for m in folded.modules())
    torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)


def test_convert_sync_batchnorm_never_turns_a_variant_into_plain_bn(resnet18):
    for spec in ("mbn", "cbn", "brn", "lp_bn"):
        converted = N.convert(copy.deepcopy(resnet18), spec)
        kinds = [type(m) for m in converted.modules() if N.is_batch_norm(m)]
        synced = nn.SyncBatchNorm.convert_sync_batchnorm(converted)
        assert [type(m) for m in synced.modules() if N.is_batch_norm(m)] == kinds
        N.convert_sync(synced)  # bnlab's: every layer synchronizes its statistics, as itself
        layers = [m for m in synced.modules() if isinstance(m, N.ChannelNorm)]
        assert len(layers) == 20 and all(m.sync for m in layers)
        assert [type(m) for m in synced.modules() if N.is_batch_norm(m)] == kinds


def test_fuse_conv_bn_eval_on_a_converted_resnet18_stem(resnet18):
    """As a user fuses a backbone's stem by hand: torch's formula is off for cbn; torch's function
    (extended to bnlab's layers) and ours are not."""
    model = N.convert(copy.deepcopy(resnet18), "cbn")
    with torch.no_grad():  # β as training leaves it (0 at timm's initialization)
        model.bn1.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(model, lr=0.01)
        for seed in range(3):
            model.train()(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed)))
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    expected = model.bn1(model.conv1(x))
    torch.testing.assert_close(N.fuse_conv_bn_eval(model.conv1, model.bn1)(x), expected,
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fusion.fuse_conv_bn_eval(model.conv1, model.bn1)(x), expected,
                               rtol=1e-4, atol=1e-4)
    formula = fusion.fuse_conv_bn_eval.__wrapped__(model.conv1, model.bn1)
    assert (formula(x) - expected).abs().max() > 1e-2
