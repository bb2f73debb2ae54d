"""Probes say what they will cost before they run: Lab (and the doctor) price each probe on the
user's model from one timed forward+backward and its declared passes, and warn, or thin the
cadence, before a probe dominates the run. Checked with a fake expensive probe whose real cost is
known (it runs its declared passes), against the time it really took."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnlab import probes
from bnlab.doctor import Doctor
from bnlab.doctor import cost as doctor_cost
from bnlab.probes import Lab, Probe
from bnlab.probes import cost as probe_cost
from bnlab.probes.cost import ProbeCostWarning

PASSES = 40


class Expensive(Probe):
    """Runs ``PASSES`` train-mode forward+backward passes of the batch: exactly what it declares."""

    name = "expensive"
    cost = f"{PASSES} forward/backward passes"
    passes = PASSES

    def measure(self, ctx):
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        for _ in range(PASSES):
            ctx.snapshot.reset_forward_state()
            torch.autograd.grad(ctx.loss(), params)
        return {"done": 1.0}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256, bias=False), nn.BatchNorm1d(256), nn.ReLU(),
                         nn.Linear(256, 256, bias=False), nn.BatchNorm1d(256), nn.ReLU(),
                         nn.Linear(256, 10))


def run(model, lab_probes, steps=8, **lab_options):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lab = Lab(model, F.cross_entropy, lab_probes, optimizer=opt, **lab_options)
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        x, y = torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        lab.after_backward((x, y), step)
        opt.step()
        lab.after_step((x, y), step)
    return lab, opt


def test_an_expensive_probe_is_warned_about_before_its_first_call_with_its_real_cost():
    probe = Expensive(every=1)
    with pytest.warns(ProbeCostWarning, match="expensive: 40 forward") as caught:
        lab, _ = run(net(), [probe], steps=2)
    assert len(caught) == 1  # once, before the run, not per step
    (estimate,) = lab.costs
    assert estimate.passes == PASSES and estimate.share == pytest.approx(PASSES, rel=1e-9)
    measured = min(v for _, v in lab.series("probe/expensive/seconds"))
    # priced from one timed pass: the same order as the time the probe really took
    assert measured / 4 < estimate.seconds < measured * 4, (estimate.seconds, measured)
    assert "every 40 steps keeps it within 1×" in str(caught[0].message)


def test_thin_raises_the_cadence_to_the_budget_and_leaves_training_unchanged():
    probe = Expensive(every=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab, opt = run(net(), [probe], steps=8, on_cost="thin", cost_budget=10.0)
    # 40 passes every 2 steps: 20× the step; within 10× needs every ceil(2 · 20 / 10) = 4
    assert probe.every == 4
    assert [s for s, n, _ in lab.records if n == "probe/expensive/done"] == [4, 8]
    assert any("now every" in str(w.message) for w in caught)
    plain = net()
    run(plain, [], steps=8)
    a, b = lab.model.state_dict(), plain.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cheap_probes_and_on_cost_ignore_give_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lab, _ = run(net(), [probes.create("effective_lr"), probes.create("gamma")], steps=2)
        run(net(), [Expensive()], steps=1, on_cost="ignore")
    assert [c.passes for c in lab.costs] == [0.0, 0.0]


def test_the_readme_hessian_every_step_is_warned_about():
    with pytest.warns(ProbeCostWarning, match="hessian: 91 forward"):
        run(net(), [probes.create("hessian")], steps=1)


def test_every_bnlab_probe_declares_its_passes():
    model = net()
    for name in probes.available():
        assert probe_cost.passes(probes.create(name), model) is not None, name
    assert probe_cost.passes(probes.create("landscape", num=6), model) == 7.0
    assert probe_cost.passes(probes.create("hessian", iters=5, samples=0), model) == 16.0


def test_bad_cost_options_name_the_valid_ones():
    with pytest.raises(ValueError, match="warn, thin, ignore"):
        Lab(net(), F.cross_entropy, [], on_cost="skip")
    with pytest.raises(ValueError, match="cost_budget must be positive"):
        Lab(net(), F.cross_entropy, [], cost_budget=0)


def test_the_doctor_prices_its_sharpness_cadence_on_the_model():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    doc = Doctor(model, F.cross_entropy, opt)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    doc.after_backward((x, y), 1)
    every = doc.sharpness_every
    assert every % doc.every == 0
    share = doc.costs["sharpness_cost"]["share"]
    assert share <= doctor_cost.SHARPNESS_BUDGET  # within budget at the chosen cadence
    # one watched cadence less would be over it (the cadence is the smallest that fits)
    if every > doc.every:
        assert share * every / (every - doc.every) > doctor_cost.SHARPNESS_BUDGET


def test_the_cost_benchmark_dry_run_writes_its_documented_keys(tmp_path):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "doctor.py"
    spec = importlib.util.spec_from_file_location("bench_doctor", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "doctor.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark sets its own
    result = json.loads(out.read_text())
    assert {"date", "commit", "settings", "examine", "watcher", "amortized_sharpness",
            "total_at_default", "pricing"} <= set(result)
    assert [row["every"] for row in result["watcher"]] == [1, 16]
    assert result["pricing"]["warned"]  # the hessian probe every step is warned about
