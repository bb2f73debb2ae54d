"""torchvision and timm for the tests, through the library's :mod:`bnlab.models.vision_compat`.

The workaround for a torchvision whose C++ operators do not match torch (``torchvision::nms does not
exist`` at import) lives in the library; this module only turns "cannot import" into a skip with the
reason, and builds the test models.
"""

from __future__ import annotations

import pytest
import torch

from bnlab.models.vision_compat import VisionImportError, import_timm, import_torchvision


def import_or_skip(name: str):
    """``torchvision`` or ``timm`` (through bnlab.models.vision_compat), or skip the calling
    test."""
    if name not in ("torchvision", "timm"):
        raise ValueError(f"vision_shim imports torchvision or timm, not {name!r}")
    try:
        return import_torchvision() if name == "torchvision" else import_timm()
    except VisionImportError as err:
        pytest.skip(f"{name} cannot be imported here: {err}")


VISION_MODELS = ("torchvision.resnet18", "timm.resnet18", "timm.efficientnet_b0")


def build(name: str, generator: torch.Generator) -> torch.nn.Module:
    """A torchvision/timm model (random init, no pretrained weights) in eval mode, with every
    BatchNorm's running statistics and affine parameters drawn at random, so that eval outputs
    depend on all of them."""
    package, _, model = name.partition(".")
    if name not in VISION_MODELS:
        raise ValueError(f"unknown test model {name!r}; valid: {', '.join(VISION_MODELS)}")
    lib = import_or_skip(package)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
    net = lib.models.get_model(model) if package == "torchvision" else lib.create_model(model)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5, generator=generator)
                m.running_var.uniform_(0.5, 2.0, generator=generator)
                m.weight.uniform_(0.5, 1.5, generator=generator)
                m.bias.uniform_(-0.5, 0.5, generator=generator)
    return net.eval()
