"""Replace the BatchNorm layers of any torch model (torchvision, timm, your own) by bnlab layers.

:func:`convert` takes every kind of BatchNorm a model is built with — ``nn.BatchNorm1d/2d/3d``,
``nn.SyncBatchNorm``, lazy BatchNorm once initialized, subclasses that only change defaults, and
timm's norm-act layers (``BatchNormAct2d``, ``SyncBatchNormAct``: BatchNorm → drop path →
activation, which become a :class:`NormAct`). torch's hyper-parameters (``eps``, ``momentum``
including ``None`` for the cumulative average, ``affine``, ``bias``, ``track_running_stats``), the
device and dtype, and the parameters and running statistics are carried over — also buffers kept
with ``track_running_stats=False``, with which torch's eval normalizes. A ``_BatchNorm`` subclass
with behaviour of its own (another ``forward``, submodules) is refused with an error that names it:
bnlab would silently drop what it adds. torchvision's and timm's ``FrozenBatchNorm2d`` (and timm's
``FrozenBatchNormAct2d``) become the spec's layer with the same buffers, frozen
(:func:`bnlab.norms.freeze` with ``stats=True, affine=True``): the same outputs, nothing trained.
"""

from __future__ import annotations

from typing import cast

import inspect
import warnings

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

from ..variants.base import ChannelNorm
from ..variants.batchnorm import NativeBatchNorm
from .freeze import freeze
from ..variants.noisy import StochasticLayer
from ..ops import spec_parts, create
from ..registry import lookup, parse_spec
from ..engine.switches import active_group
from ..engine.sync import broadcast_seed

# torch's option names, passed to the new layer's constructor with torch's semantics, and their
# defaults (an option a layer does not take is refused by name unless the old layer has the
# default).
TORCH_OPTIONS = {"eps": 1e-5, "momentum": 0.1, "affine": True, "track_running_stats": True,
                 "bias": True}

# Layers whose forward is exactly BatchNorm over dim 1 (what every bnlab layer generalizes).
_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, NativeBatchNorm)
_TORCH_FORWARDS = {cls.forward for cls in (_BatchNorm, *_PLAIN)}

# timm's norm-act layers: forward = BatchNorm, then self.drop, then self.act
# (timm/layers/norm_act.py).
NORM_ACT_CLASSES = ("timm.layers.norm_act.BatchNormAct2d", "timm.layers.norm_act.SyncBatchNormAct")
# fixed-statistics BatchNorm (detection backbones, fine-tuning): γ, β and statistics are buffers.
# timm's FrozenBatchNorm2d is torchvision's class.
FROZEN_CLASSES = ("torchvision.ops.misc.FrozenBatchNorm2d",)
FROZEN_ACT_CLASSES = ("timm.layers.norm_act.FrozenBatchNormAct2d",)


class NormAct(nn.Module):
    """``act(drop(norm(x)))``: the converted form of a BatchNorm fused with its activation (timm).

    The state_dict keeps the names of the layer it replaces: the norm's entries sit at the top level
    (``weight``, ``running_mean``, ...), not under ``norm.``, so checkpoints of the original model
    load.
    """

    def __init__(self, norm: nn.Module, drop: nn.Module, act: nn.Module) -> None:
        super().__init__()
        self.norm, self.drop, self.act = norm, drop, act
        self.register_state_dict_post_hook(_lift_norm_entries)
        self.register_load_state_dict_pre_hook(_nest_norm_entries)

    def forward(self, x):
        return self.act(self.drop(self.norm(x)))


def _lift_norm_entries(module: NormAct, state_dict, prefix, local_metadata) -> None:
    nested = prefix + "norm."
    for key in [k for k in state_dict if k.startswith(nested)]:
        state_dict[prefix + key[len(nested):]] = state_dict.pop(key)


def _nest_norm_entries(module: NormAct, state_dict, prefix, *args) -> None:
    for name in module.norm.state_dict():
        if "." not in name and prefix + name in state_dict:
            state_dict[prefix + "norm." + name] = state_dict.pop(prefix + name)


def convert(model: nn.Module, spec: str) -> nn.Module:
    """Replace every BatchNorm of ``model`` (in place) by ``create(spec, C)``; returns the model.

    ``eps``, ``momentum`` (``None``: cumulative average), ``affine``, ``bias`` and
    ``track_running_stats`` of each replaced layer are passed on (running buffers too, with
    ``track_running_stats=False``), unless ``spec`` sets them (``"bn(momentum=0.01)"``); ``weight``,
    ``bias`` and the running statistics are copied where the new layer has them; device, dtype and
    train/eval mode follow the replaced layer. timm's ``BatchNormAct2d`` becomes a :class:`NormAct`
    that keeps its activation and drop path. ``SyncBatchNorm`` becomes a layer that synchronizes its
    statistics over the same process group. Raises ``ValueError`` for an uninitialized lazy
    BatchNorm and for a ``_BatchNorm`` subclass whose extra behaviour would be lost.
    """
    parts = spec_parts(spec)
    if len(parts) > 1:
        raise ValueError(f"convert replaces each norm by one layer; {spec!r} combines several "
                         "(use bnlab.norms.normalized(layer, spec) to build such blocks)")
    lookup(spec)  # unknown names and bad values fail before the model is touched
    if isinstance(model, _BatchNorm) or _frozen_kind(model):
        return _replacement(model, spec, type(model).__name__)
    # every replacement is built (and may refuse) before the first one is set: never half-converted
    replacements = [(parent, name, _replacement(child, spec, f"{path}.{name}" if path else name))
                    for path, parent in model.named_modules()
                    for name, child in parent.named_children()
                    if (isinstance(child, _BatchNorm) or _frozen_kind(child))
                    and not isinstance(parent, _BatchNorm)]
    for parent, name, new in replacements:
        setattr(parent, name, new)
    return model


