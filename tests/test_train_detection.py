"""Scale-invariance detection in place (``bnlab.train.optim.find_scale_invariant``) against the
reference it replaced: every evaluation on a fresh deep copy of the model.

The in-place evaluator must find the same parameters with the same granularities for every
registered layer, and leave the model exactly as it found it: parameter and buffer values and
bindings, step counters, layer noise generators, modes, and attributes a forward sets.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bnlab.models as M
from bnlab.norms.registry import REGISTRY, lookup
from bnlab.train.optim import _same, find_scale_invariant

SPECS = sorted(REGISTRY)


def _batch(n=64, d=16, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def _reference(model, batch, rtol=1e-4, seed=0) -> dict[str, str]:
    """Arora Def. 2.1 by brute force: each evaluation on its own deep copy (the old
    implementation)."""

    def loss(edit=None):
        clone = copy.deepcopy(model).train()
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed)
            if edit is not None:
                edit(dict(clone.named_parameters()))
            return float(F.cross_entropy(clone(batch[0]), batch[1]))

    def scaled(names, factor):
        return lambda p: [p[n].mul_(factor) for n in names]

    ref, found = loss(), {}
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        rows = torch.where(torch.arange(p.shape[0]) % 2 == 0, 2.0, 0.5)
        rows = rows.reshape(-1, *[1] * (p.dim() - 1))
        if p.shape[0] >= 2 and _same(ref, loss(scaled([name], rows)), rtol):
            found[name] = "rows"
        elif all(_same(ref, loss(scaled([name], c)), rtol) for c in (2.0, 0.5)):
            found[name] = "tensor"
    for mname, m in model.named_modules():
        w, b = getattr(m, "weight", None), getattr(m, "bias", None)
        if isinstance(w, nn.Parameter) and isinstance(b, nn.Parameter) and w.dim() == 1 \
                and w.shape == b.shape:
            names = [f"{mname}.weight", f"{mname}.bias"]
            if not any(n in found for n in names) and all(
                    _same(ref, loss(scaled(names, c)), rtol) for c in (2.0, 0.5)):
                found.update({n: f"joint:{mname}" for n in names})
    return found


def _state(model: nn.Module) -> dict:
    """Everything observable: tensors by name, buffer identity, modes, generator states,
    attributes."""
    out = {"tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()},
           "attr_objects": {(name, k): id(v) for name, m in model.named_modules()
                            for k, v in vars(m).items() if not k.startswith("_")},
           "ids": {k: id(v) for k, v in [*model.named_parameters(), *model.named_buffers()]},
           "modes": [m.training for m in model.modules()]}
    for name, m in model.named_modules():
        gen = getattr(m, "_generator", None)
        if isinstance(gen, torch.Generator):
            out[f"{name}.generator"] = gen.get_state()
            out[f"{name}.generator_object"] = id(gen)  # a trainer holding it keeps the layer's own
        out[f"{name}.attrs"] = sorted(k for k in vars(m) if not k.startswith("_"))
    return out


def _assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "tensors":
            for name, t in before[key].items():
                assert torch.equal(t, after[key][name]), name
        elif isinstance(before[key], torch.Tensor):
            assert torch.equal(before[key], after[key]), key
        else:
            assert before[key] == after[key], key


@pytest.mark.parametrize("spec", SPECS)
def test_detection_matches_deep_copy_reference_and_leaves_model_untouched(spec):
    placement = "pre_activation" if lookup(spec)[0].kind == "wrapper" else "pre_linear"
    model = M.create("mlp", norm=spec, activation="relu", placement=placement, input_shape=(16,),
                     num_classes=5, seed=0, depth=3, width=12)
    batch = _batch()
    model.train()
    model(batch[0])  # one step of history: running statistics, counters, generator states moved
    model.eval()  # detection must hand back the caller's mode
    before = _state(model)
    found = find_scale_invariant(model, F.cross_entropy, batch)
    _assert_same_state(before, _state(model))
    assert found == _reference(model, batch)


def test_restore_removes_attributes_set_by_the_forward_and_rebinds_replaced_buffers():
    class Caching(nn.BatchNorm1d):
        def forward(self, x):
            self.last_input_mean = x.mean()  # a new attribute, set during the forward
            self.running_var = self.running_var * 1.0 + 1.0  # a buffer rebound to a new tensor
            return super().forward(x)

    model = nn.Sequential(nn.Linear(16, 8, bias=False), Caching(8), nn.ReLU(), nn.Linear(8, 5))
    buffer = model[1].running_var
    found = find_scale_invariant(model, F.cross_entropy, _batch())
    assert found.get("0.weight") == "rows"
    assert model[1].running_var is buffer and torch.equal(buffer, torch.ones(8))
    assert not hasattr(model[1], "last_input_mean")
