"""Fold eval-mode normalization layers into the adjacent convolution or linear layer, anywhere in a
model.

In eval mode every BatchNorm-family layer is a per-channel affine map ``y = a ⊙ x + b`` (Ioffe &
Szegedy 2015, §3.2: "the normalization … is simply a linear transform"). Next to a linear layer it
can be absorbed: after ``z = W x + c`` it becomes ``W' = diag(a) W``, ``c' = a ⊙ c + b``; before it
(``z = W (a ⊙ x + b) + c``) it becomes ``W' = W diag(a)``, ``c' = c + W b`` — for a convolution only
without padding (zero padding does not commute with the shift) and without groups.

Adjacency is read from the model's ``torch.fx`` graph, so it is found in any traceable forward (a
ResNet block, a timm stage), not only inside ``nn.Sequential``. A norm is folded into its producer
only when the producer's output feeds the norm alone, and into its consumer only when the norm's
output feeds that layer alone, so no other path sees a changed tensor. A module whose forward cannot
be traced is searched child by child. Whatever stays is named, with the reason, in a warning or in
the :class:`FoldReport` that ``fold(model, report=True)`` returns.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, cast

import torch
import torch.fx as fx
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ..variants.base import ChannelNorm
from .convert import NORM_ACT_CLASSES
from ..variants.wrappers import LINEAR_TYPES, ScaleInvariantBN, WeightNorm

# torch's BatchNorm classes whose eval forward is the running-statistics affine map. timm's norm-act
# layers apply that map and then an activation: they fold into the layer before them only, and leave
# their drop path and activation behind.
_TORCH_AFFINE = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_NORMS = (ChannelNorm, _BatchNorm, ScaleInvariantBN)


def _is_norm(module: nn.Module) -> bool:
    """bnlab's and torch's norms, and frozen BatchNorm (torchvision/timm), which is affine by
    design."""
    return isinstance(module, _NORMS) or _is_frozen(module)


def _is_frozen(module: nn.Module) -> bool:
    return type(module).__name__ == "FrozenBatchNorm2d" and hasattr(module, "running_var")


@dataclass
class FoldReport:
    """What :func:`fold` did: ``folded`` maps each norm to the layer that absorbed it, ``unfolded``
    each norm left in place to the reason, ``untraced`` each module whose forward fx could not
    trace."""

    folded: dict[str, str] = field(default_factory=dict)
    unfolded: dict[str, str] = field(default_factory=dict)
    untraced: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"folded {len(self.folded)} norm(s); left {len(self.unfolded)} in place"]
        lines += [f"  {name}: {reason}" for name, reason in self.unfolded.items()]
        return "\n".join(lines)


@torch.no_grad()
def fold(model: nn.Module, report: bool = False):
    """A copy of ``model`` in eval mode with every foldable normalization folded into its neighbour.

    Folds bnlab's layers whose eval mode is affine (``bn``, ``mbn``, ``cbn``, ``brn``, ``lp_bn``,
    ..., ``si_bn`` into its own layer, ``wn``-wrapped layers as plain copies) and torch's
    ``BatchNorm1d/2d/3d``. Returns the folded model; with ``report=True`` returns ``(model,
    FoldReport)`` and does not warn. Without it, norms left in place are named in a ``UserWarning``.
    """
    model = copy.deepcopy(model).eval()
    rep = FoldReport()
    _fold_traced(model, model, "", rep)
    _explain_leftovers(model, rep)
    if report:
        return model, rep
    if rep.unfolded:
        warnings.warn(f"fold left {len(rep.unfolded)} normalization layer(s) in place:\n"
                      + "\n".join(f"  {n}: {r}" for n, r in rep.unfolded.items()), stacklevel=2)
    return model


class _Tracer(fx.Tracer):
    """Norms and weight wrappers are leaves: fold reasons about them as whole layers."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return _is_norm(m) or isinstance(m, WeightNorm) or super().is_leaf_module(m, qualname)


def _fold_traced(root: nn.Module, module: nn.Module, prefix: str, rep: FoldReport) -> None:
    try:
        graph = _Tracer().trace(module)
    # fx raises many kinds (TraceError, TypeError, ...) on untraceable code
    except Exception as err:
        key = prefix.rstrip(".") or "<model>"
        rep.untraced[key] = f"{type(err).__name__}: {err}".splitlines()[0]
        for name, child in module.named_children():
            if not (_is_norm(child) or isinstance(child, WeightNorm)):
                _fold_traced(root, child, prefix + name + ".", rep)
        return
    for kind, layer, norm, affine in _plan(graph, module, prefix, rep):
        _apply(root, kind, prefix + layer, prefix + norm, affine)
        rep.folded[prefix + norm] = prefix + layer


