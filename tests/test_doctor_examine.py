"""bnlab.doctor.examine on every BN layer type: state left bitwise as found, the measurements
against their references (torch's own cumulative average, Theorem 1's 1/m, the exact Hessian,
torch's num_batches_tracked), the contract's validation and the report's formats."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import bnlab.norms as N
from bnlab.doctor import CODES, Finding, Report, examine
from bnlab.doctor import checks_effective_lr, checks_sharpness, checks_small_batch
from bnlab.doctor.checks_double import UpdateCounter
from bnlab.doctor.context import Checkup
from bnlab.doctor.state import same_state, state_digest
from bnlab.norms.registry import REGISTRY
from bnlab.probes.base import bn_layers

CE = nn.functional.cross_entropy
STAT_SPECS = [name for name in REGISTRY if name not in ("none", "si_bn", "wn")]


def images(dims: int, n: int = 4, batch: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 2) + (5,) * dims
    return [(torch.randn(shape, generator=g), torch.randint(0, 3, (batch,), generator=g))
            for _ in range(n)]


def conv_net(norm: nn.Module, dims: int = 2, conv: nn.Module | None = None) -> nn.Sequential:
    conv_cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    pool = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[dims]
    torch.manual_seed(0)
    layers = [conv if conv is not None else conv_cls(2, 4, 3, padding=1, bias=False)]
    if norm is not None:
        layers.append(norm)
    return nn.Sequential(*layers, nn.ReLU(), nn.Dropout(0.2), pool(1), nn.Flatten(),
                         nn.Linear(4, 3))


def models():
    """(label, model, dims) for every layer type the doctor supports."""
    yield "torch.BatchNorm1d", conv_net(nn.BatchNorm1d(4), 1), 1
    yield "torch.BatchNorm2d", conv_net(nn.BatchNorm2d(4), 2), 2
    yield "torch.BatchNorm3d", conv_net(nn.BatchNorm3d(4), 3), 3
    yield "torch.SyncBatchNorm", conv_net(nn.SyncBatchNorm(4), 2), 2
    for spec in STAT_SPECS:
        yield f"bnlab.{spec}", conv_net(N.create(spec, 4)), 2
    for spec in ("si_bn", "wn"):
        yield f"bnlab.{spec}", conv_net(None, 2, N.normalized(nn.Conv2d(2, 4, 3, padding=1),
                                                               spec)), 2


def trained_step(model, batches, optimizer):
    """One real training step, so the optimizer has state and the parameters have .grad."""
    N.set_progress(model, lr=optimizer.param_groups[0]["lr"], epoch=2, epochs=3)
    model.train()
    optimizer.zero_grad()
    CE(model(batches[0][0]), batches[0][1]).backward()
    optimizer.step()
    CE(model(batches[1][0]), batches[1][1]).backward()  # leave a .grad behind as well


@pytest.mark.parametrize("label,model,dims", list(models()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_state_bitwise_as_found_on_every_layer_type(label, model, dims):
    batches = images(dims)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    trained_step(model, batches, optimizer)
    model.eval() if "3d" in label else model.train()  # either mode is kept
    torch.manual_seed(1234)
    before = state_digest(model, optimizer)
    report = examine(model, CE, batches, optimizer=optimizer, accumulation_steps=2)
    assert same_state(before, state_digest(model, optimizer)) == []
    # accumulation warns exactly when a BN-family layer normalizes with batch statistics
    assert ("micro-batch-statistics" in report.codes("warn")) == bool(bn_layers(model))
    # the global RNG continues exactly as if examine had not run
    expected = state_digest(model, optimizer)["rng/cpu"]
    assert torch.equal(torch.get_rng_state(), expected)


def test_timm_norm_act_layer_is_examined_and_kept():
    from tests.vision_shim import import_or_skip

    timm = import_or_skip("timm")
    layer = timm.layers.BatchNormAct2d(4, act_layer=nn.Tanh)
    model = conv_net(layer, 2)
    with torch.no_grad():
        layer.bias.fill_(5.0)  # β swamps the tanh inside the norm-act layer
    batches = images(2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trained_step(model, batches, optimizer)
    N.recollect_running_stats(model, [x for x, _ in batches])
    before = state_digest(model, optimizer)
    report = examine(model, CE, batches, optimizer=optimizer)
    assert same_state(before, state_digest(model, optimizer)) == []
    assert report.measurements["beta_share"]["1"]["activation"].startswith("before Tanh (inside")
    assert "beta-swamping" in report.codes("warn")


def test_population_statistics_are_torchs_cumulative_average():
    """The population the stale check compares with is what torch's own BN collects with
    momentum=None over the same batches (Ioffe & Szegedy's Alg. 2)."""
    model = conv_net(nn.BatchNorm2d(4))
    batches = images(2, n=5)
    report = examine(model, CE, batches, checks=["stale-running-stats"])
    reference = conv_net(nn.BatchNorm2d(4, momentum=None)).train()
    with torch.no_grad():
        for x, _ in batches:
            reference(x)
    got = report.measurements["running_vs_population"]["1"]
    torch.testing.assert_close(torch.tensor(got["population_mean"], dtype=torch.float32),
                               reference[1].running_mean)
    torch.testing.assert_close(torch.tensor(got["population_var"], dtype=torch.float32),
                               reference[1].running_var)


def test_batch_noise_matches_theorem_1_on_gaussian_inputs():
    """iid Gaussian inputs straight into BN: E[ξ_μ²] ≈ 1/m and Var ξ_σ ≈ 2(m−1)/m² (Yong et al.
    Theorem 1), m = 4 values per channel."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 64, generator=g) * 3 + 1, torch.zeros(4, dtype=torch.long))
               for _ in range(400)]
    model = nn.Sequential(nn.BatchNorm1d(64), nn.Linear(64, 2))
    checkup = Checkup(model, CE, batches)
    noise = checks_small_batch.noise_by_layer(checkup)["0"]
    assert noise["m"] == 4
    assert noise["xi_mu_power"] == pytest.approx(1 / 4, rel=0.05)
    assert noise["xi_sigma_mean"] == pytest.approx(3 / 4, rel=0.03)
    assert noise["xi_sigma_var"] == pytest.approx(2 * 3 / 16, rel=0.1)
    report = examine(model, CE, batches, max_batches=400)
    assert "small-batch" in report.codes("warn")


def test_sharpness_is_the_exact_top_eigenvalue_of_the_train_mode_hessian():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.BatchNorm1d(4), nn.Tanh(),
                          nn.Linear(4, 2)).double()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, generator=g, dtype=torch.float64),
                torch.randint(0, 2, (8,), generator=g))]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    report = examine(model, CE, batches, optimizer=optimizer, checks=["sharpness"],
                     hessian_iters=60)
    _, top, threshold = report.measurements["sharpness"][0]
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(flat):
        params, i = {}, 0
        for name, shape in zip(names, shapes):
            k = shape.numel()
            params[name] = flat[i:i + k].view(shape)
            i += k
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        out = torch.func.functional_call(model, (params, buffers), (batches[0][0],))
        return CE(out, batches[0][1])

    model.train()
    exact = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, flat0))[-1]
    assert top == pytest.approx(float(exact), rel=1e-6)
    assert threshold == pytest.approx(2 / 0.3)


@pytest.mark.parametrize("make,expected", [
    (lambda p: torch.optim.SGD(p, lr=0.1), 2 / 0.1),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 3.8 / 0.1),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), 3.8 / (0.1 * 2.8)),
    (lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.999)), 3.8 / (0.1 * 0.01)),
])
def test_stability_thresholds(make, expected):
    threshold, what, _ = checks_sharpness.threshold_for(make([nn.Parameter(torch.zeros(1))]))
    assert threshold == pytest.approx(expected)
    assert what


class Block(nn.Module):
    """A user's block: conv and BN as attributes, not a Sequential."""

    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)
        self.checkpointed = checkpointed

    def inner(self, x):
        return torch.relu(self.bn1(self.conv1(x)))

    def forward(self, x):
        if self.checkpointed and self.training:
            h = checkpoint(self.inner, x, use_reentrant=False)
        else:
            h = self.inner(x)
        return self.head(h.mean((2, 3)))


