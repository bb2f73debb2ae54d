"""Probes on any device and any learning-rate schedule.

Device: every tensor a probe creates must be made on the parameters' device (or, for host-side
bookkeeping, explicitly on the CPU), never on torch's *default* device. A CPU-only machine can still
tell the two apart: the tests set torch's default device to ``meta`` (``with torch.device("meta")``)
while the model and the batch stay on the CPU. A tensor created without an explicit device then
lands on ``meta`` and the first op mixing it with the model fails exactly as a CPU tensor does on a
CUDA model ("expected device cpu but got meta" from ``autograd.grad``, the hessian probe's Lanczos
vectors before the fix), while correctly placed tensors compute real numbers. The measurements must
equal a run without the meta default: a probe's result does not depend on where torch puts unplaced
tensors.

Learning rate 0 (the first step of every warm-up): every probe runs; the hessian probe's stability
threshold 2/η is ``inf`` (before: ``ZeroDivisionError``) and its eigenvalues do not depend on η.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import bnlab.norms as norms
import bnlab.probes as probes

# every registered probe, with options that make it cheap on the small models below; landscape twice
# (the vmapped "batched" evaluation and the naive loop take different code paths)
PROBE_SPECS = [(name, {}) for name in probes.PROBES
               if name not in ("grad_stats", "hessian", "landscape")]
PROBE_SPECS += [("grad_stats", {"k": 4}), ("hessian", {"iters": 6, "samples": 3}),
                ("landscape", {"method": "naive", "num": 3}),
                ("landscape", {"method": "batched", "num": 3})]
IDS = [f"{name}{'-' + opts['method'] if 'method' in opts else ''}" for name, opts in PROBE_SPECS]


def conv_net() -> nn.Module:
    """BN and Complete BN (AMAT on: moving statistics in the forward pass), a conv and a linear
    layer."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False), norms.create("bn", 4), nn.ReLU(),
        norms.create("cbn(rho=2)", 4), nn.Conv2d(4, 4, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    norms.set_progress(model, lr=0.01)
    return model


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 1, 4, 4, generator=g), torch.randint(0, 3, (16,), generator=g)


def measure(name: str, options: dict, lr: float,
            default_device: str | None = None) -> dict[str, float]:
    """One training step's probe metrics (``after_backward`` and, for two-phase probes,
    ``after_step``)."""
    model = conv_net()
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    lab = probes.Lab(model, nn.CrossEntropyLoss(), [probes.create(name, **options)], optimizer=opt)
    if default_device is None:
        out = lab.after_backward((x, y), 0)
        opt.step()
        out.update(lab.after_step((x, y), 0))
    else:
        with torch.device(default_device):
            out = lab.after_backward((x, y), 0)
            opt.step()
            out.update(lab.after_step((x, y), 0))
    # the meta default never reached them
    assert all(p.device.type == "cpu" for p in model.parameters())
    return {k.split("/", 2)[2]: v for k, v in out.items() if not k.endswith("/seconds")}


@pytest.mark.parametrize("name, options", PROBE_SPECS, ids=IDS)
def test_probe_creates_no_tensor_on_the_default_device(name, options):
    reference = measure(name, options, lr=0.1)
    on_meta_default = measure(name, options, lr=0.1, default_device="meta")
    assert reference, name
    assert on_meta_default.keys() == reference.keys()
    for key, value in reference.items():
        assert on_meta_default[key] == pytest.approx(value, rel=1e-6, abs=1e-9,
                                                     nan_ok=True), (name, key)


@pytest.mark.parametrize("name, options", PROBE_SPECS, ids=IDS)
def test_probe_runs_at_learning_rate_zero(name, options):
    values = measure(name, options, lr=0.0, default_device="meta")
    assert values, name
    # 2/η → inf; β-smoothness divides by s = 0·lr
    undefined_at_zero = {"threshold", "beta_smoothness"}
    for key, value in values.items():
        if key.split("/")[0] not in undefined_at_zero and not key.startswith("eff_lr"):
            assert math.isfinite(value), (name, key, value)


def test_hessian_threshold_is_inf_at_lr_zero_and_the_spectrum_does_not_depend_on_lr():
    at_zero = measure("hessian", {"iters": 6, "samples": 3}, lr=0.0)
    at_tenth = measure("hessian", {"iters": 6, "samples": 3}, lr=0.1)
    assert at_zero["threshold"] == math.inf
    assert at_tenth["threshold"] == pytest.approx((2 + 2 * 0.9) / 0.1)  # Cohen et al.: (2 + 2β)/η
    for key in ("top_eigenvalue", "bottom_eigenvalue", "trace", "loss"):
        assert at_zero[key] == pytest.approx(at_tenth[key], rel=1e-9), key


def test_lanczos_and_hutchinson_keep_their_vectors_on_the_operator_device():
    """The functions themselves, with an operator that refuses vectors from any other device or
    dtype."""
    h = torch.diag(torch.arange(1.0, 6.0, dtype=torch.float64))
    seen = []

    def hvp(v):
        seen.append((v.device, v.dtype))
        assert v.device.type == "cpu" and v.dtype == torch.float64
        return h @ v

    with torch.device("meta"):
        top, bottom, steps = probes.lanczos_extremes(
            hvp, 5, 5, torch.Generator().manual_seed(0), device="cpu")
        trace, _ = probes.hutchinson_trace(
            hvp, 5, 4, torch.Generator().manual_seed(0), device="cpu")
    assert (top, bottom) == (pytest.approx(5.0), pytest.approx(1.0))
    assert trace == pytest.approx(15.0)  # Rademacher zᵀHz = tr H exactly for a diagonal H
    assert seen