def _plan(graph: fx.Graph, module: nn.Module, prefix: str, rep: FoldReport) -> list[tuple]:
    """(kind, layer, norm, affine) for each fold the graph allows; reasons for the others."""
    modules = dict(module.named_modules())
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
    taken: set[tuple[str, str]] = set()  # (layer, side): one norm per side of a layer
    plan = []
    for node in graph.nodes:
        if node.op != "call_module" or not _is_norm(modules[node.target]):
            continue
        norm = modules[node.target]
        affine, reason = eval_affine(norm)
        if affine is None:
            rep.unfolded[prefix + node.target] = reason
        elif calls[node.target] > 1:
            rep.unfolded[prefix + node.target] = "called more than once in forward"
        elif isinstance(norm, ScaleInvariantBN):
            plan.append(("self", node.target, node.target, affine))
        elif ((side := _neighbour(node, modules, calls, taken, _is_norm_act(norm)))
              and isinstance(side, tuple)):
            taken.add(side)
            plan.append((side[1], side[0], node.target, affine))
        else:
            rep.unfolded[prefix + node.target] = side
    return plan


def _neighbour(node: fx.Node, modules: dict, calls: Counter, taken: set,
               output_only: bool) -> tuple[str, str] | str:
    """(layer, "output"|"input") the norm can fold into, or the reason it cannot."""
    src = node.args[0] if len(node.args) == 1 and not node.kwargs else None
    if isinstance(src, fx.Node) and src.op == "call_module":
        layer = _unwrap(modules[src.target])
        if (isinstance(layer, LINEAR_TYPES) and calls[src.target] == 1
                and (src.target, "output") not in taken):
            if len(src.users) == 1:
                return str(src.target), "output"  # a call_module node's target is the module's path
            others = ", ".join(sorted(u.name for u in src.users if u is not node))
            producer_note = f"the output of {src.target!r} also feeds {others}"
        else:
            producer_note = f"its input comes from {_describe(src)}, not a conv/linear layer"
    else:
        producer_note = f"its input comes from {_describe(src)}"
    users = list(node.users)
    if output_only:
        return f"a norm-act layer folds only into the layer before it: {producer_note}"
    if (len(users) == 1 and users[0].op == "call_module" and users[0].args == (node,)
            and not users[0].kwargs):
        dst = users[0]
        layer = _unwrap(modules[dst.target])
        if (calls[dst.target] == 1 and (dst.target, "input") not in taken
                and _accepts_input_fold(layer)):
            return str(dst.target), "input"
    consumer_note = "its output feeds " + (", ".join(_describe(u) for u in users) or "nothing")
    return f"no adjacent conv/linear to fold into: {producer_note}; {consumer_note}"


def _describe(node) -> str:
    if not isinstance(node, fx.Node):
        return repr(node)
    if node.op == "call_module":
        return f"module {node.target!r}"
    if node.op == "placeholder":
        return f"the input {node.target!r}"
    return f"{node.op} {getattr(node.target, '__name__', node.target)}"


def eval_affine(norm: nn.Module) -> tuple[tuple[Tensor, Tensor] | None, str]:
    """The eval-mode map as per-channel (scale, shift), or (None, why it is not one): each layer's
    own (``inference_affine``), plain BN's from the running statistics for torch's."""
    if _is_frozen(norm):
        return _running_affine(norm), ""
    # torch's rule: eval normalizes with the buffers whenever they exist, track_running_stats or not
    if getattr(norm, "running_mean", 0) is None or getattr(norm, "running_var", 0) is None:
        return None, ("uses batch statistics in eval mode (track_running_stats=False, no running "
                      "buffers): not a fixed affine map")
    if isinstance(norm, _BatchNorm) and not hasattr(norm, "inference_affine"):
        if type(norm) not in _TORCH_AFFINE and not _is_norm_act(norm):
            return None, f"{type(norm).__name__} has a forward of its own: not known to be affine"
        return _running_affine(norm), ""
    inference_affine = cast(Callable[[], "tuple[Tensor, Tensor] | None"], norm.inference_affine)
    affine = inference_affine()
    if affine is None:
        return None, f"{type(norm).__name__} is not an affine map in eval mode"
    return affine, ""


