"""Every model × every norm × every activation × both placements builds and trains a step on CPU.

Full product for the fully connected models (mlp, dln, perceptron); for each conv net a cycle
through the norms in which every norm and every activation, and both placements, appear.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import bnlab.models as M
import bnlab.norms as N
from bnlab.norms.registry import REGISTRY, lookup

# Every registry entry, plus the '+'-joined spec of Luo §5 and non-default parameters of the
# variants.
NORM_SPECS = [*REGISTRY, "wn+mean_only_bn", "lp_bn(p=inf)", "cbn(decouple=false, rho=2)"]
ACTS = list(M.ACTIVATIONS)
PLACEMENTS = list(N.PLACEMENTS)
FLAT_MODELS = {"mlp": dict(depth=3, width=6), "dln": dict(depth=4, width=5), "perceptron": {}}
CONV_MODELS = {
    "vgg_santurkar": dict(input_shape=(1, 8, 8), width=0.0625),
    "vgg_arora": dict(input_shape=(3, 16, 16), width=0.0625),
    "luo_cnn": dict(input_shape=(1, 8, 8), width=0.25),
    "resnet20": dict(input_shape=(3, 16, 16), width=0.25),
    "vgg16": dict(input_shape=(1, 8, 8), width=0.0625),
}


WEIGHT_TYPES = (nn.Linear, nn.Conv2d, N.ScaleInvariantBN, N.WeightNorm)
NORM_TYPES = (N.ChannelNorm, nn.modules.batchnorm._BatchNorm)  # native_bn is torch's own


def layer_units(model: nn.Module) -> list[nn.Sequential]:
    """The innermost Sequentials that hold a weight layer: the blocks."""
    return [m for m in model.modules() if isinstance(m, nn.Sequential)
            and any(isinstance(c, WEIGHT_TYPES) for c in m.children())
            and not any(isinstance(c, nn.Sequential) for c in m.children()) and len(m) >= 2]



def run_case(name: str, norm: str, act: str, placement: str, input_shape, num_classes=3,
             batch=6, **options):
    torch.manual_seed(0)
    model = M.create(name, norm=norm, activation=act, placement=placement, input_shape=input_shape,
                     num_classes=num_classes, **options)
    x = torch.randn(batch, *input_shape)
    out = model(x)
    assert out.shape == (batch, num_classes)
    assert torch.isfinite(out).all()
    out.pow(2).mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), pname
    # The structure the placement promises: every block holds its weight layer and the spec's
    # channel norms, after the layer (pre_activation) or before it (pre_linear).
    channel_parts = [p for p in norm.split("+") if lookup(p)[0].kind == "channel"
                     and lookup(p)[0].name != "none"]
    units = layer_units(model)
    assert units
    # Arora's logit norm (logit_bn) follows the last layer whatever the placement (Arora Eq. 2)
    logit_unit = units[-1] if model.spec.get("logit_bn") else None
    for unit in units:
        children = list(unit.children())
        layer_at = [i for i, c in enumerate(children) if isinstance(c, WEIGHT_TYPES)]
        norm_at = [i for i, c in enumerate(children) if isinstance(c, NORM_TYPES)]
        assert len(layer_at) == 1 and len(norm_at) == len(channel_parts), unit
        if norm_at and (placement == "pre_activation" or unit is logit_unit):
            assert layer_at[0] < min(norm_at), unit
        elif norm_at:
            assert max(norm_at) < layer_at[0], unit
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    assert model.spec["norm"] == norm and model.spec["activation"] == act \
        and model.spec["placement"] == placement
    return model


FLAT_CASES = [(name, norm, act, placement) for name in FLAT_MODELS for norm in NORM_SPECS
              for act in ACTS for placement in PLACEMENTS]


@pytest.mark.parametrize("name,norm,act,placement", FLAT_CASES)
def test_flat_models_full_product(name, norm, act, placement):
    options = dict(FLAT_MODELS[name])
    if norm.startswith("si_bn") and placement == "pre_linear":
        with pytest.raises(ValueError, match="pre_linear"):
            M.create(name, norm=norm, activation=act, placement=placement,
                     input_shape=(2, 3), **options)
        return
    run_case(name, norm, act, placement, input_shape=(2, 3), **options)


def conv_cases():
    cases = []
    for name in CONV_MODELS:
        for i, norm in enumerate(NORM_SPECS):
            act = ACTS[(i + len(cases)) % len(ACTS)]
            placement = "pre_activation" if norm == "si_bn" else PLACEMENTS[i % 2]
            cases.append((name, norm, act, placement))
        cases.append((name, "si_bn", ACTS[0], "pre_linear"))  # the expected error
    return cases


CONV_CASES = conv_cases()


def test_conv_cases_cover_every_norm_and_activation():
    for name in CONV_MODELS:
        mine = [c for c in CONV_CASES if c[0] == name]
        assert {c[1] for c in mine} == set(NORM_SPECS)
        assert {c[2] for c in mine} == set(ACTS)
        assert {c[3] for c in mine} == set(PLACEMENTS)


@pytest.mark.parametrize("name,norm,act,placement", CONV_CASES)
def test_conv_models(name, norm, act, placement):
    options = dict(CONV_MODELS[name])
    input_shape = options.pop("input_shape")
    if norm == "si_bn" and placement == "pre_linear":
        with pytest.raises(ValueError, match="si_bn"):
            M.create(name, norm=norm, activation=act, placement=placement,
                     input_shape=input_shape, **options)
        return
    run_case(name, norm, act, placement, input_shape=input_shape, batch=4, **options)


# tv_* (torchvision, RGB input only) have their own tests in tests/test_models_vision.py
@pytest.mark.parametrize("name", [n for n in M.MODELS if not n.startswith("tv_")])
def test_every_hidden_layer_has_exactly_one_norm_and_the_output_layer_none(name):
    options = {**FLAT_MODELS.get(name, {}), **CONV_MODELS.get(name, {})}
    input_shape = options.pop("input_shape", (2, 3))
    for placement in PLACEMENTS:
        model = M.create(name, norm="bn", placement=placement, input_shape=input_shape, **options)
        weight_layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        norm_layers = [m for m in model.modules() if isinstance(m, N.ChannelNorm)]
        # The perceptron's only layer is normalized, and Arora's VGG has BN on the logits (Arora Eq.
        # 2); everywhere else the output layer is not.
        expected = len(weight_layers) if name in ("perceptron", "vgg_arora") \
            else len(weight_layers) - 1
        assert len(norm_layers) == expected, (name, placement)
        last = weight_layers[-1]
        assert last.out_features == 10
        # dln is W_1⋯W_k x (Santurkar App. A.1): no biases anywhere; other output layers have one.
        # The perceptron's layer follows the block rule (no bias before a mean-removing norm).
        no_bias = name in ("dln", "vgg_arora") \
            or (name == "perceptron" and placement == "pre_activation")
        assert (last.bias is None) == no_bias
