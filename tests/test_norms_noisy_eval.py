"""noisy_bn's eval after noisy training is not silently wrong.

The layers after a noisy_bn collect their running statistics on noisy activations, which eval no
longer produces (tests/test_norms_eval_networks.py measures eval 0.44 against 0.91 in a ReLU VGG).
The first eval forward after such training warns once and names the remedy; after
``recollect_running_stats`` (the clean network's population statistics) eval is silent.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

import bnlab.norms as N


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8, bias=False), N.create("noisy_bn", 8), nn.ReLU(),
                         nn.Linear(8, 8, bias=False), N.create("noisy_bn", 8),
                         nn.ReLU(), nn.Linear(8, 3))


def _batches(count=4):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(32, 6, generator=g) for _ in range(count)]


def _eval_messages(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.eval()(_batches(1)[0])
        model(_batches(1)[0])
    return [str(w.message) for w in caught]


def test_eval_after_noisy_training_warns_once_per_layer_and_names_the_remedy():
    model = _model().train()
    for x in _batches():
        model(x)
    messages = _eval_messages(model)
    assert len(messages) == 2  # one per noisy layer, on the first eval forward only
    assert all("recollect_running_stats" in m for m in messages)


def test_recollected_or_noise_free_statistics_are_silent():
    model = _model().train()
    for x in _batches():
        model(x)
    N.recollect_running_stats(model, _batches())
    assert _eval_messages(model) == []
    quiet = _model().train()
    for layer in quiet.modules():
        if isinstance(layer, N.NoisyBatchNorm):
            layer.noise = False
    for x in _batches():
        quiet(x)
    assert _eval_messages(quiet) == []
