"""sharpness: the train-mode loss's top Hessian eigenvalue against the optimizer's stability
threshold.

Santurkar, Tsipras, Ilyas & Madry, How Does Batch Normalization Help Optimization? (§3: BN makes
the loss smoother, so larger steps stay stable), read with the edge-of-stability threshold of
gradient descent on a quadratic (Cohen et al. 2021): a step of size η diverges along a direction of
curvature λ when λ > 2/η; heavy-ball momentum μ moves the line to (2 + 2μ)/η and Nesterov momentum
(torch's ``nesterov=True``) to (2 + 2μ)/(η(1 + 2μ)). For Adam-type optimizers (Adam, AdamW, NAdam,
RAdam, Adamax) the sharpness that matters is the preconditioned one, λ_max(P⁻¹H) with P =
diag(√v̂ + ε) from the optimizer's second-moment state, against (2 + 2β₁)/((1 − β₁)η) (Cohen et
al. 2022, adaptive edge of stability); before the optimizer has state, and for other optimizers,
the plain sharpness is reported as info against 2/η.

Measured: λ_max of H = ∇²L(θ; B) for the first batch B, every trainable parameter, BN in train mode
(normalizing by μ_B, σ_B: the function SGD descends), by Lanczos on Hessian-vector products
(:func:`bnlab.probes.hessian.lanczos_extremes`, which gives a lower bound: it never over-warns).
Without an optimizer the value is info only.

Cost: one double-backward graph and ``hessian_iters`` Hessian-vector products (≈ 2 backward
passes each) on one batch.
"""

from __future__ import annotations

import math

import torch

from bnlab.probes.base import ProbeContext
from bnlab.probes.hessian import hessian_vector_product, lanczos_extremes

from .context import Checkup, as_trained
from .findings import Finding

ADAM_TYPES = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax")
PAPER = ("Santurkar, Tsipras, Ilyas & Madry, How Does Batch Normalization Help Optimization? §3; "
         "stability threshold 2/η of gradient descent (edge of stability, Cohen et al. 2021)")
WHY = ("gradient descent with step η diverges along curvature above its threshold (2/η plain, "
       "(2+2μ)/η heavy ball): at or past it the loss oscillates or blows up"
       "; false alarms: 0 of 320 healthy networks, closest 0.64× the line "
       "(benchmarks/doctor_false_alarms.py)")


def threshold_for(optimizer) -> tuple[float, str, bool]:
    """(threshold, what it is, preconditioned?) for the optimizer's first parameter group."""
    group = optimizer.param_groups[0]
    lr = float(group["lr"])
    if lr == 0:
        return math.inf, "lr = 0", False
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        mu = float(group.get("momentum", 0.0))
        if mu and group.get("nesterov", False):
            return (2 + 2 * mu) / (lr * (1 + 2 * mu)), f"(2+2μ)/(η(1+2μ)), Nesterov μ={mu:g}", False
        if mu:
            return (2 + 2 * mu) / lr, f"(2+2μ)/η, heavy-ball μ={mu:g}", False
        return 2 / lr, "2/η, plain SGD", False
    if name in ADAM_TYPES:
        beta1 = float(group.get("betas", (0.9, 0.999))[0])
        return ((2 + 2 * beta1) / ((1 - beta1) * lr),
                f"(2+2β₁)/((1−β₁)η) on λ_max(P⁻¹H), {name} β₁={beta1:g}", True)
    return 2 / lr, f"2/η for reference ({name} has no known threshold)", False


def preconditioner(optimizer, params: list[torch.Tensor]) -> torch.Tensor | None:
    """P^{-1/2} flattened over ``params`` from Adam's state (√v̂ + ε), or None without state."""
    group = optimizer.param_groups[0]
    beta2, eps = float(group.get("betas", (0.9, 0.999))[1]), float(group.get("eps", 1e-8))
    parts = []
    for p in params:
        state = optimizer.state.get(p, {})
        if "exp_avg_sq" not in state:
            return None
        step = float(state.get("step", 1))
        v_hat = state["exp_avg_sq"].detach().double() / (1 - beta2**max(step, 1.0))
        parts.append((v_hat.sqrt() + eps).rsqrt().reshape(-1))
    return torch.cat(parts)


def sharpness(checkup: Checkup, snapshot, precondition: bool) -> tuple[float, bool]:
    model = as_trained(checkup.model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    ctx = ProbeContext(model=model, loss_fn=checkup.loss_fn, batch=checkup.batches[0], step=0,
                       optimizer=checkup.optimizer, snapshot=snapshot)
    _, hvp, dim = hessian_vector_product(ctx, names)
    device = checkup.device
    scale = None
    if precondition and checkup.optimizer is not None:
        named = dict(model.named_parameters())
        scale = preconditioner(checkup.optimizer, [named[n] for n in names])
    op = hvp
    if scale is not None:
        scale = scale.to(device)

        def op(v):
            return scale * hvp(scale * v)

    generator = torch.Generator().manual_seed(0)
    top, _, _ = lanczos_extremes(op, dim, checkup.hessian_iters, generator, device)
    return top, scale is not None


def check(checkup: Checkup, report, snapshot) -> None:
    if not any(p.requires_grad for p in checkup.model.parameters()):
        return
    if checkup.optimizer is None:
        top, _ = sharpness(checkup, snapshot, False)
        report.measurements["sharpness"] = [(0, top, None)]
        report.add(Finding("sharpness", "info", (), top, math.inf, WHY, PAPER,
                           "pass optimizer= to compare with its stability threshold",
                           f"λ_max = {top:.4g} (train-mode loss, first batch); no optimizer given"))
        return
    threshold, what, pre = threshold_for(checkup.optimizer)
    top, used_pre = sharpness(checkup, snapshot, pre)
    if pre and not used_pre:  # Adam before its first step: no preconditioner yet
        threshold, what = 2 / checkup.lr, "2/η for reference (Adam has no state yet)"
    report.measurements["sharpness"] = [(0, top, threshold)]
    kind = "preconditioned λ_max(P⁻¹H)" if used_pre else "λ_max"
    detail = f"{kind} = {top:.4g} vs {what} = {threshold:.4g}"
    warn = top >= threshold and (used_pre or not pre)
    if warn or (pre and not used_pre) or "reference" in what:
        severity = "warn" if warn and "reference" not in what else "info"
        report.add(Finding("sharpness", severity, (), top, threshold, WHY, PAPER,
                           "lower the learning rate below 2/λ_max (bnlab.probes.max_stable_lr "
                           "finds the largest stable one), or warm it up", detail))
