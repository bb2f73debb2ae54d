"""bnlab.theory.santurkar: Theorems 4.1 and 4.2 and Lemma 4.5 evaluated on BN layers by autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bnlab.theory import santurkar

LOSSES = ["mse", "logistic", "quartic", "coupled"]


def test_bn_jacobian_is_the_projection_of_fact_c2():
    rng = np.random.default_rng(0)
    y = torch.as_tensor(rng.standard_normal(7) * 3 + 1)
    gamma = 1.7
    J = torch.autograd.functional.jacobian(
        lambda t: santurkar.batchnorm_1d(t, gamma, 0.2), y).numpy()
    m = y.numel()
    sigma = float(y.std(unbiased=False))
    yh = ((y - y.mean()) / sigma).numpy()
    P = np.eye(m) - np.ones((m, m)) / m - np.outer(yh, yh) / m
    np.testing.assert_allclose(J, gamma / sigma * P, atol=1e-12)
    np.testing.assert_allclose(P @ P, P, atol=1e-12)  # an orthogonal projection (Eq. 44)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("m", [4, 16, 64])
def test_theorem41_holds_with_equality_and_printed_form_fails(loss, m):
    r = santurkar.theorem41(m=m, loss=loss, seed=m)
    assert r["lhs"] == pytest.approx(r["rhs"], rel=1e-10)
    assert 0.0 <= r["reduction"] <= 1.0  # BN only removes components (after the γ/σ rescaling)
    assert r["printed_violated"]  # with 1/√m the "≤" is false whenever ⟨ĝ, ŷ⟩ ≠ 0
    assert r["correlation_term"] > 0


def test_theorem41_printed_form_only_fails_through_the_correlation_term():
    m = 16
    rng = np.random.default_rng(1)
    y = rng.standard_normal(m)
    yh = (y - y.mean()) / y.std()
    # mse: ĝ = z − target. Pick ĝ orthogonal to ŷ; then 1/m vs 1/√m does not matter.
    g = rng.standard_normal(m)
    g -= (g @ yh) / m * yh
    z = 1.5 * yh
    r = santurkar.theorem41(y, gamma=1.5, beta=0.0, loss="mse", target=z - g)
    assert abs(r["correlation_term"]) < 1e-20
    assert not r["printed_violated"]
    assert r["rhs_printed"] == pytest.approx(r["lhs"], rel=1e-10)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("m", [4, 16, 64])
def test_theorem42_first_statement_is_an_equality(loss, m):
    r = santurkar.theorem42(m=m, loss=loss, seed=m)
    assert r["lhs"] == pytest.approx(r["rhs"], rel=1e-8, abs=1e-10)


def test_theorem42_second_statement_needs_its_assumption():
    # mse (H = I): the first term is (γ⁴/σ⁴)ĝᵀPĝ against (γ²/σ²)ĝᵀĝ, so γ/σ > 1 breaks the second
    # statement — "H preserves the relative norms of ĝ and ∇_y L̂" fails when ‖∇_y L̂‖ ≫ ‖ĝ‖.
    small = santurkar.theorem42(m=16, gamma=1.0, loss="mse", scale=0.1, seed=2)
    assert small["sigma"] < 0.2 and not small["second_holds"]
    large = santurkar.theorem42(m=16, gamma=1.0, loss="mse", scale=10.0, seed=2)
    assert large["second_holds"]


def test_lemma45_identity_and_scale_invariant_optimum():
    rng = np.random.default_rng(3)
    for _ in range(5):
        w0, ws = rng.standard_normal(12), rng.standard_normal(12)
        if w0 @ ws < 0:
            ws = -ws
        r = santurkar.lemma45(w0, ws, seed=4)
        assert r["gap"] == pytest.approx(r["gap_predicted"], rel=1e-10, abs=1e-12)
        assert r["gap"] >= 0
        grid_step = 3 * max(r["k"], 1.0) / 20000
        assert abs(r["argmin_c"] - r["k"]) <= grid_step  # kW* is the closest point of the ray
        assert r["bn_loss_at_w_star"] == pytest.approx(0.0, abs=1e-25)
        # scaled optimum is an optimum
        assert r["bn_loss_at_k_w_star"] == pytest.approx(0.0, abs=1e-25)
    with pytest.raises(ValueError, match="k > 0"):
        santurkar.lemma45(np.ones(3), -np.ones(3))


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown loss .*; valid losses: "):
        santurkar.theorem41(m=8, loss="hinge")
    with pytest.raises(ValueError, match="1-D batch"):
        santurkar.bn_layer_quantities([1.0])


def test_cli_santurkar_json():
    import json

    from typer.testing import CliRunner

    from bnlab.cli import app

    out = CliRunner().invoke(
        app, ["theory", "santurkar", "--m", "8", "--loss", "quartic", "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)[0]
    assert row["grad_sq"] == pytest.approx(row["thm41_rhs"], rel=1e-10)
    assert row["curv"] == pytest.approx(row["thm42_rhs"], rel=1e-8)
