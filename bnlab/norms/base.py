"""Shared machinery of the per-channel normalization layers.

Every layer here keeps ``torch.nn.BatchNorm``'s names (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) so that state_dicts interchange where the semantics match.

Most layers are, for a fixed batch, an affine map per channel whose coefficients depend on the batch
statistics: ``y = a(μ_B, σ²_B) · x + b(μ_B, σ²_B)``. They compute ``(μ_B, σ²_B)`` with one fused
``torch.var_mean``, build the per-channel ``a, b`` with ordinary autograd (cheap: C numbers), and apply
them with a single ``addcmul``. Autograd then differentiates through the statistics exactly, which is
what makes the variants (moving statistics, stop-gradient corrections) one-liners and keeps them close
to the speed of torch's fused kernel.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

CoefFn = Callable[..., tuple[Tensor, Tensor]]


def channel_sum(t: Tensor) -> Tensor:
    """Σ over every dim but 1, without a strided multi-dim reduction (faster on CPU)."""
    return t.sum(0) if t.dim() == 2 else t.flatten(2).sum(2).sum(0)


def channel_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-channel Σ a·b as a batched matrix product: no (N, C, *) temporary."""
    if a.dim() == 2:
        return (a * b).sum(0)
    n, c = a.shape[:2]
    return (a.reshape(n, c, 1, -1) @ b.reshape(n, c, -1, 1)).sum(0).flatten()


class _StatsAffine(torch.autograd.Function):
    """y = scale·x + shift with (scale, shift) = coef_fn(μ_B, σ²_B, *tensors), in a few fused passes.

    The per-channel coefficient graph is built with ordinary autograd inside forward and differentiated
    in backward; the (N, C, *) part of the gradient is then assembled in two passes,
    ``∂L/∂x = scale·g + (2/n)·g_v·(x − μ) + g_μ/n``. Double backward is refused with a clear error:
    compute Hessian-vector products inside ``with bnlab.norms.plain_autograd():``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, coef_fn: CoefFn, *tensors: Tensor):
        n = x.numel() // x.shape[1]
        mean = channel_sum(x) / n
        # E[x²] − μ², accumulated in float64 per channel: the cancellation costs float32 digits only
        # when |μ| ≫ σ, far beyond what activations show.
        sq = channel_dot(x, x).double() / n
        var = (sq - mean.double() ** 2).clamp_min(0).to(x.dtype)
        with torch.enable_grad():
            m = mean.detach().requires_grad_()
            v = var.detach().requires_grad_()
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            scale, shift = coef_fn(m, v, *leaves)
        ctx.graph = (m, v, leaves, scale, shift)
        ctx.n = n
        ctx.save_for_backward(x)
        view = [1, -1] + [1] * (x.dim() - 2)
        y = torch.addcmul(shift.detach().view(view), x, scale.detach().view(view))
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g: Tensor, _gm, _gv):
        if torch.is_grad_enabled():
            raise RuntimeError("bnlab's fused normalization does not support double backward (create_graph=True); "
                               "run the forward pass inside `with bnlab.norms.plain_autograd():`")
        (x,) = ctx.saved_tensors
        m, v, leaves, scale, shift = ctx.graph
        view = [1, -1] + [1] * (x.dim() - 2)
        inputs = [m, v] + [t for t in leaves if t.requires_grad]
        grads = torch.autograd.grad((scale, shift), inputs, (channel_dot(g, x), channel_sum(g)),
                                    allow_unused=True, retain_graph=True)  # tiny; lets gradcheck re-run
        grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, inputs)]
        g_mean, g_var, rest = grads[0], grads[1], iter(grads[2:])
        s = (2.0 / ctx.n) * g_var
        gx = torch.addcmul((g_mean / ctx.n - s * m.detach()).view(view), x, s.view(view))
        gx.addcmul_(g, scale.detach().view(view))
        return (gx, None, *[next(rest) if t.requires_grad else None for t in leaves])


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
    # torch.func transforms (vmap, grad) cannot trace through a Function with a closure graph.
    return (not _PLAIN_AUTOGRAD[0] and x.numel() >= FUSED_MIN_NUMEL
            and not torch._C._are_functorch_transforms_active())


class ChannelNorm(nn.Module):
    """Base class: parameters, buffers, input checks and running-statistics bookkeeping."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive integer, got {num_features!r}")
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
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"

    # ---- helpers -------------------------------------------------------------------------------
    def check_input(self, x: Tensor) -> None:
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
        if self.training and x.numel() // x.shape[1] <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input of shape {tuple(x.shape)}"
            )

    @staticmethod
    def reduce_dims(x: Tensor) -> list[int]:
        return [0, *range(2, x.dim())]

    @staticmethod
    def per_channel(t: Tensor, x: Tensor) -> Tensor:
        """View a (C,) tensor so that it broadcasts against x of shape (N, C, *)."""
        return t.view(1, -1, *([1] * (x.dim() - 2)))

    def batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Per-channel mean and biased variance over the batch and all trailing dims, and the count."""
        dims = self.reduce_dims(x)
        if torch._C._are_functorch_transforms_active():
            var, mean = torch.var_mean(x, dim=dims, correction=0)
        else:  # two passes: several times faster than var_mean's strided Welford on CPU
            mean = x.mean(dim=dims)
            var = (x - self.per_channel(mean, x)).pow(2).mean(dim=dims)
        return mean, var, x.numel() // x.shape[1]

    def normalize_with_batch_stats(self, x: Tensor, coef_fn: CoefFn, *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        """Apply the per-channel affine map ``coef_fn(μ_B, σ²_B, *tensors) -> (scale, shift)`` to x.

        Returns ``(y, μ_B, σ²_B, n)`` (statistics detached, for running-statistics updates). Gradients
        flow through μ_B, σ²_B and ``tensors`` exactly as autograd on the plain expression would give.
        """
        n = x.numel() // x.shape[1]
        if fused_enabled(x):
            y, mean, var = _StatsAffine.apply(x, coef_fn, *tensors)
            return y, mean, var, n
        mean, var, _ = self.batch_stats(x)
        scale, shift = coef_fn(mean, var, *tensors)
        return self.apply_affine(x, scale, shift), mean.detach(), var.detach(), n

    def use_batch_stats(self) -> bool:
        return self.training or not self.track_running_stats

    @torch.no_grad()
    def update_running_stats(self, mean: Tensor, var: Tensor, n: int, momentum: float | None = None) -> None:
        """PyTorch's convention: biased variance normalizes, the unbiased one goes into running_var."""
        if not (self.training and self.track_running_stats):
            return
        m = self.momentum if momentum is None else momentum
        self.num_batches_tracked.add_(1)
        if m is None:  # cumulative moving average, as torch does for momentum=None
            m = 1.0 / float(self.num_batches_tracked)
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
        unbiased = var.detach() * (n / max(n - 1, 1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)

    def gamma_beta(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.affine:
            return self.weight, self.bias
        one = torch.ones(self.num_features, dtype=x.dtype, device=x.device)
        return one, torch.zeros_like(one)

    def weight_or_one(self) -> Tensor:
        return self.weight if self.affine else torch.ones_like(self.running_mean)

    def bias_or_zero(self) -> Tensor:
        return self.bias if self.affine else torch.zeros_like(self.running_mean)

    def apply_affine(self, x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """y = scale·x + shift per channel, in one pass."""
        return torch.addcmul(self.per_channel(shift, x), x, self.per_channel(scale, x))

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
