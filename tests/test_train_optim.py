"""Scale-invariance detection, Arora's Lemma 2.4, projected SGD and separate learning rates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnlab.callbacks import Callback
from bnlab.train.callbacks import trainer_of
from bnlab.train import Projection, build_optimizer, find_scale_invariant, resolve_override, run



class FrobeniusNormalized(nn.Module):
    """A linear layer whose weight is divided by its Frobenius norm: invariant as a whole tensor
    only (scaling one row changes the direction of the whole matrix)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in))

    def forward(self, x):
        return x @ (self.weight / self.weight.norm()).T


def bn_mlp(d_in=64, width=32, classes=10, *, bn=True, eps=1e-5):
    layers = [nn.Flatten(), nn.Linear(d_in, width, bias=not bn)]
    layers += [nn.BatchNorm1d(width, eps=eps)] if bn else []
    layers += [nn.Tanh(), nn.Linear(width, width, bias=not bn)]
    layers += [nn.BatchNorm1d(width, eps=eps)] if bn else []
    layers += [nn.Tanh(), nn.Linear(width, classes)]
    return nn.Sequential(*layers)


def _batch(n=128, d=64, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_detection_finds_bn_weights_per_row_and_leaves_model_untouched():
    torch.manual_seed(0)
    model = bn_mlp()
    model[2].running_mean.fill_(0.25)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = find_scale_invariant(model, F.cross_entropy, _batch())
    # the two weights feeding BN are invariant row by row (Arora Sec. 2.1); the output layer is not
    assert found == {"1.weight": "rows", "4.weight": "rows"}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats, weights intact


def test_detection_without_normalization_finds_nothing_and_tensor_granularity():
    torch.manual_seed(0)
    assert find_scale_invariant(bn_mlp(bn=False), F.cross_entropy, _batch()) == {}
    model = nn.Sequential(FrobeniusNormalized(64, 10))
    assert find_scale_invariant(model, F.cross_entropy, _batch()) == {"0.weight": "tensor"}


def test_override_patterns_and_errors():
    model = bn_mlp()
    assert resolve_override(model, ["*.weight"]) == {
        n: "tensor" for n, p in model.named_parameters() if n.endswith("weight")}
    assert resolve_override(model, ["1.weight:rows"]) == {"1.weight": "rows"}
    with pytest.raises(ValueError, match="matches no parameter; parameters: 1.weight"):
        resolve_override(model, ["conv.weight"])


def test_lemma_2_4_norm_growth_of_scale_invariant_weight():
    """Arora Lemma 2.4: w ⟂ ∇_w F, hence ‖w_{t+1}‖² = ‖w_t‖² + η²‖∇_w F‖² for plain SGD.

    Exact only for BN without ``eps`` (Arora eq. 7 notes that a constant eps breaks invariance);
    with PyTorch's eps=1e-5 the orthogonality residual here is ~1e-7 relative instead of ~1e-16.
    """
    torch.manual_seed(1)
    model = bn_mlp(eps=1e-30).double()  # torch refuses eps=0; 1e-30 is 0 next to variances ~1
    xb, yb = _batch()
    xb = xb.double()
    w = model[1].weight
    eta = 0.7
    opt = build_optimizer(model, {"1.weight": "rows"}, lr=0.01, lr_scale_invariant=eta,
                          momentum=0.0, weight_decay=0.0)
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    grad = w.grad.detach().clone()
    w0 = w.detach().clone()
    # per row (each row is scale-invariant): w_k · g_k = 0 to rounding
    assert (w0 * grad).sum(dim=1).abs().max() <= 1e-12 * w0.norm() * grad.norm()
    opt.step()
    predicted = w0.norm() ** 2 + eta**2 * grad.norm() ** 2
    assert w.detach().norm() ** 2 == pytest.approx(predicted.item(), rel=1e-12)
    assert w.detach().norm() > w0.norm()


def test_projection_restores_initial_norms():
    torch.manual_seed(2)
    model = bn_mlp()
    proj = Projection(model, {"1.weight": "rows", "4.weight": "tensor"})
    r_rows = model[1].weight.detach().double().norm(dim=1)
    r_tensor = model[4].weight.detach().double().norm()
    with torch.no_grad():
        model[1].weight.mul_(torch.linspace(0.5, 3.0, 32)[:, None])
        model[4].weight.mul_(7.0)
    proj.project()
    assert torch.allclose(model[1].weight.detach().double().norm(dim=1), r_rows, rtol=1e-6, atol=0)
    assert model[4].weight.detach().double().norm().item() == pytest.approx(
        r_tensor.item(), rel=1e-6)


class NormTracker(Callback):
    """Callback: the largest relative change of each scale-invariant weight's norm over a run."""

    def __init__(self):
        self.initial = {}
        self.max_rel_change = {}

    def on_train_start(self, loop):
        params = dict(loop.model.named_parameters())
        self.initial = {n: params[n].detach().double().norm().item()
                        for n in trainer_of(loop).scale_invariant}
        self.max_rel_change = dict.fromkeys(self.initial, 0.0)

    def on_train_batch_end(self, loop):
        params = dict(loop.model.named_parameters())
        for n, r0 in self.initial.items():
            change = abs(params[n].detach().double().norm().item() - r0) / r0
            self.max_rel_change[n] = max(self.max_rel_change[n], change)
            loop.log(f"norm/{n}", params[n].detach().norm())


def _digits_bn(shape, classes):
    d = 1
    for s in shape:
        d *= s
    return bn_mlp(d_in=d, width=32, classes=classes)


@pytest.mark.parametrize("optimizer", ["psgd", "sgd"])
def test_projected_sgd_keeps_norms_fixed_plain_sgd_grows_them(tmp_path, optimizer):
    """Arora App. D: PSGD holds every scale-invariant norm (to 1e-6); SGD grows it (Lemma 2.4)."""
    tracker = NormTracker()
    record = run(
        dict(model="test_bn_mlp", data="digits", steps=40, lr=0.1, lr_scale_invariant=2.0,
             batch_size=64, optimizer=optimizer, runs_dir=str(tmp_path)),
        callbacks=[tracker],
        model_factory=_digits_bn,
        progress=False,
    )
    assert record.status == "finished"
    assert sorted(record.scale_invariant) == ["1.weight", "4.weight"]
    changes = tracker.max_rel_change
    if optimizer == "psgd":
        assert max(changes.values()) <= 1e-6, changes
    else:
        # with lr 2 on unit-scale weights, growth is far beyond rounding
        assert min(changes.values()) > 1e-2, changes


def test_separate_learning_rates_reach_their_groups(tmp_path):
    """Arora eq. 4 / D.1: η_w for scale-invariant weights, η_g for the rest."""
    seen = []

    class Spy(Callback):
        def on_before_optimizer_step(self, loop):
            seen.append({g["group"]: g["lr"] for g in loop.optimizer.param_groups})

    run(dict(model="test_bn_mlp", data="digits", steps=2, lr=0.05, lr_scale_invariant=3.0,
             schedule="exp:0.5", batch_size=128, runs_dir=str(tmp_path)),
        callbacks=[Spy()], model_factory=_digits_bn, progress=False)
    assert seen[0] == {"scale_invariant": 3.0, "scale_variant": 0.05}
    assert seen[1] == {"scale_invariant": 1.5, "scale_variant": 0.025}  # schedule scales both


def relu_bn_mlp(d_in=64, width=32, classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(d_in, width, bias=False), nn.BatchNorm1d(width),
                         nn.ReLU(), nn.Linear(width, width, bias=False), nn.BatchNorm1d(width),
                         nn.ReLU(), nn.Linear(width, classes))


def test_joint_gamma_beta_groups_found_only_before_a_normalized_layer():
    """Arora App. D: with ReLU, each BN's (γ, β) is scale-invariant as one vector, except the last
    BN's."""
    torch.manual_seed(0)
    model = relu_bn_mlp()
    with torch.no_grad():  # non-trivial γ, β so that a wrong scaling would show
        for bn in (model[2], model[5]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    found = find_scale_invariant(model, F.cross_entropy, _batch())
    assert found == {"1.weight": "rows", "4.weight": "rows", "2.weight": "joint:2",
                     "2.bias": "joint:2"}
    # the function really is invariant to (γ, β) → c(γ, β) for the first BN and not for the last one
    x, y = _batch()
    model.train()
    loss = F.cross_entropy(model(x), y)
    with torch.no_grad():
        model[2].weight.mul_(3), model[2].bias.mul_(3)
    assert F.cross_entropy(model(x), y).item() == pytest.approx(loss.item(), rel=1e-4)


def test_joint_group_projection_and_learning_rate():
    torch.manual_seed(3)
    model = relu_bn_mlp()
    invariant = {"2.weight": "joint:2", "2.bias": "joint:2"}
    with torch.no_grad():
        model[2].bias.fill_(0.5)
    radius = torch.sqrt(model[2].weight.double().norm() ** 2 + model[2].bias.double().norm() ** 2)
    proj = Projection(model, invariant)
    with torch.no_grad():
        model[2].weight.mul_(4.0)
        model[2].bias.mul_(0.5)
    proj.project()
    after = torch.sqrt(model[2].weight.double().norm() ** 2 + model[2].bias.double().norm() ** 2)
    assert after.item() == pytest.approx(radius.item(), rel=1e-6)  # float32 parameters
    # one common factor for the whole group: the direction (γ·4 : β·0.5 from γ = 1, β = 0.5) is kept
    ratio = (model[2].weight.double().norm() / model[2].bias.double().norm()).item()
    assert ratio == pytest.approx(16.0, rel=1e-6)
    opt = build_optimizer(model, invariant, lr=0.1, lr_scale_invariant=5.0, momentum=0.0,
                          weight_decay=0.0)
    by_group = {g["group"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    assert {id(model[2].weight), id(model[2].bias)} <= by_group["scale_invariant"]
    assert resolve_override(model, ["2.*:joint"]) == {"2.weight": "joint:2.*",
                                                      "2.bias": "joint:2.*"}
