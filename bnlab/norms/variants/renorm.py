"""Batch Renormalization (Ioffe 2017), the stop-gradient technique CBN borrows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch import Tensor

from .base import ChannelNorm
from ..engine.route import HALF_DTYPES, fused_enabled
from ..engine.switches import fast_paths_allowed, full_statistics, module_group
from ..engine.fused import define, park, take
from ..registry import BN_OPTIONS, Param, norm


def relaxed_limit(step: Tensor, start: float, final: float, relax_from: int,
                  reach_at: int) -> Tensor | float:
    """Ioffe 2017 §4's warm-up of r_max / d_max: ``start`` before step ``relax_from``, then linear
    to ``final`` at step ``reach_at`` (the paper: r_max 1 → 3 between steps 5k and 40k, d_max 0 → 5
    between 5k and 25k). ``reach_at <= relax_from`` switches at ``relax_from``. During a warm-up a
    tensor (no recompiles as it moves); without one (both 0) the plain number ``final``, so inductor
    has fewer ops to inline into the full-size loops (``benchmarks/norms.py --modes compiled``
    measures compiled brn)."""
    if relax_from == 0 and reach_at <= 0:
        return final
    step = step.to(torch.float32)
    if reach_at > relax_from:
        frac = ((step - relax_from) / (reach_at - relax_from)).clamp(0.0, 1.0)
    else:
        frac = (step >= relax_from).to(torch.float32)
    return start + (final - start) * frac


# Ioffe 2017 §4: r_max = 1, d_max = 0 for the first 5k steps, then relaxed to r_max = 3 at 40k steps
# and d_max = 5 at 25k steps.
IOFFE_RELAX_FROM, IOFFE_R_MAX_AT, IOFFE_D_MAX_AT = 5000, 40000, 25000
SETTLE = 3.0  # running averages settle in 3/momentum steps: e^-3 ≈ 5 % weight left on their start


def ioffe_schedule(run_steps: int | None, momentum: float | None) -> tuple[int, int, int]:
    """The default warm-up ``(relax_from, r_max_at, d_max_at)`` in steps.

    Run length unknown: Ioffe 2017 §4's step counts as printed (5000, 40000, 25000). Known
    (``run_steps``, which ``bnlab train`` sets): the same proportions 5 : 40 : 25, scaled so r_max
    is reached at half the run (our choice: Ioffe's run went on well past 40k steps), and never
    relaxed before the running averages settle (3/momentum steps; 10 with cumulative averages) —
    corrections r, d against unsettled running statistics are what made a 20-step resnet18 run
    diverge.
    """
    if run_steps is None:
        return IOFFE_RELAX_FROM, IOFFE_R_MAX_AT, IOFFE_D_MAX_AT
    settle = math.ceil(SETTLE / momentum) if momentum else 10
    half = run_steps / 2
    relax = max(round(half * IOFFE_RELAX_FROM / IOFFE_R_MAX_AT), settle)
    return relax, max(round(half), relax), max(round(half * IOFFE_D_MAX_AT / IOFFE_R_MAX_AT), relax)


def set_run_length(model: nn.Module, steps: int) -> int:
    """Tell every ``brn`` layer of ``model`` with the default warm-up the run's length in steps (its
    schedule then scales to it, :func:`ioffe_schedule`); returns how many layers were told."""
    layers = [m for m in model.modules() if isinstance(m, BatchRenorm) and m.default_warmup]
    for layer in layers:
        layer.run_steps = int(steps)
    return len(layers)


@norm("brn", "Batch Renormalization (stop-gradient r, d corrections)", "Ioffe 2017", "Alg. 1", {
    "r_max": Param(3.0, float, minimum=1.0), "d_max": Param(5.0, float, minimum=0.0),
    "relax_from": Param(None, int, minimum=0, nullable=True,
                        help="warm-up: r_max=1, d_max=0 before this step (none: Ioffe's schedule)"),
    "r_max_at": Param(None, int, minimum=0, nullable=True,
                      help="warm-up: step at which r_max is reached"),
    "d_max_at": Param(None, int, minimum=0, nullable=True,
                      help="warm-up: step at which d_max is reached"),
    "run_steps": Param(None, int, minimum=1, nullable=True,
                       help="the run's length, scaling the default warm-up (bnlab train sets it)"),
    **BN_OPTIONS})
class BatchRenorm(ChannelNorm):
    """Batch Renormalization (Ioffe 2017, Algorithm 1).

    ``x̂ = (x − μ_B)/σ_B · r + d`` with ``σ_B = √(σ²_B + ε)`` (biased σ²_B),
    ``r = stop_grad(clip(σ_B/σ, 1/r_max, r_max))``, ``d = stop_grad(clip((μ_B − μ)/σ, −d_max,
    d_max))``, then ``y = γ x̂ + β``; the running values follow Algorithm 1:
    ``μ ← μ + α(μ_B − μ)``, ``σ ← σ + α(σ_B − σ)`` — an EMA of σ_B itself, not of the unbiased
    variance. ``running_var`` keeps BN's name and holds ``σ² − ε``, so ``√(running_var + ε) = σ``
    and a BatchNorm state_dict loads with its meaning. Inference is BN with the running statistics.
    §4's warm-up (r_max from 1, d_max from 0) is on by default: :func:`ioffe_schedule`, scaled to
    ``run_steps`` when the run's length is known. Giving any of ``relax_from``/``r_max_at``/
    ``d_max_at`` (steps) sets the schedule by hand (the others 0); ``relax_from=0`` alone: no
    warm-up. ``track_running_stats=False``: r = 1, d = 0 (plain BN).
    """

    reads_own_updates = True  # refused in checkpoint recomputation (ChannelNorm.check_input)

    def __init__(self, num_features: int, r_max: float = 3.0, d_max: float = 5.0,
                 relax_from: int | None = None, r_max_at: int | None = None,
                 d_max_at: int | None = None, run_steps: int | None = None, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.r_max, self.d_max = r_max, d_max
        self.relax_from, self.r_max_at, self.d_max_at = relax_from, r_max_at, d_max_at
        self.run_steps = run_steps

    @property
    def default_warmup(self) -> bool:
        """Whether the warm-up is :func:`ioffe_schedule`'s (no schedule step given by hand)."""
        return self.relax_from is None and self.r_max_at is None and self.d_max_at is None

    def schedule(self) -> tuple[int, int, int]:
        """``(relax_from, r_max_at, d_max_at)`` in effect (the default, or the given steps)."""
        if self.default_warmup:
            return ioffe_schedule(self.run_steps, self.momentum)
        return self.relax_from or 0, self.r_max_at or 0, self.d_max_at or 0

    def extra_repr(self) -> str:
        relax, r_at, d_at = self.schedule()
        source = f"Ioffe's schedule, run_steps={self.run_steps}" if self.default_warmup else "given"
        return (super().extra_repr() + f", r_max={self.r_max}, d_max={self.d_max}, "
                f"relax_from={relax}, r_max_at={r_at}, d_max_at={d_at} ({source})")

    def limits(self) -> tuple[Tensor | float, Tensor | float]:
        """(r_max, d_max) at the current step."""
        t = self.num_batches_tracked
        relax, r_at, d_at = self.schedule()
        return (relaxed_limit(t, 1.0, self.r_max, relax, r_at),
                relaxed_limit(t, 0.0, self.d_max, relax, d_at))

    def normalize(self, x: Tensor) -> Tensor:
        if (y := self.without_batch_stats(x)) is not None:
            return y
        gamma, beta = self.gamma_beta(x)
        if self.takes_torch_kernel(x):
            return self.renorm_with_torch_kernel(x, gamma, beta)
        if not self.tracks_now():  # no running statistics (or not updated): r = 1, d = 0
            return self.normalize_with_batch_stats(x, self.batch_norm_coefficients, gamma, beta)[0]

        def coefficients(mean_b, var_b, gamma, beta):
            std_b = torch.sqrt(var_b + self.eps)
            r, d = self.corrections(mean_b, std_b)
            scale = gamma * r / std_b
            return scale, beta + gamma * d - mean_b * scale

        update = self._update_running if self.training else None
        return self.normalize_with_batch_stats(x, coefficients, gamma, beta, update=update)[0]

    def corrections(self, mean_b: Tensor, std_b: Tensor) -> tuple[Tensor, Tensor]:
        """Algorithm 1's ``r = clip(σ_B/σ, 1/r_max, r_max)`` and ``d = clip((μ_B − μ)/σ, −d_max,
        d_max)`` against the running values, both stop-gradient (``std_b``: σ_B = √(σ²_B + ε))."""
        std, (r_max, d_max) = torch.sqrt(self.running_var + self.eps), self.limits()
        # each limit is a number or a tensor (limits()), so both bounds of a clamp are the same kind
        r = (std_b / std).clamp(1 / r_max, r_max)  # type: ignore[arg-type]
        d = ((mean_b - self.running_mean) / std).clamp(-d_max, d_max)  # type: ignore[arg-type]
        return r.detach(), d.detach()

    def takes_torch_kernel(self, x: Tensor) -> bool:
        """Eager CPU inputs where the fused operators are not the faster route — small batches
        (the shared path would run about 100 plain ops a step) and half precision (the fused
        operators' fixed cost is large against torch's fast half kernel; both measured by
        ``benchmarks/norms.py``, benchmarks/results/norms_brn.json): r and d are
        constants to autograd, so ``γ x̂ + β`` with ``x̂ = (x − μ_B)/σ_B · r + d`` is BN's output
        with weight ``γ r`` and bias ``β + γ d`` — torch's kernel, its gradient exactly Algorithm
        1's. Elsewhere (CUDA in every dtype: kernel launches count there) the fused operators (4
        dispatched operations) or, compiled, inductor's loops run the same math; synced layers
        and ``plain_autograd`` keep the shared path."""
        cpu_half = x.device.type == "cpu" and x.dtype in HALF_DTYPES
        return (module_group(self) is None and (cpu_half or not fused_enabled(x))
                and fast_paths_allowed() and full_statistics(self) is None)

    def renorm_with_torch_kernel(self, x: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
        """Algorithm 1 through ``F.batch_norm`` (see :meth:`takes_torch_kernel`): r, d and the
        running update from the batch moments, without grad, in one operator
        (``bnlab::renorm_corrections``: its 48–50 per-channel operations are one to the
        dispatcher, as the fused operators' are), then torch's kernel with weight γ·r and bias
        β + γ·d."""
        if not self.tracks_now():  # r = 1, d = 0: BN itself
            return F.batch_norm(x, None, None, gamma, beta, True, 0.0, self.eps)
        r, d = torch.ops.bnlab.renorm_corrections(x.detach(), park(self))
        return F.batch_norm(x, None, None, gamma * r.to(gamma.dtype),
                            beta + gamma * d.to(gamma.dtype), True, 0.0, self.eps)

    def batch_norm_coefficients(self, mean_b, var_b, gamma, beta):
        scale = gamma * torch.rsqrt(var_b + self.eps)
        return scale, beta - mean_b * scale

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        if self.tracks_now():
            self._update_running(mean, var, n)

    @torch.no_grad()
    def _update_running(self, mean_b: Tensor, var_b: Tensor, n: int = 0) -> None:
        # running statistics and the step are read by this step's graph (r, d, warm-up): see
        # write_buffer
        self.write_buffer("num_batches_tracked", self.num_batches_tracked + 1)
        alpha = self.momentum_weight()
        std = torch.sqrt(self.running_var + self.eps).lerp_(
            torch.sqrt(var_b + self.eps).to(self.running_var.dtype), alpha
        )
        self.write_buffer("running_mean",
                          self.running_mean.lerp(mean_b.to(self.running_mean.dtype), alpha))
        self.write_buffer("running_var", (std**2 - self.eps).clamp_min(0))

    def inference_affine(self):
        return self.running_affine(self.weight_or_one(), self.bias_or_zero())


def _renorm_corrections(x: Tensor, key: int) -> tuple[Tensor, Tensor]:
    """Kernel of ``bnlab::renorm_corrections``: this step's (r, d) for the layer parked under
    ``key``, after which its running statistics and step are updated."""
    layer = take(key)
    with torch.no_grad():
        mean_b, var_b, n = layer.batch_moments(x)
        r, d = layer.corrections(mean_b, torch.sqrt(var_b + layer.eps))
        layer._update_running(mean_b, var_b, n)
    return r, d


define("renorm_corrections(Tensor x, int key) -> (Tensor, Tensor)", _renorm_corrections)
