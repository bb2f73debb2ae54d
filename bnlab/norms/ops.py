"""Model-level operations: build from specs, convert torch models, fold for inference, progress."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .base import ChannelNorm
from .noisy import StochasticLayer
from .registry import NormInfo, lookup
from .wrappers import LINEAR_TYPES, ScaleInvariantBN, WeightNorm, _out_features


def _parts(spec: str) -> list[str]:
    parts = [p.strip() for p in spec.split("+")] if isinstance(spec, str) else [spec]
    if any(not p for p in parts):
        raise ValueError(f"empty part in normalization spec {spec!r}")
    return parts


def validate(spec: str) -> None:
    """Raise ``ValueError`` (naming valid choices) if ``spec`` is not a valid (possibly '+'-joined) spec."""
    parts = _parts(spec)
    for i, part in enumerate(parts):
        info, _ = lookup(part)
        if info.kind == "wrapper" and i > 0:
            raise ValueError(f"in {spec!r}: {info.name} wraps the linear layer and must come first")


def create(spec: str, num_features: int) -> nn.Module:
    """Build the per-channel normalization layer described by ``spec`` for ``num_features`` channels.

    >>> create("cbn(rho=2, amat=true)", 64)
    """
    info, kwargs = lookup(spec)
    if info.kind == "wrapper":
        raise ValueError(
            f"{info.name} needs the weight of the layer it normalizes; use "
            f"bnlab.norms.normalized(layer, {spec!r}) (or {info.factory.__name__}(layer)) instead of create()"
        )
    return info.factory(num_features, **kwargs)


def removes_mean(spec: str) -> bool:
    """True if the spec's normalization subtracts a mean, which makes a preceding bias redundant."""
    return any(lookup(p)[0].removes_mean for p in _parts(spec))