def _frozen_kind(module: nn.Module) -> str | None:
    """'frozen' (torchvision's/timm's FrozenBatchNorm2d), 'frozen_act' (timm's
    FrozenBatchNormAct2d) or None."""
    cls = type(module)
    name = f"{cls.__module__}.{cls.__qualname__}"
    return ("frozen" if name in FROZEN_CLASSES else "frozen_act" if name in FROZEN_ACT_CLASSES
            else None)


def _frozen_replacement(old: nn.Module, spec: str, path: str) -> nn.Module:
    """The spec's layer with ``old``'s buffers (γ, β, statistics), statistics and affine frozen;
    a frozen ``bn`` where the spec's eval map with those statistics is not BatchNorm's (cbn with
    ``decouple=true``, lp_bn, mean_only_bn, var_only_bn), so the outputs stay the same."""
    new = _frozen_layer(old, spec, path)
    if not _keeps_outputs(old, new):
        warnings.warn(f"convert: frozen {path!r} becomes a frozen 'bn' layer, not {spec!r}: with "
                      f"its fixed statistics {spec!r} would compute other outputs", stacklevel=4)
        new = _frozen_layer(old, "bn", path)
    freeze(new, stats=True, affine=True)
    if _frozen_kind(old) == "frozen_act":
        new = NormAct(new, cast(nn.Module, old.drop), cast(nn.Module, old.act))
    return new.train(old.training)


def _frozen_layer(old: nn.Module, spec: str, path: str) -> nn.Module:
    weight = cast(Tensor, old.weight)
    try:
        new = create(spec, weight.numel(), eps=float(cast(float, old.eps)), device=weight.device,
                     dtype=weight.dtype)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot convert {path!r} ({type(old).__name__}) to {spec!r}: {err}"
                         ) from err
    wanted = new.state_dict()
    new.load_state_dict({k: v for k, v in old.state_dict().items() if k in wanted}, strict=False)
    return new


@torch.no_grad()
def _keeps_outputs(old: nn.Module, new: nn.Module) -> bool:
    """Whether ``new``'s eval map is the frozen layer's: ``x·s + b − mean·s``, s = w/√(var + ε)."""
    affine = getattr(new, "inference_affine", lambda: None)()
    if affine is None:
        return False
    w, b = cast(Tensor, old.weight).double(), cast(Tensor, old.bias).double()
    scale = w * torch.rsqrt(cast(Tensor, old.running_var).double() + float(cast(float, old.eps)))
    shift = b - cast(Tensor, old.running_mean).double() * scale
    tol = 1e-6 if w.dtype == torch.float64 else 1e-5
    return all(torch.allclose(got.double(), want, rtol=tol, atol=tol)
               for got, want in zip(affine, (scale, shift)))


def _kind(module: _BatchNorm, path: str) -> str:
    """'plain' (BatchNorm's own forward) or 'norm_act' (timm); raises for anything else."""
    cls = type(module)
    if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
        raise ValueError(f"cannot convert {path!r}: {cls.__name__} is an uninitialized lazy "
                         "BatchNorm (its number of channels is unknown); run one forward pass "
                         "before convert()")
    if f"{cls.__module__}.{cls.__qualname__}" in NORM_ACT_CLASSES:
        return "norm_act"
    if cls.forward in _TORCH_FORWARDS and not any(True for _ in module.children()):
        return "plain"  # a subclass that changes defaults or checks only
    raise ValueError(
        f"cannot convert {path!r}: {cls.__module__}.{cls.__qualname__} subclasses torch's "
        "BatchNorm with behaviour of its own (its own forward or submodules), which a bnlab layer "
        "would drop. Supported: nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm, initialized lazy "
        f"BatchNorm, subclasses that keep BatchNorm's forward, and {', '.join(NORM_ACT_CLASSES)}")


def _replacement(old: nn.Module, spec: str, path: str) -> nn.Module:
    if _frozen_kind(old):
        return _frozen_replacement(old, spec, path)
    assert isinstance(old, _BatchNorm)
    kind = _kind(old, path)
    try:
        new = create_like(old, spec)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot convert {path!r} ({old!r}) to {spec!r}: {err}") from err
    _share_parameters(old, new)
    if isinstance(old, nn.SyncBatchNorm):
        new = convert_sync(new, old.process_group)
    if kind == "norm_act":
        new = NormAct(new, cast(nn.Module, old.drop), cast(nn.Module, old.act))
    return new.train(old.training)


