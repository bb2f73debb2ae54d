"""CBNRatiosProbe's var_share_q50: the median over channels of var_B/(var_B + β²), the batch
variance's share of decoupled CBN's divisor (Peng et al., Eq. 5), against a float64 hand
computation."""

import pytest
import torch
from torch import nn

from bnlab import norms, probes


def test_var_share_matches_hand_computation():
    gen = torch.Generator().manual_seed(0)
    cbn = norms.create("cbn(rho=2)", 5)
    model = nn.Sequential(cbn, nn.Linear(5, 1))
    with torch.no_grad():
        cbn.bias.copy_(torch.tensor([0.0, 0.5, 3.0, -10.0, 1.0]))
    x = torch.randn(40, 5, generator=gen) * torch.tensor([1.0, 2.0, 0.5, 1.0, 0.1])
    model(x)
    lab = probes.Lab(model, nn.MSELoss(), ["cbn_ratios"])
    lab.after_backward((x, torch.zeros(40, 1)), 0)
    var = torch.var(x.double(), dim=0, correction=0)
    beta = cbn.bias.detach().double()
    share = var / (var + beta**2)
    got = [v for _, n, v in lab.records if n == "probe/cbn_ratios/var_share_q50/0"][-1]
    assert got == pytest.approx(float(share.median()), rel=1e-6)
    assert 0.0 < got < 1.0
