"""Import torchvision (and timm) when torchvision's C++ operators do not match the installed torch.

Why: a torchvision wheel built for another torch build (say the CUDA ``torchvision==0.28.0``
beside the CPU ``torch==2.13.0+cpu``) cannot load its ``_C`` extension. torchvision then runs
without its C++ operators, by design — its classification models are pure Python — but
``torchvision/_meta_registrations.py`` still registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` unconditionally, so ``import torchvision``, and with it ``import timm``, fails
with ``RuntimeError: operator torchvision::nms does not exist``.

How: :func:`import_torchvision` imports torchvision; only when that exact error happens does it
declare the two operator schemas (copied from torchvision 0.28's ``csrc/ops/nms.cpp`` and
``csrc/ops/quantized/cpu/qnms_kernel.cpp``) with ``torch.library``, each with a kernel that raises,
and retry. Classification models (ResNet, EfficientNet, ViT...) never call these operators; anything
that does (detection's NMS) raises :class:`VisionOpsUnavailable` instead of computing something
wrong.
Any other failure becomes a :class:`VisionImportError` that says what to install.

    >>> from bnlab.models.vision_compat import import_timm, import_torchvision
    >>> tv = import_torchvision()                 # torchvision, also with mismatched C++ operators
    >>> net = import_timm().create_model("resnet18")

The supported install keeps your torch (``pip install timm torchvision`` alone may replace it)::

    python -c "import torch; print('torch==' + torch.__version__)" > torch-pin.txt
    pip install timm torchvision -c torch-pin.txt

bnlab itself imports neither package unless asked (``tv_*`` models, this module).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

__all__ = [
    "VisionImportError",
    "VisionOpsUnavailable",
    "import_timm",
    "import_torchvision",
    "prepare_torchvision",
    "INSTALL_HINT",
]

MISSING_OP = "operator torchvision::nms does not exist"
# torchvision 0.28 csrc/ops/nms.cpp and csrc/ops/quantized/cpu/qnms_kernel.cpp
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
INSTALL_HINT = (
    'install the torchvision built for your torch, keeping it: python -c "import torch; '
    "print('torch==' + torch.__version__)\" > torch-pin.txt && pip install timm torchvision "
    "-c torch-pin.txt (CPU torch: add --index-url https://download.pytorch.org/whl/cpu)"
)
_LIBRARY: list = []  # keeps the torch.library registrations alive for the whole process


class VisionImportError(ImportError):
    """torchvision or timm cannot be imported, even with the placeholders; the message says why."""


class VisionOpsUnavailable(RuntimeError):
    """A torchvision C++ operator was called where torchvision's extension does not load."""


def _unavailable(name: str):
    def kernel(*args, **kwargs):
        raise VisionOpsUnavailable(
            f"torchvision::{name} is a placeholder (bnlab.models.vision_compat): torchvision's C++ "
            f"extension does not load with torch {torch.__version__}; to use it, {INSTALL_HINT}"
        )

    return kernel


def define_missing_schemas() -> bool:
    """Declare ``torchvision::nms``/``qnms`` with raising kernels; False if already done here."""
    if _LIBRARY:
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, _unavailable(name), "CompositeExplicitAutograd")
    _LIBRARY.append(lib)
    return True


def _forget(package: str) -> None:
    """Drop a half-imported package so that the retry starts from scratch."""
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


def ops_placeholder_active() -> bool:
    """True once this module had to declare placeholder operators (torchvision's C++ ops absent)."""
    return bool(_LIBRARY)


def import_torchvision() -> ModuleType:
    """``torchvision``, also where its C++ operators do not match torch (see the module docstring).

    Raises :class:`VisionImportError` (an ``ImportError``) naming the install line otherwise."""
    try:
        try:
            return importlib.import_module("torchvision")
        except RuntimeError as err:
            if MISSING_OP not in str(err):
                raise
        _forget("torchvision")
        define_missing_schemas()
        return importlib.import_module("torchvision")
    except ImportError as err:
        raise VisionImportError(f"torchvision is not importable ({err}); {INSTALL_HINT}") from err
    except RuntimeError as err:
        raise VisionImportError(
            f"torchvision is installed but cannot be imported with torch "
            f"{torch.__version__} ({err}); {INSTALL_HINT}"
        ) from err


def import_timm() -> ModuleType:
    """``timm``, with torchvision (which timm imports) through :func:`import_torchvision` first."""
    if importlib.util.find_spec("timm") is None:
        raise VisionImportError(f"timm is not installed; {INSTALL_HINT}")
    import_torchvision()
    try:
        return importlib.import_module("timm")
    except (ImportError, RuntimeError) as err:
        raise VisionImportError(f"timm cannot be imported ({err}); {INSTALL_HINT}") from err


def prepare_torchvision() -> bool:
    """Make a later ``import torchvision`` work (also from inside other packages: Lightning's
    torchmetrics, timm) where it is installed; True if torchvision is importable now.

    Nothing happens where torchvision is not installed or already imported. Where it fails for
    another reason than the missing operators, it stays failing (False): the package that imports
    it reports that itself. For modules that import such packages at their top (bnlab's Lightning
    adapter), so that no manual :func:`import_torchvision` is needed first.
    """
    if "torchvision" in sys.modules:
        return True
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import_torchvision()
    except VisionImportError:
        return False
    return True
