"""bnlab.theory.mbn: Theorem 1's laws and moments, Theorem 2's expansion and the moving statistics,
against simulation with tolerances set by the sample sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from bnlab.theory import mbn


@pytest.mark.parametrize("m", [4, 16])
def test_chi_square_moments_of_xi_sigma(m):
    n = 200_000
    xi_mu, xi_sigma = mbn.simulate_batch_noise(m, n, seed=m)
    assert xi_mu.shape == xi_sigma.shape == (n,)
    mean_th, var_th = mbn.xi_sigma_moments(m)
    assert mean_th == pytest.approx((m - 1) / m) and var_th == pytest.approx(2 * (m - 1) / m**2)
    # SE(mean) = √(var/n); SE(var) ≈ var·√((kurt(ξ_σ) − 1)/n), kurt(χ²_k) = 3 + 12/k
    se_mean = math.sqrt(var_th / n)
    se_var = var_th * math.sqrt((2 + 12 / (m - 1)) / n)
    assert abs(xi_sigma.mean() - mean_th) < 4 * se_mean
    assert abs(xi_sigma.var(ddof=1) - var_th) < 4 * se_var
    assert abs(xi_mu.var(ddof=1) - 1 / m) < 4 * (1 / m) * math.sqrt(2 / n)


def test_ks_distances_gaussian_inputs():
    n, m = 20_000, 8
    r = mbn.theorem1_report(m, n, seed=1)
    crit99 = 1.63 / math.sqrt(n)  # 99% KS critical value
    assert r["ks_xi_mu_normal"] < crit99  # ξ_μ ~ N(0, 1/m) exactly for Gaussian data
    assert r["ks_xi_sigma_chi2"] < crit99  # ξ_σ ~ χ²(m−1)/m exactly
    # the large-m normal limit is poor at m = 8
    assert r["ks_xi_sigma_normal_2_over_m"] > 5 * crit99


def test_non_gaussian_variance_is_kappa_minus_one_over_m():
    kappa, m, n = 6.0, 32, 100_000
    r = mbn.theorem1_report(m, n, kurtosis=kappa, seed=2)
    _, var_exact = mbn.xi_sigma_moments(m, kappa)
    # SE of a sample variance of ξ_σ (heavy tails at κ = 6): ≈ 1.5%; allow 6%
    assert r["xi_sigma_var"] == pytest.approx(var_exact, rel=0.06)
    mv = r["xi_sigma_var_times_m"]
    assert abs(mv - (kappa - 1)) < abs(mv - kappa)  # (κ−1)/m, not the printed κ/m
    assert mv == pytest.approx(m * var_exact, rel=0.06)
    # χ²(m−1)/m is wrong for non-Gaussian data
    assert r["ks_xi_sigma_chi2"] > 5 * 1.63 / math.sqrt(n)
    assert r["ks_xi_mu_normal"] < 1.63 / math.sqrt(n) * 1.5  # the CLT for ξ_μ is fine at m = 32


@pytest.mark.parametrize("kappa", [1.4, 2.2, 6.0])
def test_standardized_samples_have_requested_kurtosis(kappa):
    x = mbn.standardized_samples(1_000_000, kappa, np.random.default_rng(3))
    assert x.mean() == pytest.approx(0.0, abs=5e-3)
    assert x.var() == pytest.approx(1.0, rel=5e-3)
    # SE of the 4th moment: √((E x⁸ − κ²)/n) ≤ √(2520/1e6) = 0.05 for the Laplace case
    assert np.mean(x**4) == pytest.approx(kappa, abs=0.2)


def test_theorem2_expansion_against_real_batches():
    loss = np.cos
    x = np.array([-1.5, -0.5, 0.3, 1.0, 2.0])
    m = 8
    t = mbn.theorem2_terms(loss, x, m)
    # quadrature check: for Gaussian ξ_μ, R_add = E[cos(x + ξ)] − cos x = cos x (e^{−1/2m} − 1)
    np.testing.assert_allclose(t["R_add"], np.cos(x) * (math.exp(-1 / (2 * m)) - 1), atol=1e-12)
    np.testing.assert_allclose(t["loss"] + t["R_add"] + t["R_mul"] + t["R"],
                               t["expected"], atol=1e-12)
    mc = mbn.expected_loss_mc(loss, x, m, 200_000, seed=4)
    z = (mc["mean"] - t["expected"]) / mc["sem"]
    assert np.all(np.abs(z) < 4.5)  # real batches follow the expansion (5 points, 4.5σ)
    z_printed = (mc["mean"] - (t["expected"] - t["R"])) / mc["sem"]  # E[ξ_μ]^n = 0 drops R
    assert np.max(np.abs(z_printed)) > 10


def test_theorem2_leading_order_error_is_order_one_over_m_squared():
    x = np.linspace(-2, 2, 9)
    errs = []
    for m in (8, 16, 32):
        t = mbn.theorem2_terms(np.cos, x, m)
        lo = mbn.theorem2_leading_order(-np.sin(x), -np.cos(x), x, m)
        errs.append(np.max(np.abs(t["loss"] + lo["R_add"] + lo["R_mul"] - t["expected"])))
    assert 3.0 < errs[0] / errs[1] < 6.0 and 3.0 < errs[1] / errs[2] < 6.0  # ≈ 4: O(1/m²)


@pytest.mark.parametrize("lam", [0.5, 0.9])
def test_moving_statistics_noise(lam):
    m, n = 4, 40_000
    r = mbn.moving_average_noise(m, lam, n, seed=5)
    # an AR(1) series of n steps has ≈ n(1−λ)/(1+λ) independent values; SE(var) ≈ var·√(2/n_eff)
    n_eff = n * (1 - lam) / (1 + lam)
    tol = 4 * math.sqrt(2 / n_eff)
    assert r["var_mu"] == pytest.approx(r["var_mu_theory"], rel=tol)
    assert r["var_sigma2"] == pytest.approx(r["var_sigma2_theory"], rel=tol * 1.5)  # χ² is skewed
    assert r["mean_sigma2"] == pytest.approx((m - 1) / m, abs=0.02)
    assert r["var_mu"] < r["var_mu_plain_bn"] / 2
    assert r["equivalent_batch_size"] == pytest.approx(m * (1 + lam) / (1 - lam))


def test_momentum_zero_is_plain_bn_and_bad_inputs():
    r = mbn.moving_average_noise(8, 0.0, 20_000, seed=6)
    assert r["var_mu_theory"] == r["var_mu_plain_bn"] == pytest.approx(1 / 8)
    assert r["var_mu"] == pytest.approx(1 / 8, rel=4 * math.sqrt(2 / 20_000))
    with pytest.raises(ValueError, match="momentum"):
        mbn.moving_average_noise(8, 1.0)
    with pytest.raises(ValueError, match="kurtosis"):
        mbn.simulate_batch_noise(8, 10, kurtosis=0.5)
    with pytest.raises(ValueError, match="m \\(batch size\\)"):
        mbn.simulate_batch_noise(1, 10)


def test_cli_mbn_theorem1_json():
    import json

    from typer.testing import CliRunner

    from bnlab.cli import app

    out = CliRunner().invoke(
        app, ["theory", "mbn-theorem1", "--m", "16", "--n-batches", "5000", "--json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)[0]
    assert rep["xi_sigma_mean_theory"] == pytest.approx(15 / 16)
    assert rep["ks_xi_sigma_chi2"] < 1.63 / math.sqrt(5000)
    assert stats.chi2(15, scale=1 / 16).mean() == pytest.approx(rep["xi_sigma_mean_theory"])