def normalized(layer: nn.Module, spec: str, placement: str = "pre_activation") -> nn.Module:
    """``layer`` (Linear/Conv) combined with the normalization ``spec`` at ``placement``.

    * ``"pre_activation"`` (the usual BN position): ``norm(layer(x))``; wrappers (``si_bn``, ``wn``)
      replace the layer, and ``"wn+mean_only_bn"`` applies mean-only BN after WN (Luo §5).
    * ``"pre_linear"`` (CBN's position, after the previous activation): ``layer(norm(x))``.

    Returns an ``nn.Sequential`` so :func:`fold` sees the layer and its norm as neighbours.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; valid placements: {', '.join(PLACEMENTS)}")
    validate(spec)
    parts = _parts(spec)
    first, kwargs = lookup(parts[0])
    if first.kind == "wrapper":
        if placement == "pre_linear" and first.name == "si_bn":
            raise ValueError("si_bn normalizes the output of its layer; it cannot be placed pre_linear")
        layer = first.factory(layer, **kwargs)
        parts = parts[1:]
    if placement == "pre_activation":
        width = _out_features(layer.layer if isinstance(layer, (ScaleInvariantBN, WeightNorm)) else layer)
        return nn.Sequential(layer, *(create(p, width) for p in parts))
    inner = layer.layer if isinstance(layer, (ScaleInvariantBN, WeightNorm)) else layer
    width = inner.in_features if isinstance(inner, nn.Linear) else inner.in_channels
    return nn.Sequential(*(create(p, width) for p in parts), layer)


PLACEMENTS = ("pre_activation", "pre_linear")


def set_progress(model: nn.Module, *, lr: float | None = None, epoch: int | None = None,
                 epochs: int | None = None) -> None:
    """Tell every layer that needs it (CBN's AMAT, MBN's λ schedule) the learning rate and epoch (1-based)."""
    for module in model.modules():
        if isinstance(module, ChannelNorm) and hasattr(module, "set_progress"):
            module.set_progress(lr=lr, epoch=epoch, epochs=epochs)


def seed_layers(model: nn.Module, seed: int) -> None:
    """Give every stochastic layer (noisy_bn) its own generator seeded from ``seed``, in module order."""
    for index, module in enumerate(m for m in model.modules() if isinstance(m, StochasticLayer)):
        module.reseed(int(seed) * 1_000_003 + index)


def stochastic_layers(model: nn.Module) -> list[tuple[str, StochasticLayer]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, StochasticLayer)]


def regularization_loss(model: nn.Module) -> torch.Tensor | float:
    """Sum of the explicit regularizers that layers expose (WN's γ-decay ζ Σγ², Luo Eq. 15)."""
    terms = [m.regularization_loss() for m in model.modules() if isinstance(m, WeightNorm) and m.zeta > 0]
    return sum(terms) if terms else 0.0


_TORCH_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def convert(model: nn.Module, spec: str) -> nn.Module:
    """Replace every ``nn.BatchNorm1d/2d/3d`` in ``model`` (in place) by ``create(spec, C)``.

    ``weight``, ``bias`` and the running statistics are carried over where the new layer has them;
    dtype and device follow the replaced layer. Returns the model.
    """
    validate(spec)
    if isinstance(model, _TORCH_BN):
        return _replacement(model, spec)
    for name, child in list(model.named_children()):
        if isinstance(child, _TORCH_BN):
            setattr(model, name, _replacement(child, spec))
        else:
            convert(child, spec)
    return model


def _replacement(old: nn.Module, spec: str) -> nn.Module:
    new = create(spec, old.num_features)
    ref = next(iter(old.parameters()), None)
    if ref is None and old.running_mean is not None:
        ref = old.running_mean
    if ref is not None:
        new = new.to(device=ref.device, dtype=ref.dtype)
    state = {k: v for k, v in old.state_dict().items() if k in new.state_dict()}
    new.load_state_dict(state, strict=False)
    if isinstance(new, ChannelNorm):
        new.eps = old.eps
        if old.momentum is not None or isinstance(new, nn.modules.batchnorm._BatchNorm):
            new.momentum = old.momentum
    new.train(old.training)
    return new


def _affine_of(module: nn.Module):
    fn = getattr(module, "inference_affine", None)
    if fn is None or module.training:
        return None
    return fn()


@torch.no_grad()
def fold(model: nn.Module) -> nn.Module:
    """Fold every eval-mode normalization that is an affine map into its neighbouring linear/conv layer.

    Handles, inside any ``nn.Sequential``: ``[Linear|Conv, norm]`` (scale the output channels),
    ``[norm, Linear]`` and ``[norm, Conv without padding]`` (scale the input channels; zero padding
    would not commute with the shift), and ``ScaleInvariantBN`` on its own layer. Works on a deep copy;
    returns the folded model (in eval mode). Layers that are not affine (noisy_bn in training, lp_bn
    with batch statistics, …) are left in place.
    """
    model = copy.deepcopy(model).eval()
    _fold_into(model)
    return model


def _fold_into(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, ScaleInvariantBN):
            scale, shift = child.inference_affine()
            setattr(module, name, _scaled_output(child.layer, scale, shift))
        else:
            _fold_into(child)
    if not isinstance(module, nn.Sequential):
        return
    keys = list(module._modules)
    i = 0
    while i < len(keys) - 1:
        a, b = (_unwrap(module._modules[k]) for k in keys[i:i + 2])
        if isinstance(a, LINEAR_TYPES) and (aff := _affine_of(b)) is not None:
            module._modules[keys[i]] = _scaled_output(a, *aff)
            module._modules[keys[i + 1]] = nn.Identity()
        elif (aff := _affine_of(a)) is not None and _accepts_input_fold(b):
            module._modules[keys[i + 1]] = _scaled_input(b, *aff)
            module._modules[keys[i]] = nn.Identity()
        i += 1


def _unwrap(module: nn.Module) -> nn.Module:
    """WN is a reparametrized linear layer: fold into (a plain copy of) the layer it wraps."""
    return module.layer if isinstance(module, WeightNorm) else module


def _accepts_input_fold(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear):
        return True
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return all(p == 0 for p in layer.padding) if not isinstance(layer.padding, str) else layer.padding == "valid"
    return False


def _plain_copy(layer: nn.Module, bias: bool) -> nn.Module:
    """A parametrization-free copy (so WN-wrapped layers fold too), with a bias."""
    weight = layer.weight.detach().clone()
    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, layer.out_features, bias=bias)
    else:
        new = type(layer)(layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
                          padding=layer.padding, dilation=layer.dilation, groups=layer.groups, bias=bias,
                          padding_mode=layer.padding_mode)
    new = new.to(device=weight.device, dtype=weight.dtype)
    new.weight.copy_(weight)
    if bias:
        new.bias.copy_(layer.bias.detach() if layer.bias is not None else torch.zeros_like(new.bias))
    return new


def _scaled_output(layer: nn.Module, scale: torch.Tensor, shift: torch.Tensor) -> nn.Module:
    new = _plain_copy(layer, bias=True)
    new.weight.mul_(scale.view(-1, *([1] * (new.weight.dim() - 1))))
    new.bias.mul_(scale).add_(shift)
    return new


def _scaled_input(layer: nn.Module, scale: torch.Tensor, shift: torch.Tensor) -> nn.Module:
    if getattr(layer, "groups", 1) != 1:
        raise ValueError("cannot fold a normalization into a grouped convolution's input")
    new = _plain_copy(layer, bias=True)
    w = new.weight
    # The bias gains W·shift; a conv without padding sees the shift at every tap of its kernel.
    per_input = w.flatten(2).sum(-1) if w.dim() > 2 else w
    new.bias.add_(per_input @ shift)
    w.mul_(scale.view(1, -1, *([1] * (w.dim() - 2))))
    return new


def describe() -> list[NormInfo]:
    from .registry import REGISTRY

    return list(REGISTRY.values())