def test_update_counter_agrees_with_num_batches_tracked_under_checkpointing():
    torch.manual_seed(0)
    model = Block(checkpointed=True)
    x, y = images(2)[0]
    with UpdateCounter(model) as counter:
        CE(model(x), y).backward()
    assert counter.forwards == 1
    assert counter.updates["bn1"] == int(model.bn1.num_batches_tracked) == 2
    report = examine(model, CE, images(2))
    assert "double-update" in report.codes("warn")
    assert not Block().train() or "double-update" not in examine(Block(), CE, images(2)).codes()


def test_scale_invariant_weights_found_by_dataflow_outside_sequential():
    torch.manual_seed(0)
    model = Block()
    checkup = Checkup(model, CE, images(2))
    assert checks_effective_lr.invariant_weights(checkup) == ["conv1.weight"]
    with torch.no_grad():
        model.conv1.weight.mul_(1e3)
    report = examine(model, CE, images(2), checks=["effective-lr"])
    assert report.findings[0].layers == ("conv1.weight",)
    assert report.findings[0].value < report.findings[0].threshold


def test_finding_and_report_contract(tmp_path):
    assert CODES == ("stale-running-stats", "small-batch", "beta-swamping", "sharpness",
                     "effective-lr", "micro-batch-statistics", "double-update")
    with pytest.raises(ValueError, match="small-batch"):
        Finding("tiny-batch", "warn", (), 1, 1, "", "", "")
    with pytest.raises(ValueError, match="warn, info"):
        Finding("small-batch", "error", (), 1, 1, "", "", "")
    info = Finding("sharpness", "info", (), 1.0, float("inf"), "w", "p", "r")
    mild = Finding("small-batch", "warn", ("a",), 0.2, 0.1, "w", "p", "r")
    strong = Finding("beta-swamping", "warn", ("b",), 0.001, 0.1, "w", "p", "r")
    report = Report([info, mild, strong])
    assert [f.code for f in report.findings] == ["beta-swamping", "small-batch", "sharpness"]
    assert str(report).splitlines()[0].startswith("WARN beta-swamping [b]")
    assert str(Report([info])).endswith("no warnings")
    data = json.loads(report.to_json(tmp_path / "r.json").read_text())
    assert data["findings"][2]["threshold"] == "inf"
    assert data["findings"][0]["layers"] == ["b"]


