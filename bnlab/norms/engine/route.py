"""The one place that picks how a layer's step runs.

Every bnlab layer's ``forward(x)`` is ``route.run(self, x)`` (:class:`~bnlab.norms.ChannelNorm`),
which takes the first route that applies:

1. **compiled step** (opt-in, :func:`.switches.compiled_steps`): a small CPU training step of a
   catalogue class as compiled functions (:mod:`.compiled_step`);
2. **torch.fx node**: under ``torch.fx`` tracing the layer is one ``call_module`` node, as torch's
   own BatchNorm (:func:`fx_node`);
3. **guarded step**: in training, when the non-finite guard is on, an accumulation runs or the call
   may be inside ``torch.utils.checkpoint``, the step runs under :mod:`.guard`'s guarantees (one
   statistics update per training forward);
4. otherwise ``layer.normalize(x)``, the variant's own step.

Inside ``normalize`` the batch statistics take the fused operators or the plain autograd ops:
:func:`takes_fused` decides. The switches all of this reads are in :mod:`.switches`.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.nn as nn
from torch import Tensor

from . import compiled_step, guard
from .switches import (
    COMPILED_STEPS, fast_paths_allowed, full_statistics, module_group, needs_guard,
)

# On the CPU, below this many elements the fused function's fixed Python cost (an autograd.Function,
# two Python operator kernels, a nested engine call) exceeds what it saves: the plain ops are 0–20 %
# faster at (1000, 10) and (32, 16, 8, 8) (thread CPU time, 2026-11-26). Not on other devices: there
# each plain op is a kernel launch (43–125 per step), which is what the fused operators remove.
FUSED_MIN_NUMEL = 1 << 16

HALF_DTYPES = (torch.float16, torch.bfloat16)
FUSED_DTYPES = (torch.float32, torch.float64, *HALF_DTYPES)


def run(layer: Any, x: Tensor, *args: Tensor) -> Tensor:
    """The layer's step on x (and a wrapper layer's further tensor inputs ``args``), by the first
    route of the module docstring that applies. ``layer``: a bnlab layer (``ChannelNorm``,
    ``NativeBatchNorm``), which has ``normalize``."""
    if COMPILED_STEPS[0] and (y := compiled_step.compiled_call(layer, x, args)) is not None:
        return y
    if isinstance(x, torch.fx.Proxy):
        return fx_node(layer, x, args)
    if needs_guard(layer):
        return guard.guarded_step(layer, functools.partial(layer.normalize, x, *args), x)
    return layer.normalize(x, *args)


def fx_node(layer: nn.Module, x: torch.fx.Proxy, args: tuple) -> torch.fx.Proxy:
    """The layer as ONE ``call_module`` node of the graph ``torch.fx`` is tracing.

    torch.fx traces into every module outside ``torch.nn`` (its leaf rule), and a layer's Python
    checks and path choices cannot run on a ``Proxy``; torch's own BatchNorm is a leaf. So is every
    bnlab layer: ``torch.fx.symbolic_trace``, torchvision's ``create_feature_extractor`` and FX
    quantization see it as torch's, and the traced module calls it."""
    tracer = cast(torch.fx.Tracer, x.tracer)
    try:
        path = tracer.path_of_module(layer)
    except NameError:
        path = ""
    if not path:  # the layer is the root: there is no parent to hold it
        raise TypeError(f"{type(layer).__name__} is a leaf module for torch.fx: trace a model that "
                        "contains it, not the layer alone")
    return tracer.create_proxy("call_module", path, (x, *args), {})


def fused_enabled(x: Tensor) -> bool:
    """Whether the eager fused function runs. Never under torch.compile (inductor fuses the plain
    ops, and the function cannot be traced) nor torch.func transforms (vmap, grad: a closure graph);
    for floating inputs of :data:`FUSED_DTYPES` (half ones, as a convolution under autocast hands
    them on: statistics, coefficients and gradient factors in float32, each full-size result
    rounded to half once, as torch's kernels do); on the CPU only from :data:`FUSED_MIN_NUMEL`
    elements; never on the meta device (shape inference: the plain ops have meta kernels, torch's
    statistics kernel has none)."""
    return ((x.numel() >= FUSED_MIN_NUMEL or x.device.type != "cpu")
            and x.device.type != "meta"
            and x.dtype in FUSED_DTYPES
            and fast_paths_allowed())


def takes_fused(layer: nn.Module, x: Tensor) -> bool:
    """Whether this step of a layer runs the fused operators: :func:`fused_enabled` for x, and
    the layer neither synced (autograd through the collectives) nor inside
    ``accumulate(normalize="full")`` (the full batch's statistics)."""
    return (fused_enabled(x) and module_group(layer) is None
            and full_statistics(layer) is None)
