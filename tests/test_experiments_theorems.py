"""The theorem entries (peng-eq14, peng-thm1, arora-rates, mbn-theorems): their measurements against
outside references (torch's BatchNorm, autograd, a closed form) and their verdicts on data that
should pass or fail."""

import math

import numpy as np
import pytest
import torch

from bnlab.experiments import get, reproduce
from bnlab.experiments.arora import rates as R
from bnlab.experiments.mbn import theorems as MT
from bnlab.experiments.peng import theorems as T
from bnlab.theory.arora import ScaleInvariantNet, sgd_convergence_rate


def test_eq14_against_torch_batchnorm_on_a_symmetric_batch():
    """Eq. 14 with torch's own BN: for a batch symmetric about 0, ReLU(BN(y)) equals ℓ2
    normalization of ReLU(y) with ρ = √2 exactly, and effective_rho says √2; for a skewed batch it
    does not."""
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(32, 3, generator=gen, dtype=torch.float64)
    y = torch.cat([half, -half]) + 5.0  # symmetric about its mean
    bn = torch.nn.BatchNorm1d(3, affine=False, eps=1e-300).double().train()
    lhs = torch.relu(bn(y))
    yc = y - y.mean(0)
    rhs = torch.relu(yc) / torch.sqrt(2 * torch.relu(yc).pow(2).mean(0))
    torch.testing.assert_close(lhs, rhs)
    torch.testing.assert_close(
        T.effective_rho(y), torch.full((3,), math.sqrt(2), dtype=torch.float64)
    )
    skewed = torch.empty(4096, 1, dtype=torch.float64).exponential_(generator=gen)
    assert abs(float(T.effective_rho(skewed)) - math.sqrt(2)) > 0.1


def test_eq14_verdict_holds_and_fails():
    gauss = {"16": {"mean": 1.41, "sd": 0.1}}
    assert T.eq14_verdict({"gaussian": gauss, "network_rho": [1.40, 1.42, 1.43]})[0] == "held"
    assert T.eq14_verdict({"gaussian": gauss, "network_rho": [1.7, 1.8, 1.9]})[0] == "not held"
    assert T.eq14_verdict({"gaussian": gauss, "network_rho": []})[0] == "inconclusive"


def test_thm1_verdict_refuted_by_one_violating_run():
    good = {
        n: [{"T1": 1.0, "T2": 1.0, "T3": 1.0, "bound": 3.0, "lhs": 0.5}] * 3
        for n in ("base", "lr 0.25", "lr 1", "noise 0.1", "noise 1", "batch 64")
    }
    for hi, lo in (("lr 0.25", "lr 1"), ("noise 1", "noise 0.1"), ("base", "batch 64")):
        good[lo] = [
            {**r, "T1": 0.5 + 0.01 * i, "T2": 0.5 + 0.01 * i, "T3": 0.5 + 0.01 * i}
            for i, r in enumerate(good[lo])
        ]
    assert T.thm1_verdict(good)[0] == "held"
    bad = {**good, "base": [{**good["base"][0], "lhs": 4.0}] + good["base"][1:]}
    verdict, summary = T.thm1_verdict(bad)
    assert verdict == "not held" and "violated" in summary


def test_sgd_full_gradient_is_the_mean_of_the_minibatch_gradients_by_autograd():
    """arora-rates' SGD measures ‖∇L‖ for L = mean of the fixed minibatch losses; check the
    hand-written minibatch gradients against torch autograd of that L."""
    net = ScaleInvariantNet(seed=1)
    parts = np.array_split(np.arange(net.n), 4)
    W = torch.tensor(net.W0, requires_grad=True)
    g = [torch.tensor(p, requires_grad=True) for p in net.g0]
    loss = sum(net.torch_loss(W, g, idx) for idx in parts) / len(parts)
    loss.backward()
    per = [net.grads(net.W0, net.g0, idx) for idx in parts]
    np.testing.assert_allclose(sum(p[0] for p in per) / 4, W.grad.numpy(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(
        sum(p[1][2] for p in per) / 4, g[2].grad.numpy(), rtol=1e-8, atol=1e-12
    )


def test_sgd_rate_small_run_decays_and_bound_slope():
    r = sgd_convergence_rate((1.0,), steps=300, seed=0)
    assert np.all(np.isfinite(r["mean_sq"])) and r["mean_sq"][0, -1] < r["mean_sq"][0, 0]
    # the slope of log T/√T over [30, 300]: −1/2 + 1/ln T on average, between −0.5 and −0.25
    assert -0.5 < r["bound_slope_sq"] < -0.25


def test_rates_verdict_on_synthetic_slopes():
    def data(gd, sgd):
        n = len(R.RATE_LRS)
        return {
            "lrs": list(R.RATE_LRS),
            "T": [2000],
            "gd": [{"slope": [gd] * n}],
            "projected": [{"slope": [0.0] * n}],
            "sgd": [{"slope": [sgd] * n, "bound_slope": -0.35}],
        }

    assert R.rates_verdict(data(-0.5, -0.9))[0] == "held"
    assert R.rates_verdict(data(-0.2, -0.9))[0] == "not held"
    assert R.rates_verdict(data(-0.5, -0.1))[0] == "not held"
    assert R.rates_verdict(data(-0.5, float("nan")))[0] == "not held"  # a diverged run fails


def test_mbn_theorems_tiny_and_a_wrong_prediction_fails():
    data = MT.mbn_data(tiny=True)
    assert {r["m"] for r in data["moving"]} == set(MT.MBN_M)
    doctored = {
        **data,
        "moving": [{**r, "var_mu_theory": r["var_mu_theory"] * 1.5} for r in data["moving"]],
    }
    assert MT.mbn_verdict(doctored)[0] == "not held"


@pytest.mark.parametrize("entry", ["peng-eq14", "mbn-theorems"])
def test_theorem_entries_run_tiny(tmp_path, entry):
    outcome = reproduce(entry, "smoke", runs_dir=tmp_path, tiny=True, report=False, progress=False)
    assert outcome.verdict == "inconclusive" and outcome.table and outcome.figures
    assert get(entry).describe()["paper_title"]


def test_thm1_verdict_with_one_seed_per_arm_says_what_it_cannot_resolve():
    """One seed per arm (a tiny reproduction, a user's quick run): no Welch test, so no p; the
    verdict is still given and the summary shows the missing p as "—" instead of failing."""
    one = {n: [{"T1": 1.0, "T2": 1.0, "T3": 1.0, "bound": 3.0, "lhs": 0.5}]
           for n in ("base", "lr 0.25", "lr 1", "noise 0.1", "noise 1", "batch 64")}
    verdict, summary = T.thm1_verdict(one, tiny=True)
    assert verdict == "inconclusive" and "p_Holm=—" in summary
    assert T.thm1_verdict(one)[0] in ("held", "inconclusive")
