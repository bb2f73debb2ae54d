"""``recollect_running_stats`` and ``bnlab.norms.update_bn`` take every loader batch that torch's
``torch.optim.swa_utils.update_bn`` takes — tensors, ``(x, y)`` tuples, lists — and dicts (the
``"input"`` entry, or ``input=`` a key), a position, or a function picking the input; each form is
checked against torch's ``update_bn`` on torch's own BatchNorm (the reference users hold a
drop-in to). An ``(x, y)`` loader used to crash inside the first convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import update_bn as torch_update_bn

import bnlab.norms as N


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(8, 3, 5, 5, generator=g) * 2 + 1 for _ in range(4)]


def _net(norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), norm, nn.ReLU(), nn.Conv2d(4, 2, 1))


def _targets() -> list[torch.Tensor]:
    return [torch.zeros(8, dtype=torch.long) for _ in range(4)]


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    model = _net(nn.BatchNorm2d(4))
    torch_update_bn(_inputs(), model)
    return model[1].state_dict()


FORMS = {
    "tensors": (lambda: _inputs(), {}),
    "tuples": (lambda: list(zip(_inputs(), _targets())), {}),
    "lists": (lambda: [[x, y] for x, y in zip(_inputs(), _targets())], {}),
    "dicts": (lambda: [{"input": x, "label": y} for x, y in zip(_inputs(), _targets())], {}),
    "dicts by key": (lambda: [{"image": x, "label": y} for x, y in zip(_inputs(), _targets())],
                     {"input": "image"}),
    "position": (lambda: [(y, x) for x, y in zip(_inputs(), _targets())], {"input": 1}),
    "function": (lambda: [{"sample": {"pixels": x}} for x in _inputs()],
                 {"input": lambda batch: batch["sample"]["pixels"]}),
    "generator": (lambda: ((x, y) for x, y in zip(_inputs(), _targets())), {}),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("layer", ["torch", "bn"])
def test_every_loader_form_gives_torch_update_bn(form, layer, reference):
    make, kwargs = FORMS[form]
    norm = nn.BatchNorm2d(4) if layer == "torch" else N.create("bn", 4)
    model = _net(norm)
    N.recollect_running_stats(model, make(), **kwargs)
    for name, value in reference.items():
        torch.testing.assert_close(model[1].state_dict()[name], value, msg=name, rtol=0, atol=1e-6)
    other = _net(nn.BatchNorm2d(4) if layer == "torch" else N.create("bn", 4))
    N.update_bn(make(), other, device="cpu", **kwargs)
    for name, value in reference.items():
        torch.testing.assert_close(other[1].state_dict()[name], value, msg=name, rtol=0, atol=1e-6)


def test_torch_update_bn_accepts_the_tuple_loader_too(reference):
    """The baseline: torch's own tool takes ``(x, y)`` batches, so the drop-in must."""
    model = _net(nn.BatchNorm2d(4))
    torch_update_bn(list(zip(_inputs(), _targets())), model)
    torch.testing.assert_close(model[1].running_var, reference["running_var"])


@pytest.mark.parametrize("batches, kwargs, match", [
    ([{"image": torch.zeros(2, 3, 5, 5)}], {}, r"'input' entry .*\['image'\].*input="),
    ([{"image": torch.zeros(2, 3, 5, 5)}], {"input": "img"}, r"input='img'.*\['image'\]"),
    ([torch.zeros(2, 3, 5, 5)], {"input": 1}, r"position in a tuple/list.*Tensor"),
    ([()], {}, r"empty tuple/list"),
    ([torch.zeros(2, 3, 5, 5)], {"input": 1.5}, r"None, a dict key \(str\), a position"),
    ([], {}, r"batches is empty"),
])
def test_unusable_batches_are_refused_by_name(batches, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        N.recollect_running_stats(_net(N.create("bn", 4)), batches, **kwargs)


def test_mode_and_momentum_restored_after_a_failing_batch():
    model = _net(N.create("bn(momentum=0.3)", 4)).eval()
    with pytest.raises(ValueError):
        N.recollect_running_stats(model, [torch.zeros(2, 3, 5, 5), {"x": 1}])
    assert model[1].momentum == 0.3 and not any(m.training for m in model.modules())


def test_update_bn_without_norm_layers_does_nothing_like_torch():
    model = nn.Sequential(nn.Linear(3, 2))
    N.update_bn([torch.zeros(2, 3)], model)  # torch's returns without running a batch
    with pytest.raises(ValueError, match="no layer with running statistics"):
        N.recollect_running_stats(model, [torch.zeros(2, 3)])
