"""The papers' network forms: Arora's BN on the logits (every kernel scale-invariant), Peng's Eq. 7
residual form, conv padding modes, and the padding-pattern share of a norm's input."""

import copy

import pytest
import torch
import torch.nn as nn

import bnlab.models as M


def _kernels(model):
    return [name for name, p in model.named_parameters() if name.endswith("weight")
            and p.dim() >= 2]


@pytest.mark.parametrize("name, options, shape", [
    ("mlp", {"depth": 4, "width": 16, "logit_bn": True}, (64,)),
    ("vgg_arora", {"width": 1 / 16}, (1, 16, 16)),
])
def test_every_kernel_of_aroras_models_is_scale_invariant(name, options, shape):
    """Arora et al. 2019 Eq. 2 / App. D: BN on the logits too, so scaling any kernel by c > 0 leaves
    the train-mode output unchanged (ε = 1e-12 in float64: exact up to rounding)."""
    model = M.create(name, norm="bn(eps=1e-12)", input_shape=shape, num_classes=10, seed=0,
                     **options).double()
    x = torch.randn(32, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = model.train()(x)
    kernels = _kernels(model)
    # the last layer is among them
    assert any("classifier" in k or k.startswith("layers.3") for k in kernels)
    for kernel in kernels:
        scaled = copy.deepcopy(model)
        with torch.no_grad():
            dict(scaled.named_parameters())[kernel].mul_(7.3)
        assert torch.allclose(scaled(x), ref, rtol=1e-9, atol=1e-9), kernel
    # the last BN's γ is scale-variant
    last_gamma = [n for n, p in model.named_parameters() if p.dim() == 1 and "weight" in n][-1]
    with torch.no_grad():
        dict(model.named_parameters())[last_gamma].mul_(2.0)
    assert not torch.allclose(model(x), ref)


def test_logit_bn_is_off_without_a_norm_and_by_default_for_the_mlp():
    plain = M.create("mlp", norm="none", input_shape=(8,), logit_bn=True, seed=0)
    assert isinstance(plain.layers[-1], nn.Linear) and plain.layers[-1].bias is not None
    assert isinstance(M.create("mlp", input_shape=(8,), seed=0).layers[-1], nn.Linear)
    assert not isinstance(M.create("vgg_arora", input_shape=(1, 8, 8), width=1 / 16, logit_bn=False,
                                   seed=0).classifier[-1], nn.Sequential)


@pytest.mark.parametrize("residual", ["he", "peng"])
def test_resnet20_residual_forms(residual):
    """He: act(F(x) + shortcut(x)); Peng Eq. 7: shortcut(x) + act(F(x)) — the activation before the
    sum."""
    model = M.create("resnet20", norm="bn", activation="sigmoid", input_shape=(1, 8, 8), width=0.25,
                     seed=0, residual=residual).train()
    block = model.stage1[1]
    x = torch.randn(16, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    branch = block.unit2(block.unit1(x))
    expected = torch.sigmoid(branch + x) if residual == "he" else branch + x
    assert torch.allclose(block(x), expected, atol=1e-6)
    if residual == "peng":  # the branch ends in the activation: in (0, 1) for Sigmoid
        assert float(branch.detach().min()) > 0 and float(branch.detach().max()) < 1
    with pytest.raises(ValueError, match="he, peng"):
        M.create("resnet20", input_shape=(1, 8, 8), residual="post")


def test_padding_mode_option():
    model = M.create("resnet20", input_shape=(1, 8, 8), width=0.25,
                     padding_mode="replicate", seed=0)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.padding_mode == "replicate" for c in convs)
    assert all(c.padding_mode == "replicate" for c in M.create(
        "vgg16", input_shape=(1, 8, 8), width=1 / 16, padding_mode="replicate").modules()
               if isinstance(c, nn.Conv2d))
    with pytest.raises(ValueError, match="zeros, replicate"):
        M.create("vgg16", input_shape=(1, 8, 8), padding_mode="circular")


def test_position_share_against_a_known_pattern():
    """x = p(h, w) + ε: share = Var_hw(p) / (Var_hw(p) + σ²) (here 4 / (4 + 1) = 0.8)."""
    gen = torch.Generator().manual_seed(0)
    pattern = torch.randn(1, 3, 6, 6, generator=gen, dtype=torch.float64)
    pattern = (pattern - pattern.mean(dim=(2, 3), keepdim=True)) / pattern.std(
        dim=(2, 3), correction=0, keepdim=True) * 2.0
    x = pattern + torch.randn(4000, 3, 6, 6, generator=gen, dtype=torch.float64)
    assert M.position_share(x) == pytest.approx(0.8, abs=0.01)
    assert M.position_share(
        torch.randn(4000, 3, 6, 6, generator=gen)) == pytest.approx(0.0, abs=0.01)
    assert M.position_share(torch.randn(50, 3, 1, 1, generator=gen)) == 0.0
    with pytest.raises(ValueError, match="N, C, H, W"):
        M.position_share(torch.randn(5, 3))


def test_padding_share_sees_the_zero_padding_pattern_of_small_maps():
    """BN + Sigmoid ResNet-20 on 8×8 inputs: the deepest stage's norm inputs (2×2 maps, all border)
    are almost all padding pattern with zero padding, almost none with replicate padding; the model
    is not modified."""
    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    shares = {}
    for mode in ("zeros", "replicate"):
        model = M.create("resnet20", norm="bn", activation="sigmoid", input_shape=(1, 8, 8),
                         width=0.25, seed=0, padding_mode=mode)
        before = copy.deepcopy(model.state_dict())
        shares[mode] = M.padding_share(model, x)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    deep = [k for k in shares["zeros"] if k.startswith("stage3")]
    assert deep and min(shares["zeros"][k] for k in deep) > 0.9
    assert max(shares["replicate"][k] for k in deep) < 0.2
    model = M.create("resnet20", norm="bn", activation="sigmoid", input_shape=(1, 8, 8),
                     width=0.25, seed=0)
    by_size = M.padding_share_by_size(model, x)
    assert list(by_size) == ["8×8", "4×4", "2×2"]
    assert by_size["2×2"] == pytest.approx(sum(shares["zeros"][k] for k in deep) / len(deep))
