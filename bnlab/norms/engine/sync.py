"""Batch statistics synchronized over the ranks of a ``torch.distributed`` process group.

Under data parallelism every rank holds a slice of the global batch. A synchronized layer computes
its statistics over the whole global batch, as ``nn.SyncBatchNorm`` does, so that N ranks with
slices of one batch give the outputs, the gradients and the running buffers of one process given
the whole batch (``tests/test_norms_sync.py`` checks this for every layer with 2 and 3 gloo ranks,
uneven slices included).

The primitives are differentiable. Each forward collective's backward is an all-reduce of the
gradient: the training loss of data parallelism is the sum (or, after DDP's averaging, the mean)
of the ranks' losses, and every rank's loss depends on the global statistic, so the gradient that
reaches a rank's local contribution is the sum over ranks of ∂L_r/∂(global statistic). This is the
backward of ``nn.SyncBatchNorm`` (Ioffe & Szegedy 2015, Alg. 1, with the batch split over devices).

Outside an initialized process group, or in a group of one, nothing is communicated: a synchronized
layer then behaves exactly like the unsynchronized one. Statistics are synchronized in training
only (evaluation uses the running statistics, and ranks need not evaluate in lockstep).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

# whether a layer is synced now, and over which group: questions the route asks before any step,
# so they are answered in .switches; part of this module's API all the same
from .switches import active_group, module_group

__all__ = [
    "active_group", "all_gather", "all_reduce_sum", "batch_samples", "broadcast_seed",
    "channel_count", "channel_mean", "channel_topk", "global_batch_rows", "global_topk",
    "module_group", "sample_offset", "synced_moments",
]


class _AllGather(torch.autograd.Function):
    """Stack of every rank's ``t`` (equal shapes), shape ``(world, *t.shape)``; backward sums over
    ranks."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: Tensor):
        # Rank r's loss depends on every row; row q's total gradient is Σ_r ∂L_r/∂row_q.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None


class _AllReduceSum(torch.autograd.Function):
    """Σ over ranks of ``t``; backward all-reduces the gradient (every rank's loss sees the sum)."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        out = t.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_gather(t: Tensor, group) -> Tensor:
    """Differentiable all-gather of equal-shaped tensors: ``(world, *t.shape)``."""
    return _AllGather.apply(t, group)


def all_reduce_sum(t: Tensor, group) -> Tensor:
    """Differentiable all-reduce (sum)."""
    return _AllReduceSum.apply(t, group)


def _channel_last_flat(x: Tensor) -> Tensor:
    """x of shape (N, C, *) as (C, N·∏*)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def synced_moments(x: Tensor, group,
                   dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, int]:
    """Per-channel mean and biased variance over the global batch, and the global count per channel.

    Each rank reduces its slice to (count n_r, mean μ_r, M2_r = Σ(x − μ_r)²) — a two-pass, shifted
    sum, so a large mean does not cancel the variance — and the slices are combined exactly (Chan,
    Golub & LeVeque's parallel update): ``μ = Σ n_r μ_r / N``, ``M2 = Σ M2_r + Σ n_r (μ_r − μ)²``,
    ``σ² = M2 / N``. One all-gather of ``2C + 1`` numbers per rank: uneven (even empty) slices need
    no padding. Every rank combines the same gathered numbers in the same order, so the statistics
    are bitwise identical on all ranks. ``dtype``: accumulation dtype (default float32 for half
    inputs, else x's). Differentiable in x.
    """
    acc = dtype or (torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype)
    flat = _channel_last_flat(x).to(acc)
    n_local = flat.shape[1]
    mean_r = flat.sum(1) / max(n_local, 1)
    m2_r = (flat - mean_r[:, None]).pow(2).sum(1)
    count = torch.full((1,), float(n_local), dtype=acc, device=x.device)
    gathered = all_gather(torch.cat([mean_r, m2_r, count]), group)  # (world, 2C + 1)
    c = x.shape[1]
    means, m2s, counts = gathered[:, :c], gathered[:, c:2 * c], gathered[:, 2 * c:].detach()
    total = int(counts.sum().item())
    if total < 2:
        raise ValueError("Expected more than 1 value per channel over all ranks when training, "
                         f"got {total}")
    mean = (counts * means).sum(0) / total
    m2 = m2s.sum(0) + (counts * (means - mean).pow(2)).sum(0)
    return mean, m2 / total, total


# Below this many entries along ``dim`` a stable sort is cheaper than topk_first's selection passes
# (a fixed cost per call); from it the selection wins, by more the longer the row (timed on the
# CPU, one thread, with benchmarks/norms.py's lp_bn(p=inf) rows).
TOPK_SORT_BELOW = 256


