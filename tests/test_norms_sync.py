"""Synchronized batch statistics (bnlab.norms.engine.sync): N gloo ranks with slices of one batch
equal one process given the whole batch — outputs, input and parameter gradients, every buffer,
eval outputs.

All layer checks of one world size run in a single launch of processes
(tests/distributed_harness.py): every rank builds the reference layer too and runs it, unsynced, on
the whole batch, and reports the largest deviation of each compared quantity; the parent asserts
them. Splits are uneven on purpose (2 ranks: 4 + 3 samples; 3 ranks: 3 + 1 + 3, so one rank holds
fewer values than ℓ∞'s top-k).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms import amat_eta, mbn_lambda
from bnlab.norms.engine import switches, sync
from tests.distributed_harness import run_ranks

TOL = 1e-5
BATCH = 7
SPLITS = {2: [4, 3], 3: [3, 1, 3]}
SPECS = ["bn", "mean_only_bn", "var_only_bn", "mbn(ideal_batch=64)", "cbn",
         "cbn(decouple=false, rho=2)", "cbn(center=false)", "cbn(eta=0.9)", "cbn(amat=false)",
         "brn(r_max=1.5, d_max=0.5)", "lp_bn(p=1)", "lp_bn(p=2)", "lp_bn(p=inf)", "noisy_bn",
         "si_bn", "bn(momentum=none, affine=false)",
         "mbn(ideal_batch=64, track_running_stats=false)"]
STEPS = 3


def _build(spec: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # initial weights and noise seeds
    if spec == "si_bn":
        return N.normalized(nn.Conv2d(2, 3, 1, bias=False), "si_bn")
    return N.create(spec, 3)


def _excess(a: torch.Tensor, b: torch.Tensor) -> float:
    """max(|a − b| − TOL·|b|): ≤ TOL means a equals b within rtol = atol = TOL."""
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float(((a.double() - b.double()).abs() - TOL * b.double().abs()).max())


def _check_layer(spec: str, rank: int, split: list[int],
                 shape: tuple[int, ...]) -> dict[str, float]:
    """Deviation of the synced layer on this rank's rows from the reference on the whole batch."""
    ref = _build(spec, seed=0)
    synced = N.convert_sync(_build(spec, seed=rank))  # other ranks start from other noise seeds
    synced.load_state_dict(ref.state_dict())
    for layer in (ref, synced):
        N.set_progress(layer, lr=0.05, epoch=3, epochs=5)  # MBN λ > 0, CBN's AMAT η = 0.5
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    gen = torch.Generator().manual_seed(1)
    out: dict[str, float] = {}
    for step in range(STEPS):
        x = torch.randn(BATCH, *shape, generator=gen) * 2 + 3
        w = torch.randn(BATCH, 3, *shape[1:], generator=gen)
        x_ref, x_loc = x.clone().requires_grad_(), x[lo:hi].clone().requires_grad_()
        y_ref, y_loc = ref(x_ref), synced(x_loc)
        (y_ref * w).sum().backward()
        (y_loc * w[lo:hi]).sum().backward()
        out[f"step {step} output"] = _excess(y_loc.detach(), y_ref.detach()[lo:hi])
        out[f"step {step} input grad"] = _excess(x_loc.grad, x_ref.grad[lo:hi])
        for (name, p_ref), p_loc in zip(ref.named_parameters(), synced.parameters()):
            grad = p_loc.grad.clone()
            dist.all_reduce(grad)  # what DDP does (up to its 1/world)
            out[f"step {step} grad {name}"] = _excess(grad, p_ref.grad)
    for (name, b_ref), b_loc in zip(ref.named_buffers(), synced.buffers()):
        out[f"buffer {name}"] = _excess(b_loc.float(), b_ref.float())
    x = torch.randn(BATCH, *shape, generator=gen)
    if all(m.track_running_stats for m in ref.modules() if isinstance(m, N.ChannelNorm)):
        # (without running statistics eval normalizes each rank's batch: synced in training only, as
        # torch)
        with torch.no_grad():
            out["eval output"] = _excess(synced.eval()(x[lo:hi]), ref.eval()(x)[lo:hi])
    return out


def _schedules_on_ranks(rank: int, split: list[int]) -> dict[str, float]:
    """MBN's λ and CBN's AMAT η as each rank uses them (gathered, so the parent compares ranks)."""
    mbn = N.convert_sync(N.create("mbn(ideal_batch=64)", 3))
    cbn = N.convert_sync(N.create("cbn", 3))
    for layer in (mbn, cbn):
        N.set_progress(layer, lr=0.05, epoch=3, epochs=5)
        layer(torch.randn(split[rank], 3, 2, 2))
    m = sync.batch_samples(mbn, torch.empty(split[rank], 3))
    values = torch.tensor([mbn.current_lambda(m), cbn.current_eta()], dtype=torch.float64)
    gathered = [torch.empty_like(values) for _ in split]
    dist.all_gather(gathered, values)
    return {"lambda": [float(g[0]) for g in gathered], "eta": [float(g[1]) for g in gathered]}


