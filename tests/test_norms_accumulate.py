"""Gradient accumulation BN understands (bnlab.norms.accumulate).

Reference: one step on the full batch — torch's ``nn.BatchNorm2d`` for ``bn`` and the same bnlab
layer otherwise — against k micro-batches inside ``accumulate(model, steps=k)``: every running and
moving buffer equal to float32 rounding (the micro-batch statistics are combined in float64, the
update's arithmetic is the layer's, not torch's kernel's), one update per optimizer step; with
``normalize="full"`` also the outputs and every parameter's gradient, in a three-layer network.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N

ALLOWED = ["bn", "mean_only_bn", "var_only_bn", "native_bn", "noisy_bn", "mbn", "cbn",
           "cbn(order=literal)", "cbn(amat=false)", "cbn(decouple=false)", "brn(relax_from=0)",
           "lp_bn"]


def _layer(spec: str) -> nn.Module:
    torch.manual_seed(0)
    layer = N.create(spec, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(layer, lr=0.01, epoch=3, epochs=5)  # mbn's λ, cbn's η non-zero
    return layer


def _batches(steps: int = 3):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(16, 3, 4, 4, generator=g) * 2 + 1 for _ in range(steps)]


@pytest.mark.parametrize("spec", ALLOWED)
def test_running_statistics_equal_one_full_batch_step(spec):
    accumulated = _layer(spec)
    full = copy.deepcopy(accumulated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in _batches():
            full(x)
            with N.accumulate(accumulated, steps=4):
                for micro in x.chunk(4):
                    accumulated(micro)
    expected = full.state_dict()
    for name, value in accumulated.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-6, msg=name)
    assert int(accumulated.num_batches_tracked) == 3


def test_bn_equals_torchs_batchnorm_on_the_full_batch_and_not_without_accumulate():
    torch_bn, layer, plain = nn.BatchNorm2d(3), N.create("bn", 3), N.create("bn", 3)
    for x in _batches():
        torch_bn(x)
        with N.accumulate(layer, steps=4):
            for micro in x.chunk(4):
                layer(micro)
        for micro in x.chunk(4):
            plain(micro)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(layer, name), getattr(torch_bn, name), rtol=1e-6,
                                   atol=1e-6)
    assert int(plain.num_batches_tracked) == 12  # what accumulation without the block does
    assert not torch.allclose(plain.running_var, torch_bn.running_var, rtol=1e-3)


@pytest.mark.parametrize("spec", ["mbn", "cbn", "brn(relax_from=0)"])
def test_each_micro_batch_is_normalized_from_the_steps_starting_state(spec):
    """Outputs and gradients: those of each micro-batch run alone from the state before the step
    (the moving statistics are not advanced between micro-batches)."""
    layer = _layer(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer(_batches()[0])  # the moving statistics hold a batch
        x = _batches()[1]
        with N.accumulate(layer, steps=2) as _:
            start = copy.deepcopy(layer)
            got = [layer(m.clone().requires_grad_()) for m in x.chunk(2)]
        for micro, y in zip(x.chunk(2), got):
            alone = copy.deepcopy(start)
            assert torch.equal(alone(micro), y)


def test_one_update_per_steps_forwards_in_a_long_block_and_the_rest_at_exit():
    layer = N.create("bn", 3)
    with N.accumulate(layer, steps=2):
        for x in _batches(5):
            layer(x)
        assert int(layer.num_batches_tracked) == 2
    assert int(layer.num_batches_tracked) == 3  # the fifth batch alone, at exit


def test_layers_that_do_not_allow_it_are_refused_by_name():
    model = nn.Sequential(N.create("bn", 3), N.create("lp_bn(p=inf)", 3), nn.BatchNorm2d(3))
    with pytest.raises(ValueError) as err:
        N.accumulate(model, steps=2)
    message = str(err.value)
    assert "1: lp_bn(p=inf)" in message and "2: torch's BatchNorm2d" in message
    assert "Layers that allow it: 0" in message
    with pytest.raises(ValueError, match="normalize must be one of micro, full"):
        N.accumulate(N.create("bn", 3), steps=2, normalize="ghost")
    with pytest.raises(ValueError, match="positive integer"):
        N.accumulate(N.create("bn", 3), steps=0)


# ---- normalize="full" -------------------------------------------------------------------------
FULL = ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)",
        "cbn(order=literal)", "brn(relax_from=0)", "lp_bn"]


def _deep(norm) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), norm(4, 2), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), norm(4, 2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64, 2), norm(2, 1))


def _full_step(net, x):
    with N.accumulate(net, steps=4, normalize="full") as acc:
        outputs = acc.step(list(x.chunk(4)), lambda out, i: out.square().sum())
    return torch.cat(outputs), acc


def _assert_same_step(net, ref, y, y_ref):
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    scale = max(p.grad.abs().max() for p in ref.parameters())
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad / scale, q.grad / scale, rtol=0, atol=1e-5, msg=name)
    for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("spec", FULL)
def test_full_normalization_equals_one_full_batch_step(spec):
    net = _deep(lambda c, _: N.create(spec, c))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        N.set_progress(net, lr=0.01, epoch=3, epochs=5)
        ref = copy.deepcopy(net)
        x = torch.randn(16, 3, 4, 4, generator=torch.Generator().manual_seed(1)) * 2 + 1
        y_ref = ref(x)
        y_ref.square().sum().backward()
        y, acc = _full_step(net, x)
    _assert_same_step(net, ref, y, y_ref)
    assert acc.rounds == 4  # three normalization layers: exact sums from the third round on


def test_full_bn_equals_torchs_batchnorm_on_the_full_batch_and_micro_batches_do_not():
    torch_norm = {2: nn.BatchNorm2d, 1: nn.BatchNorm1d}
    ref = _deep(lambda c, dims: torch_norm[dims](c))
    net, naive = (_deep(lambda c, _: N.create("bn", c)) for _ in range(2))
    x = torch.randn(16, 3, 4, 4, generator=torch.Generator().manual_seed(2)) * 2 + 1
    y_ref = ref(x)
    y_ref.square().sum().backward()
    y, _ = _full_step(net, x)
    _assert_same_step(net, ref, y, y_ref)
    y_naive = torch.cat([naive(m) for m in x.chunk(4)])  # what a plain accumulation loop gets
    y_naive.square().sum().backward()
    assert not torch.allclose(y_naive, y_ref, atol=1e-2)
    assert not torch.allclose(naive[0].weight.grad, ref[0].weight.grad, atol=1e-2)


def test_full_refuses_layers_whose_step_it_cannot_reproduce_and_lists_the_others():
    model = nn.Sequential(N.create("bn", 3), N.create("noisy_bn", 3), N.create("native_bn", 3),
                          N.create("lp_bn(p=1)", 3))
    with pytest.raises(ValueError) as err:
        N.accumulate(model, steps=2, normalize="full")
    message = str(err.value)
    assert "1: noisy_bn" in message and "2: native_bn" in message and "3: lp_bn(p=1)" in message
    assert "Layers that allow it: 0" in message


def test_full_needs_the_micro_batches_at_once():
    layer = N.create("bn", 3)
    with N.accumulate(layer, steps=2, normalize="full"):
        with pytest.raises(RuntimeError, match=r"acc.step\(inputs, loss_fn\)"):
            layer(torch.randn(4, 3))
