"""``topk_first`` (the ℓ∞ scale's top-k, ties to the lowest index) equals a stable sort of the row.

Long rows take a selection (``torch.topk`` for the k-th value, the first tied entries, a stable sort
of the k picked) instead of sorting the whole row (a full sort would take most of ``lp_bn(p=inf)``'s
step). The reference is the definition: ``torch.sort(..., descending=True, stable=True)``
truncated to k — values, indices and the gradient through the values.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bnlab.norms.engine import sync


def _reference(values: torch.Tensor, k: int, dim: int):
    ordered, order = torch.sort(values, dim=dim, descending=True, stable=True)
    return ordered.narrow(dim, 0, k), order.narrow(dim, 0, k)


def _rows(kind: str, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "ties":  # few distinct values: the k-th value is tied many times
        return (x * 2).round().abs()
    if kind == "relu":  # most entries 0, as after a ReLU
        return x.clamp_min(1.5)
    return x


@pytest.mark.parametrize("kind", ["plain", "ties", "relu"])
@pytest.mark.parametrize("shape, k, dim", [((6, 3000), 10, 1), ((3000, 5), 10, 0),
                                           ((4, 700), 700, 1), ((3, 600), 1, -1),
                                           ((3, 50), 10, 1)])
def test_topk_first_equals_a_stable_sort(kind, shape, k, dim):
    values = _rows(kind, shape, seed=len(kind) + k).requires_grad_()
    got_v, got_i = sync.topk_first(values, k, dim)
    want_v, want_i = _reference(values, k, dim)
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v)
    weights = torch.randn(got_v.shape, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64)
    (got_g,) = torch.autograd.grad((got_v * weights).sum(), values)
    (want_g,) = torch.autograd.grad((want_v * weights).sum(), values)
    assert torch.equal(got_g, want_g)


def test_long_rows_do_not_sort_the_whole_row(monkeypatch):
    """The selection runs from ``TOPK_SORT_BELOW`` entries on: every sort it makes is k long."""
    lengths = []
    real_sort = torch.sort

    def counting_sort(t, *args, **kwargs):
        dim = kwargs.get("dim", args[0] if args else -1)
        lengths.append(t.shape[dim])
        return real_sort(t, *args, **kwargs)

    monkeypatch.setattr(torch, "sort", counting_sort)
    sync.topk_first(torch.randn(4, sync.TOPK_SORT_BELOW * 4), 10, dim=1)
    assert lengths and max(lengths) == 10


def test_long_rows_take_no_running_count():
    """The tie-break is one key and one topk: no cumsum over the row (2.3 of lp_bn(p=inf)'s 36 ms a
    step on (128, 64, 32, 32)); two topk (the k-th value, the picked entries) and two k-long sorts
    (the picked indices into batch order, then by value)."""
    from bnlab.norms.tools.opcount import count_ops

    values = _rows("ties", (64, 4096), seed=3)
    names = count_ops(lambda: sync.topk_first(values, 10, dim=1)).by_name()
    assert "cumsum" not in names, names
    assert names["topk"] == 2 and names.get("sort", 0) <= 2, names


def _aten_calls(fn) -> list[str]:
    """The aten operators ``fn`` ran, read with the profiler (not a dispatch mode, under which
    topk_first takes its branch-free path)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


def test_rows_without_a_tie_at_the_kth_value_build_no_key():
    """Where no row ties its k-th value to its (k+1)-th, topk's first k are the one top-k set: no
    key over the row (its two wheres were 3–4 of an eager ℓ∞ layer's 32 ms on (128, 64, 32, 32)).
    A tie at the boundary still takes the key, and both equal the stable sort."""
    distinct = _rows("plain", (64, 4096), seed=5)
    tied = _rows("ties", (64, 4096), seed=5)
    assert "aten::where" not in _aten_calls(lambda: sync.topk_first(distinct, 10, dim=1))
    assert "aten::where" in _aten_calls(lambda: sync.topk_first(tied, 10, dim=1))
    for values in (distinct, tied):
        got, want = sync.topk_first(values, 10, dim=1), _reference(values, 10, 1)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("shape", [(300, 4), (300, 4, 1, 1)])
@pytest.mark.parametrize("kind", ["plain", "ties", "relu"])
def test_one_value_per_row_takes_the_entries_as_candidates(shape, kind):
    """(N, C) inputs (one value per sample and channel) pick the top-k of |x − μ| directly: no row
    bounds, no candidate copy; the same values, indices (ties to the lowest sample) and signs as a
    stable sort of each channel."""
    from bnlab.norms.engine.lp_fused import linf_top_entries

    x = _rows(kind, shape, seed=7) - 0.5
    mean = x.mean(dim=[0, *range(2, x.dim())])
    calls = _aten_calls(lambda: linf_top_entries(x, mean, 10))
    assert not {"aten::amin", "aten::amax", "aten::index_select"} & set(calls), calls
    values, index, signs = linf_top_entries(x, mean, 10)
    centred = (x - mean.view(1, -1, *[1] * (x.dim() - 2))).flatten(1)
    want_v, want_i = _reference(centred.abs(), 10, 0)
    assert torch.equal(values, want_v.t()) and torch.equal(index[0], want_i.t())
    assert torch.equal(signs, centred.gather(0, want_i).sign().t())
    # laid out as the other shapes' (C, k): the ℓ∞ scale's sum over k rounds as theirs (a
    # transposed view summed in another order: 6 stored ℓ∞ runs changed in their first step)
    assert values.is_contiguous() and signs.is_contiguous()
    assert torch.equal(values.sum(1), want_v.t().contiguous().sum(1))
    assert torch.equal(x[index], x.flatten(1).gather(0, want_i).t())


def test_the_stable_sort_key_orders_float32_as_a_stable_sort():
    """One int64 key per entry (monotone IEEE bits, then the reversed position): its descending
    order is the stable descending sort's, over negatives, ±0, ±inf and many ties."""
    g = torch.Generator().manual_seed(11)
    values = torch.cat([torch.randint(-3, 4, (5, 300), generator=g).float() * 0.5,
                        torch.tensor([[-0.0, 0.0, float("inf"), -float("inf")] * 75])])
    values[2, ::7] = -0.0
    key = sync.stable_sort_key(values, dim=1)
    assert torch.equal(key.argsort(dim=1, descending=True), _reference(values, 300, 1)[1])
    assert torch.equal(sync.stable_sort_key(values.t(), dim=0).t(), key)


@pytest.mark.parametrize("kind", ["ties", "relu"])
def test_traced_rows_take_the_key_and_pick_the_same_entries(kind):
    """Under a dispatch mode (as in make_fx, torch.compile: no branch on values) float32 rows take
    the one-key path: the stable sort's entries, with one topk (no sort over the picked)."""
    from bnlab.norms.tools.opcount import count_ops

    values = _rows(kind, (16, 2048), seed=13).float()
    got = count_ops(lambda: sync.topk_first(values, 10, dim=1))
    assert got.by_name().get("topk") == 1 and "sort" not in got.by_name(), got.by_name()
    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough():
        got_v, got_i = sync.topk_first(values, 10, dim=1)
    want_v, want_i = _reference(values, 10, 1)
    assert torch.equal(got_v, want_v) and torch.equal(got_i, want_i)