def _is_norm_act(module: nn.Module) -> bool:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}" in NORM_ACT_CLASSES


def _running_affine(bn: nn.Module) -> tuple[Tensor, Tensor]:
    # a BN-like module (torch's or ours) that tracks running statistics: its buffers are tensors
    mean, var = cast(Tensor, bn.running_mean), cast(Tensor, bn.running_var)
    weight = cast(Tensor, bn.weight) if bn.weight is not None else torch.ones_like(mean)
    bias = cast(Tensor, bn.bias) if bn.bias is not None else torch.zeros_like(mean)
    scale = weight * torch.rsqrt(var + cast(float, bn.eps))
    return scale, bias - mean * scale


def _explain_leftovers(model: nn.Module, rep: FoldReport) -> None:
    """Every norm still in the model gets a reason (e.g. never called, or inside untraceable
    code)."""
    for name, module in model.named_modules():
        if _is_norm(module) and name not in rep.unfolded and name not in rep.folded:
            parents = [p for p in rep.untraced if p == "<model>" or name.startswith(p + ".")]
            rep.unfolded[name] = (f"inside {parents[-1]!r}, whose forward fx cannot trace "
                                  f"({rep.untraced[parents[-1]]})"
                                  if parents else "not called by the traced forward")


def _apply(root: nn.Module, kind: str, layer_path: str, norm_path: str, affine) -> None:
    if kind == "self":  # si_bn: the norm wraps its own layer
        _set(root, norm_path,
             _scaled_output(cast(ScaleInvariantBN, root.get_submodule(norm_path)).layer, *affine))
        return
    layer = _unwrap(root.get_submodule(layer_path))
    new = _scaled_output(layer, *affine) if kind == "output" else _scaled_input(layer, *affine)
    _set(root, layer_path, new)
    norm = root.get_submodule(norm_path)
    _set(root, norm_path,
         nn.Sequential(cast(nn.Module, norm.drop), cast(nn.Module, norm.act))
         if _is_norm_act(norm) else nn.Identity())


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def _unwrap(module: nn.Module) -> nn.Module:
    """WN is a reparametrized linear layer: fold into (a plain copy of) the layer it wraps."""
    return cast(nn.Module, module.layer) if isinstance(module, WeightNorm) else module


def _accepts_input_fold(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear):
        return True
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and layer.groups == 1:
        return (layer.padding == "valid" if isinstance(layer.padding, str)
                else all(p == 0 for p in layer.padding))
    return False


def _plain_copy(layer: nn.Module, bias: bool) -> nn.Linear | _ConvNd:
    """A parametrization-free copy (so WN-wrapped layers fold too), with a bias."""
    weight = cast(Tensor, layer.weight).detach().clone()
    new: nn.Linear | _ConvNd
    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, layer.out_features, bias=bias)
    else:  # Conv1d/2d/3d (LINEAR_TYPES): one constructor, which the stubs spell per dimension
        conv = cast(_ConvNd, layer)
        conv_type = cast(Callable[..., _ConvNd], type(conv))
        new = conv_type(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                        padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=bias,
                        padding_mode=conv.padding_mode)
    new = new.to(device=weight.device, dtype=weight.dtype)
    new.weight.copy_(weight)
    if bias:
        old_bias = cast("Tensor | None", layer.bias)
        _bias(new).copy_(old_bias.detach() if old_bias is not None
                         else torch.zeros_like(_bias(new)))
    return new


def _bias(layer: nn.Linear | _ConvNd) -> Tensor:
    if layer.bias is None:  # _plain_copy(bias=True) always makes one
        raise RuntimeError(f"{type(layer).__name__} copy has no bias")
    return layer.bias


def _scaled_output(layer: nn.Module, scale: Tensor, shift: Tensor) -> nn.Module:
    new = _plain_copy(layer, bias=True)
    new.weight.mul_(scale.view(-1, *([1] * (new.weight.dim() - 1))))
    _bias(new).mul_(scale).add_(shift)
    return new


def _scaled_input(layer: nn.Module, scale: Tensor, shift: Tensor) -> nn.Module:
    new = _plain_copy(layer, bias=True)
    w = new.weight
    # The bias gains W·shift; a conv without padding sees the shift at every tap of its kernel.
    per_input = w.flatten(2).sum(-1) if w.dim() > 2 else w
    _bias(new).add_(per_input @ shift)
    w.mul_(scale.view(1, -1, *([1] * (w.dim() - 2))))
    return new