def test_bad_arguments_name_the_choices():
    model = conv_net(nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="double-update"):
        examine(model, CE, images(2), checks=["ghost"])
    with pytest.raises(ValueError, match="accumulation_steps"):
        examine(model, CE, images(2), accumulation_steps=0)
    with pytest.raises(ValueError, match="empty"):
        examine(model, CE, [])
    with pytest.raises(ValueError, match="pairs"):
        examine(model, CE, [torch.randn(4, 2, 5, 5)])


def test_beta_swamping_seen_through_dropout_and_not_before_relu():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))
               for _ in range(4)]
    model = nn.Sequential(nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6), nn.Dropout(0.1),
                          nn.Sigmoid(), nn.Linear(6, 3))
    with torch.no_grad():
        model[1].bias.fill_(-6.0)
    report = examine(model, CE, batches, checks=["beta-swamping"])
    # share var/(var + β²) with var = γ² = 1 (train mode): 1/37
    assert report.findings[0].value == pytest.approx(1 / 37, rel=0.05)
    model[3] = nn.ReLU()  # not saturating: nothing to report
    assert examine(model, CE, batches, checks=["beta-swamping"]).findings == []


def test_a_frozen_bn_is_neither_double_updated_nor_a_micro_batch():
    """A BN the user keeps in eval mode inside a training model (fine-tuning with frozen BN)
    normalizes with its running statistics: checkpointing cannot update it twice and accumulation
    does not change what it computes."""
    torch.manual_seed(0)
    model = Block(checkpointed=True).train()
    model.bn1.eval()
    report = examine(model, CE, images(2), accumulation_steps=4)
    assert report.codes("warn") == []
    assert report.measurements["updates_per_forward"] == {"bn1": 0.0}
    assert model.training and not model.bn1.training  # the modes as found
    model.bn1.train()
    assert {"double-update", "micro-batch-statistics"} <= set(
        examine(model, CE, images(2), accumulation_steps=4).codes("warn"))


def test_cbn_share_is_pengs_divisor_ratio():
    """For CBN the output's share var(y)/(var(y) + mean(y)²) is Peng et al.'s var_B/(var_B + β²)
    (Eq. 5), computed here in float64 from the layer's input."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 4, generator=g) * 2, torch.randint(0, 3, (32,), generator=g))
               for _ in range(4)]
    cbn = N.create("cbn", 6)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), cbn, nn.ReLU(), nn.Linear(6, 3))
    N.set_progress(model, lr=0.1, epoch=1, epochs=2)
    with torch.no_grad():
        cbn.bias.copy_(torch.linspace(3.0, 9.0, 6))
        x = model[0](batches[0][0]).double()
    var = x.var(0, unbiased=False)
    peng = var / (var + cbn.bias.detach().double() ** 2)
    report = examine(model, CE, batches, checks=["beta-swamping"])
    assert report.measurements["beta_share"]["1"]["share"] == pytest.approx(
        float(peng.median()), rel=1e-4)
    assert report.codes("warn") == ["beta-swamping"]


def test_a_data_loaders_ragged_last_batch_is_skipped():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(41, 4, generator=g), torch.randint(0, 3, (41,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6), nn.ReLU(),
                          nn.Linear(6, 3))
    report = examine(model, CE, loader)  # the last batch holds 1 sample
    assert report.context["batches"] == 5 and report.context["batch_size"] == 8