def _check_layer_unsynced(rank: int, split: list[int]) -> float:
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    x = torch.randn(BATCH, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    ref, local = N.create("bn", 3), N.create("bn", 3)
    return _excess(local(x[lo:hi]).detach(), ref(x).detach()[lo:hi])


def _primitives(rank: int, split: list[int]) -> dict:
    """synced_moments at a large offset and global_topk against float64 references on the whole
    batch."""
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    group = switches.active_group()
    x = torch.randn(BATCH, 3, 4, generator=torch.Generator().manual_seed(2)) + 1e4
    x_loc = x[lo:hi].clone().requires_grad_()
    mean, var, n = sync.synced_moments(x_loc, group)
    var64, mean64 = torch.var_mean(x.double(), dim=(0, 2), correction=0)
    top = sync.global_topk(x_loc.transpose(0, 1).reshape(3, -1), 5, group)
    top64 = x.double().transpose(0, 1).reshape(3, -1).topk(5, dim=1).values
    # only rank 0's loss: d/dx Σ global top-5 is 1 on those entries
    (top.sum() * (rank == 0)).backward()
    x_ref = x.clone().requires_grad_()
    x_ref.transpose(0, 1).reshape(3, -1).topk(5, dim=1).values.sum().backward()
    return {"n": n, "mean": float((mean - mean64).abs().max()),
            "var": float(((var - var64) / var64).abs().max()),
            "top": float((top - top64).abs().max()),
            "top grad": float((x_loc.grad - x_ref.grad[lo:hi]).abs().max())}


def _worker(rank: int, world: int) -> dict:
    """Every check of one world size, in one launch (process start-up dominates the cost).

    The fused kernel is forced on (any size): the unsynced references take it, and a synced layer
    must not (its backward knows nothing of the other ranks)."""
    norms_route.FUSED_MIN_NUMEL = 0
    split = SPLITS[world]
    layers = {spec: _check_layer(spec, rank, split, (2, 2, 2) if spec == "si_bn" else (3, 2, 2))
              for spec in SPECS}
    layers["bn (N, C)"] = _check_layer("bn", rank, split, (3,))
    return {"layers": layers, "schedules": _schedules_on_ranks(rank, split),
            "unsynced": _check_layer_unsynced(rank, split), "primitives": _primitives(rank, split)}


@functools.lru_cache(maxsize=None)
def _launch(world: int) -> list[dict]:
    return run_ranks(world, _worker, timeout=120)


@pytest.mark.parametrize("world", [2, 3])
def test_synced_layers_equal_one_process_on_the_whole_batch(world):
    ranks = _launch(world)
    bad = [f"rank {r} {spec}: {what} off by {err:.2e}" for r, res in enumerate(ranks)
           for spec, checks in res["layers"].items() for what, err in checks.items()
           if not err <= TOL]
    assert not bad, "\n".join(bad)
    # sensitivity: the same comparison for an unsynced layer fails on these uneven splits
    assert all(res["unsynced"] > 1e-2 for res in ranks)


@pytest.mark.parametrize("world", [2, 3])
def test_mbn_lambda_and_cbn_eta_identical_on_all_ranks(world):
    for res in _launch(world):
        lambdas, etas = res["schedules"]["lambda"], res["schedules"]["eta"]
        # the global batch's m
        assert lambdas == [mbn_lambda(3, 5, BATCH, 64)] * world and lambdas[0] > 0
        assert etas == [pytest.approx(amat_eta(0.05, 10.0))] * world and etas[0] > 0


@pytest.mark.parametrize("world", [2, 3])
def test_sync_primitives_against_float64_on_the_whole_batch(world):
    for res in _launch(world):
        prim = res["primitives"]
        assert prim["n"] == BATCH * 4
        assert prim["mean"] < 2e-3 and prim["var"] < 1e-3  # float32 at offset 1e4: ulp(1e4) ≈ 1e-3
        assert prim["top"] == 0 and prim["top grad"] == 0


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("spec", SPECS)
def test_synced_layer_outside_a_process_group_is_the_unsynced_layer(spec, fused, monkeypatch):
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0 if fused else 1 << 62)
    shape = (2, 2, 2) if spec == "si_bn" else (3, 2, 2)
    plain = _build(spec, seed=0)
    synced = N.convert_sync(copy.deepcopy(plain))
    assert not dist.is_initialized()
    gen = torch.Generator().manual_seed(3)
    for layer in (plain, synced):
        N.set_progress(layer, lr=0.05, epoch=3, epochs=5)
    for _ in range(2):
        x = torch.randn(5, *shape, generator=gen)
        assert torch.equal(plain(x), synced(x))
    for a, b in zip(plain.buffers(), synced.buffers()):
        assert torch.equal(a, b)


SYNC_NAMES = ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "brn", "lp_bn",
              "noisy_bn", "si_bn"]


def _norms_of(spec: str) -> list[N.ChannelNorm]:
    layer = N.normalized(nn.Conv2d(2, 3, 1), spec) if spec.startswith("si_bn") \
        else N.create(spec, 3)
    return [m for m in layer.modules() if isinstance(m, N.ChannelNorm)]


@pytest.mark.parametrize("name", SYNC_NAMES)
def test_sync_in_the_spec(name):
    assert all(m.sync for m in _norms_of(f"{name}(sync=true)")) and _norms_of(f"{name}(sync=true)")
    assert not any(m.sync for m in _norms_of(name))


def test_convert_sync_switches_every_layer_and_torch_batchnorms_become_sync_batchnorm():
    model = nn.Sequential(nn.Conv2d(2, 3, 1), N.create("cbn", 3), N.create("native_bn", 3),
                          N.normalized(nn.Conv2d(3, 3, 1), "si_bn"), N.create("noisy_bn", 3),
                          nn.BatchNorm2d(3))
    weight = model[2].weight
    assert N.convert_sync(model) is model
    assert all(m.sync for m in model.modules() if isinstance(m, N.ChannelNorm))
    # an optimizer keeps working
    assert isinstance(model[2], nn.SyncBatchNorm) and model[2].weight is weight
    assert isinstance(model[5], nn.SyncBatchNorm)
    with pytest.raises(ValueError, match="native_bn|valid"):
        N.create("native_bn(sync=true)", 3)
