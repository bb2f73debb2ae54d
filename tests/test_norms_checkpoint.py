"""Activation checkpointing and non-finite batches (bnlab.norms.engine.guard).

Reference for checkpointing: the same network trained without ``torch.utils.checkpoint`` — outputs,
parameter and input gradients and every buffer after three steps must be bitwise equal, for both
``use_reentrant`` settings, on the plain path (small inputs) and the fused one. torch's own
``nn.BatchNorm2d`` updates twice under checkpoint (pytorch#96136): the test shows that first, so it
would notice a torch that fixed it.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import bnlab.norms as N

SPECS = ["bn", "mean_only_bn", "var_only_bn", "native_bn", "noisy_bn", "mbn", "cbn",
         "cbn(order=literal)", "cbn(amat=false,decouple=false)", "brn(relax_from=0)", "lp_bn",
         "lp_bn(p=1)", "lp_bn(p=inf)"]
SHAPES = {"plain": (8, 4, 5, 5), "fused": (64, 4, 16, 16)}


WRAPPERS = ["si_bn", "wn", "wn+mean_only_bn"]  # they replace the convolution they normalize


def _net(spec: str) -> nn.Module:
    torch.manual_seed(0)
    if spec in WRAPPERS:
        return nn.Sequential(*N.normalized(nn.Conv2d(4, 4, 3, padding=1, bias=False), spec),
                             nn.ReLU(),
                             *N.normalized(nn.Conv2d(4, 4, 3, padding=1, bias=False), spec))
    net = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), N.create(spec, 4), nn.ReLU(),
                        nn.Conv2d(4, 4, 3, padding=1), N.create(spec, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(net, lr=0.01, epoch=3, epochs=5)  # mbn's λ and cbn's η non-zero
    return net


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("spec", SPECS + WRAPPERS)
def test_checkpointed_training_equals_the_plain_one_bit_for_bit(spec, reentrant, shape):
    plain = _net(spec)
    checkpointed = copy.deepcopy(plain)  # noisy_bn: the same generator seed
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            x = torch.randn(*shape, generator=g) + 2
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya = plain(xa)
            ya.square().sum().backward()
            yb = checkpoint(checkpointed, xb, use_reentrant=reentrant)
            yb.square().sum().backward()
    assert torch.equal(ya, yb)
    assert torch.equal(xa.grad, xb.grad)
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.equal(a.grad, b.grad), name
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_bn_updates_once_where_torchs_batchnorm_updates_twice(reentrant):
    x = torch.randn(16, 3, 4, 4, generator=torch.Generator().manual_seed(2), requires_grad=True)
    torch_bn, ours = nn.BatchNorm2d(3), N.create("bn", 3)
    for layer in (torch_bn, ours):
        checkpoint(layer, x, use_reentrant=reentrant).square().sum().backward()
    assert int(torch_bn.num_batches_tracked) == 2  # pytorch#96136 (the reason for this test)
    assert int(ours.num_batches_tracked) == 1
    once = nn.BatchNorm2d(3)
    once(x)
    assert torch.equal(ours.running_mean, once.running_mean)
    assert torch.equal(ours.running_var, once.running_var)


def test_a_checkpoint_that_stops_recomputing_early_leaves_nothing_behind():
    """Non-reentrant checkpoint stops recomputing once it has every saved tensor (early stop), so a
    layer after the last saved tensor may not be recomputed at all: its record dies with the
    region, and the next step is a normal one."""
    net = _net("mbn")
    ref = copy.deepcopy(net)
    x = torch.randn(8, 4, 5, 5, generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            checkpoint(net, x.clone().requires_grad_(), use_reentrant=False).sum().backward()
            ref(x.clone().requires_grad_()).sum().backward()
    for a, b in zip(net.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)


# ---- non-finite batches ------------------------------------------------------------------------

@pytest.fixture
def guard():
    previous = N.set_nonfinite_guard(True)
    yield
    N.set_nonfinite_guard(previous)


def _layer(spec: str) -> nn.Module:
    layer = N.create(spec, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(layer, lr=0.01, epoch=3, epochs=5)
    return layer


def _batch(bad: float | None = None) -> torch.Tensor:
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(4)) + 1
    if bad is not None:
        x[2, 1, 0, 0] = bad
    return x


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("spec", SPECS)
def test_the_guard_leaves_every_buffer_of_a_nonfinite_batch_untouched(spec, bad, guard):
    layer = _layer(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer(_batch())  # one finite step first: the moving statistics hold a batch
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="not finite"):
        layer(_batch(bad).requires_grad_()).sum().backward()
    for name, value in layer.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert layer.nonfinite_batches == 1
    assert N.nonfinite_batches(nn.Sequential(layer)) == {"0": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        layer(_batch())  # the next finite batch trains as usual
    assert layer.nonfinite_batches == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_the_guard_covers_the_wrapper_layers(bad, guard):
    model = N.normalized(nn.Conv2d(3, 3, 1, bias=False), "si_bn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(_batch())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="not finite"):
        model(_batch(bad))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert N.nonfinite_batches(model) == {"0.norm": 1}


@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "brn"])
def test_without_the_guard_torchs_behaviour_stays(spec):
    """Off by default: the non-finite statistics enter the buffers, as in nn.BatchNorm2d."""
    assert not N.nonfinite_guard_enabled()
    layer, reference = _layer(spec), nn.BatchNorm2d(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        layer(_batch(float("nan")))
    reference(_batch(float("nan")))
    assert torch.isnan(reference.running_mean).any()
    assert torch.isnan(layer.running_mean).any()
    assert layer.nonfinite_batches == 0


def test_the_guard_changes_nothing_on_finite_batches(guard):
    """Outputs, gradients and buffers bit-identical with the guard on and off."""
    results = []
    for on in (True, False):
        N.set_nonfinite_guard(on)
        layer = _layer("mbn")
        x = _batch().requires_grad_()
        layer(x).square().sum().backward()
        results.append((x.grad, *layer.state_dict().values()))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "brn(relax_from=0)"])
def test_checkpointing_inside_accumulate_changes_nothing(spec, reentrant):
    """The reentrant first pass runs without grad; it still goes through the accumulator (one
    update per optimizer step) and the recomputation replays it."""
    net = _net(spec)
    ref = copy.deepcopy(net)
    x = torch.randn(16, 4, 5, 5, generator=torch.Generator().manual_seed(6)) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with N.accumulate(ref, steps=4):
            for micro in x.chunk(4):
                ref(micro.clone().requires_grad_()).square().sum().backward()
        with N.accumulate(net, steps=4):
            for micro in x.chunk(4):
                out = checkpoint(net, micro.clone().requires_grad_(), use_reentrant=reentrant)
                out.square().sum().backward()
    for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name
    for a, b in zip(net.parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_the_guard_works_inside_a_checkpointed_region(reentrant, guard):
    layer = _layer("mbn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer(_batch())
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="not finite"):
        out = checkpoint(layer, _batch(float("nan")).requires_grad_(), use_reentrant=reentrant)
        out.sum().backward()
    for name, value in layer.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert layer.nonfinite_batches == 1  # counted once: the recomputation replays, not counts
