"""Architecture facts, initialization, fold, reproducibility and errors of bnlab.models."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

import bnlab.models as M
import bnlab.norms as N



def weight_layers(model):
    return [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---- architectures -------------------------------------------------------------------------------

def test_resnet20_has_20_weight_layers_and_the_known_parameter_count():
    model = M.create("resnet20", norm="bn")
    layers = weight_layers(model)
    assert sum(isinstance(m, nn.Conv2d) for m in layers) == 19
    assert sum(isinstance(m, nn.Linear) for m in layers) == 1
    # He et al. 2016 Table 6: 0.27M. Exactly: convs 432 + 6·2304 + (4608 + 5·9216) + (18432 +
    # 5·36864) = 267,696; BN γ, β 2·(16 + 6·16 + 6·32 + 6·64) = 1,376; fc 64·10 + 10 = 650.
    assert n_params(model) == 269_722
    assert [m.out_channels for m in layers[:-1]] == [16] * 7 + [32] * 6 + [64] * 6
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resnet20_width_multiplier_and_option_a_shortcuts():
    model = M.create("resnet20", width=0.5)
    assert [m.out_channels for m in weight_layers(model)[:-1]] == [8] * 7 + [16] * 6 + [32] * 6
    shortcuts = [m for m in model.modules() if isinstance(m, M.ZeroPadShortcut)]
    assert len(shortcuts) == 2  # the first block of stages 2 and 3
    x = torch.randn(2, 8, 6, 6)
    y = shortcuts[0](x)
    assert y.shape == (2, 16, 3, 3)
    # identity on the subsampled input, zeros in the padded channels
    torch.testing.assert_close(y[:, 4:12], x[:, :, ::2, ::2])
    assert y[:, :4].abs().sum() == 0 and y[:, 12:].abs().sum() == 0


def test_resnet_pre_linear_blocks_normalize_the_block_input_not_the_shortcut():
    torch.manual_seed(0)
    model = M.create("resnet20", norm="bn", placement="pre_linear",
                     input_shape=(3, 8, 8), width=0.25)
    block = model.stage1[1]
    assert isinstance(block.unit1[0], N.ChannelNorm) and isinstance(block.unit1[1], nn.Conv2d)
    # Zeroing the residual branch leaves act(shortcut(x)) = act(x): the shortcut skips the norm.
    with torch.no_grad():
        block.unit2[1].weight.zero_()
        block.unit2[1].bias.zero_()
    x = torch.randn(4, 4, 8, 8)
    torch.testing.assert_close(block(x), torch.relu(x))


def test_vgg_layer_counts_and_sizes_on_cifar():
    arora = M.create("vgg_arora", width=0.125)
    convs = [m for m in weight_layers(arora) if isinstance(m, nn.Conv2d)]
    fcs = [m for m in weight_layers(arora) if isinstance(m, nn.Linear)]
    # Arora App. D: 2×conv64, 3×conv128, 3×conv256, 3×conv512, 3×conv512, fc512, fc10 (here ×1/8).
    assert [c.out_channels for c in convs] == [8] * 2 + [16] * 3 + [32] * 3 + [64] * 6
    assert [(f.in_features, f.out_features) for f in fcs] == [(64, 64), (64, 10)]
    assert sum(isinstance(m, nn.MaxPool2d) for m in arora.modules()) == 5

    vgg16 = M.create("vgg16")
    assert sum(isinstance(m, nn.Conv2d) for m in vgg16.modules()) == 13
    assert [f.in_features for f in weight_layers(vgg16) if isinstance(f, nn.Linear)] == [512]
    big = M.create("vgg16", fc_widths=(512, 512), width=0.25)
    assert len(weight_layers(big)) == 16  # 13 conv + fc512 + fc512 + fc10, widths ×1/4
    santurkar = M.create("vgg_santurkar", width=0.25)
    assert sum(isinstance(m, nn.Conv2d) for m in santurkar.modules()) == 8
    assert sum(isinstance(m, nn.Linear) for m in santurkar.modules()) == 3


def test_luo_cnn_matches_section_5():
    model = M.create("luo_cnn")
    layers = weight_layers(model)
    assert [m.out_channels for m in layers if isinstance(m, nn.Conv2d)] == [32, 32, 64, 64]
    # one 2×2 pool on a 32×32 input with size-preserving 3×3 convs: 64·16·16 inputs to fc512
    assert [(m.in_features, m.out_features) for m in layers
            if isinstance(m, nn.Linear)] == [(16384, 512), (512, 10)]


@pytest.mark.parametrize("name", ["vgg_santurkar", "vgg_arora", "vgg16"])
def test_small_inputs_limit_the_pooling_stages(name):
    model = M.create(name, input_shape=(1, 8, 8), width=0.0625, num_classes=7)
    # 8 → 4 → 2 → 1: three pools fit, the later ones are skipped
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 3
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 7)
    assert weight_layers(model)[-1].out_features == 7


def test_dln_is_a_product_of_bias_free_matrices():
    torch.manual_seed(0)
    model = M.create("dln", norm="none", input_shape=(10,))
    layers = weight_layers(model)
    assert len(layers) == 25 and all(m.weight.shape == (10, 10) and m.bias is None for m in layers)
    assert model.spec["activation"] == "identity"
    x, y = torch.randn(5, 10), torch.randn(5, 10)
    torch.testing.assert_close(model(2 * x - 3 * y), 2 * model(x) - 3 * model(y),
                               atol=1e-5, rtol=1e-4)
    product = layers[0].weight
    for m in layers[1:]:
        product = m.weight @ product
    torch.testing.assert_close(model(x), x @ product.T, atol=1e-5, rtol=1e-4)
    with_bn = M.create("dln", norm="bn", input_shape=(10,))
    assert sum(isinstance(m, N.ChannelNorm) for m in with_bn.modules()) == 24


def test_perceptron_is_one_normalized_unit():
    torch.manual_seed(0)
    model = M.create("perceptron", norm="bn", activation="identity",
                     input_shape=(50,), num_classes=1)
    (layer,) = weight_layers(model)
    assert layer.weight.shape == (1, 50) and layer.bias is None
    out = model(torch.randn(256, 50) * 3 + 1).squeeze(1)
    # BN in training mode with γ = 1, β = 0: zero batch mean, unit (biased) batch variance
    assert abs(out.mean().item()) < 1e-5
    assert abs(out.var(unbiased=False).item() - 1) < 1e-3
    plain = M.create("perceptron", norm="none", activation="tanh", input_shape=(4,), num_classes=1)
    x = torch.randn(3, 4)
    lin = weight_layers(plain)[0]
    torch.testing.assert_close(plain(x), torch.tanh(lin(x)))


def test_norm_layers_have_readable_paths_and_spec_is_recorded():
    model = M.create("luo_cnn", norm="bn", input_shape=(1, 8, 8), width=0.25, num_classes=4)
    paths = [n for n, m in model.named_modules() if isinstance(m, N.ChannelNorm)]
    assert paths == ["features.0.1", "features.1.1", "features.2.1", "features.3.1",
                     "classifier.0.1"]
    resnet = M.create("resnet20", norm="cbn", placement="pre_linear",
                      input_shape=(3, 8, 8), width=0.25)
    paths = [n for n, m in resnet.named_modules() if isinstance(m, N.ChannelNorm)]
    # Peng Fig. 2: layer#2 = stage1.0
    assert paths[:3] == ["stem.0", "stage1.0.unit1.0", "stage1.0.unit2.0"]
    assert paths[7] == "stage2.0.unit1.0" and paths[13] == "stage3.0.unit1.0"  # layer#8, layer#14
    assert model.spec == dict(name="luo_cnn", norm="bn", activation="relu",
                              placement="pre_activation", input_shape=(1, 8, 8), num_classes=4,
                              init="glorot", seed=None, dropout=0.0, width=0.25)


@pytest.mark.parametrize("norm,has_bias", [("bn", False), ("mean_only_bn", False), ("cbn", False),
                                           ("var_only_bn", True), ("none", True), ("wn", True),
                                           ("wn+mean_only_bn", False), ("si_bn", False)])
def test_bias_only_where_the_norm_does_not_remove_the_mean(norm, has_bias):
    model = M.create("mlp", norm=norm, input_shape=(5,), depth=3, width=4)
    hidden = weight_layers(model)[:-1]
    assert all((m.bias is not None) == has_bias for m in hidden)
    if norm != "si_bn":  # after the activation the bias is not redundant
        pre_linear = M.create("mlp", norm=norm, placement="pre_linear", input_shape=(5,),
                              depth=3, width=4)
        assert all(m.bias is not None for m in weight_layers(pre_linear))


# ---- initialization and reproducibility ----------------------------------------------------------

def test_glorot_uniform_init_variance_and_bound():
    torch.manual_seed(0)
    model = M.create("mlp", norm="none", input_shape=(400,), depth=2, width=300)
    w = weight_layers(model)[0].weight
    fan_in, fan_out = 400, 300
    # Glorot & Bengio 2010: U(−a, a), a = √(6/(fan_in+fan_out)), variance 2/(fan_in+fan_out).
    # 120,000 draws: the sample variance of a uniform has relative sd √(0.8/n) ≈ 0.26%; allow 2%.
    assert w.var().item() == pytest.approx(2 / (fan_in + fan_out), rel=0.02)
    assert w.abs().max().item() <= math.sqrt(6 / (fan_in + fan_out))
    assert w.abs().max().item() > 0.99 * math.sqrt(6 / (fan_in + fan_out))
    assert (weight_layers(model)[0].bias == 0).all()
    # 32 → 64, 3×3
    conv = [m for m in weight_layers(M.create("luo_cnn")) if isinstance(m, nn.Conv2d)][2]
    assert conv.weight.var().item() == pytest.approx(2 / ((32 + 64) * 9), rel=0.03)  # 18,432 draws


def test_kaiming_init_variance_and_bad_init():
    torch.manual_seed(0)
    model = M.create("mlp", norm="bn", input_shape=(400,), depth=2, width=300, init="kaiming")
    w = weight_layers(model)[0].weight
    # He et al. 2015: N(0, 2/fan_in). Normal sample variance has relative sd √(2/n) ≈ 0.4%; allow
    # 2%.
    assert w.var().item() == pytest.approx(2 / 400, rel=0.02)
    assert w.abs().max().item() > math.sqrt(6 / 700)  # not the bounded Glorot uniform
    with pytest.raises(ValueError, match="glorot"):
        M.create("mlp", init="orthogonal")


def test_weight_norm_starts_from_the_initialized_weight():
    torch.manual_seed(0)
    model = M.create("mlp", norm="wn", input_shape=(400,), depth=2, width=300)
    wn = next(m for m in model.modules() if isinstance(m, N.WeightNorm))
    assert wn.layer.weight.var().item() == pytest.approx(2 / 700, rel=0.02)


def test_global_seed_and_seed_option_reproduce_the_weights():
    def state(**kw):
        return M.create("resnet20", width=0.25, input_shape=(3, 8, 8), **kw).state_dict()

    torch.manual_seed(3)
    a = state()
    torch.manual_seed(3)
    b = state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rng = torch.get_rng_state()
    c, d, e = state(seed=5), state(seed=5), state(seed=6)
    assert torch.equal(torch.get_rng_state(), rng)  # seed=... leaves the global RNG alone
    assert all(torch.equal(c[k], d[k]) for k in c)
    assert not torch.equal(c["stem.0.weight"], e["stem.0.weight"])
    noisy = [M.create("mlp", norm="noisy_bn", input_shape=(3,), seed=9) for _ in range(2)]
    x = torch.randn(6, 3)
    torch.testing.assert_close(noisy[0](x), noisy[1](x))  # the noise generators are seeded too


# ---- fold ----------------------------------------------------------------------------------------

def trained_eval(model, shape, seed=0):
    """Non-trivial γ, β and running statistics (three training batches), then eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, N.ChannelNorm) and m.affine:
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.normal_(0, 0.3, generator=g)
    N.set_progress(model, lr=0.05, epoch=2, epochs=4)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, *shape, generator=g) * 2 + 0.5)
    return model.eval()


