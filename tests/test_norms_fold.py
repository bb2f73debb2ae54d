"""fold(): every eval-mode affine norm folded into its neighbour anywhere in an fx-traceable graph.

torchvision and timm are imported through tests/vision_shim.py (see its docstring).
"""

import warnings

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

import bnlab.norms as N
from tests.vision_shim import build, import_or_skip

NORM_TYPES = (N.ChannelNorm, _BatchNorm, N.ScaleInvariantBN)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def assert_same_output(a, b, x):
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "brn"])
@pytest.mark.parametrize("name", ["torchvision.resnet18", "timm.resnet18"])
def test_resnet18_folds_completely(name, spec):
    model = build(name, gen(0))
    N.convert(model, spec)
    folded, report = N.fold(model, report=True)
    assert report.unfolded == {} and len(report.folded) == 20
    assert not any(isinstance(m, NORM_TYPES) for m in folded.modules())
    assert type(folded) is type(model)  # the model's own class and forward, only its layers changed
    assert_same_output(folded, model, torch.randn(2, 3, 32, 32, generator=gen(1)))


@pytest.mark.parametrize("convert", [True, False])
def test_timm_norm_act_layers_fold_keeping_their_activation(convert):
    model = build("timm.efficientnet_b0", gen(2))
    if convert:
        N.convert(model, "bn")
    folded, report = N.fold(model, report=True)
    assert report.unfolded == {} and len(report.folded) == 49
    assert sum(isinstance(m, nn.SiLU) for m in folded.modules()) == sum(
        isinstance(m, nn.SiLU) for m in model.modules())
    assert_same_output(folded, model, torch.randn(2, 3, 32, 32, generator=gen(3)))


def test_norm_act_never_folds_into_the_next_layer():
    norm_act = import_or_skip("timm").layers.BatchNormAct2d(3, act_layer=nn.ReLU)
    model = _randomized(nn.Sequential(norm_act, nn.Conv2d(3, 2, 1)), 12)
    folded, report = N.fold(model, report=True)
    assert "folds only into the layer before it" in report.unfolded["0"]
    assert_same_output(folded, model, torch.randn(2, 3, 4, 4, generator=gen(13)))


class _Shared(nn.Module):
    """conv → norm, but the conv's output also feeds the residual sum: folding would change it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.norm = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1)
        self.norm2 = nn.BatchNorm2d(3)

    def forward(self, x):
        h = self.conv(x)
        y = self.norm(h) + h
        return self.norm2(self.conv2(y))


def _randomized(model, seed):
    g = gen(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (N.ChannelNorm, _BatchNorm)) and m.running_mean is not None:
                m.running_mean.uniform_(-1, 1, generator=g)
                m.running_var.uniform_(0.5, 2, generator=g)
                if m.weight is not None:
                    m.weight.uniform_(0.5, 2, generator=g)
                    m.bias.uniform_(-1, 1, generator=g)
    return model.eval()


def test_norm_whose_conv_output_is_shared_is_left_and_named():
    model = _randomized(_Shared(), 4)
    with pytest.warns(UserWarning, match=r"norm: .*output of 'conv' also feeds"):
        folded = N.fold(model)
    assert isinstance(folded.norm, nn.BatchNorm2d) and isinstance(folded.norm2, nn.Identity)
    assert_same_output(folded, model, torch.randn(2, 3, 5, 5, generator=gen(5)))


class _PreLinear(nn.Module):
    """norm → Linear and norm → padded conv, written in forward (no nn.Sequential)."""

    def __init__(self, spec):
        super().__init__()
        self.norm_in = N.create(spec, 3)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm_mid = N.create(spec, 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm_out = N.create(spec, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = self.norm_mid(self.conv(self.norm_in(x)))
        return self.fc(self.norm_out(self.pool(torch.relu(h)).flatten(1)))


@pytest.mark.parametrize("spec", ["bn", "cbn", "mean_only_bn"])
def test_fold_into_following_linear_and_padded_conv_refusal(spec):
    model = _randomized(_PreLinear(spec), 6)
    folded, report = N.fold(model, report=True)
    assert report.folded == {"norm_mid": "conv", "norm_out": "fc"}
    assert "norm_in" in report.unfolded and "module 'conv'" in report.unfolded["norm_in"]
    assert_same_output(folded, model, torch.randn(3, 3, 6, 6, generator=gen(7)))


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), N.create("bn", 4))
        self.extra = N.create("bn", 4)

    def forward(self, x):
        x = self.block(x)
        return self.extra(x) if x.sum() > 0 else x  # data-dependent: fx cannot trace it


def test_untraceable_forward_is_folded_child_by_child():
    model = _randomized(_Untraceable(), 8)
    folded, report = N.fold(model, report=True)
    assert "<model>" in report.untraced
    assert report.folded == {"block.1": "block.0"}
    assert "extra" in report.unfolded and "cannot trace" in report.unfolded["extra"]
    x = torch.randn(5, 4, generator=gen(9)) + 3
    assert_same_output(folded, model, x)


class _Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = N.create("bn", 4)

    def forward(self, x):
        return self.norm(self.fc(self.norm(self.fc(x))))


def test_module_called_twice_is_not_folded():
    model = _randomized(_Reused(), 10)
    folded, report = N.fold(model, report=True)
    assert report.unfolded == {"norm": "called more than once in forward"} and report.folded == {}
    assert_same_output(folded, model, torch.randn(3, 4, generator=gen(11)))


def test_batch_statistics_in_eval_are_named_and_a_clean_fold_is_silent():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, track_running_stats=False))
    _, report = N.fold(model, report=True)
    assert "track_running_stats=False" in report.unfolded["1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        N.fold(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))


@pytest.mark.parametrize("spec", ["torch", "bn", "mbn"])
def test_kept_buffers_with_tracking_off_fold_like_torchs_eval(spec):
    """track_running_stats=False with the buffers still there: torch's eval normalizes with the
    buffers (a fixed affine map), so fold must fold it, not refuse it as batch statistics."""
    norm = nn.BatchNorm1d(3) if spec == "torch" else N.create(spec, 3)
    model = nn.Sequential(nn.Linear(3, 3), norm)
    model.train()
    for i in range(3):
        model(torch.randn(16, 3, generator=gen(i)) * 2 + 1)
    norm.track_running_stats = False  # buffers kept, as torch allows
    folded, report = N.fold(model, report=True)
    assert not report.unfolded, report.unfolded
    assert_same_output(model.eval(), folded, torch.randn(8, 3, generator=gen(9)))


def test_frozen_batchnorm_folds():
    frozen = import_or_skip("torchvision").ops.misc.FrozenBatchNorm2d(4)
    g = gen(14)
    for buffer in (frozen.weight, frozen.bias, frozen.running_mean):
        buffer.uniform_(-1, 1, generator=g)
    frozen.running_var.uniform_(0.5, 2, generator=g)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), frozen, nn.ReLU()).eval()
    folded, report = N.fold(model, report=True)
    assert report.folded == {"1": "0"} and isinstance(folded[1], nn.Identity)
    assert_same_output(folded, model, torch.randn(2, 3, 5, 5, generator=gen(15)))