def topk_first(values: Tensor, k: int, dim: int = -1) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries along ``dim``, sorted descending, equal values taken lowest index
    first: ``(values, indices)``. ``torch.topk`` leaves the choice among equal values unspecified,
    so where the k-th value is tied (integer-valued inputs, ReLU zeros) two layouts of one batch —
    2 ranks × 8 samples, 1 × 16 — could put the ℓ∞ scale's gradient on different entries. Here the
    choice is a function of the values and their order in the batch alone: what a stable sort of
    the whole row gives (which short rows use), found on long rows without sorting them: where no
    row ties its k-th value to its (k+1)-th, topk's own k, put in order; else, for float32, one
    topk of :func:`stable_sort_key`; for other dtypes every entry above the k-th largest value,
    then the first entries equal to it, put in order. (NaN entries are not ordered as a sort
    orders them.)"""
    dim = dim % values.dim()
    n = values.size(dim)
    if n < TOPK_SORT_BELOW or k == 0:
        sorted_values, order = torch.sort(values, dim=dim, descending=True, stable=True)
        return sorted_values.narrow(dim, 0, k), order.narrow(dim, 0, k)
    plain = values.detach()  # the selection is not differentiated; the gather below is
    if k < n and _concrete(plain):
        top = torch.topk(plain, k + 1, dim=dim)
        if bool((top.values.narrow(dim, k, 1) < top.values.narrow(dim, k - 1, 1)).all()):
            # no row ties its k-th value to its (k+1)-th: topk's k are the one top-k set, and
            # only their order needs fixing; no key pass (the wheres of a (64, 10 240) key are a
            # visible share of an eager ℓ∞ layer's step in torch's profiler)
            return _ordered(values, top.indices.narrow(dim, 0, k).sort(dim=dim).values, dim)
    if plain.dtype == torch.float32:
        # one key orders entries as the stable sort does, so one topk picks and orders them (in
        # compiled code: one fused pass and one topk instead of two topk, two sorts, four gathers)
        index = torch.topk(stable_sort_key(plain, dim), k, dim=dim).indices
        return values.gather(dim, index), index
    # Every entry above the k-th value, then the first entries equal to it: one key each, n + the
    # reversed position above, the reversed position at the k-th value, 0 below; the k largest keys
    # are exactly those entries (fewer than k lie above). A running count of the tied entries would
    # do the same with a cumsum over the row, a slow scan on the CPU.
    kth = torch.topk(plain, k, dim=dim).values.narrow(dim, k - 1, 1)
    reversed_position = _reversed_positions(plain, dim, 1)
    key = torch.where(plain > kth, reversed_position + n,
                      torch.where(plain == kth, reversed_position, 0))
    # in batch order, as the stable sort of _ordered needs
    return _ordered(values, torch.topk(key, k, dim=dim).indices.sort(dim=dim).values, dim)


def _reversed_positions(values: Tensor, dim: int, last: int) -> Tensor:
    """n − 1 + last, …, last along ``dim`` (shaped to broadcast against ``values``)."""
    n = values.size(dim)
    shape = [1] * values.dim()
    shape[dim] = n
    return torch.arange(n - 1 + last, last - 1, -1, device=values.device).view(shape)


def stable_sort_key(values: Tensor, dim: int) -> Tensor:
    """int64 keys that order float32 ``values`` along ``dim`` as a stable descending sort does:
    larger values first, equal values lowest index first.

    The high 32 bits are the value's IEEE bits made monotone (a negative value's bits all flipped
    but the sign, a non-negative one's kept: then signed integers order as the floats; + 0.0 first
    turns −0.0 into +0.0, which a sort ties with it), the low 32 bits the reversed position. NaN
    with the sign bit set ranks last, not first as in a sort."""
    bits = (values + 0.0).view(torch.int32)
    monotone = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return monotone.to(torch.int64) * (1 << 32) + _reversed_positions(values, dim, 0)


def _ordered(values: Tensor, index: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """The entries at ``index`` (ascending along ``dim``), sorted descending, ties in index
    order."""
    picked = values.gather(dim, index)
    order = torch.sort(picked.detach(), dim=dim, descending=True, stable=True).indices
    return picked.gather(dim, order), index.gather(dim, order)


def _concrete(t: Tensor) -> bool:
    """Whether Python may branch on ``t``'s values cheaply: a CPU tensor (on a GPU the branch would
    wait for the device; there the key's passes are cheap), not under torch.compile, a torch.func
    transform or a dispatch mode (make_fx's fake tensors; an operation counter sees the branch-free
    path)."""
    return (t.device.type == "cpu" and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and _get_current_dispatch_mode() is None)


def global_topk(values: Tensor, k: int, group) -> Tensor:
    """The k largest entries of each row of ``values`` (shape (C, n_r) on rank r) over all ranks.

    Every rank offers its local top-min(k, n_r) per row (padded to k with the dtype's lowest value,
    never selected while the global row holds ≥ k entries); the gathered (C, world·k) candidates
    contain the global top-k, which is taken again. Returns (C, min(k, Σ n_r)), sorted descending,
    identical on all ranks; gradients reach the local entries that are among the global top-k.
    Ties go to the lowest index of the global batch (ranks in order, :func:`topk_first` on each rank
    and on the rank-ordered candidates): the entries one process given the whole batch picks.
    """
    rows, n_local = values.shape
    k_local = min(k, n_local)
    local = topk_first(values, k_local, dim=1)[0] if k_local else values[:, :0]
    if k_local < k:
        pad = torch.full((rows, k - k_local), torch.finfo(values.dtype).min, dtype=values.dtype,
                         device=values.device)
        local = torch.cat([local, pad], dim=1)
    k_global = min(k, sample_offset(n_local, group, values.device)[1])
    candidates = all_gather(local, group).permute(1, 0, 2).reshape(rows, -1)
    return topk_first(candidates, k_global, dim=1)[0]


# ---- layer-level helpers: what a layer calls instead of a local reduction --------------------

def batch_samples(module: nn.Module, x: Tensor) -> int:
    """Number of samples in the batch the layer normalizes over: x.shape[0], summed over ranks when
    synced.

    MBN's m (its λ schedule and τ = τ0^{m/m0}, Yong et al. 2020 Eq. 4) is the batch the statistics
    come from, so with synchronized statistics it is the global batch: λ is then identical on all
    ranks.
    """
    group = module_group(module)
    return x.shape[0] if group is None else sample_offset(x.shape[0], group, x.device)[1]


def channel_mean(module: nn.Module, t: Tensor) -> Tensor:
    """Per-channel mean of t (N, C, *) over the batch and trailing dims, over all ranks when
    synced."""
    group = module_group(module)
    if group is None:
        return t.mean(dim=[0, *range(2, t.dim())])
    flat = _channel_last_flat(t)
    total = all_reduce_sum(flat.sum(1), group)
    return total / sample_offset(flat.shape[1], group, t.device)[1]


def channel_count(module: nn.Module, t: Tensor) -> int:
    """Values per channel of t (N, C, *), over all ranks when synced."""
    group = module_group(module)
    n = t.numel() // t.shape[1]
    return n if group is None else sample_offset(n, group, t.device)[1]


def channel_topk(module: nn.Module, values: Tensor, k: int) -> Tensor:
    """Top-min(k, n) of each row of ``values`` (C, n), over the rows of all ranks when synced."""
    group = module_group(module)
    if group is None:
        return topk_first(values, min(k, values.shape[1]), dim=1)[0]
    return global_topk(values, k, group)


def global_batch_rows(module: nn.Module, x: Tensor) -> tuple[tuple[int, ...], slice]:
    """(shape of the global batch, this rank's rows in it) for drawing per-sample noise.

    A synced stochastic layer draws the noise of the whole global batch from a generator that is
    identical on every rank and keeps its own rows: the ranks together then draw exactly what one
    process given the whole batch draws (Santurkar et al. 2018, App. A.2.1, Alg. 1's noise).
    Unsynced: (x.shape, every row).
    """
    group = module_group(module)
    if group is None:
        return tuple(x.shape), slice(None)
    offset, total = sample_offset(x.shape[0], group, x.device)
    return (total, *x.shape[1:]), slice(offset, offset + x.shape[0])


def sample_offset(n_local: int, group, device: torch.device | None = None) -> tuple[int, int]:
    """(index of this rank's first sample in the global batch, global batch size): ranks in
    order."""
    counts = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    counts[dist.get_rank(group)] = n_local
    dist.all_reduce(counts, group=group)
    return int(counts[: dist.get_rank(group)].sum()), int(counts.sum())


def broadcast_seed(seed: int, group, device: torch.device | None = None) -> int:
    """Rank 0's ``seed`` (of ``group``) on every rank."""
    t = torch.tensor([int(seed)], dtype=torch.int64, device=device)
    dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
    return int(t.item())