FOLD_MODELS = {"mlp": ((5,), dict(depth=4, width=16)), "resnet20": ((3, 16, 16), dict(width=0.25)),
               "luo_cnn": ((1, 8, 8), dict(width=0.25)),
               "vgg_santurkar": ((3, 16, 16), dict(width=0.0625))}


@pytest.mark.parametrize("norm", ["bn", "cbn", "mbn", "brn", "mean_only_bn", "var_only_bn"])
@pytest.mark.parametrize("name", list(FOLD_MODELS))
def test_fold_gives_equal_outputs(name, norm):
    shape, options = FOLD_MODELS[name]
    torch.manual_seed(0)
    model = trained_eval(
        M.create(name, norm=norm, activation="tanh", input_shape=shape, **options), shape)
    folded = N.fold(model)
    assert not any(isinstance(m, N.ChannelNorm) for m in folded.modules())
    x = torch.randn(16, *shape) * 2 + 0.5
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["bn", "cbn"])
def test_fold_pre_linear_mlp_folds_into_the_next_layer(norm):
    torch.manual_seed(0)
    model = trained_eval(
        M.create("mlp", norm=norm, placement="pre_linear", input_shape=(5,), depth=4, width=16),
        (5,))
    folded = N.fold(model)
    assert not any(isinstance(m, N.ChannelNorm) for m in folded.modules())
    x = torch.randn(16, 5)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)