def _share_parameters(old: nn.Module, new: nn.Module) -> None:
    """The new layer takes the old one's γ and β Parameter objects, as torch's
    ``convert_sync_batchnorm`` does: a frozen γ/β (``requires_grad=False``) stays frozen, and an
    optimizer built before the conversion keeps updating them (fresh copies silently unfroze
    fine-tuning's frozen BN affines)."""
    for name in ("weight", "bias"):
        mine, theirs = getattr(new, name, None), getattr(old, name, None)
        if (isinstance(mine, nn.Parameter) and isinstance(theirs, nn.Parameter)
                and mine.shape == theirs.shape and mine.dtype == theirs.dtype
                and mine.device == theirs.device):
            setattr(new, name, theirs)


def torch_options(old: _BatchNorm) -> dict:
    """The constructor options of a torch BatchNorm, read from the module (no ``bias`` flag
    kept)."""
    options = {k: getattr(old, k) for k in ("eps", "momentum", "affine", "track_running_stats")}
    options["bias"] = not old.affine or old.bias is not None
    # buffers kept with track_running_stats=False: torch's eval normalizes with them, so the new
    # layer is built with them and the flag set afterwards (create_like)
    options["track_running_stats"] = old.track_running_stats or old.running_mean is not None
    return options


def create_like(old: _BatchNorm, spec: str) -> nn.Module:
    """``create(spec, C)`` with ``old``'s torch options, parameters, statistics, device and dtype.

    An option of ``old`` that the new layer cannot take (unless it has torch's default) raises a
    ``ValueError`` naming it rather than being dropped (``bias=False`` would become a bias)."""
    info, _ = lookup(spec)
    explicit = set(parse_spec(spec)[1])
    options = {k: v for k, v in torch_options(old).items() if k not in explicit}
    refused = [k for k, v in options.items()
               if not _accepts(info.factory, k) and v != TORCH_OPTIONS[k]]
    if refused:
        named = ", ".join(f"{k}={options[k]!r}" for k in refused)
        raise ValueError(f"{info.name} does not take the option(s) {named} that "
                         f"{type(old).__name__} has; set them in the spec or leave them at torch's "
                         "defaults")
    options = {k: v for k, v in options.items() if _accepts(info.factory, k)}
    ref: Tensor | None = next(iter(old.parameters()), None)
    ref = old.running_mean if ref is None else ref
    if ref is not None and _accepts(info.factory, "device") and _accepts(info.factory, "dtype"):
        options.update(device=ref.device, dtype=ref.dtype)  # built in place: no CPU copy first
    new = create(spec, old.num_features, **options)
    if ref is not None:
        new = new.to(device=ref.device, dtype=ref.dtype)
    wanted = new.state_dict()
    new.load_state_dict({k: v for k, v in old.state_dict().items() if k in wanted}, strict=False)
    if "track_running_stats" not in explicit and hasattr(new, "track_running_stats"):
        setattr(new, "track_running_stats", old.track_running_stats)
    return new


def _accepts(factory, name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def convert_sync(model: nn.Module, process_group=None) -> nn.Module:
    """Switch every bnlab normalization layer of ``model`` (in place) to synchronized statistics.

    bnlab layers (``bn``, ``mean_only_bn``, ``var_only_bn``, ``mbn``, ``cbn``, ``brn``, ``lp_bn``,
    ``noisy_bn``, ``si_bn``'s inner norm) get ``sync=True`` and ``process_group``; ``native_bn`` and
    any other torch BatchNorm become torch's own ``nn.SyncBatchNorm`` (same parameters and buffers),
    which torch runs on GPUs only — nothing is left unsynchronized silently. Stochastic layers
    (``noisy_bn``) take rank 0's noise seed when a process group is initialized, so every rank draws
    the same noise. Like ``nn.SyncBatchNorm.convert_sync_batchnorm``, returns the model.
    """
    if _torch_batchnorm(model):
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
    for name, child in list(model.named_children()):
        if _torch_batchnorm(child):
            setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child, process_group))
        else:
            convert_sync(child, process_group)
    if isinstance(model, ChannelNorm):
        model.sync = True
        model.process_group = process_group
        if isinstance(model, StochasticLayer):
            align_seed(model)
    return model


def _torch_batchnorm(module: nn.Module) -> bool:
    return (isinstance(module, nn.modules.batchnorm._BatchNorm)
            and not isinstance(module, nn.SyncBatchNorm))


def align_seed(layer) -> None:
    """Give a stochastic synced layer rank 0's seed (no-op outside a multi-rank group)."""
    group = active_group(getattr(layer, "process_group", None))
    if group is not None:
        seed = broadcast_seed(layer._seed, group)
        if seed != layer._seed:  # equal seeds keep the generator (and any state restored into it)
            layer.reseed(seed)
