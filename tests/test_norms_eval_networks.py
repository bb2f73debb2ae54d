"""Eval paths that hold in real networks (issue 17, item 2).

Every registered layer trains resnet20 (sigmoid), Luo et al.'s VGG-style CNN (ReLU and tanh) and the
MLP (sigmoid) — the project's own builders, tiny widths — on the digits that ship with bnlab, for 48
steps of the issue's recipe (SGD, momentum 0.9, weight decay 5e-4, lr ÷ 10 for the last of 4 epochs;
``placement="pre_linear"``, Peng's placement; si_bn and wn wrap the layer they normalize). Then the test accuracy of the model in eval mode
(running statistics) must be within 3 points of the same model's accuracy in train mode (batch
statistics, on a copy: the buffers move; noisy_bn's training noise switched off in that copy, since
its eval is plain BN). The reference is each layer's own training normalization.

Before the fix Complete BN's eval accuracy fell to chance in resnet20 (``cbn(rho=2)``: 0.097 against
0.574 in train mode here; ``bnlab train`` in the issue: 0.111 against 0.777): its running statistics
were BN's EMA started at (0, 1) and lagging 10 batches, and CBN — β inside the normalized quantity —
turns any error of its divisor into an error of the next layer's centre (docs/readme/norms.md, "CBN
inference"). VGG-16 itself is left out: at 1/16 width on 8×8 digits torch's own BatchNorm misses by
5.6 points (eval 0.663 against 0.719) — a short-run property of BN's EMA, not of bnlab.

Cost: 56 trainings of 48 steps (about 2 minutes on one core, most of it resnet20).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bnlab.data as D
import bnlab.models as M
import bnlab.norms as N
from bnlab.norms.registry import REGISTRY, lookup
from bnlab.data import batches

# Every registered layer with its defaults (cbn with Peng's ρ = 2), plus CBN's AMAT-off and ρ = 1 arms.
DEFAULTS = {"cbn": "cbn(rho=2)"}
SPECS = [DEFAULTS.get(name, name) for name in sorted(REGISTRY)] + ["cbn(rho=2, amat=false)", "cbn"]
NETWORKS = {  # name: (model, activation, options)
    "resnet20-sigmoid": ("resnet20", "sigmoid", {"width": 0.25}),
    "luo_cnn-relu": ("luo_cnn", "relu", {"width": 0.125}),
    "luo_cnn-tanh": ("luo_cnn", "tanh", {"width": 0.125}),
    "mlp-sigmoid": ("mlp", "sigmoid", {"width": 32, "depth": 2}),
}
EPOCHS, BATCH, TRAIN_SAMPLES, LR = 4, 64, 768, 0.05  # 48 steps
# Layers of other owners that miss at this recipe (measured; issue 17 leaves them open): they run and
# are reported as xfail, and turn into passes when fixed.
KNOWN = {
    ("mean_only_bn", "resnet20-sigmoid"): "does not learn at lr 0.05 (chance in both modes)",
    ("var_only_bn", "resnet20-sigmoid"): "does not learn at lr 0.05 (chance in both modes)",
    ("var_only_bn", "luo_cnn-tanh"): "does not learn at lr 0.05 (chance in both modes)",
    ("var_only_bn", "mlp-sigmoid"): "does not learn at lr 0.05 (chance in both modes)",
    ("noisy_bn", "resnet20-sigmoid"): "eval 0.552 against 0.593: BN's EMA lag (its eval is plain BN)",
    ("noisy_bn", "luo_cnn-relu"): "eval 0.939 against 0.986 without the training noise",
    ("lp_bn", "resnet20-sigmoid"): "eval 0.694 against 0.724: its running ℓp scale lags (3.1 points)",
    ("brn", "resnet20-sigmoid"): "eval 0.694 against 0.724: its running σ lags (3.1 points)",
    ("none", "resnet20-sigmoid"): "20 sigmoid layers without normalization do not learn in 48 steps",
    ("wn", "resnet20-sigmoid"): "does not learn at lr 0.05 (chance in both modes)",
    ("si_bn", "resnet20-sigmoid"): "eval 0.170 against 0.323 (BN's EMA, ε‖w‖² smoothing)",
    # CBN without AMAT normalizes each batch by itself; its BN-style EMA (start bias removed) gives 0.524
    # against 0.579, the final network's exact population statistics 0.560 (tests the EMA, not Peng)
    ("cbn(rho=2, amat=false)", "resnet20-sigmoid"): "eval 0.524 against 0.579: EMA of 10 batches",
}


def cases():
    for spec in SPECS:
        for network in NETWORKS:
            reason = KNOWN.get((spec, network))
            marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
            yield pytest.param(spec, network, marks=marks, id=f"{spec}-{network}")


@pytest.fixture(scope="module")
def digits():
    return D.load("digits", seed=0)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        predicted = torch.cat([model(x[i:i + 128]).argmax(1) for i in range(0, len(y), 128)])
    return float(predicted.eq(y).float().mean())


def train(spec: str, network: str, data) -> nn.Module:
    name, activation, options = NETWORKS[network]
    wrapper = lookup(spec)[0].kind == "wrapper"  # si_bn, wn normalize their own layer's output
    placement = "pre_activation" if wrapper else "pre_linear"
    model = M.create(name, norm=spec, activation=activation, placement=placement,
                     input_shape=data.input_shape, num_classes=10, seed=0, **options)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    x, y = data.x_train[:TRAIN_SAMPLES], data.y_train[:TRAIN_SAMPLES]
    model.train()
    for epoch in range(EPOCHS):
        lr = LR if epoch < EPOCHS - 1 else LR / 10  # AMAT's η = 0.5, then 0.95: moving statistics matter
        for group in opt.param_groups:
            group["lr"] = lr
        N.set_progress(model, lr=lr, epoch=epoch + 1, epochs=EPOCHS)
        for xb, yb in batches(x, y, BATCH, generator=g):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model


def batch_statistics_copy(model: nn.Module) -> nn.Module:
    """A train-mode copy (batch statistics), noisy_bn's noise off (s = 1, m = 0 in Santurkar's Alg. 1)."""
    reference = copy.deepcopy(model).train()
    for module in reference.modules():
        if isinstance(module, N.NoisyBatchNorm):
            module.n_mu, module.n_sigma, module.r_mu, module.r_sigma = 0.0, 1.0, 0.0, 0.0
    return reference


@pytest.mark.parametrize("spec, network", list(cases()))
def test_eval_accuracy_is_within_3_points_of_batch_statistics(spec, network, digits):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. wn's zero-padding note; the accuracies are the test
        model = train(spec, network, digits)
    batch_stats = accuracy(batch_statistics_copy(model), digits.x_test, digits.y_test)
    eval_mode = accuracy(model.eval(), digits.x_test, digits.y_test)
    assert batch_stats > 0.3, (spec, network, batch_stats)  # it learned: the comparison means something
    assert abs(eval_mode - batch_stats) <= 0.03, (spec, network, eval_mode, batch_stats)


def _sigmoid_like_batches(count: int, gen: torch.Generator):
    """Inputs like a sigmoid's outputs in resnet20: mean 0.5, standard deviation 0.05 (variance 0.0025)."""
    return [0.5 + 0.05 * torch.randn(64, 3, generator=gen, dtype=torch.float64) for _ in range(count)]


