"""The doctor watching a plain PyTorch loop: each cause that only shows over time, planted in a
real training loop, is named; the healthy loop gets no warning; the watched run is bitwise the run
without the doctor.

References: torch's own ``num_batches_tracked`` (updates per forward under activation
checkpointing), the loop's own count of micro-batches, ‖w‖² read from the model, and the same loop
run without the doctor (weights, buffers and optimizer state bitwise equal).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bnlab.doctor import CODES, Doctor, Report
from bnlab.probes import Lab
from bnlab.probes.cost import ProbeCostWarning

STEPS = 160


class Net(nn.Module):
    """Two Linear→BN→ReLU blocks and a head; ``checkpointed`` runs the first block under
    ``torch.utils.checkpoint`` (its forward runs again in backward)."""

    def __init__(self, checkpointed: bool = False, momentum: float = 0.1) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.block = nn.Sequential(nn.Linear(10, 32, bias=False),
                                   nn.BatchNorm1d(32, momentum=momentum), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(32, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (checkpoint(self.block, x, use_reentrant=False) if self.checkpointed
             else self.block(x))
        return self.head(self.block2(h))


def data(seed: int, offset: float = 0.0) -> tuple[torch.Generator, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 10, generator=g) + offset
    y = (x[:, 0] > offset).long() + (x[:, 1] > offset + 0.5).long()
    return g, x, y


def train(*, seed: int = 0, checkpointed: bool = False, accumulate: int = 1, lr: float = 0.1,
          weight_decay: float = 0.0, momentum: float = 0.1, offset: float = 0.0,
          drop_at: int | None = None, jump: tuple[int, float] | None = None, watch: bool = True,
          **doctor) -> tuple[nn.Module, torch.optim.Optimizer, Doctor | None, list[int]]:
    torch.manual_seed(seed)
    model = Net(checkpointed, momentum)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    g, x_all, y_all = data(seed, offset)
    doc = Doctor(model, F.cross_entropy, opt, **doctor) if watch else None
    tracked = []
    for step in range(1, STEPS + 1):
        if drop_at == step or (jump and jump[0] == step):
            for group in opt.param_groups:
                group["lr"] = group["lr"] * 0.1 if drop_at == step else jump[1]
        opt.zero_grad()
        for _ in range(accumulate):
            i = torch.randint(0, len(x_all), (64,), generator=g)
            x, y = x_all[i], y_all[i]
            (F.cross_entropy(model(x), y) / accumulate).backward()
            if doc:
                doc.after_backward((x, y), step)
        opt.step()
        if doc:
            doc.after_step((x, y), step)
        tracked.append(int(model.block[1].num_batches_tracked))
    return model, opt, doc, tracked


def watched(**kwargs) -> tuple[Doctor, Report, list[int]]:
    _, _, doc, tracked = train(**kwargs)
    assert doc is not None
    return doc, doc.report(examine=False), tracked


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_loop_gets_no_warning(seed):
    doc, report, _ = watched(seed=seed)
    assert report.warnings == [], str(report)
    assert str(report).endswith("no warnings")
    # it did watch: one step in 16, every scale-invariant weight, both BN layers
    assert [s for s, _ in report.measurements["forwards_per_step"]] == list(range(16, STEPS + 1,
                                                                                16))
    assert set(report.measurements["effective_lr"]) == {"block.0.weight", "block2.0.weight"}
    assert set(report.measurements["running_lag"]) == {"block.1", "block2.1"}
    assert report.measurements["updates_per_forward"] == {"block.1": 1.0, "block2.1": 1.0}


def test_the_full_report_of_a_healthy_loop_has_no_warning_and_the_seven_codes_only():
    _, _, doc, _ = train(seed=0)
    report = doc.report()  # with the checkup (bnlab.doctor.examine) on the last batches
    assert report.warnings == [], str(report)
    assert set(report.codes()) <= set(CODES)
    assert report.context["steps"] == STEPS and report.context["optimizer"] == "SGD"


def test_activation_checkpointing_is_a_double_update_as_torch_counts_it():
    doc, report, tracked = watched(checkpointed=True)
    # torch's own counter: two updates of the checkpointed layer per training step
    assert tracked[-1] == 2 * STEPS
    assert report.codes("warn") == ["double-update"], str(report)
    finding = report.findings[0]
    assert finding.layers == ("block.1",)  # the layer outside the checkpoint is not named
    assert finding.value == tracked[-1] / STEPS == 2.0
    assert report.measurements["updates_per_forward"]["block2.1"] == 1.0


def test_gradient_accumulation_is_micro_batch_statistics():
    doc, report, _ = watched(accumulate=4)
    assert report.codes("warn") == ["micro-batch-statistics"], str(report)
    finding = report.findings[0]
    assert (finding.value, finding.threshold) == (64, 256)  # the loop's micro-batch and step
    assert set(finding.layers) == {"block.1", "block2.1"}
    assert {k for _, k in report.measurements["forwards_per_step"]} == {4}


def test_weight_decay_shrinking_the_weights_is_an_effective_lr_drift():
    model, _, doc, _ = train(lr=0.5, weight_decay=0.5)
    report = doc.report(examine=False)
    assert "effective-lr" in report.codes("warn"), str(report)
    finding = next(f for f in report.findings if f.code == "effective-lr")
    assert "shrank" in finding.remedy or "exploded" in finding.remedy
    # the value is ‖w_first‖²/‖w_last‖² as the model holds it now (float64 reference)
    first = report.measurements["weight_norm_sq"][finding.layers[0]][0][1]
    weight = dict(model.named_parameters())[finding.layers[0]]
    last_recorded = report.measurements["weight_norm_sq"][finding.layers[0]][-1][1]
    assert finding.value == pytest.approx(first / last_recorded, rel=1e-9)
    assert float(weight.detach().double().pow(2).sum()) < last_recorded  # still shrinking


def test_running_statistics_lagging_after_the_lr_drop_are_stale():
    # Keras's momentum 0.999 written as torch's 0.001 in the first BN only, inputs of mean 5:
    # its running statistics stay near their init long after the learning rate dropped
    doc, report, _ = watched(momentum=0.001, offset=5.0, drop_at=100)
    assert report.codes("warn") == ["stale-running-stats"], str(report)
    finding = report.findings[0]
    assert finding.layers == ("block.1",)
    assert "dropped 0.1 → 0.01 at step 100" in finding.detail
    # against the population statistics torch's own update_bn recollects, the layer is far off
    model = doc.model
    twin = Net(momentum=None)
    twin.load_state_dict(model.state_dict())
    _, x_all, _ = data(0, 5.0)
    torch.optim.swa_utils.update_bn([(x_all[:1024],)], twin)
    running = model.block[1].running_mean
    population, sd = twin.block[1].running_mean, twin.block[1].running_var.sqrt()
    assert float(((running - population).abs() / sd).mean()) > finding.threshold
    # the same loop with torch's default momentum: no warning
    _, healthy, _ = watched(offset=5.0, drop_at=100)
    assert healthy.warnings == [], str(healthy)


def test_a_learning_rate_jump_past_two_over_lambda_is_sharpness():
    with pytest.warns(ProbeCostWarning, match="sharpness"):  # every step is over its budget
        doc, report, _ = watched(jump=(STEPS - 2, 5.0), sharpness_every=1)
    assert "sharpness" in report.codes("warn"), str(report)
    points = report.measurements["sharpness"]
    assert all(threshold == pytest.approx(2 * 1.9 / 0.1) for _, _, threshold in points[:-3])
    assert points[-1][2] == pytest.approx(2 * 1.9 / 5.0)  # (2 + 2μ)/η with μ = 0.9


def test_the_doctor_leaves_the_run_bitwise_unchanged():
    plain_model, plain_opt, _, _ = train(watch=False, checkpointed=True, accumulate=2)
    with pytest.warns(ProbeCostWarning):  # sharpness every 32 steps is over its budget here
        model, opt, doc, _ = train(checkpointed=True, accumulate=2, sharpness_every=32)
    doc.report()  # the checkup too
    a, b = model.state_dict(), plain_model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for p, q in zip(model.parameters(), plain_model.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], plain_opt.state[q]["momentum_buffer"])
    assert len(doc.series["sharpness"]) == STEPS // 32


def test_the_doctor_runs_as_a_probe_of_lab_and_binds_the_loops_model():
    torch.manual_seed(0)
    model = Net(checkpointed=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    doc = Doctor(every=4)  # no model: it takes the loop's
    lab = Lab(model, F.cross_entropy, [doc], optimizer=opt)
    g, x_all, y_all = data(0)
    for step in range(1, 33):
        i = torch.randint(0, len(x_all), (32,), generator=g)
        x, y = x_all[i], y_all[i]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        lab.after_backward((x, y), step)
        opt.step()
        lab.after_step((x, y), step)
    assert doc.model is model and doc.steps == 32
    assert doc.report(examine=False).codes("warn") == ["double-update"]


def test_bad_arguments_name_the_valid_ones():
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        Doctor(every=0)
    with pytest.raises(ValueError, match="sharpness_every must be None"):
        Doctor(sharpness_every=-1)
    doc = Doctor(Net(), F.cross_entropy)
    with pytest.raises(ValueError, match=r"\(inputs, targets\) pair"):
        doc.after_backward(torch.zeros(2, 10), 1)


def test_report_without_steps_is_empty_and_says_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = Doctor(Net(), F.cross_entropy).report()
    assert report.findings == [] and str(report) == "no warnings"
