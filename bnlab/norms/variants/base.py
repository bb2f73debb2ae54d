"""The contract of the per-channel normalization layers: what a variant declares and writes, and
what the base gives it to call.

Every layer here keeps ``torch.nn.BatchNorm``'s names (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) and options (``eps``, ``momentum`` with ``None`` for a
cumulative average, ``affine``, ``track_running_stats``) so that state_dicts and hyper-parameters
interchange where the semantics match.

Most layers are, for a fixed batch, an affine map per channel whose coefficients depend on the batch
statistics: ``y = a(μ_B, σ²_B) · x + b(μ_B, σ²_B)``. A variant writes ``normalize`` and its
``coefficients`` (the per-channel ``a, b``, ordinary autograd on C numbers), its buffer update and
its inference rule; how the step runs is the engine's (:mod:`bnlab.norms.engine`): ``forward`` is
:func:`~bnlab.norms.engine.route.run`, and the statistics, the fused or plain application of the
map and the buffer writes are :mod:`bnlab.norms.engine.step`, reached through the methods of the
same names here. The statistics come from ONE overridable method, :meth:`ChannelNorm.batch_moments`
(the hook for synchronized statistics across processes).

torch's forward rule, here because it is part of every step (the module lifecycle is
:mod:`.conventions`): batch statistics in training, or in eval when there are no running buffers
(buffers present but ``track_running_stats=False``: eval normalizes with the buffers); running
statistics updated only in training with ``track_running_stats``; a zero-size batch gives an empty
output and zero parameter gradients and leaves the running statistics alone (in training
``num_batches_tracked`` still counts it, as torch's does); the input has the parameters' dtype, or
is float16/bfloat16 with float32 parameters (AMP), anything else is torch's "mixed dtype"
``RuntimeError``.

Numerics: statistics are two-pass or Welford (never Σx² − (Σx)²/n), accumulated in float32 or better
whatever the input dtype, so a large mean does not destroy the variance and half-precision inputs
cannot overflow; the per-channel coefficient graph runs in float64 (C numbers: free). Autocast is
switched off inside the layer (like ``nn.BatchNorm``, the output has the input's dtype).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .conventions import BatchNormConventions
from ..engine import route, step
from ..engine.fused import CoefFn, UpdateFn
from ..engine.guard import refuse_recomputation
from ..engine.kernels import autocast_off, per_channel, reduce_dims, stats_dtype
from ..engine.switches import inside_backward, module_group


class ChannelNorm(BatchNormConventions):
    """Base class: parameters, buffers, flags, input checks, the step's hooks and the update and
    inference rules.

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

    # ---- the flags a variant may declare (read by the engine and the tools) ------------------
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

    def without_batch_stats(self, x: Tensor) -> Tensor | None:
        """After :meth:`check_input`, the step's output where it takes no batch statistics:
        :meth:`empty_batch`'s for a zero-size batch, the inference rule (:meth:`running_normalize`)
        where not :meth:`use_batch_stats`; None where ``normalize`` goes on with them."""
        self.check_input(x)
        if (empty := self.empty_batch(x)) is not None:
            return empty
        if not self.use_batch_stats():
            return self.running_normalize(x)
        return None

    # ---- torch's forward rule --------------------------------------------------------------------
    def use_batch_stats(self) -> bool:
        """torch's ``bn_training``: training, or eval without running buffers."""
        return self.training or (self.running_mean is None and self.running_var is None)

    def tracks_now(self) -> bool:
        """Whether this forward updates the running statistics (training, track_running_stats)."""
        return self.training and self.track_running_stats and self.running_mean is not None



    # ---- input checks and per-channel shapes -----------------------------------------------------
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
        if (self.training and self.reads_own_updates and not torch.compiler.is_compiling()
                and inside_backward()):  # a checkpoint recomputing its region, or a misuse
            refuse_recomputation(type(self).__name__,
                                 "its training step reads statistics (moving or running) that its "
                                 "own forward pass updated, and would read the updated ones",
                                 "Keep this layer outside checkpointed regions")

    reduce_dims = staticmethod(reduce_dims)
    per_channel = staticmethod(per_channel)

    # ---- the step with batch statistics: one-line calls of bnlab.norms.engine.step -----------
    def batch_moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Per-channel (mean, biased variance, count) of x: THE hook for synchronized statistics
        (both routes call it), by default :func:`.step.batch_moments`."""
        return step.batch_moments(self, x)

    def plain_moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """:meth:`batch_moments` on the plain route: :func:`.step.plain_moments`."""
        return step.plain_moments(self, x)

    def saves_half_statistics(self, x: Tensor) -> bool:
        """Whether torch keeps half statistics: :func:`.step.saves_half_statistics`."""
        return step.saves_half_statistics(self, x)

    def step_samples(self, x: Tensor) -> int:
        """The samples this step normalizes over: :func:`.step.step_samples`."""
        return step.step_samples(self, x)

    def normalize_with_batch_stats(self, x: Tensor, coef_fn: CoefFn, *tensors: Tensor,
                                   update: UpdateFn | None = None
                                   ) -> tuple[Tensor, Tensor, Tensor, int]:
        """(y, μ_B, σ²_B, n): coef_fn's map on x, :func:`.step.normalize_with_batch_stats`."""
        return step.normalize_with_batch_stats(self, x, coef_fn, *tensors, update=update)

    def write_buffer(self, name: str, value: Tensor) -> None:
        """Set a buffer this step's graph read: :func:`.step.write_buffer`."""
        step.write_buffer(self, name, value)

    # ---- update rules: the buffers after a training step ---------------------------------------
    def momentum_weight(self, momentum: float | None = None) -> float | Tensor:
        """This step's running-average weight: ``momentum``, or 1/t (cumulative average) when None.
        Call after ``num_batches_tracked`` was incremented. A tensor for None, so compile never
        guards on t."""
        m = self.momentum if momentum is None else momentum
        if m is None:
            return 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        return m

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

    # ---- affine helpers ------------------------------------------------------------------------
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


REDUCED_DTYPES = (torch.float16, torch.bfloat16)


def check_eps_now(module: nn.Module) -> None:
    """ε may have been changed after construction: torch checks it at every forward."""
    eps = getattr(module, "eps", 1e-5)
    if module.training and not eps > 0:
        raise ValueError(f"batch_norm eps must be positive during training, but got {eps}")
    if not eps >= 0:
        raise ValueError(f"batch_norm eps must be non-negative, but got {eps}")


def check_dtype(module: nn.Module, x: Tensor) -> None:
    """torch's rule: the state's dtype, or float16/bfloat16 input with float32 state (AMP)."""
    names = ("weight", "bias", "running_mean", "running_var")
    state = next((t for t in (getattr(module, n, None) for n in names) if t is not None), None)
    if state is None or x.dtype == state.dtype:
        return
    if state.dtype == torch.float32 and x.dtype in REDUCED_DTYPES:
        return
    raise RuntimeError(
        f"mixed dtype: {type(module).__name__} has {state.dtype} parameters and buffers but the "
        f"input is {x.dtype} (torch.nn.BatchNorm accepts the same dtype, or float16/bfloat16 input "
        f"with float32 parameters); convert one of them, e.g. layer.to({x.dtype}) or "
        f"x.to({state.dtype})")
