"""Shared machinery of the per-channel normalization layers.

Every layer here keeps ``torch.nn.BatchNorm``'s names (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) and options (``eps``, ``momentum`` with ``None`` for a
cumulative average, ``affine``, ``track_running_stats``) so that state_dicts and hyper-parameters
interchange where the semantics match.

Most layers are, for a fixed batch, an affine map per channel whose coefficients depend on the batch
statistics: ``y = a(μ_B, σ²_B) · x + b(μ_B, σ²_B)``. The statistics come from ONE overridable method,
:meth:`ChannelNorm.batch_moments` (the hook for synchronized statistics across processes); the
per-channel ``a, b`` are built with ordinary autograd on C numbers (a variant is one ``coefficients``
function), and applied in one pass (:func:`channel_affine`).

Numerics: statistics are two-pass or Welford (never Σx² − (Σx)²/n), accumulated in float32 or better
whatever the input dtype, so a large mean does not destroy the variance and half-precision
inputs cannot overflow; the per-channel coefficient graph runs in float64 (C numbers: free). Autocast
is switched off inside the layer (like ``nn.BatchNorm``, the output has the input's dtype).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from .sync import module_group, synced_moments

CoefFn = Callable[..., tuple[Tensor, Tensor]]
MomentsFn = Callable[[Tensor], tuple[Tensor, Tensor, int]]


def channel_sum(t: Tensor) -> Tensor:
    """Σ over every dim but 1, without a strided multi-dim reduction (faster on CPU)."""
    return t.sum(0) if t.dim() == 2 else t.flatten(2).sum(2).sum(0)


def channel_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-channel Σ a·b as a batched matrix product: no (N, C, *) temporary."""
    if a.dim() == 2:
        return (a * b).sum(0)
    n, c = a.shape[:2]
    return (a.reshape(n, c, 1, -1) @ b.reshape(n, c, -1, 1)).sum(0).flatten()


def centred_reductions(g: Tensor, x: Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (Σ g, Σ g·(x − mean)) in one pass over g and x, accumulated in double on CPU.

    torch's BatchNorm backward kernel computes exactly these two reductions for its weight and bias
    gradients; with invstd = 1 its "x̂" is x − mean. Elsewhere: a centred temporary and two reductions.
    """
    if x.device.type in ("cpu", "cuda"):
        one = torch.ones_like(mean)  # invstd = 1, and weight = 1: CUDA's kernel refuses weight=None
        _, dot, total = torch.ops.aten.native_batch_norm_backward(
            g, x, one, None, None, mean, one, True, 0.0, [False, True, True])
        return total, dot
    return channel_sum(g), channel_dot(g, x - per_channel(mean, x))


def stats_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision inputs (no overflow of Σx², no 8-bit mantissa sums), else x's dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def coef_dtype(x: Tensor) -> torch.dtype:
    """The per-channel coefficient graph runs in float64 (C numbers), except where float64 is missing."""
    return torch.float32 if x.device.type == "mps" else torch.float64


def per_channel(t: Tensor, x: Tensor) -> Tensor:
    """View a (C,) tensor so that it broadcasts against x of shape (N, C, *)."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def channel_affine(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """scale·x + shift per channel (scale, shift: (C,) in x's dtype), into a new tensor.

    On CPU through torch's inference BatchNorm kernel with zero mean, unit variance and ε = 0 (its
    per-channel factor is then scale·1/√1 = scale and its offset shift, exactly): a vectorized loop,
    where ``addcmul`` with two broadcast operands takes a scalar one (on (128, 64, 32, 32), 1 thread:
    25 against 33 ms with the allocation, 3.6 against 11 ms without)."""
    if x.device.type == "cpu":
        zero = torch.zeros_like(scale)
        return torch.batch_norm(x, scale, shift, zero, torch.ones_like(scale), False, 0.0, 0.0, False)
    return torch.addcmul(per_channel(shift, x), x, per_channel(scale, x))


def refuse_double_backward(what: str) -> None:
    """The fused functions' backward is not itself differentiable: say so, and how to get a graph that is."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"bnlab's fused {what} does not support double backward (create_graph=True); "
                           "run the forward pass inside `with bnlab.norms.plain_autograd():`")


