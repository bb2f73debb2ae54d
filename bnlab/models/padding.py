"""How much of what a norm sees is a spatial pattern shared by every sample (e.g. the conv
padding's)?

A 3×3 conv with zero padding adds, at each border position, a different constant (the missing taps'
contribution is zero instead of the data's): a pattern over (h, w) that is the same for every
sample. On small maps every position is border (a 2×2 map: four corners), and that pattern can make
up most of the input variance a batch norm divides by — normalizing a proxy network's deep stages by
the padding instead of by the data (Peng's Table 1 on 8×8 digits). :func:`padding_share`
measures, for each norm, the share of its per-channel input variance explained by the per-position
mean over the batch. On the deep stages of a zero-padded network this is the padding pattern
(compare with ``padding_mode="replicate"`` or larger inputs to see how much of it is); on the stem
it also contains the data's own mean image.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from bnlab.norms import ChannelNorm


def position_share(x: torch.Tensor) -> float:
    """Share of the per-channel variance of ``x`` (N, C, H, W) explained by the mean over samples at
    each position.

    For channel c: total = mean over (n, h, w) of (x − x̄_c)², between = mean over (h, w) of (m(h,
    w) − x̄_c)² with m(h, w) the sample mean at (h, w). The sample means carry noise (within / N on
    average), removed with the unbiased correction between − within/(N − 1), floored at 0. Returns
    the mean over channels of between/total (channels without variance are skipped); 0 for 1×1 maps
    (no spatial pattern). ``x = p(h, w) + ε`` with Var_hw(p) = P, Var(ε) = σ² gives P/(P + σ²).
    """
    if x.dim() != 4:
        raise ValueError("position_share needs (N, C, H, W) activations, got shape "
                         f"{tuple(x.shape)}")
    x = x.detach().double()
    n = x.shape[0]
    if n < 2:
        raise ValueError("position_share needs at least 2 samples")
    centred = x - x.mean(dim=(0, 2, 3), keepdim=True)
    total = centred.pow(2).mean(dim=(0, 2, 3))
    between = centred.mean(dim=0).pow(2).mean(dim=(1, 2))
    within = total - between
    between = (between - within / (n - 1)).clamp(min=0.0)
    keep = total > 0
    if not bool(keep.any()):
        return 0.0
    return float((between[keep] / total[keep]).mean())


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (ChannelNorm, nn.modules.batchnorm._BatchNorm))


@torch.no_grad()
def _norm_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, tuple[float, int, int]]:
    """{norm path: (position_share, H, W)} from one train-mode pass of a copy of ``model`` (which is
    not touched)."""
    probe = copy.deepcopy(model).train()
    found: dict[str, tuple[float, int, int]] = {}
    hooks = []
    for name, module in probe.named_modules():
        if _is_norm(module):
            def hook(mod, inputs, _name=name):
                if inputs and inputs[0].dim() == 4:
                    found[_name] = (position_share(inputs[0]), *inputs[0].shape[-2:])
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        probe(x)
    finally:
        for h in hooks:
            h.remove()
    return found


def padding_share(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """``{norm module path: position_share of its input}`` for every norm on a 4-D (conv) input.

    One train-mode forward pass of a copy of ``model`` on the batch ``x`` (the model itself, its
    running statistics included, is not touched).
    """
    return {name: share for name, (share, _, _) in _norm_inputs(model, x).items()}


def padding_share_by_size(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """Mean :func:`padding_share` over the norms whose inputs have the same map size, ``{"4×4":
    share, ...}``, largest maps first (a network's stages, whatever its module names)."""
    groups: dict[tuple[int, int], list[float]] = {}
    for share, h, w in _norm_inputs(model, x).values():
        groups.setdefault((h, w), []).append(share)
    return {f"{h}×{w}": sum(v) / len(v) for (h, w), v in sorted(groups.items(), reverse=True)}
