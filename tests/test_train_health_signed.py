"""The health check's negative-variance rule (bnlab.train.health) against Complete BN's signed
``running_var``: CBN stores σ²_A − (off + β)², which is negative whenever β grew faster than the
moving second moment followed. The old check read that as divergence and killed healthy CBN runs (a
ResNet-20 with CBN + Sigmoid at lr 0.05 was stopped at step 50 at 53 % test accuracy, rising)."""

import torch
from torch import nn

from bnlab.norms import create
from bnlab.train.divergence import Divergence
from bnlab.train.health import check_variances, variance_buffers


def _cbn_with_negative_running_var() -> nn.Module:
    gen = torch.Generator().manual_seed(0)
    layer = create("cbn(eta=0.9)", 4)
    layer.train()
    x = torch.randn(64, 4, generator=gen)
    layer(x)  # first step: β = 0, σ²_A ≈ var(x)
    with torch.no_grad():
        layer.bias.fill_(10.0)  # β jumps: σ²_A = 0.9·var + 0.1·(var + 100) < (0 + β)² = 100
    layer(x)
    return layer


def test_cbn_running_var_can_be_negative_and_eval_stays_finite():
    layer = _cbn_with_negative_running_var()
    assert layer.running_var.min() < 0
    layer.eval()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    assert torch.isfinite(out).all()
    # eval divides by √(running_var + β² + ε) = √σ²_A: what the last training step divided by
    divisor = layer.running_var + layer.bias.detach() ** 2 + layer.eps
    assert torch.allclose(divisor, layer.amat_var + layer.eps, rtol=1e-5)


def test_health_check_skips_signed_buffers_but_checks_the_rest():
    model = nn.Sequential(nn.Linear(3, 4), _cbn_with_negative_running_var(), nn.BatchNorm1d(4))
    names = [name for name, _ in variance_buffers(model)]
    assert "1.running_var" not in names  # signed: σ²_A − β²
    assert "1.amat_var" in names and "2.running_var" in names
    check_variances(variance_buffers(model), step=2, loss=1.0)  # healthy: no Divergence

    with torch.no_grad():
        model[2].running_var[0] = -1.0  # a real negative variance still ends the run
    try:
        check_variances(variance_buffers(model), step=3, loss=1.0)
    except Divergence as err:
        assert "2.running_var" in str(err)
    else:
        raise AssertionError("a negative BatchNorm running_var was not flagged")