class _StatsAffine(torch.autograd.Function):
    """y = scale·x + shift with (scale, shift) = coef_fn(μ_B, σ²_B, *tensors), in a few fused passes.

    Eager only: :func:`_fused_normalize` is excluded from torch.compile, because dynamo cannot trace
    the closure graph built here; when it tried, it inlined ``forward`` as plain code and silently
    dropped this ``backward`` (the input gradient lost its statistics terms: 1e-2 relative error).

    The per-channel coefficient graph is built with ordinary autograd (in float64) inside forward and
    differentiated in backward; the (N, C, *) part of the gradient is then assembled from the centred
    input, ``∂L/∂x = scale·g + (2/n)·g_v·(x − μ) + g_μ/n``, so a large mean cancels nothing. Double
    backward is refused with a clear error: use ``with bnlab.norms.plain_autograd():``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, moments_fn: MomentsFn, coef_fn: CoefFn, *tensors: Tensor):
        mean, var, n = moments_fn(x)
        with torch.enable_grad():
            m = mean.detach().to(coef_dtype(x)).requires_grad_()
            v = var.detach().to(coef_dtype(x)).requires_grad_()
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            scale, shift = coef_fn(m, v, *leaves)
        ctx.graph = (m, v, leaves, scale, shift)
        ctx.n = n
        ctx.save_for_backward(x)
        y = channel_affine(x, scale.detach().to(x.dtype), shift.detach().to(x.dtype))
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g: Tensor, _gm, _gv):
        refuse_double_backward("normalization")
        (x,) = ctx.saved_tensors
        m, v, leaves, scale, shift = ctx.graph
        m_x = m.detach().to(x.dtype)  # the mean as x's dtype: every use below takes this same value
        g_sum, g_dot_centred = centred_reductions(g, x, m_x)
        g_sum = g_sum.to(m.dtype)
        g_dot = g_dot_centred.to(m.dtype) + m_x.to(m.dtype) * g_sum  # Σ g·x, exactly, without cancellation
        inputs = [m, v] + [t for t in leaves if t.requires_grad]
        raw_grads = torch.autograd.grad((scale, shift), inputs, (g_dot, g_sum),
                                        allow_unused=True, retain_graph=True)  # tiny; lets gradcheck re-run
        grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(raw_grads, inputs)]
        g_mean, g_var, rest = grads[0], grads[1], iter(grads[2:])
        s = (2.0 / ctx.n) * g_var
        # gx = s·(x − μ) + g_μ/n + scale·g = s·x + (g_μ/n − s·μ) + scale·g: the constant in float64, so
        # only s·x rounds at |x| (as nn.BatchNorm's own x·a + b does)
        const = (g_mean / ctx.n - s * m_x.to(m.dtype)).to(x.dtype)
        gx = channel_affine(x, s.to(x.dtype), const)
        gx.addcmul_(g, per_channel(scale.detach().to(x.dtype), x))
        return (gx, None, None, *[next(rest) if t.requires_grad else None for t in leaves])


@torch.compiler.disable
def _fused_normalize(x: Tensor, moments_fn: MomentsFn, coef_fn: CoefFn, *tensors: Tensor):
    """Run :class:`_StatsAffine` eagerly, never traced (see its docstring for why)."""
    return _StatsAffine.apply(x, moments_fn, coef_fn, *tensors)


_PLAIN_AUTOGRAD = [False]


class plain_autograd:
    """Context manager: build normalization layers' graphs from plain autograd ops (slower, but
    twice differentiable), e.g. for Hessian-vector products."""

    def __enter__(self):
        self._previous = _PLAIN_AUTOGRAD[0]
        _PLAIN_AUTOGRAD[0] = True
        return self

    def __exit__(self, *exc):
        _PLAIN_AUTOGRAD[0] = self._previous
        return False


# Below this many elements the fused function's fixed Python cost (a graph built in forward, a
# torch.autograd.grad call in backward) exceeds what it saves: plain ops are faster (DLN: 10 → 5 ms).
FUSED_MIN_NUMEL = 1 << 16


def fused_enabled(x: Tensor) -> bool:
    """Whether the eager fused function runs. Never under torch.compile (inductor fuses the plain ops,
    and the function cannot be traced) nor torch.func transforms (vmap, grad: a closure graph); only
    for float32/float64 inputs (half inputs take the plain path, which promotes them to float32)."""
    return (not _PLAIN_AUTOGRAD[0] and x.numel() >= FUSED_MIN_NUMEL
            and x.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


class ChannelNorm(nn.Module):
    """Base class: parameters, buffers, input checks, batch moments and running-statistics bookkeeping.

    Options follow ``torch.nn.BatchNorm2d``: ``momentum=None`` is a cumulative moving average,
    ``track_running_stats=False`` keeps no buffers and normalizes with batch statistics in eval mode too,
    ``affine=False`` has no γ, β.
    """

    # Declared for the type checker (nn.Module.__getattr__ would type them ``Tensor | Module``). They are
    # None when affine=False / track_running_stats=False; every read is behind those flags (or use_batch_stats).
    weight: Tensor
    bias: Tensor
    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        sync: bool = False,
    ) -> None:
        super().__init__()
        # batch statistics over all ranks of process_group (None: the default group): bnlab.norms.sync
        self.sync, self.process_group = bool(sync), None
        if not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive integer, got {num_features!r}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1] or None (cumulative average), got {momentum!r}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")

    # ---- helpers -------------------------------------------------------------------------------
    def check_input(self: nn.Module, x: Tensor) -> None:  # self: nn.Module, NativeBatchNorm calls it too
        """Clear errors for the mistakes people make when dropping a layer into a model."""
        if not torch.is_tensor(x) or not x.is_floating_point():
            dtype = getattr(x, "dtype", type(x).__name__)
            raise ValueError(f"{type(self).__name__} expects a floating-point tensor, got {dtype}")
        if x.dim() < 2:
            raise ValueError(f"{type(self).__name__} expects input of shape (N, C) or (N, C, *), got {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_features} channels but the input has "
                f"{x.shape[1]} (shape {tuple(x.shape)})"
            )
        if self.training and x.numel() // x.shape[1] <= 1 and module_group(self) is None:  # synced: counted globally
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input of shape {tuple(x.shape)}"
            )

    @staticmethod
    def reduce_dims(x: Tensor) -> list[int]:
        return [0, *range(2, x.dim())]

    per_channel = staticmethod(per_channel)

    def batch_moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Per-channel mean, biased variance and count of x over the batch and all trailing dims.

        THE single place batch statistics come from (both the fused and the plain path): override it to
        synchronize statistics across processes. Results are in :func:`stats_dtype` (float32 or
        better), two-pass or Welford, so a mean of 1e4 costs no variance digits. Differentiable when grad is on;
        without grad (inside the fused function) torch's two-pass statistics kernel runs instead.
        """
        if (group := module_group(self)) is not None:  # training with sync=True in a process group
            return synced_moments(x, group, stats_dtype(x))
        n = x.numel() // x.shape[1]
        plain = (torch.is_grad_enabled() or x.dtype != stats_dtype(x) or x.device.type not in ("cpu", "cuda")
                 or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active())
        if not plain:  # one call, double accumulation; eager and no-grad only
            mean, var = torch.batch_norm_update_stats(x, None, None, 0.0)
            return mean, var, n
        dims = self.reduce_dims(x)
        if torch.compiler.is_compiling() and x.device.type == "cpu":
            # inductor's one Welford reduction (as stable to a large mean as two passes): one read of x
            # instead of two, bn 1.01 → 0.91× native eager on (128, 64, 32, 32), brn 1.50 → 1.19×. Not on
            # CUDA: with torch 2.11 Triton fails to compile cbn(decouple=false)'s var_mean kernel there.
            var, mean = torch.var_mean(x.to(stats_dtype(x)), dim=dims, correction=0)
            return mean, var, n
        # eager: two passes, and a graph whose Σ(x − μ) term var_only_bn's gradient at large means needs
        mean = x.mean(dim=dims, dtype=stats_dtype(x))
        var = (x - per_channel(mean, x)).pow(2).mean(dim=dims)
        return mean, var, n

    def normalize_with_batch_stats(self, x: Tensor, coef_fn: CoefFn, *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        """Apply the per-channel affine map ``coef_fn(μ_B, σ²_B, *tensors) -> (scale, shift)`` to x.

        Returns ``(y, μ_B, σ²_B, n)`` (statistics detached, for running-statistics updates). Gradients
        flow through μ_B, σ²_B and ``tensors`` exactly as autograd on the plain expression would give.
        ``y`` has x's dtype; everything per-channel is computed in float32 or better, autocast off.
        """
        with torch.autocast(x.device.type, enabled=False):
            if fused_enabled(x) and module_group(self) is None:  # synced: autograd through the collectives
                y, mean, var = _fused_normalize(x, self.batch_moments, coef_fn, *tensors)
                return y, mean, var, x.numel() // x.shape[1]
            mean, var, n = self.batch_moments(x)
            dt = coef_dtype(x)
            scale, shift = coef_fn(mean.to(dt), var.to(dt), *tensors)
            # y = scale·(x − μ) + (shift + scale·μ): the centred form keeps a large mean out of autograd
            centred = x - per_channel(mean, x)
            y = torch.addcmul(per_channel((shift + scale * mean).to(centred.dtype), x), centred,
                              per_channel(scale.to(centred.dtype), x))
            return y.to(x.dtype), mean.detach(), var.detach(), n

    def use_batch_stats(self) -> bool:
        return self.training or not self.track_running_stats

    def momentum_weight(self, momentum: float | None = None) -> float | Tensor:
        """This step's running-average weight: ``momentum``, or 1/t (cumulative average) when None.
        Call after ``num_batches_tracked`` was incremented. A tensor for None, so compile never guards on t."""
        m = self.momentum if momentum is None else momentum
        if m is None:
            return 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        return m

    @torch.no_grad()
    def write_buffer(self, name: str, value: Tensor) -> None:
        """Set a buffer that this step's differentiable graph READ (moving statistics, step counters).

        Eager: in place. Under torch.compile the buffer is rebound to a new tensor instead: AOTAutograd
        may recompute forward values in backward from the buffer, and after an in-place update it reads
        the new value (wrong gradients, measured with torch 2.13 on mbn: 1e-3 off; cbn, brn likewise).
        Buffers only read outside the graph (BN's running statistics) are updated in place.
        """
        old = getattr(self, name)
        value = value.detach().to(old.dtype)
        if torch.compiler.is_compiling():
            setattr(self, name, value)
        else:
            old.copy_(value)

    @torch.no_grad()
    def update_running_stats(self, mean: Tensor, var: Tensor, n: int, momentum: float | None = None) -> None:
        """PyTorch's convention: biased variance normalizes, the unbiased one goes into running_var."""
        if not (self.training and self.track_running_stats):
            return
        self.num_batches_tracked.add_(1)
        m = self.momentum_weight(momentum)
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
        unbiased = var.detach() * (n / max(n - 1, 1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)

    def gamma_beta(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.affine:
            return self.weight, self.bias
        one = torch.ones(self.num_features, dtype=stats_dtype(x), device=x.device)
        return one, torch.zeros_like(one)

    def weight_or_one(self) -> Tensor:
        return self.weight if self.affine else torch.ones_like(self.running_mean)

    def bias_or_zero(self) -> Tensor:
        return self.bias if self.affine else torch.zeros_like(self.running_mean)

    @staticmethod
    def apply_affine(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """y = scale·x + shift per channel, in one pass, computed in float32 or better, x's dtype out."""
        dt = stats_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            y = torch.addcmul(per_channel(shift.to(dt), x), x, per_channel(scale.to(dt), x))
        return y.to(x.dtype)

    # ---- inference ---------------------------------------------------------------------------
    def running_affine(self, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        """BN with the running statistics as a per-channel (scale, shift) — most layers' eval mode."""
        scale = gamma * torch.rsqrt(self.running_var + self.eps)
        return scale, beta - self.running_mean * scale

    def inference_affine(self) -> tuple[Tensor, Tensor] | None:
        """The eval-mode map as per-channel (scale, shift), or None if the layer is not affine.

        Used by :func:`bnlab.norms.fold`. Subclasses that are affine at inference override it.
        """
        return None
