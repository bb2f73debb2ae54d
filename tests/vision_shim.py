"""Import torchvision and timm for the tests, also where torchvision's C++ extension cannot load.

Why: the registry's ``torchvision`` wheel that matches torch 2.13.0 is a CUDA build. Against the CPU
torch of this project's venv its ``_C.so`` does not load (torchvision then runs without its C++ ops,
by design), but ``torchvision/_meta_registrations.py`` still registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` unconditionally, so ``import torchvision`` — and with it
``import timm`` — fails with ``RuntimeError: operator torchvision::nms does not exist``.

How: only when that exact error happens, :func:`_define_missing_schemas` declares the two operator
schemas (copied from torchvision's C++ sources) with ``torch.library``, each with a kernel that raises,
and the import is retried. The classification models the tests build (ResNet, EfficientNet) are pure
Python and never call these operators; anything that does (detection's NMS) fails loudly instead of
computing something wrong. If the import still fails, tests that need the packages are skipped with the
reason. The shim lives in ``tests/`` only: bnlab itself never imports torchvision or timm.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

_MISSING_OP = "operator torchvision::nms does not exist"
# torchvision 0.28 csrc/ops/nms.cpp and csrc/ops/quantized/cpu/qnms_kernel.cpp
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY: list = []  # keeps the torch.library registrations alive for the whole session


def _unavailable(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"torchvision::{name} is a placeholder defined by tests/vision_shim.py: "
                           "torchvision's C++ extension is not loadable in this environment")
    return kernel


def _define_missing_schemas() -> None:
    if _LIBRARY:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, _unavailable(name), "CompositeExplicitAutograd")
    _LIBRARY.append(lib)


def _forget(package: str) -> None:
    """Drop a half-imported package so that the retry starts from scratch."""
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


def _import_torchvision():
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as err:
        if _MISSING_OP not in str(err):
            raise
    _forget("torchvision")
    _define_missing_schemas()
    return importlib.import_module("torchvision")


def import_or_skip(name: str):
    """``torchvision`` or ``timm`` (imported through the shim above), or skip the calling test."""
    if name not in ("torchvision", "timm"):
        raise ValueError(f"vision_shim imports torchvision or timm, not {name!r}")
    try:
        _import_torchvision()
        return importlib.import_module(name)
    except ImportError as err:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]'): {err}")
    except RuntimeError as err:
        pytest.skip(f"{name} cannot be imported here, even through tests/vision_shim.py: {err}")


VISION_MODELS = ("torchvision.resnet18", "timm.resnet18", "timm.efficientnet_b0")


def build(name: str, generator: torch.Generator) -> torch.nn.Module:
    """A torchvision/timm model (random init, no pretrained weights) in eval mode, with every BatchNorm's
    running statistics and affine parameters drawn at random, so that eval outputs depend on all of them."""
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
