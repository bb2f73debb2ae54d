"""bnlab.theory.luo: every formula of Luo et al. against Monte Carlo, quadrature, finite differences
or a known value. Tolerances are derived from the sample sizes in each test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from bnlab.theory import luo
from bnlab.theory.mbn import standardized_samples

# ---------------------------------------------------------------------------------------------
# ζ (Eq. 13, Theorem 1)
# ---------------------------------------------------------------------------------------------


def test_zeta_linear_known_value_and_limits():
    assert luo.zeta_linear(32) == pytest.approx(0.0206, abs=5e-5)  # the ζ(M=32) ≈ 0.0206λ
    assert luo.zeta_linear(32, lam=2.5) == pytest.approx(2.5 * luo.zeta_linear(32), rel=1e-12)
    # large-M limit λ/(2M): the ratio tends to 1 with an O(1/M) correction
    ms = (64, 512, 4096)
    ratios = [luo.zeta_linear(m) / luo.zeta_linear_large_m(m) for m in ms]
    assert ratios[0] > ratios[1] > ratios[2] > 1.0
    # ζ = λ/(2M) (1 + c/M + O(1/M²)): (ratio − 1)·M settles to a constant (≈ 8.9)
    assert (ratios[2] - 1) * ms[2] == pytest.approx((ratios[1] - 1) * ms[1], rel=0.02)


def test_zeta_linear_against_monte_carlo():
    # (1 − 1/σ_B)² at M = 32 has mean 0.0206 and sd ≈ 0.03, so 200k batches give SE ≈ 7e-5.
    mc = luo.zeta_linear_mc(32, 200_000, seed=1)
    assert mc == pytest.approx(luo.zeta_linear(32), abs=4e-4)
    assert luo.zeta_linear_mc(8, 200_000, seed=2) == pytest.approx(luo.zeta_linear(8), rel=0.02)


def test_inverse_sigma_moments_and_the_missing_half():
    M = 16
    rng = np.random.default_rng(3)
    sb = rng.standard_normal((400_000, M)).std(axis=1)
    e1, e2 = luo.inverse_sigma_moments(M)
    # SE of mean(1/σ_B²) ≈ sd/√n ≈ 0.6/632 ≈ 1e-3
    assert np.mean(1 / sb) == pytest.approx(e1, abs=2e-3)
    assert np.mean(1 / sb**2) == pytest.approx(e2, abs=5e-3)
    # appendix, no 1/2
    printed = M * math.exp(special.gammaln((M - 3) / 2) - special.gammaln((M - 1) / 2))
    assert printed == pytest.approx(2 * e2)
    assert abs(np.mean(1 / sb**2) - printed) > 0.5


def test_bn_noise_penalty_includes_the_mean_term_eq13_drops():
    M = 32
    without_mean = luo.bn_output_noise_mc(M, 100_000, include_mean=False, seed=4)
    with_mean = luo.bn_output_noise_mc(M, 100_000, include_mean=True, seed=4)
    # σ_B-only penalty ≈ Eq. 13 up to O(1/M²) self-inclusion terms
    assert without_mean == pytest.approx(luo.zeta_linear(M), rel=0.25)
    # μ_B noise adds E[μ_B²/σ_B²] ≈ (1/M)·M/(M−3)
    assert with_mean - without_mean == pytest.approx(1 / (M - 3), rel=0.15)


@pytest.mark.parametrize("kurtosis", [None, 6.0, 1.8])
def test_theorem1_relu_estimator_matches_direct_expansion(kurtosis):
    rng = np.random.default_rng(5)
    h = 2.0 * standardized_samples(8192, kurtosis, rng) + 0.5
    M = 64
    est = luo.zeta_relu_estimate(h, M, gamma=2.0, beta=0.5)
    mc = luo.zeta_relu_mc(h, M, gamma=2.0, beta=0.5, n_batches=40_000, seed=6)
    # Theorem 1 keeps O(1/M) terms; at M = 64 the neglected O(1/M²) part is ~1-2%, and the MC
    # error is < 1% (Gaussian) to ~2% (heavy-tailed Laplace-like h).
    assert mc == pytest.approx(est["zeta"], rel=0.06)
    expected_rho = 0.0 if kurtosis is None else kurtosis - 3.0
    # SE of a sample kurtosis is √((E x⁸ − κ²)/n): ≈ 0.03 (Gaussian), 0.55 (Laplace, E x⁸ = 2520)
    assert est["kurtosis"] == pytest.approx(expected_rho, abs=2.2 if kurtosis == 6.0 else 0.35)


# ---------------------------------------------------------------------------------------------
# Generalization (Eqs. 14-16)
# ---------------------------------------------------------------------------------------------


def test_eq14_corrected_against_pseudo_inverse_and_printed_sign_slip():
    for alpha in (0.5, 2.0):
        sim = luo.ridge_gen_error_mc(alpha, 0.0, 0.25, N=300, n_trials=6, seed=7)
        # finite-N corrections are O(1/N); 6 draws of a self-averaging quantity: ±6%
        assert sim["mean"] == pytest.approx(luo.gen_error_sgd(alpha, 0.25), rel=0.08)
    assert luo.gen_error_sgd_printed(2.0, 0.25) < 0 < luo.gen_error_sgd(2.0, 0.25)
    assert luo.gen_error_sgd(1.0, 0.25) == math.inf


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_eq15_16_against_ridge_simulation(alpha):
    sim = luo.ridge_gen_error_mc(alpha, 0.1, 0.25, N=400, n_trials=6, seed=8)
    assert sim["mean"] == pytest.approx(luo.gen_error_wn(alpha, 0.1, 0.25), rel=0.06)


def test_G_is_the_trace_of_the_resolvent():
    rng = np.random.default_rng(9)
    N, alpha, zeta = 400, 1.5, 0.2
    X = rng.standard_normal((int(alpha * N), N)) / math.sqrt(N)
    tr = np.trace(np.linalg.inv(X.T @ X + zeta * np.eye(N))) / N
    assert tr == pytest.approx(luo.krogh_hertz_G(alpha, zeta), rel=0.02)


def test_wn_curve_reduces_to_sgd_and_is_minimised_at_the_noise_variance():
    for alpha in (0.3, 0.8, 1.7, 3.0):
        assert luo.gen_error_wn(alpha, 1e-9, 0.25) \
            == pytest.approx(luo.gen_error_sgd(alpha, 0.25), rel=1e-5)
    for noise in (0.1, 0.25):
        for alpha in (0.3, 1.0, 2.5):
            # Krogh–Hertz optimum
            assert luo.optimal_zeta(alpha, noise) == pytest.approx(noise, rel=1e-4)


# ---------------------------------------------------------------------------------------------
# Dynamics (Eqs. 9-11, Table 2, Propositions 1-3)
# ---------------------------------------------------------------------------------------------


def test_relu_integrals_closed_form_vs_monte_carlo_and_printed_I2():
    rng = np.random.default_rng(10)
    n = 1_000_000
    for gamma, R in [(0.5, 0.2), (1.3, 0.8)]:
        u, v = rng.standard_normal(n), rng.standard_normal(n)
        s, t = gamma * u, R * u + math.sqrt(1 - R * R) * v
        d = (s > 0) * (np.maximum(t, 0) - np.maximum(s, 0))
        mc = [np.mean(d * s), np.mean(d * d), np.mean(d * t)]
        closed = luo.order_parameter_integrals(gamma, R, "relu")
        np.testing.assert_allclose(closed, mc, atol=4e-3)  # SE ≈ sd/1000 ≤ 1e-3
        quad = luo.order_parameter_integrals(gamma, R, "relu", method="quadrature", n_nodes=200)
        np.testing.assert_allclose(closed, quad, atol=2e-3)
        printed = luo.relu_integrals_printed(gamma, R)
        assert printed[0] == pytest.approx(closed[0]) and printed[2] == pytest.approx(closed[2])
        assert abs(printed[1] - closed[1]) > 0.05  # πR where π belongs


def test_erf_printed_I1_correct_I2_not():
    for gamma, R in [(0.5, 0.2), (0.8, 1.0)]:
        quad = luo.order_parameter_integrals(gamma, R, "erf", n_nodes=120)
        p1, p2 = luo.erf_integrals_printed(gamma, R)
        assert p1 == pytest.approx(quad[0], abs=1e-9)
        assert abs(p2 - quad[1]) > 0.01


def test_fixed_point_and_ode_convergence():
    zeta = 0.15
    g0, R0, _ = luo.relu_fixed_point(zeta)
    assert g0 == pytest.approx(1 / 1.3)
    i1, _, i3 = luo.order_parameter_integrals(g0, 1.0)
    assert i1 / g0 - zeta * g0 == pytest.approx(0.0, abs=1e-14) \
        and g0 * i3 - i1 == pytest.approx(0.0, abs=1e-14)
    ode = luo.integrate_order_parameters(eta=0.3, zeta=zeta, t_max=150.0, n_points=3)
    # the O(η²) terms keep R a little below 1 and let L grow slowly
    assert ode["gamma"][-1] == pytest.approx(g0, abs=0.01)
    assert ode["R"][-1] > 0.995
    assert np.all(np.diff(ode["L"]) > 0)
    g_erf = luo.fixed_point(0.1, "erf")[0]
    assert luo.order_parameter_integrals(g_erf, 1.0, "erf")[0] == pytest.approx(
        0.1 * g_erf**2, abs=1e-10)
    assert abs(g_erf - 1 / 1.2) > 0.1  # Prop. 2's γ0 = 1/(2ζ+1) is ReLU's, not erf's


@pytest.mark.parametrize("zeta", [0.05, 0.2])
def test_jacobian_eigenvalues_against_finite_differences(zeta):
    eta = 1.0  # large η makes the I2 term of λ_R (∝ η²) visible
    st = luo.stability(zeta, eta=eta)
    printed = luo.stability(zeta, eta=eta, include_i2_term=False)
    assert st["lambda_Q"] == pytest.approx(-eta * (zeta + 0.5), rel=1e-12)
    assert st["lambda_Q_fd"] == pytest.approx(st["lambda_Q"], rel=1e-7)
    assert st["lambda_R_fd"] == pytest.approx(st["lambda_R"], rel=1e-6)
    gap = abs(printed["lambda_R"] - st["lambda_R"])
    g0 = 1 / (1 + 2 * zeta)
    assert gap == pytest.approx(eta**2 * g0**2 * (1 - g0) ** 2 / 2 / 2, rel=1e-9)  # η²γ0²I2/(2L⁴)
    assert gap > 1e3 * abs(st["lambda_R_fd"] - st["lambda_R"])
    # "eigenvalues by inspection": the Jacobian is triangular up to O(η²) entries
    for e in (1e-2, 1e-3):
        J = luo.stability(zeta, eta=e)["jacobian"]
        assert abs(J[1, 0]) < 10 * e**2 and np.all(np.abs(J[2]) < 10 * e**2)
    erf = luo.stability(zeta, eta=0.5, activation="erf")
    assert erf["lambda_R_fd"] == pytest.approx(erf["lambda_R"], rel=1e-5)
    assert erf["lambda_Q_fd"] == pytest.approx(erf["lambda_Q"], rel=1e-5)


def test_learning_rates_table2_and_proposition3():
    for zeta in (0.01, 0.1, 0.3):
        mx_bn, eff_bn = luo.learning_rates("bn", zeta, eta=0.2, L0=2.0)
        mx_wn, eff_wn = luo.learning_rates("wn", zeta, eta=0.2, L0=2.0)
        mx_sgd, eff_sgd = luo.learning_rates("sgd", zeta, eta=0.2, L0=2.0)
        assert mx_wn == pytest.approx(2.0) and mx_sgd == pytest.approx(2.0)
        assert luo.learning_rates("bn", zeta, include_i2_term=False)[0] \
            == pytest.approx(2 + 4 * zeta)
        assert mx_bn >= mx_wn + 2 * zeta  # Proposition 3 (the gap is ≈ 4ζ)
        g0 = 1 / (1 + 2 * zeta)
        assert (eff_bn, eff_wn, eff_sgd) == pytest.approx((0.2 * g0 / 4, 0.2 / 4, 0.2))
    # λ_R < 0 iff η_eff < η_max (Proposition 2): move η_eff across η_max with L0
    zeta = 0.1
    mx, _ = luo.learning_rates("bn", zeta, eta=1.0)
    g0 = 1 / 1.2
    for factor, sign in ((0.9, -1), (1.1, 1)):
        L0 = math.sqrt(g0 / (factor * mx))  # η_eff = η γ0 / L0² = factor · η_max
        assert np.sign(luo.stability(zeta, eta=1.0, L0=L0)["lambda_R_fd"]) == sign


def test_ode_matches_direct_simulation_of_the_student():
    # 8 students of N = 500: each trajectory fluctuates by O(1/√N) ≈ 0.02-0.03 at t = 6, the mean
    # by ≈ 0.01; the γ step must be η/N for this to hold (Eq. 7 corrected).
    kw = dict(eta=1.0, zeta=0.1, gamma0=0.5, R0=0.2, L0=1.0, t_max=6.0)
    ode = luo.integrate_order_parameters(n_points=7, **kw)
    sim = luo.simulate_online_student(N=500, n_students=8, n_records=7, seed=11, **kw)
    np.testing.assert_allclose(sim["t"], ode["t"])
    assert np.max(np.abs(sim["R"] - ode["R"])) < 0.035
    assert np.max(np.abs(sim["gamma"] - ode["gamma"])) < 0.045
    assert np.max(np.abs(sim["L"] - ode["L"])) < 0.02
    assert ode["R"][-1] - ode["R"][0] > 0.3  # the trajectories really moved


# ---------------------------------------------------------------------------------------------
# Fig. 2 teacher–student simulation
# ---------------------------------------------------------------------------------------------


def test_bn_points_near_wn_curve_and_not_from_batch_noise():
    N, noise = 256, 0.25
    kw = dict(N=N, noise_var=noise, epochs=150, n_seeds=3, seed=12)
    bn = luo.simulate_teacher_student([1.0, 2.0, 3.0], M=32, lr=8.0, **kw)
    curve = luo.gen_error_wn(bn["alpha"], luo.zeta_linear(32), noise)
    # Fig. 2: the BN points lie near WN with Eq. 13's ζ — at α = 1 too, where the pseudo-inverse
    # (vanilla SGD) diverges. Single seeds at N = 256 scatter by ~10% (20% at α = 1); mean of 3.
    np.testing.assert_allclose(bn["gen_error"], curve, rtol=0.2)
    assert luo.ridge_gen_error_mc(1.0, 0.0, noise, N=N, n_trials=2, seed=13)["mean"] > 5.0
    # ... but a noise-free full-batch BN (M = P, one step per epoch) trained on the same data
    # reaches the same error: the batch noise is not what keeps the BN point finite.
    P = N
    full = luo.simulate_teacher_student([1.0], M=P, lr=P / 4, **kw)
    np.testing.assert_allclose(full["per_seed"][0], bn["per_seed"][0], rtol=0.1)  # paired by seed


def test_wn_student_simulation_matches_krogh_hertz():
    res = luo.simulate_teacher_student([2.0], student="wn", zeta=0.1, N=256, epochs=150,
                                       n_seeds=2, seed=14)
    assert res["gen_error"][0] == pytest.approx(luo.gen_error_wn(2.0, 0.1, 0.25), rel=0.12)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="M \\(batch size\\)"):
        luo.zeta_linear(3)
    with pytest.raises(ValueError, match="unknown activation .*; valid activations: "):
        luo.order_parameter_integrals(1.0, 0.5, "softsign")
    with pytest.raises(ValueError, match="unknown method .*; valid methods: "):
        luo.learning_rates("ln", 0.1)
    with pytest.raises(ValueError, match="unknown student .*; valid students: bn, wn, sgd"):
        luo.simulate_teacher_student([1.0], student="ln")
    with pytest.raises(ValueError, match="fewer than one batch"):
        luo.simulate_teacher_student([0.05], N=64, M=32)


def test_cli_luo_commands():
    import json

    from typer.testing import CliRunner

    from bnlab.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["theory", "luo-zeta", "--m", "32", "--n-batches", "2000", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)[0]["zeta_exact"] == pytest.approx(0.0206, abs=5e-5)
    listed = runner.invoke(app, ["theory", "list"]).output
    for name in ("luo-zeta", "luo-gen-error", "mbn-theorem1", "santurkar",
                 "arora-rate", "peng-terms"):
        assert name in listed
    bad = runner.invoke(app, ["theory", "luo-zeta", "--m", "2"])
    assert bad.exit_code == 2 and "batch size" in bad.output


def test_one_zeta_estimator_shared_with_the_probe():
    # Theorem 1's ζ has one implementation (bnlab.theory.luo_zeta, numpy only); the probe and
    # zeta_relu_estimate return its terms under the same keys.
    import torch

    from bnlab.probes.bn_regularization import luo_zeta
    from bnlab.theory.luo_zeta import ACTIVATIONS, ZETA_KEYS, zeta_terms

    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 300, generator=g, dtype=torch.float64) ** 3
    gamma, beta = torch.tensor([0.5, 2.0], dtype=torch.float64), \
        torch.tensor([0.1, -0.3], dtype=torch.float64)
    for activation in ACTIVATIONS:
        probe = luo_zeta(h, gamma, beta, 16, activation)
        theory = zeta_terms(h.numpy(), 16, gamma.numpy(), beta.numpy(), activation)
        assert tuple(probe) == ZETA_KEYS == tuple(theory)
        one_unit = zeta_terms(h[1].numpy(), 16, 2.0, -0.3, activation)
        for key in ZETA_KEYS:
            np.testing.assert_allclose(probe[key].numpy(), theory[key], rtol=1e-12)
            assert float(one_unit[key]) == pytest.approx(float(theory[key][1]), rel=1e-12)
    # linear A'' = 1: F_γ = E z² = 1, so ζ = (ρ + 2)/(8M) + 1/(2M) exactly
    lin = zeta_terms(h[0].numpy(), 16, activation="linear")
    z = (h[0].numpy() - h[0].numpy().mean()) / h[0].numpy().std()
    rho = float(np.mean(z**4) - 3)
    assert float(lin["zeta"]) == pytest.approx((rho + 2) / 128 + 1 / 32, rel=1e-12)
    assert set(luo.zeta_relu_estimate(h[0].numpy(), 16, gamma=0.5, beta=0.1)) == set(ZETA_KEYS)
    with pytest.raises(ValueError, match="valid activations: relu, linear, tanh, sigmoid"):
        zeta_terms(h.numpy(), 16, activation="gelu")
