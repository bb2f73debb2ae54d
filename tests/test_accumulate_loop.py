"""``N.accumulate`` in a real training loop, for every spec in the registry: k micro-batches, one
``loss.backward()`` per micro-batch (or ``acc.step`` in the exact mode) and ONE optimizer step,
against one optimizer step on the full batch. What the docs and the errors promise, checked:
the running statistics always equal the full batch's; the normalization (so the gradients and the
parameters after the step) only with ``normalize="full"``, for the layers that allow it; the
others are refused by name, with the reason and the mode that does take them."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bnlab.norms as N
from bnlab.norms.registry import REGISTRY

K = 4
SPECS = sorted(REGISTRY) + ["lp_bn(p=1)", "lp_bn(p=inf)", "cbn(decouple=false)"]
MICRO_REFUSED = {"lp_bn(p=1)": "mean |x − μ|", "lp_bn(p=inf)": "top-k"}
FULL_REFUSED = {"noisy_bn": "draws its noise in one draw", "native_bn": "torch's kernel",
                **MICRO_REFUSED}
NO_BATCH_STATISTICS = {"gn", "none", "wn"}  # normalization independent of the batch


def _net(spec: str) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = N.normalized(conv, spec)
        model = nn.Sequential(block, nn.ReLU(), nn.Flatten(), nn.Linear(64, 5))
        N.set_progress(model, lr=0.01, epoch=2, epochs=5)  # mbn's λ, cbn's η non-zero
    N.seed_layers(model, 3)
    return model.train()


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 6, 6, generator=g) * 2 + 1, torch.randint(0, 5, (16,), generator=g)


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.double() for k, v in model.named_buffers()}


def _full_batch_step(spec: str) -> nn.Module:
    model = _net(spec)
    x, y = _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    return model


def _accumulated_step(spec: str, normalize: str) -> nn.Module:
    model = _net(spec)
    x, y = _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with N.accumulate(model, steps=K, normalize=normalize) as acc:
        if normalize == "micro":
            for xi, yi in zip(x.chunk(K), y.chunk(K)):
                (F.cross_entropy(model(xi), yi) / K).backward()
        else:
            acc.step(list(x.chunk(K)),
                     lambda out, i: F.cross_entropy(out, y.chunk(K)[i], reduction="sum") / len(x))
    optimizer.step()
    return model


def _max_param_difference(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("normalize", ["micro", "full"])
def test_one_accumulated_step_against_one_full_batch_step(spec, normalize):
    refused = (MICRO_REFUSED if normalize == "micro" else FULL_REFUSED).get(spec)
    if refused:
        with pytest.raises(ValueError) as err:
            _accumulated_step(spec, normalize)
        message = str(err.value)
        assert f"0.1: {spec.split('(')[0]}" in message and refused in message  # the layer, why
        if normalize == "full" and spec not in MICRO_REFUSED:
            assert "normalize='micro' accepts this model" in message
        return
    reference, model = _full_batch_step(spec), _accumulated_step(spec, normalize)
    ours, theirs = _buffers(model), _buffers(reference)
    assert ours.keys() == theirs.keys()
    for name in ours:  # running statistics: the full batch's in both modes
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    difference = _max_param_difference(model, reference)
    if normalize == "full" or spec in NO_BATCH_STATISTICS:
        assert difference < 1e-5  # the normalization too: one full-batch step
    else:
        assert difference > 1e-3  # each micro-batch normalized with its own statistics


def test_the_docs_lists_of_layers_are_the_registrys():
    """The layers the messages list as allowing each mode are the registry's batch norms minus
    the refused ones."""
    from bnlab.norms.tools.accumulate import FULL_KINDS, MICRO_KINDS
    batch_norms = set(REGISTRY) - NO_BATCH_STATISTICS
    micro = {k.split("(")[0] for k in MICRO_KINDS.split(", ")}
    full = {k.split("(")[0] for k in FULL_KINDS.split(", ")}
    assert micro == batch_norms
    assert full == batch_norms - {"noisy_bn", "native_bn"}
