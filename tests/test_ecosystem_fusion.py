"""torch's own fusion functions on bnlab's layers, against the unfused eval model: torch.ao's
``fuse_modules`` (conv-bn, conv-bn-relu, linear-bn) and ``torch.nn.utils.fusion.
fuse_conv_bn_eval``/``fuse_linear_bn_eval`` fold every variant with its own eval map (cbn via its
inference affine) to float32 tolerance, on a conv-bn pair and on a converted timm resnet18;
quantization-aware fusion is refused by name; torch.fx's ``fuse`` leaves the layers unfused with
the model's outputs (``bnlab.norms.fold`` is the whole-model fusion)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.fx.experimental.optimization as fx_optimization
import torch.nn as nn
from torch.ao.quantization import fuse_modules, fuse_modules_qat
from torch.nn.utils import fusion

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm

SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "lp_bn(p=inf)", "mbn", "cbn",
         "cbn(decouple=false)", "cbn(center=false)", "brn", "native_bn"]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _trained(model: nn.Module, shape: tuple[int, ...], seed: int = 0) -> nn.Module:
    """Statistics, moving statistics and the affine parameters away from their start values."""
    g = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(model, lr=0.01, epoch=2, epochs=3)
        for _ in range(3):
            model.train()(torch.randn(*shape, generator=g) * 2 + 1)
    with torch.no_grad():
        for m in model.modules():
            if N.is_batch_norm(m):
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-1, 1, generator=g)
    return model.eval()


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_ao_fuse_modules_folds_every_layer(spec):
    torch.manual_seed(0)
    model = _trained(nn.Sequential(nn.Conv2d(3, 4, 3), N.create(spec, 4), nn.ReLU()), (8, 3, 6, 6))
    x = _x(2, 3, 6, 6)
    for pattern in (["0", "1"], ["0", "1", "2"]):
        fused = fuse_modules(copy.deepcopy(model), [pattern])
        assert not any(N.is_batch_norm(m) for m in fused.modules())
        torch.testing.assert_close(fused(x), model(x), **TOL)
    linear = _trained(nn.Sequential(nn.Linear(3, 4), N.create(spec, 4)), (16, 3))
    fused = fuse_modules(copy.deepcopy(linear), [["0", "1"]])
    assert isinstance(fused[0], nn.Linear) and isinstance(fused[1], nn.Identity)
    torch.testing.assert_close(fused(_x(5, 3)), linear(_x(5, 3)), **TOL)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_fuse_conv_bn_eval_folds_every_layer(spec, transpose):
    torch.manual_seed(0)
    conv = nn.ConvTranspose2d(3, 4, 3) if transpose else nn.Conv2d(3, 4, 3)
    model = _trained(nn.Sequential(conv, N.create(spec, 4)), (8, 3, 5, 5))
    x = _x(2, 3, 5, 5)
    fused = fusion.fuse_conv_bn_eval(model[0], model[1], transpose=transpose)
    torch.testing.assert_close(fused(x), model(x), **TOL)
    fused = torch.nn.utils.fuse_conv_bn_eval(model[0], model[1], transpose)
    torch.testing.assert_close(fused(x), model(x), **TOL)
    linear = _trained(nn.Sequential(nn.Linear(3, 4), N.create(spec, 4)), (16, 3))
    torch.testing.assert_close(fusion.fuse_linear_bn_eval(linear[0], linear[1])(_x(5, 3)),
                               linear(_x(5, 3)), **TOL)


def test_torch_layers_still_reach_torchs_own_code():
    """On torch's BatchNorm the functions are torch's, bit for bit."""
    torch.manual_seed(0)
    model = _trained(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), (8, 3, 5, 5))
    ours = fusion.fuse_conv_bn_eval(model[0], model[1])
    theirs = fusion.fuse_conv_bn_eval.__wrapped__(model[0], model[1])
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    fused = fuse_modules(copy.deepcopy(model), [["0", "1"]])
    assert torch.equal(fused[0].weight, theirs.weight)


def test_quantization_aware_fusion_and_training_mode_are_refused_by_name():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), N.create("cbn", 4), nn.ReLU())
    with pytest.raises(ValueError, match="CompleteBatchNorm cannot be fused for quantization"):
        fuse_modules_qat(copy.deepcopy(model).train(), [["0", "1"]])
    with pytest.raises(ValueError, match="fusion only for eval"):
        fuse_modules(copy.deepcopy(model).train(), [["0", "1"]])
    batch_only = nn.Sequential(nn.Conv2d(3, 4, 3), N.create("bn(track_running_stats=false)", 4))
    with pytest.raises(ValueError, match="uses batch statistics in eval"):
        fuse_modules(batch_only.eval(), [["0", "1"]])


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "cbn(decouple=false)", "var_only_bn", "brn",
                                  "lp_bn"])
def test_fusion_on_a_converted_timm_resnet18(spec):
    timm = import_timm()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = N.convert(timm.create_model("resnet18", num_classes=10), spec)
    model = _trained(model, (8, 3, 32, 32))
    pairs = [["conv1", "bn1", "act1"]] + [
        [f"{name}.conv{i}", f"{name}.bn{i}"] for name, m in model.named_modules()
        if name.startswith("layer") and name.count(".") == 1 for i in (1, 2)] + [
        [f"layer{k}.0.downsample.0", f"layer{k}.0.downsample.1"] for k in (2, 3, 4)]
    assert len(pairs) == 20  # every norm layer of resnet18
    x = _x(2, 3, 32, 32)
    fused = fuse_modules(copy.deepcopy(model), pairs)
    assert not any(N.is_batch_norm(m) for m in fused.modules())
    torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-4)
    by_torch = copy.deepcopy(model)
    by_torch.conv1 = fusion.fuse_conv_bn_eval(model.conv1, model.bn1)
    by_torch.bn1 = nn.Identity()
    torch.testing.assert_close(by_torch(x), model(x), rtol=1e-4, atol=1e-4)
    fx_fused = fx_optimization.fuse(copy.deepcopy(model))  # finds nn.BatchNorm2d by type only
    assert sum(N.is_batch_norm(m) for m in fx_fused.modules()) == 20
    torch.testing.assert_close(fx_fused(x), model(x))
    folded = N.fold(copy.deepcopy(model))
    assert not any(N.is_batch_norm(m) for m in folded.modules())
    torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-4)
