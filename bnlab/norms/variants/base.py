"""Shared machinery of the per-channel normalization layers.

Every layer here keeps ``torch.nn.BatchNorm``'s names (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) and options (``eps``, ``momentum`` with ``None`` for a
cumulative average, ``affine``, ``track_running_stats``) so that state_dicts and hyper-parameters
interchange where the semantics match.

Most layers are, for a fixed batch, an affine map per channel whose coefficients depend on the batch
statistics: ``y = a(μ_B, σ²_B) · x + b(μ_B, σ²_B)``. The statistics come from ONE overridable
method, :meth:`ChannelNorm.batch_moments` (the hook for synchronized statistics across processes);
the per-channel ``a, b`` are built with ordinary autograd on C numbers (a variant is one
``coefficients`` function), and applied in one pass (:func:`channel_affine`).

Numerics: statistics are two-pass or Welford (never Σx² − (Σx)²/n), accumulated in float32 or better
whatever the input dtype, so a large mean does not destroy the variance and half-precision inputs
cannot overflow; the per-channel coefficient graph runs in float64 (C numbers: free). Autocast is
switched off inside the layer (like ``nn.BatchNorm``, the output has the input's dtype).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from .conventions import BatchNormConventions, check_dtype, check_eps_now
from ..engine import route, written_grad
from ..engine.fused import fused_normalize, refuse_recomputation
from ..engine.guard import full_statistics, statistics_as_with_grad
from ..engine.kernels import (
    autocast_off, batch_statistics, coef_dtype, per_channel, reduce_dims, saved_statistics,
    stats_dtype,
)
from ..engine.sync import batch_samples, module_group, synced_moments

CoefFn = Callable[..., tuple[Tensor, Tensor]]
MomentsFn = Callable[[Tensor], tuple[Tensor, Tensor, int]]
UpdateFn = Callable[[Tensor, Tensor, int], None]


class ChannelNorm(BatchNormConventions):
    """Base class: parameters, buffers, input checks, batch moments and running-statistics
    bookkeeping.

    Options, defaults and module protocol follow ``torch.nn.BatchNorm2d`` (:mod:`.conventions`):
    ``momentum=None`` is a cumulative moving average, ``track_running_stats=False`` keeps no buffers
    and normalizes with batch statistics in eval mode too, ``affine=False`` has no γ, β and
    ``bias=False`` no β; ``device``/``dtype`` place the parameters and buffers. ``sync=True``:
    batch statistics over all ranks of ``process_group`` (None: the default group), :mod:`.sync`.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True, sync: bool = False) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)
        self.sync, self.process_group = bool(sync), None

    # ---- the contract: what a variant may declare (read by the engine and the tools) ---------
    reads_own_updates: bool = False
    """True when the training step reads buffers that the step itself updates (mbn's and cbn's
    moving statistics, brn's running ones): ``torch.utils.checkpoint`` cannot recompute such a
    step outside bnlab's record and replay, so :meth:`check_input` refuses it there."""

    signed_buffers: tuple[str, ...] = ()
    """Buffers named like a variance that may hold negative values (cbn's ``running_var``, a
    signed part of its divisor): ``bnlab.train.health`` does not hold them to be ≥ 0."""

    counts_empty_batches: bool = True
    """Whether a zero-size training batch counts in ``num_batches_tracked`` (torch's rule). cbn
    says False: its counter also says whether its moving statistics hold a batch yet."""

    nonfinite_batches: int = 0
    """Training batches the non-finite guard skipped on this layer
    (:func:`bnlab.norms.set_nonfinite_guard`); the engine counts them here."""

    _step_has_backward: bool = True  # this step's grad mode, set by normalize_with_batch_stats

    def forward(self, x: Tensor) -> Tensor:
        """The layer on x: :func:`bnlab.norms.engine.route.run` picks how the step runs (a
        ``torch.fx`` node, a compiled step, a guarded step) and calls :meth:`normalize`."""
        return route.run(self, x)

    def normalize(self, x: Tensor) -> Tensor:
        """The variant's step on x, what a variant writes: batch statistics where
        :meth:`use_batch_stats` (its buffers updated where :meth:`tracks_now`), its inference
        rule otherwise. ``docs/readme/writing-a-variant.md`` shows one."""
        raise NotImplementedError(f"{type(self).__name__} defines no normalize(x)")

    def empty_batch(self, x: Tensor) -> Tensor | None:
        """For a zero-size input, torch's result (else None): an empty output whose graph reaches γ
        and β, so their gradients are zeros; running statistics untouched, ``num_batches_tracked``
        counted in training (:attr:`counts_empty_batches`). Synced layers go on (every rank must
        join the collectives)."""
        if x.numel() != 0 or module_group(self) is not None:
            return None
        if self.tracks_now() and self.counts_empty_batches and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        shape = (1, -1, *([1] * (x.dim() - 2)))
        y = x.clone()
        if self.weight is not None:
            y = y * self.weight.view(shape)
        if self.bias is not None:
            y = y + self.bias.view(shape)
        return y.to(x.dtype)

    # ---- helpers -------------------------------------------------------------------------------
    # self: nn.Module, NativeBatchNorm calls it too
    def check_input(self: nn.Module, x: Tensor) -> None:
        """Clear errors for the mistakes people make when dropping a layer into a model."""
        if not torch.is_tensor(x) or not x.is_floating_point():
            dtype = getattr(x, "dtype", type(x).__name__)
            raise ValueError(f"{type(self).__name__} expects a floating-point tensor, got {dtype}")
        if x.dim() < 2:
            raise ValueError(f"{type(self).__name__} expects input of shape (N, C) or (N, C, *), "
                             f"got {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_features} channels but the input "
                f"has {x.shape[1]} (shape {tuple(x.shape)})"
            )
        # torch's _verify_batch_size: exactly one value per channel (a zero-size batch is fine);
        # synced layers count globally
        if self.training and x.numel() // x.shape[1] == 1 and module_group(self) is None:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input of shape "
                f"{tuple(x.shape)}"
            )
        check_eps_now(self)
        if x.numel() != 0:  # torch returns an empty output for an empty batch of any float dtype
            check_dtype(self, x)
        if self.training and self.reads_own_updates and not torch.compiler.is_compiling():
            refuse_recomputation(type(self).__name__,
                                 "its training step reads statistics (moving or running) that its "
                                 "own forward pass updated, and would read the updated ones",
                                 "Keep this layer outside checkpointed regions")

    reduce_dims = staticmethod(reduce_dims)
    per_channel = staticmethod(per_channel)

    def batch_moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Per-channel mean, biased variance and count of x over the batch and all trailing dims.

        THE single place batch statistics come from (both the fused and the plain path): override it
        to synchronize statistics across processes. Results are in :func:`stats_dtype` (float32 or
        better), two-pass or Welford, so a mean of 1e4 costs no variance digits. Differentiable when
        grad is on; without grad (inside the fused function) torch's two-pass statistics kernel runs
        instead.
        """
        if (group := module_group(self)) is not None:  # training with sync=True in a process group
            return synced_moments(x, group, stats_dtype(x))
        n = x.numel() // x.shape[1]
        plain = (torch.is_grad_enabled() or x.device.type not in ("cpu", "cuda")
                 or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active())
        if not plain:  # one call, double accumulation; eager and no-grad only
            return (*batch_statistics(x), n)
        dims = self.reduce_dims(x)
        if torch.compiler.is_compiling() and x.device.type == "cpu":
            # inductor's one Welford reduction (as stable to a large mean as two passes): one read
            # of x instead of two (benchmarks/norms.py --modes compiled). Not on CUDA: with torch
            # 2.11 Triton fails to compile cbn(decouple=false)'s var_mean kernel there.
            var, mean = torch.var_mean(x.to(stats_dtype(x)), dim=dims, correction=0)
            return mean, var, n
        # eager: two passes, and a graph whose Σ(x − μ) term var_only_bn's gradient at large means
        # needs
        mean = x.mean(dim=dims, dtype=stats_dtype(x))
        var = (x - per_channel(mean, x)).pow(2).mean(dim=dims)
        return mean, var, n

    def saves_half_statistics(self, x: Tensor) -> bool:
        """Whether torch's CPU kernel would keep this step's statistics in half precision: a half
        input into a layer whose parameters and buffers are that dtype too (or that has none).
        With float32 state (autocast) they stay float32, and torch's CUDA kernels keep float32
        statistics for every half input (:func:`.kernels.saved_statistics`)."""
        if (x.dtype not in route.HALF_DTYPES or x.device.type != "cpu" or full_statistics(self)
                or module_group(self) is not None):  # synced: global statistics, kept in float32
            return False
        state = next((t for t in (self.weight, self.bias, self.running_mean, self.running_var)
                      if t is not None), None)
        return state is None or state.dtype == x.dtype

    def step_samples(self, x: Tensor) -> int:
        """The samples of the batch this step normalizes over: x's (over all ranks when synced),
        or the full batch's inside ``accumulate(normalize="full")``."""
        full = full_statistics(self)
        return full.samples if full is not None else batch_samples(self, x)

    def plain_moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """:meth:`batch_moments` for the plain path. Without grad they come from torch's
        statistics kernel, which rounds differently from the two passes taken with grad; in the
        first pass of a reentrant checkpoint (no grad) the two passes run, so that the
        recomputation (grad on) reproduces the step bit for bit (:mod:`.guard`)."""
        if (full := full_statistics(self)) is not None:  # bnlab.norms.tools.accumulate_full
            return full(x)
        if torch.is_grad_enabled() or not statistics_as_with_grad():
            return self.batch_moments(x)
        with torch.enable_grad():
            mean, var, n = self.batch_moments(x)
        return mean.detach(), var.detach(), n

    def normalize_with_batch_stats(self, x: Tensor, coef_fn: CoefFn, *tensors: Tensor,
                                   update: UpdateFn | None = None
                                   ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Apply the per-channel affine map ``coef_fn(μ_B, σ²_B, *tensors) -> (scale, shift)`` to x.

        Returns ``(y, μ_B, σ²_B, n)`` (statistics detached, for running-statistics updates).
        Gradients flow through μ_B, σ²_B and ``tensors`` exactly as autograd on the plain expression
        would give. ``y`` has x's dtype; everything per-channel is computed in float32 or better,
        autocast off. ``update(μ_B, σ²_B, n)``, if given, updates the layer's buffers without grad,
        after the coefficients were taken (inside the fused operator: no extra dispatched
        operations).
        """
        with autocast_off(x):
            if route.takes_fused(self, x):
                if not self.saves_half_statistics(x):
                    y, mean, var = fused_normalize(x, self.batch_moments, coef_fn, *tensors,
                                                   update=update)
                    return y, mean, var, x.numel() // x.shape[1]
                # the coefficients see torch's half statistics, the buffers the exact ones
                exact: list[Tensor] = []

                def moments(xs: Tensor) -> tuple[Tensor, Tensor, int]:
                    mean, var, n = self.batch_moments(xs)
                    exact[:] = [mean, var]
                    return (*saved_statistics(x, mean, var, self.eps), n)

                def exact_update(_mean: Tensor, _var: Tensor, n: int) -> None:
                    if update is not None:
                        update(exact[0], exact[1], n)
                y, _, _ = fused_normalize(x, moments, coef_fn, *tensors, update=exact_update)
                return y, exact[0], exact[1], x.numel() // x.shape[1]
            y, mean, var, n = self._plain_normalize(x, coef_fn, *tensors)
        if update is not None:
            # read by write_buffer (dynamo traces neither torch.is_inference_mode_enabled nor
            # Tensor.is_inference, so the grad mode of the call is the test)
            self._step_has_backward = torch.is_grad_enabled()
            with torch.no_grad():
                update(mean, var, n)
        return y, mean, var, n

    def _plain_normalize(self, x: Tensor, coef_fn: CoefFn,
                         *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        """:meth:`normalize_with_batch_stats` from plain autograd ops (compile, half inputs, sync,
        vmap)."""
        # half inputs: one float32 copy feeds μ_B, σ²_B and the centred x, so their three
        # input-gradient paths add up in float32 and round to half once (as torch's kernel)
        xs = x.to(stats_dtype(x))
        if written_grad.tracing() and xs is x and module_group(self) is None:
            # a compiled step's trace: μ_B detached where its gradient is zero (.written_grad)
            mean, var, n = written_grad.moments(x)
            anchor = mean.detach()
        else:
            mean, var, n = self.plain_moments(xs)
            anchor = mean
        exact = mean.detach(), var.detach()
        if self.saves_half_statistics(x):
            mean, var = saved_statistics(x, mean, var, self.eps)
            anchor = mean
        dt = coef_dtype(x)
        scale, shift = coef_fn(mean.to(dt), var.to(dt), *tensors)
        # y = scale·(x − μ) + (shift + scale·μ): the centred form keeps a large mean out of autograd
        centred = xs - per_channel(anchor, xs)
        y = torch.addcmul(per_channel((shift + scale * anchor).to(centred.dtype), x), centred,
                          per_channel(scale.to(centred.dtype), x))
        return y.to(x.dtype), *exact, n

    def momentum_weight(self, momentum: float | None = None) -> float | Tensor:
        """This step's running-average weight: ``momentum``, or 1/t (cumulative average) when None.
        Call after ``num_batches_tracked`` was incremented. A tensor for None, so compile never
        guards on t."""
        m = self.momentum if momentum is None else momentum
        if m is None:
            return 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        return m

    @torch.no_grad()
    def write_buffer(self, name: str, value: Tensor) -> None:
        """Set a buffer that this step's differentiable graph READ (moving statistics, step
        counters).

        Eager: in place. Under torch.compile the buffer is rebound to a new tensor instead:
        AOTAutograd may recompute forward values in backward from the buffer, and after an in-place
        update it reads the new value (wrong gradients, measured with torch 2.13 on mbn: 1e-3 off;
        cbn, brn likewise). Buffers only read outside the graph (BN's running statistics) are
        updated in place. So are all where the step has no backward (grad off when the layer was
        called, :meth:`normalize_with_batch_stats`): under ``torch.inference_mode`` a rebound
        buffer would be an inference tensor that no later training step could save.
        """
        old = getattr(self, name)
        value = value.detach().to(old.dtype)
        if torch.compiler.is_compiling() and self._step_has_backward:
            setattr(self, name, value)
        else:
            old.copy_(value)

    @torch.no_grad()
    def update_running_stats(self, mean: Tensor, var: Tensor, n: int,
                             momentum: float | None = None) -> None:
        """PyTorch's convention: biased variance normalizes, the unbiased one goes into
        running_var."""
        if not self.tracks_now():
            return
        self.num_batches_tracked.add_(1)
        m = self.momentum_weight(momentum)
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
        unbiased = var.detach() * (n / max(n - 1, 1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)

    # ---- one step's update from given statistics (bnlab.norms.accumulate) -------------------
    def accumulation_refusal(self) -> str | None:
        """Why this layer's buffer update is not a function of its batch's per-channel mean and
        variance (so micro-batches cannot be combined exactly), or None when it is."""
        return None

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        """The buffer update of one training step on a batch with per-channel mean and biased
        variance (mean, var) over n values per channel, from ``samples`` samples: what the
        forward does after normalizing that batch."""
        self.update_running_stats(mean, var, n)

    def gamma_beta(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # no constants built: 2 dispatched ops fewer
        if self.weight is not None and self.bias is not None:
            return self.weight, self.bias
        one = torch.ones(self.num_features, dtype=stats_dtype(x), device=x.device)
        gamma = self.weight if self.weight is not None else one
        return gamma, (self.bias if self.bias is not None else torch.zeros_like(gamma))

    def weight_or_one(self) -> Tensor:
        return self.weight if self.weight is not None else torch.ones_like(self.running_mean)

    def bias_or_zero(self) -> Tensor:
        return self.bias if self.bias is not None else torch.zeros_like(self.running_mean)

    @staticmethod
    def apply_affine(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """y = scale·x + shift per channel, in one pass, computed in float32 or better, x's dtype
        out."""
        dt = stats_dtype(x)
        with autocast_off(x):
            y = torch.addcmul(per_channel(shift.to(dt), x), x, per_channel(scale.to(dt), x))
        return y.to(x.dtype)

    # ---- inference ---------------------------------------------------------------------------
    @staticmethod
    def centred_affine(x: Tensor, mean: Tensor, var: Tensor, eps: float, weight: Tensor | None,
                       bias: Tensor | None) -> Tensor:
        """``weight·(x − mean)/√(var + eps) + bias`` per channel through torch's inference BatchNorm
        kernel: bitwise ``nn.BatchNorm``'s eval output, its γ-gradient the centred Σ g·(x − μ)/σ
        (the uncentred Σ g·x − μ Σ g loses digits at a large activation mean), memory format
        kept."""
        dt = stats_dtype(x)

        def cast(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dt)
        with autocast_off(x):
            return torch.batch_norm(x, cast(weight), cast(bias), cast(mean), cast(var), False, 0.0,
                                    eps, torch.backends.cudnn.enabled)

    def running_normalize(self, x: Tensor) -> Tensor:
        """Eval with the running statistics: torch's own inference kernel (``nn.BatchNorm``'s)."""
        return self.centred_affine(x, self.running_mean, self.running_var, self.eps, self.weight,
                                   self.bias)

    def running_affine(self, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        """BN with the running statistics as a per-channel (scale, shift) — most layers' eval
        mode."""
        scale = gamma * torch.rsqrt(self.running_var + self.eps)
        return scale, beta - self.running_mean * scale

    def inference_affine(self) -> tuple[Tensor, Tensor] | None:
        """The eval-mode map as per-channel (scale, shift), or None if the layer is not affine.

        Used by :func:`bnlab.norms.fold`. Subclasses that are affine at inference override it.
        """
        return None