# ---- errors --------------------------------------------------------------------------------------

def test_clear_value_errors():
    with pytest.raises(ValueError, match="valid models: vgg_santurkar.*perceptron"):
        M.create("alexnet")
    with pytest.raises(ValueError, match="valid activations: relu, sigmoid, tanh, selu, swish, "
                                         "softplus, identity"):
        M.create("mlp", activation="gelu")
    with pytest.raises(ValueError, match="valid placements: pre_activation, pre_linear"):
        M.create("mlp", placement="post_activation")
    with pytest.raises(ValueError, match="valid options: depth, width"):
        M.create("mlp", input_shape=(4,), momentum=0.5)
    with pytest.raises(ValueError, match="valid options: width$|valid options: width "):
        M.create("luo_cnn", depth=3)
    with pytest.raises(ValueError, match="width"):
        M.create("luo_cnn", width=0)
    with pytest.raises(ValueError, match="depth"):
        M.create("mlp", depth=1)
    with pytest.raises(ValueError, match="integer"):
        M.create("mlp", width=0.5)
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        M.create("resnet20", input_shape=(10,))
    with pytest.raises(ValueError, match="num_classes"):
        M.create("mlp", num_classes=0)
    with pytest.raises(ValueError, match="input_shape"):
        M.create("mlp", input_shape=(3, 0))
    with pytest.raises(ValueError, match="si_bn"):
        M.create("vgg16", norm="si_bn", placement="pre_linear")


@pytest.mark.parametrize("spec", ["batchnorm", "bn(rho=2)", "cbn(rho=-1)", "mean_only_bn+wn"])
def test_bad_norm_spec_raises_the_norms_error(spec):
    with pytest.raises(ValueError) as expected:
        N.validate(spec)
    with pytest.raises(ValueError) as got:
        M.create("mlp", norm=spec)
    assert str(got.value) == str(expected.value)


def test_every_builder_is_create():
    for name, builder in M.MODELS.items():
        if name.startswith("tv_"):  # torchvision's RGB networks: tests/test_models_vision.py
            continue
        info = M.MODEL_INFO[name]
        shape = (1, 8, 8) if info.images_only else (6,)
        small = {"width": 0.0625} if isinstance(info.options.get("width"), float) else {}
        torch.manual_seed(0)
        a = builder(input_shape=shape, **small).state_dict()
        torch.manual_seed(0)
        b = M.create(name, input_shape=shape, **small).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_models_list():
    from bnlab.cli import app

    result = CliRunner().invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    for name in M.MODELS:
        assert name in result.output
    assert "Arora" in result.output and "width=1.0" in result.output
