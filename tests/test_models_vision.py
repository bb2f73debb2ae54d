"""torchvision's ImageNet networks with bnlab norms (Peng et al. Table 5): activation swap,
pre-linear placement, Eq. 7 residual form, conversion — imported through tests/vision_shim.py."""

import sys

import pytest
import torch
import torch.nn as nn

import bnlab.models as M
import bnlab.norms as N
from bnlab.models import vision
from tests.vision_shim import import_or_skip


@pytest.fixture(scope="module")
def tv():
    return import_or_skip("torchvision")


def test_missing_torchvision_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ValueError, match="need torchvision: pip install torchvision"):
        M.create("tv_resnet18", input_shape=(3, 32, 32))


def test_bad_input_and_options(tv):
    with pytest.raises(ValueError, match=r"RGB images \(3, H, W\)"):
        M.create("tv_resnet18", input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="he, peng"):
        M.create("tv_resnet18", input_shape=(3, 8, 8), residual="none")
    with pytest.raises(ValueError, match="dropout"):
        M.create("tv_efficientnet_b0", input_shape=(3, 8, 8), dropout=0.1)


def test_bn_relu_model_is_torchvision_resnet18_converted(tv):
    """norm=bn, ReLU, pre_activation, He's form: the same function as torchvision's resnet18 (eval
    mode)."""
    torch.manual_seed(0)
    ours = M.create("tv_resnet18", norm="bn", activation="relu", input_shape=(3, 32, 32),
                    num_classes=7).eval()
    torch.manual_seed(0)
    ref = tv.models.resnet18(weights=None, num_classes=7).eval()
    assert sum(isinstance(m, N.ChannelNorm) for m in ours.modules()) == 20
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


def test_activation_swap_keeps_the_squeeze_excitation_gates(tv):
    ref = tv.models.efficientnet_b0(weights=None)
    silu = sum(isinstance(m, nn.SiLU) for m in ref.modules())
    gates = sum(isinstance(m, nn.Sigmoid) for m in ref.modules())
    model = M.create("tv_efficientnet_b0", norm="bn", activation="tanh", input_shape=(3, 32, 32))
    assert sum(isinstance(m, nn.Tanh) for m in model.modules()) == silu > 0
    assert sum(isinstance(m, (nn.SiLU, nn.ReLU)) for m in model.modules()) == 0
    assert sum(isinstance(m, nn.Sigmoid) for m in model.modules()) == gates == 16
    resnet = M.create("tv_resnet50", norm="bn", activation="sigmoid", input_shape=(3, 32, 32))
    assert not any(isinstance(m, nn.ReLU) for m in resnet.modules())


@pytest.mark.parametrize("name", ["tv_resnet18", "tv_efficientnet_b0"])
def test_pre_linear_puts_a_norm_on_every_conv_input(tv, name):
    """Peng Fig. 1(c): each BatchNorm moves in front of the convolution that fed it."""
    model = M.create(name, norm="cbn(amat=false)", activation="sigmoid", placement="pre_linear",
                     input_shape=(3, 32, 32), num_classes=5)
    normed = [m for m in model.modules() if isinstance(m, nn.Sequential) and len(m) == 2
              and isinstance(m[0], N.ChannelNorm) and isinstance(m[1], nn.Conv2d)]
    ref = getattr(tv.models, name[3:])(weights=None)
    bn_count = sum(isinstance(m, nn.BatchNorm2d) for m in ref.modules())
    assert len(normed) == bn_count == sum(isinstance(m, N.ChannelNorm) for m in model.modules())
    for pair in normed:
        assert pair[0].num_features == pair[1].in_channels and pair[1].bias is not None
    out = model(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    out.sum().backward()
    assert out.shape == (4, 5) and torch.isfinite(out).all()


def test_place_before_convs_refuses_a_norm_without_a_conv():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="cannot place norm 1 before a linear layer"):
        vision.place_before_convs(net)
    assert isinstance(net[1], nn.BatchNorm2d)  # nothing changed


def test_peng_residual_puts_the_activation_before_the_sum(tv):
    """Eq. 7: block(x) = x + δ(bn2(conv2(δ(bn1(conv1 x))))) — no activation after the sum."""
    torch.manual_seed(0)
    model = M.create("tv_resnet18", norm="bn", activation="tanh", residual="peng",
                     input_shape=(3, 16, 16)).eval()
    block = model.layer1[0]
    x = torch.randn(2, 64, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        bn1, bn2 = block.bn1[0], block.bn2[0]  # each bnK is now [norm, activation]
        assert isinstance(bn1, N.ChannelNorm) and isinstance(block.relu, nn.Identity)
        branch = torch.tanh(bn2(block.conv2(torch.tanh(bn1(block.conv1(x))))))
        torch.testing.assert_close(block(x), x + branch)
        assert (block(x).abs() > 1).any()  # He's form would squash the sum into (-1, 1)
    # torchvision adds the shortcut in place: the branch's last Tanh output must survive for the
    # backward
    model.train()(torch.randn(2, 3, 16, 16,
                              generator=torch.Generator().manual_seed(3))).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