@pytest.mark.parametrize("spec, lr", [("cbn(rho=2, amat=false)", None), ("cbn(rho=2, amat=false)", 0.01),
                                      ("cbn(rho=2)", 0.01), ("cbn(rho=2, eta=0.9)", None)])
def test_cbn_inference_statistics_carry_no_trace_of_their_start(spec, lr):
    """20 batches of small-variance inputs, then eval against the float64 truth: the layer normalizing
    by the population mean 0.5 and variance 0.0025. BN's EMA from (0, 1) still holds 0.9^20 = 12 % of
    its start value 1 in ``running_var`` (50× the variance), which the old CBN code did too."""
    layer = N.create(spec, 3).double()
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([0.0, 0.05, -0.1]))
    if lr is not None:
        N.set_progress(layer, lr=lr)
    for xb in _sigmoid_like_batches(20, torch.Generator().manual_seed(0)):
        layer(xb)
    x = _sigmoid_like_batches(1, torch.Generator().manual_seed(1))[0]
    beta = layer.bias.detach()
    truth = (x - 0.5 + beta) / (layer.rho * torch.sqrt(0.0025 + beta**2 + layer.eps))
    # tolerance: the statistics of a 64-sample batch (or ~10 of them) are that far from the population
    torch.testing.assert_close(layer.eval()(x), truth, atol=0.15, rtol=0.0)
