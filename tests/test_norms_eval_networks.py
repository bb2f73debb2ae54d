"""Eval paths that hold in real networks.

Every registered layer trains resnet20 (sigmoid), Santurkar's VGG (configuration A; ReLU and tanh),
Luo et al.'s VGG-style CNN (ReLU and tanh) and the MLP (sigmoid) — the project's own builders, tiny
widths — on the 8×8 digits that ship with bnlab: 72 steps of the issue's recipe (SGD, momentum 0.9,
weight decay 5e-4), 36 at lr 0.05 and a settling phase of 36 at lr/10 (``placement="pre_linear"``,
Peng's placement; si_bn and wn wrap the layer they normalize). Then the test accuracy of the model
in eval mode (running statistics) must be within 3 points of the same model's accuracy in train mode
(batch statistics, on a copy: the buffers move; noisy_bn's training noise switched off in that copy,
since its eval is plain BN). The reference is each layer's own training normalization.

Why the settling phase: with 12 steps at lr/10 (the issue's 4-epoch recipe) torch's own BatchNorm2d
misses too — VGG-16 at 1/16 width on 16×16 digits by 9.5 points (eval 0.741 against 0.836),
Santurkar's VGG at 1/16 by 4.5, resnet20 with BN before the sigmoid (si_bn's place) 0.298 against
0.407 — while the final network's exact population statistics (a cumulative average over the
training set, the same weights) give batch-statistics accuracy within 2 points in every such case,
si_bn's included (0.334 against 0.323). So those misses were BN's EMA (momentum 0.1) lagging
weights that still move, not an eval path. After 36 steps at lr/10 the EMA keeps 0.9^36 = 2 % of
what it held when the lr fell.

Before the fix Complete BN's eval accuracy fell to chance in resnet20 (``cbn(rho=2)``: 0.097 against
0.574 in train mode at the 4-epoch recipe; ``bnlab train`` in the issue: 0.111 against 0.777): its
running statistics were BN's EMA started at (0, 1) and lagging 10 batches, and CBN — β inside the
normalized quantity — turns any error of its divisor into an error of the next layer's centre
(docs/readme/norms.md, "CBN inference"). The settled recipe hides that (the old code: 0.618 against
0.610), so :func:`test_cbn_eval_holds_after_a_short_run` keeps the 4-epoch recipe for CBN.

Left as measured: combinations that cannot learn (``CANNOT_LEARN``, skipped with the numbers), and
``KNOWN`` misses that belong to the method — noisy_bn's later layers keep statistics of noisy inputs
that eval never sees (its inference path is :func:`bnlab.norms.recollect_running_stats`, tested
below), and one si_bn channel whose variance (5e-4) is as small as what remains of running_var's
start value 1 after 72 steps.

Cost: 92 trainings, 84 run, and 4 more below (about 2 min 30 s of CPU on one core, most of it
resnet20).
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

# Every registered layer with its defaults (cbn with Peng's ρ = 2), plus CBN's AMAT-off and ρ = 1
# arms.
DEFAULTS = {"cbn": "cbn(rho=2)"}
SPECS = [DEFAULTS.get(name, name) for name in sorted(REGISTRY)] + ["cbn(rho=2, amat=false)", "cbn"]
NETWORKS = {  # name: (model, activation, options); all on 8×8 digits
    "resnet20-sigmoid": ("resnet20", "sigmoid", {"width": 0.25}),
    "luo_cnn-relu": ("luo_cnn", "relu", {"width": 0.125}),
    "luo_cnn-tanh": ("luo_cnn", "tanh", {"width": 0.125}),
    # Santurkar's VGG (configuration A, 8 conv + 3 fc) at 1/8 width, He init: its smoke entries' net
    "vgg_santurkar-relu": ("vgg_santurkar", "relu", {"width": 0.125, "init": "kaiming"}),
    "vgg_santurkar-tanh": ("vgg_santurkar", "tanh", {"width": 0.125, "init": "kaiming"}),
    "mlp-sigmoid": ("mlp", "sigmoid", {"width": 32, "depth": 2}),
}
BATCH, TRAIN_SAMPLES, LR = 64, 768, 0.05  # 12 steps an epoch
# lr factor per epoch: 36 steps at LR, then a settling phase of 36 at LR/10, after which BN's EMA
# (momentum 0.1) keeps 0.9^36 = 2 % of what it held when the lr fell (module docstring)
SCHEDULE = (1.0, 1.0, 1.0, 0.1, 0.1, 0.1)
# var_only_bn does not remove the mean, so its output keeps the input's mean/σ: at lr 0.05 the tanh
# CNN diverges (loss 8-14 at lr 0.2); at lr 0.005 and 0.02 it learns (test accuracy 0.92, 0.86).
LR_FOR = {("var_only_bn", "luo_cnn-tanh"): 0.01}
# Combinations that cannot learn, so that eval and batch statistics are both at chance (0.100 at
# lr 0.01, 0.05, 0.2 and 1.0, 72 steps): in resnet20 with 20 sigmoids (σ' <= 1/4) and no layer that
# normalizes both moments, the first conv's gradient is 1e-8 of its weight at initialization (none
# 2.9e-8, wn 6.2e-9, mean_only_bn 4.0e-8, var_only_bn 9.5e-8; bn 0.10, si_bn 2.3e-3): vanishing
# gradients (Glorot & Bengio 2010), not an eval path. var_only_bn in the sigmoid MLP divides the
# sigmoids' outputs (mean 0.5) by their small σ without centring: chance at lr 0.005, 0.02 and 0.2;
# in the 11-layer VGG it is at chance at lr 0.01, 0.05 and 0.2 with either activation (the mean it
# keeps compounds over the layers). The VGG with ReLU and no normalization reaches 0.31 at lr 0.05,
# 0.21 at 0.01, 0.26 at 0.2: too close to the bar of 0.3 to be a stable check of nothing.
# wn and none keep no statistics: their eval is their training forward.
CANNOT_LEARN = {
    ("none", "resnet20-sigmoid"): "vanishing gradients: 20 sigmoids, no normalization",
    ("wn", "resnet20-sigmoid"): "vanishing gradients: 20 sigmoids, WN fixes no moment",
    ("mean_only_bn", "resnet20-sigmoid"): "vanishing gradients: 20 sigmoids, only the mean removed",
    ("var_only_bn", "resnet20-sigmoid"): "vanishing gradients: 20 sigmoids, the mean kept",
    ("var_only_bn", "mlp-sigmoid"): "sigmoid outputs divided by σ without centring saturate",
    ("var_only_bn", "vgg_santurkar-relu"): "chance at lr 0.01, 0.05, 0.2: the kept mean compounds",
    ("var_only_bn", "vgg_santurkar-tanh"): "chance at lr 0.01, 0.05, 0.2: the kept mean compounds",
    ("none", "vgg_santurkar-relu"): "no statistics (eval = training forward); reaches 0.31 at most",
    # GroupNorm's 32 groups clipped to the 1/8-width VGG's 8-32 channels: one channel per group,
    # and its last convs see 1×1 maps, so each group normalizes a single value to 0 (0.097, 0.100)
    ("gn", "vgg_santurkar-relu"): "one value per group at 1×1 maps: every output normalized to 0",
    ("gn", "vgg_santurkar-tanh"): "one value per group at 1×1 maps: every output normalized to 0",
}
# Measured misses that are a property of the method, not of bnlab's eval path (they run as xfail):
# noisy_bn's own running statistics are of the clean batch (BN's output a, before Santurkar's Alg. 1
# adds s·a + m), but the NEXT layers' running statistics are collected from noisy inputs while eval
# has no noise. Population statistics of the final network with the noise off give 0.978 against
# batch statistics 0.986 in luo_cnn-relu; with the noise on 0.869, as eval (0.897).
NOISE = "later layers' running statistics saw the noise"
KNOWN = {
    ("noisy_bn", "luo_cnn-relu"): f"eval 0.897 against 0.986: {NOISE}",
    ("noisy_bn", "resnet20-sigmoid"): f"eval 0.641 against 0.604: {NOISE}",
    ("noisy_bn", "vgg_santurkar-relu"): f"eval 0.435 against 0.905: {NOISE}",
    ("noisy_bn", "vgg_santurkar-tanh"): f"eval 0.730 against 0.769: {NOISE}",
    # One channel (features.7, the first conv on 1×1 maps) ends with batch variance 5e-4; the
    # running variance starts at 1 as torch's does, and 0.9^72 = 5e-4 of that start is still in it
    # after 72 steps: running_var 0.00099, twice the channel's. Population statistics: 0.933 against
    # 0.939 (torch's BatchNorm2d in si_bn's place: 0.928 against 0.925, no such channel).
    ("si_bn", "vgg_santurkar-tanh"): "eval 0.900 against 0.939: running_var's start value 1 "
                                     "still 5e-4 of it, a channel's variance is 5e-4",
}


def cases():
    for spec in SPECS:
        for network in NETWORKS:
            reason = KNOWN.get((spec, network))
            marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
            if (spec, network) in CANNOT_LEARN:
                marks = [pytest.mark.skip(reason=CANNOT_LEARN[spec, network])]
            yield pytest.param(spec, network, marks=marks, id=f"{spec}-{network}")


@pytest.fixture(scope="module")
def digits():
    return D.load("digits", seed=0)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        predicted = torch.cat([model(x[i:i + 128]).argmax(1) for i in range(0, len(y), 128)])
    return float(predicted.eq(y).float().mean())


def train(spec: str, network: str, data, schedule: tuple = SCHEDULE) -> nn.Module:
    name, activation, options = NETWORKS[network]
    wrapper = lookup(spec)[0].kind == "wrapper"  # si_bn, wn normalize their own layer's output
    placement = "pre_activation" if wrapper else "pre_linear"
    model = M.create(name, norm=spec, activation=activation, placement=placement,
                     input_shape=data.input_shape, num_classes=10, seed=0, **options)
    base_lr = LR_FOR.get((spec, network), LR)
    opt = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    x, y = data.x_train[:TRAIN_SAMPLES], data.y_train[:TRAIN_SAMPLES]
    model.train()
    for epoch, factor in enumerate(schedule):
        lr = base_lr * factor  # AMAT's η = 0.5, then 0.95: moving statistics matter
        for group in opt.param_groups:
            group["lr"] = lr
        N.set_progress(model, lr=lr, epoch=epoch + 1, epochs=len(schedule))
        for xb, yb in batches(x, y, BATCH, generator=g):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model


def batch_statistics_copy(model: nn.Module) -> nn.Module:
    """A train-mode copy (batch statistics), noisy_bn's noise off (s = 1, m = 0 in Santurkar's
    Alg. 1)."""
    reference = copy.deepcopy(model).train()
    for module in reference.modules():
        if isinstance(module, N.NoisyBatchNorm):
            module.noise = False
    return reference


@pytest.mark.parametrize("spec, network", list(cases()))
def test_eval_accuracy_is_within_3_points_of_batch_statistics(spec, network, digits):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. wn's zero-padding note; the accuracies are the test
        model = train(spec, network, digits)
    batch_stats = accuracy(batch_statistics_copy(model), digits.x_test, digits.y_test)
    eval_mode = accuracy(model.eval(), digits.x_test, digits.y_test)
    # it learned: the comparison means something
    assert batch_stats > 0.3, (spec, network, batch_stats)
    assert abs(eval_mode - batch_stats) <= 0.03, (spec, network, eval_mode, batch_stats)


# CBN's eval failure at the recipe that showed it: 48 steps, only 12 of them at lr/10. Before
# the fix: eval 0.097 against 0.574 (the running statistics' start values and lag; the settled
# recipe above hides them: the old code passes there, 0.618 against 0.610).
SHORT_SCHEDULE = (1.0, 1.0, 1.0, 0.1)


def test_cbn_eval_holds_after_a_short_run(digits):
    model = train("cbn(rho=2)", "resnet20-sigmoid", digits, SHORT_SCHEDULE)
    batch_stats = accuracy(batch_statistics_copy(model), digits.x_test, digits.y_test)
    eval_mode = accuracy(model.eval(), digits.x_test, digits.y_test)
    assert batch_stats > 0.3, batch_stats
    assert abs(eval_mode - batch_stats) <= 0.03, (eval_mode, batch_stats)


def training_inputs(data) -> list[torch.Tensor]:
    x = data.x_train[:TRAIN_SAMPLES]
    return [x[i:i + BATCH] for i in range(0, len(x), BATCH)]


# noisy_bn's misses above, with the statistics recollected from the training inputs, noise off
# (Ioffe & Szegedy's Alg. 2 population statistics of the final network): eval matches again. Not
# resnet20, the costliest (recollected there: 0.602 against 0.604).
@pytest.mark.parametrize("network", ["luo_cnn-relu", "vgg_santurkar-relu", "vgg_santurkar-tanh"])
def test_noisy_bn_eval_holds_with_recollected_statistics(network, digits):
    model = train("noisy_bn", network, digits)
    batch_stats = accuracy(batch_statistics_copy(model), digits.x_test, digits.y_test)
    generator_state = [m.generator.get_state() for _, m in N.stochastic_layers(model)]
    N.recollect_running_stats(model.eval(), training_inputs(digits))
    assert not model.training  # the mode is restored, and no noise was drawn
    assert all(torch.equal(m.generator.get_state(), state)
               for (_, m), state in zip(N.stochastic_layers(model), generator_state))
    eval_mode = accuracy(model, digits.x_test, digits.y_test)
    assert batch_stats > 0.3, batch_stats
    assert abs(eval_mode - batch_stats) <= 0.03, (eval_mode, batch_stats)


@pytest.mark.parametrize("spec", ["bn", "native_bn", "noisy_bn"])
def test_recollected_statistics_are_algorithm_2s_population_statistics(spec):
    """Ioffe & Szegedy 2015, Alg. 2: E[x] = mean of the batch means, Var[x] = m/(m−1) × mean of the
    batch variances, from a float64 truth; momentum, mode and γ, β are left as they were."""
    gen = torch.Generator().manual_seed(0)
    xs = [3.0 + 2.0 * torch.randn(16, 4, 5, 5, generator=gen) for _ in range(6)]
    layer = N.create(spec, 4)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5, generator=gen)
    weight = layer.weight.detach().clone()
    for x in xs[:3]:  # an EMA from training, to be replaced
        layer(x)
    N.recollect_running_stats(layer.eval(), xs)
    x64 = torch.stack([x.double() for x in xs])  # (batches, n, C, H, W)
    m = 16 * 5 * 5
    mean = x64.mean(dim=(1, 3, 4)).mean(0)
    var = x64.var(dim=(1, 3, 4), unbiased=False).mean(0) * m / (m - 1)
    torch.testing.assert_close(layer.running_mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.running_var.double(), var, rtol=1e-5, atol=1e-5)
    assert layer.momentum == 0.1 and not layer.training and torch.equal(layer.weight, weight)


def _sigmoid_like_batches(count: int, gen: torch.Generator):
    """Inputs like a sigmoid's outputs in resnet20: mean 0.5, standard deviation 0.05 (variance
    0.0025)."""
    return [0.5 + 0.05 * torch.randn(64, 3, generator=gen, dtype=torch.float64)
            for _ in range(count)]


@pytest.mark.parametrize(
    "spec, lr", [("cbn(rho=2, amat=false)", None), ("cbn(rho=2, amat=false)", 0.01),
                 ("cbn(rho=2)", 0.01), ("cbn(rho=2, eta=0.9)", None)])
def test_cbn_inference_statistics_carry_no_trace_of_their_start(spec, lr):
    """20 batches of small-variance inputs, then eval against the float64 truth: the layer
    normalizing by the population mean 0.5 and variance 0.0025. BN's EMA from (0, 1) still holds
    0.9^20 = 12 % of its start value 1 in ``running_var`` (50× the variance), which the old CBN code
    did too."""
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
    # tolerance: the statistics of a 64-sample batch (or ~10 of them) are that far from the
    # population
    torch.testing.assert_close(layer.eval()(x), truth, atol=0.15, rtol=0.0)
