"""Effective learning rates of scale-invariant weights (Arora, Li & Lyu 2019, Lemma 2.4, Theorem
2.5)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from bnlab.norms import ScaleInvariantBN

from .base import PROBES, Probe, ProbeContext, WEIGHT_LAYER_TYPES, cosine, is_bn_layer


def scale_invariant_weights(model: nn.Module) -> list[str]:
    """Names of weights that a following BN makes scale-invariant.

    Exactly invariant: ``ScaleInvariantBN.layer.weight`` (Arora Eq. 8, ε scaled by ‖w_k‖²).
    Invariant up to BN's ε (and only if the layer has no bias, which BN's mean subtraction removes
    anyway): the weight of a Linear/Conv directly followed by a BN layer inside an ``nn.Sequential``
    (the layout ``bnlab.norms.normalized`` builds).
    """
    names = []
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, ScaleInvariantBN):
            names.append(f"{dot}layer.weight")
        elif isinstance(module, nn.Sequential):
            children = list(module.named_children())
            for (name_a, a), (_, b) in zip(children, children[1:]):
                if isinstance(a, WEIGHT_LAYER_TYPES) and is_bn_layer(b) and a.bias is None:
                    names.append(f"{dot}{name_a}.weight")
    return names


@PROBES.register()
class EffectiveLRProbe(Probe):
    """Per scale-invariant weight w (Arora, Li & Lyu 2019, Definition 2.1): ‖w‖, the effective
    learning rate η/‖w‖² (Theorem 2.5), cos(w, ∇w) (0 for exact scale invariance, Lemma 2.4's
    ⟨w, ∇w⟩ = 0) and, after the optimizer step, the residual of Lemma 2.4's
    ‖w_{t+1}‖² = ‖w_t‖² + η²‖∇w‖² (exact for plain SGD without momentum or weight decay; other
    optimizers make it non-zero by design).

    Metrics ``norm/<param>``, ``eff_lr/<param>``, ``cos/<param>`` at ``after_backward`` and
    ``residual/<param>`` = ‖w_{t+1}‖² − ‖w_t‖² − η²‖∇w‖², ``residual_rel/<param>`` (divided by
    ‖w_{t+1}‖²) at ``after_step``; the residual needs the loop (or Lab) to call ``after_step``. ∇w
    is the ``.grad`` the optimizer is about to use; η its parameter group's learning rate. Weights:
    those of :func:`scale_invariant_weights`, or ``params=[names]``.

    Cost: no forward or backward pass (reads parameters and gradients only).
    """

    name = "effective_lr"
    summary = ("‖w‖, η/‖w‖², cos(w, ∇w) and Lemma 2.4's norm-growth residual per scale-invariant "
               "weight (Arora)")
    cost = "0 passes (reads weights and gradients)"
    read_only = True

    def __init__(self, every: int = 1, params: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.params = None if params is None else list(params)

    def _targets(self, model: nn.Module) -> list[tuple[str, torch.Tensor]]:
        named = dict(model.named_parameters())
        names = scale_invariant_weights(model) if self.params is None else self.params
        unknown = [n for n in names if n not in named]
        if unknown:
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; scale-invariant weights "
                             f"found: {', '.join(scale_invariant_weights(model)) or '(none)'}")
        return [(n, named[n]) for n in names]

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        out, carry = {}, {}
        for name, w in self._targets(ctx.model):
            if w.grad is None:
                continue
            lr = ctx.learning_rate(w)
            w64, g64 = w.detach().double(), w.grad.detach().double()
            sq = float(w64.pow(2).sum())
            grad_sq = float(g64.pow(2).sum())
            out[f"norm/{name}"] = sq**0.5
            out[f"eff_lr/{name}"] = lr / sq if sq > 0 else float("inf")
            out[f"cos/{name}"] = cosine(w64.reshape(-1), g64.reshape(-1))
            carry[name] = (w, sq + lr * lr * grad_sq)
        self._carry = carry or None
        return out

    def finish(self, ctx: ProbeContext) -> dict[str, float]:
        out = {}
        for name, (w, predicted) in self._carry.items():
            new_sq = float(w.detach().double().pow(2).sum())
            out[f"residual/{name}"] = new_sq - predicted
            out[f"residual_rel/{name}"] = ((new_sq - predicted) / new_sq if new_sq > 0
                                           else float("nan"))
        return out
