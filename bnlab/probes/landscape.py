"""Loss landscape along the gradient (Santurkar et al. 2018, Section 3.2 and App. A.2.2, Figs 9–12).

At the current parameters θ with gradient g = ∇L(θ) on this step's batch, for step sizes s in a grid
over ``[a, b] × lr``:

* the loss L(θ − s g) (its range over the grid: Fig. 9a / 11b),
* gradient predictiveness ‖∇L(θ) − ∇L(θ − s g)‖ (Fig. 9b / 10 / 11c),
* effective β-smoothness max_s ‖∇L(θ) − ∇L(θ − s g)‖ / ‖s g‖ (Fig. 9c / 11d).

BN layers run in training mode on the same batch for every s (batch statistics of that batch), with
the same running statistics and layer noise. Two evaluations:

* ``naive``: one forward/backward per step size;
* ``batched``: all step sizes in one pass: the forward is ``torch.func.vmap`` over
  ``functional_call`` with per-step-size parameters, the backward plain autograd through the batched
  kernels. BN buffers are handed to the vmapped function as per-step-size copies (so in-place
  statistic updates stay inside the transform) and running-statistic tracking is switched off for
  the duration (it changes nothing in training mode but would cost a slow per-sample ``lerp_``
  fallback). Layers vmap cannot trace (data-dependent Python control flow such as CBN's
  ``int(num_batches_tracked)``, or a private ``torch.Generator`` as in ``noisy_bn``) make it fall
  back to ``naive``; the probe records which one ran (``probe/landscape/batched`` = 1 or 0) and why;
* ``auto`` (default): ``naive`` for convolutional models on the CPU, where it is faster, else
  ``batched`` (:func:`resolve_method`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from bnlab.norms import StochasticLayer
from bnlab.spec import check_choice

from .base import PROBES, Probe, ProbeContext, is_bn_layer, loss_and_grads
from .state import preserved

METHODS = ("auto", "batched", "naive")


def resolve_method(model: nn.Module, method: str) -> str:
    """``auto``: ``naive`` for convolutional models on the CPU, ``batched`` otherwise.

    Measured (benchmarks/results/probes.json, one CPU thread): vmapped evaluation is 2× (batch 1000)
    to 5× (batch 128) faster than naive on the DLN, but 0.5× on vgg_santurkar — a convolution with a
    different weight per vmapped step size has no fast CPU kernel.
    """
    if method != "auto":
        return method
    param = next(iter(model.parameters()), None)
    on_cpu = param is None or param.device.type == "cpu"
    has_conv = any(isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in model.modules())
    return "naive" if (has_conv and on_cpu) else "batched"
SPACINGS = ("linear", "log")
CNN_RANGE = (0.5, 4.0)  # Santurkar App. A.2.2, VGG
DLN_RANGE = (0.01, 30.0)  # Santurkar App. A.2.2, deep linear network


def default_range(model: nn.Module) -> tuple[float, float]:
    """[1/2, 4] for convolutional networks, [1/100, 30] otherwise (the paper's VGG and DLN
    settings)."""
    has_conv = any(isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in model.modules())
    return CNN_RANGE if has_conv else DLN_RANGE


def step_sizes(lr: float, multipliers: tuple[float, float], num: int,
               spacing: str = "linear") -> torch.Tensor:
    a, b = (float(v) for v in multipliers)
    if not (0 < a <= b):
        raise ValueError(f"step-size range must satisfy 0 < a <= b, got {multipliers!r}")
    if not isinstance(num, int) or num < 1:
        raise ValueError(f"num must be a positive integer, got {num!r}")
    check_choice("spacing", spacing, SPACINGS)
    # host-side bookkeeping (read with tolist, moved to the parameters' device where used): on the
    # CPU explicitly, whatever torch's default device is
    if spacing == "linear":
        grid = torch.linspace(a, b, num, dtype=torch.float64, device="cpu")
    else:
        grid = torch.logspace(math.log10(a), math.log10(b), num, dtype=torch.float64, device="cpu")
    return grid * float(lr)


@dataclass
class LandscapeResult:
    steps: list[float]
    losses: list[float]
    grad_changes: list[float]
    loss: float
    grad_norm: float
    method: str
    fallback_reason: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def beta_smoothness(self) -> float:
        """max_s ‖∇L(θ) − ∇L(θ − s g)‖ / (s ‖g‖), ignoring non-finite entries (diverged steps)."""
        ratios = [d / (s * self.grad_norm) for s, d in zip(self.steps, self.grad_changes)
                  if s > 0 and self.grad_norm > 0 and d == d and abs(d) != float("inf")]
        return max(ratios) if ratios else float("nan")

    def metrics(self) -> dict[str, float]:
        finite = [v for v in self.losses if v == v and abs(v) != float("inf")]
        changes = [v for v in self.grad_changes if v == v and abs(v) != float("inf")]
        nan = float("nan")
        return {
            "loss": self.loss,
            "loss_min": min(finite) if finite else nan,
            "loss_max": max(finite) if finite else nan,
            "loss_range": (max(finite) - min(finite)) if finite else nan,
            "grad_change_min": min(changes) if changes else nan,
            "grad_change_max": max(changes) if changes else nan,
            "beta_smoothness": self.beta_smoothness,
            "batched": 1.0 if self.method == "batched" else 0.0,
        }


def _unbatchable_reason(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if isinstance(module, StochasticLayer):
            return f"{name} ({type(module).__name__}) draws from a private torch.Generator"
    return None


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _naive(ctx: ProbeContext, names, theta, direction,
           steps) -> tuple[list[float], list[torch.Tensor]]:
    """One forward/backward per step size (buffers and RNG rewound before each)."""
    losses, grads = [], []
    for s in steps.tolist():
        params = {n: theta[n] - s * direction[n] for n in names}
        loss, g = loss_and_grads(ctx, names, params)
        losses.append(loss)
        grads.append(_flat(g))
    return losses, grads


def _batched(ctx: ProbeContext, names, theta, direction, steps, chunk_size=None):
    """Loss and gradient at θ − s g for every s in one pass: the forward is vmapped over the step
    sizes (``functional_call`` with per-s parameters and per-s buffer copies), the backward is
    ordinary autograd through the batched kernels (the losses of different s are independent, so the
    gradient of their sum holds each one's gradient in its slice)."""
    model = ctx.model
    frozen = {n: p.detach() for n, p in model.named_parameters() if n not in names}
    count = steps.numel()
    leaves = {}
    for n in names:
        s = steps.to(device=theta[n].device, dtype=theta[n].dtype).view(-1, *([1] * theta[n].dim()))
        leaves[n] = (theta[n].unsqueeze(0) - s * direction[n].unsqueeze(0)).requires_grad_()
    if ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state()  # the copies must hold the buffers as the step left them
    batched_buffers = {n: b.detach().unsqueeze(0).expand(count, *b.shape).clone()
                       for n, b in model.named_buffers()}
    x, y = ctx.x, ctx.y
    loss_fn = ctx.loss_fn

    def loss_of(params, buffers):
        return loss_fn(torch.func.functional_call(model, {**params, **buffers, **frozen}, (x,)), y)

    toggled = [m for m in model.modules() if is_bn_layer(m)
               and getattr(m, "track_running_stats", False)]
    # (setattr: a BN-like module, torch's or bnlab's; nn.Module declares no such flag)
    for m in toggled:
        setattr(m, "track_running_stats", False)
    try:
        if ctx.snapshot is not None:
            ctx.snapshot.reset_rng()
        with torch.enable_grad():
            losses = torch.func.vmap(loss_of, randomness="same",
                                     chunk_size=chunk_size)(leaves, batched_buffers)
            grads = torch.autograd.grad(losses.sum(), [leaves[n] for n in names], allow_unused=True)
    finally:
        for m in toggled:
            setattr(m, "track_running_stats", True)
    dense = [torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(names, grads)]
    flat = torch.cat([g.reshape(count, -1) for g in dense], dim=1)
    return [float(v) for v in losses.detach()], list(flat.detach())


DIRECTIONS = ("grad", "recompute")


def evaluate_landscape(ctx: ProbeContext, steps: torch.Tensor, method: str = "auto",
                       chunk_size: int | None = None, direction: str = "grad") -> LandscapeResult:
    """Evaluate the landscape at ``steps`` (absolute step sizes); runs inside ``ctx.snapshot`` or
    its own.

    ``direction="grad"`` moves along the ``.grad`` the optimizer is about to use when every
    trainable parameter has one (the training step's gradient), else — and with ``"recompute"`` —
    along a freshly computed ∇L(θ) on the batch. ∇L(θ) itself, from which gradient changes are
    measured, is always evaluated by the same code path as ∇L(θ − s g) (s = 0 added to the grid), so
    the changes are free of differences between code paths. Cost (passes): naive 1 + S (+1 if
    recomputing the direction), batched 1 vmapped pass over S + 1 (+1).
    """
    check_choice("landscape method", method, METHODS, "methods")
    check_choice("direction", direction, DIRECTIONS)
    if ctx.snapshot is None:
        with preserved(ctx.model, ctx.optimizer) as snap:
            ctx.snapshot = snap
            try:
                return evaluate_landscape(ctx, steps, method, chunk_size, direction)
            finally:
                ctx.snapshot = None
    model = ctx.model
    model.train()
    method = resolve_method(model, method)
    params = dict(model.named_parameters())
    names = [n for n, p in params.items() if p.requires_grad]
    theta = {n: p.detach() for n, p in params.items()}
    eager = None
    grads_now = {n: params[n].grad for n in names}
    if direction == "grad" and all(g is not None for g in grads_now.values()):
        g_dir = {n: g.detach().clone() for n, g in grads_now.items() if g is not None}
    else:
        loss0, g_list = loss_and_grads(ctx, names)
        g_dir = dict(zip(names, g_list))
        eager = (loss0, _flat(g_list))
    grid = torch.cat([torch.zeros(1, dtype=steps.dtype, device=steps.device), steps])
    reason = None
    if method == "batched":
        reason = _unbatchable_reason(model)
        if reason is None:
            try:
                losses, grads = _batched(ctx, names, theta, g_dir, grid, chunk_size)
            except Exception as err:  # vmap cannot trace some layer: fall back, say why
                reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        if reason is not None:
            method = "naive"
    if method == "naive":
        if eager is not None:  # the direction pass is the s = 0 pass
            head_losses, head_grads = [eager[0]], [eager[1]]
            tail_losses, tail_grads = _naive(ctx, names, theta, g_dir, steps)
            losses, grads = head_losses + tail_losses, head_grads + tail_grads
        else:
            losses, grads = _naive(ctx, names, theta, g_dir, grid)
    loss0, g0 = losses.pop(0), grads.pop(0)
    changes = [float((g0 - g).norm()) for g in grads]
    return LandscapeResult(steps=steps.tolist(), losses=losses, grad_changes=changes, loss=loss0,
                           grad_norm=float(_flat(g_dir.values()).norm()), method=method,
                           fallback_reason=reason)


@PROBES.register()
class LandscapeProbe(Probe):
    """Loss, gradient predictiveness and effective β-smoothness along the gradient (Santurkar et al.
    2018, App. A.2.2, Figs 9–12).

    Records ``loss`` (at θ), ``loss_min``/``loss_max``/``loss_range`` over the grid,
    ``grad_change_min``/ ``grad_change_max`` (‖∇L(θ) − ∇L(θ − s g)‖ over the grid),
    ``beta_smoothness`` and ``batched`` (1 if the vmapped evaluation ran, 0 for the naive one).
    ``multipliers=(a, b)`` defaults to [1/2, 4] for convolutional models and [1/100, 30] otherwise,
    times the learning rate; ``num`` points, ``spacing`` linear or log; ``direction`` as in
    :func:`evaluate_landscape`. With ``verify=True`` the first batched evaluation is checked against
    the naive one (relative 1e-3) and the probe switches to naive for good if they disagree.
    ``method``: ``auto`` (default; see :func:`resolve_method`), ``batched`` or ``naive``.

    Cost: naive 1 + num forward/backward passes; batched one vmapped forward/backward over num + 1
    parameter sets (memory: num + 1 copies of the activations; ``chunk_size`` bounds it); one more
    pass if the direction is recomputed; the first batched call also runs the naive one
    (``verify``).
    """

    name = "landscape"
    summary = ("loss range, gradient predictiveness and β-smoothness along the gradient "
               "(Santurkar Figs 9-12)")
    cost = ("naive: 1 + num forward/backward passes; batched: one vmapped forward/backward over "
            "num + 1 step sizes")

    def __init__(self, every: int = 1, multipliers: Sequence[float] | None = None, num: int = 8,
                 spacing: str = "linear", method: str = "auto", verify: bool = True,
                 chunk_size: int | None = None, direction: str = "grad") -> None:
        super().__init__(every)
        check_choice("landscape method", method, METHODS, "methods")
        check_choice("direction", direction, DIRECTIONS)
        if multipliers is not None:
            multipliers = tuple(float(v) for v in multipliers)
            if len(multipliers) != 2:
                raise ValueError(f"multipliers must be a pair (a, b), got {multipliers!r}")
            step_sizes(1.0, multipliers, num, spacing)
        else:
            step_sizes(1.0, DLN_RANGE, num, spacing)
        self.multipliers = multipliers
        self.num = num
        self.spacing = spacing
        self.method = method
        self.verify = verify
        self.chunk_size = chunk_size
        self.direction = direction
        self.verified = False
        self.fallback_reason: str | None = None
        self.last: LandscapeResult | None = None

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        multipliers = self.multipliers or default_range(ctx.model)
        steps = step_sizes(ctx.learning_rate(), multipliers, self.num, self.spacing)
        method = "naive" if self.fallback_reason is not None else self.method
        result = evaluate_landscape(ctx, steps, method, self.chunk_size, self.direction)
        if result.fallback_reason is not None and self.fallback_reason is None:
            self.fallback_reason = result.fallback_reason
            warnings.warn("landscape probe: batched evaluation unavailable, using naive "
                          f"({result.fallback_reason})",
                          stacklevel=2)
        if result.method == "batched" and self.verify and not self.verified:
            reference = evaluate_landscape(ctx, steps, "naive", direction=self.direction)
            mismatch = _mismatch(result, reference)
            self.verified = True
            if mismatch is not None:
                self.fallback_reason = f"batched evaluation disagrees with naive ({mismatch})"
                warnings.warn(f"landscape probe: {self.fallback_reason}; using naive from now on",
                              stacklevel=2)
                result = reference
        self.last = result
        return result.metrics()


def _mismatch(batched: LandscapeResult, naive: LandscapeResult, rtol: float = 1e-3) -> str | None:
    a = torch.tensor(batched.losses, dtype=torch.float64, device="cpu")
    b = torch.tensor(naive.losses, dtype=torch.float64, device="cpu")
    if not torch.allclose(a, b, rtol=rtol, atol=rtol * 1e-3, equal_nan=True):
        return f"losses {batched.losses} vs {naive.losses}"
    # Gradient changes near s→0 are differences of nearly equal gradients; compare them relative to
    # ‖g‖.
    c = torch.tensor(batched.grad_changes, dtype=torch.float64, device="cpu")
    d = torch.tensor(naive.grad_changes, dtype=torch.float64, device="cpu")
    scale = max(naive.grad_norm, 1e-12)
    finite = torch.isfinite(c) & torch.isfinite(d)
    too_far = (c - d).abs()[finite] > rtol * scale + rtol * d.abs()[finite]
    if not torch.equal(torch.isfinite(c), torch.isfinite(d)) or bool(too_far.any()):
        return f"gradient changes {batched.grad_changes} vs {naive.grad_changes}"
    return None
