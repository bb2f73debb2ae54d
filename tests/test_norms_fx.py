"""bnlab's layers under ``torch.fx``: leaf modules, as torch's BatchNorm is.

torch.fx traces into every module outside ``torch.nn``; a bnlab layer's input checks and path
choices cannot run on a ``Proxy``, so ``torch.fx.symbolic_trace`` — and torchvision's
``create_feature_extractor``, FX quantization, anything built on it — failed on any model holding
one ("expects a floating-point tensor, got Proxy"). Each layer is now one ``call_module`` node
(:func:`bnlab.norms.engine.route.fx_node`), and the traced module computes what the model
does.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.norms.registry import REGISTRY
from tests.vision_shim import import_or_skip

SPECS = sorted(name for name, info in REGISTRY.items()
               if info.kind == "channel" and name not in ("none", "si_bn", "wn"))


def network(spec: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        norm = (N.normalized(nn.Conv2d(8, 8, 1), spec) if spec in ("si_bn", "wn")
                else N.create(spec, 8))
    return nn.Sequential(nn.Conv2d(3, 8, 3), norm, nn.ReLU())


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("spec", SPECS + ["si_bn", "wn"])
def test_a_traced_network_computes_what_the_network_does(spec, training):
    model = network(spec).train(training)
    traced = torch.fx.symbolic_trace(copy.deepcopy(model)).train(training)
    if spec not in ("si_bn", "wn"):  # the layer itself is one node (the wrappers trace through)
        assert [n.target for n in traced.graph.nodes if n.op == "call_module"] == ["0", "1", "2"]
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    if spec == "noisy_bn" and training:
        return  # its draws come from each copy's own generator state
    torch.testing.assert_close(traced(x), model(x))
    for (name, a), (_, b) in zip(traced.named_buffers(), model.named_buffers()):
        torch.testing.assert_close(a, b, msg=name)


def test_tracing_a_layer_alone_says_what_to_trace():
    with pytest.raises(TypeError, match="leaf module for torch.fx: trace a model"):
        torch.fx.symbolic_trace(N.create("cbn", 8))


@pytest.mark.parametrize("spec", ["bn", "cbn", "mbn", "native_bn"])
def test_torchvision_feature_extractor_on_a_converted_resnet(spec):
    tv = import_or_skip("torchvision")
    from torchvision.models.feature_extraction import create_feature_extractor

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = N.convert(tv.models.resnet18(), spec).eval()
    features = create_feature_extractor(model, {"layer1": "f"})
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    expected = model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))
    torch.testing.assert_close(features(x)["f"], expected)
