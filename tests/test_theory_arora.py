"""bnlab.theory.arora: Theorem 2.5 (SGD on w = adaptive update on v) and Theorem 3.1 (rate)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bnlab.theory import arora


@pytest.mark.parametrize("eps_mode", ["scaled", "linear", "constant"])
def test_hand_written_gradient_matches_autograd(eps_mode):
    net = arora.ScaleInvariantNet(eps=1e-2, eps_mode=eps_mode, seed=1)
    idx = np.arange(0, 64, 3)
    W = torch.tensor(net.W0, requires_grad=True)
    g = [torch.tensor(p, requires_grad=True) for p in net.g0]
    loss = net.torch_loss(W, g, idx)
    loss.backward()
    dW, dg = net.grads(net.W0, net.g0, idx)
    assert float(loss.detach()) == pytest.approx(net.loss(net.W0, net.g0, idx), rel=1e-13)
    np.testing.assert_allclose(dW, W.grad.numpy(), atol=1e-12)
    for a, b in zip(dg, g):
        np.testing.assert_allclose(a, b.grad.numpy(), atol=1e-12)


def test_scale_invariance_and_lemma22():
    net = arora.ScaleInvariantNet(eps=1e-3, seed=2)
    W, g = net.W0, net.g0
    c = np.array([0.1, 3.0, 17.0, 0.5])  # a different scale per column
    assert net.loss(W * c, g) == pytest.approx(net.loss(W, g), rel=1e-12)
    dW, _ = net.grads(W, g)
    dWc, _ = net.grads(W * c, g)
    np.testing.assert_allclose(dWc, dW / c, rtol=1e-9)  # ∇ at cw = ∇ at w / c (Lemma 2.2)
    np.testing.assert_allclose(np.sum(dW * W, axis=0), 0.0, atol=1e-12)  # Lemma 2.4: w ⊥ ∇_w F
    printed = arora.ScaleInvariantNet(eps=1e-3, eps_mode="linear", seed=2)
    assert abs(printed.loss(W * c, g) - printed.loss(W, g)) > 1e-6  # ε‖w‖ breaks it


def test_theorem25_trajectories_coincide_with_minibatch_sgd():
    for init_scale in (0.3, 1.0, 10.0):
        r = arora.run_intrinsic_pair(steps=200, lr_w=0.5, batch_size=16, init_scale=init_scale,
                                     eps=1e-3, seed=3)
        assert max(r["dev_v"].max(), r["dev_G"].max(), r["dev_g"].max()) < 1e-11
        assert r["lemma24_residual"].max() < 1e-12
        assert np.all(np.diff(r["G"], axis=0) >= 0)  # norms only grow
        assert np.all(r["eff_lr"][-1] < r["eff_lr"][0])  # so the effective rate decays
        assert r["loss"][-1] < 0.9 * r["loss"][0]  # and training makes progress
    assert arora.intrinsic_equivalence(steps=100, seed=4) < 1e-11


def test_theorem25_breaks_without_scale_invariant_smoothing():
    for mode in ("constant", "linear"):
        r = arora.run_intrinsic_pair(steps=200, eps=1e-3, eps_mode=mode, seed=3)
        assert max(r["dev_v"].max(), r["dev_g"].max()) > 1e-6
        assert r["lemma24_residual"].max() > 1e-7


def test_theorem31_rate_whatever_lr_w_and_setting2_contrast():
    lrs = (0.1, 10.0, 100.0)
    auto = arora.convergence_rate(lrs, steps=1000, seed=5)
    proj = arora.convergence_rate(lrs, steps=1000, seed=5, projected=True)
    # Σ_t ‖∇L‖² stays bounded for every η_w, so √(Σ_{t<T}‖∇L‖²/T) falls exactly as T^{-1/2}
    np.testing.assert_allclose(auto["rms_slope"], -0.5, atol=0.03)
    assert np.all(auto["min_grad"][:, -1] <= auto["rms_grad"][:, -1])
    assert np.all(auto["min_grad"][:, -1] < 0.02)  # converges for η_w = 0.1 ... 100
    # large η_w: the norm grows, rate auto-tunes
    assert auto["G_final"][2] > 100 * auto["G_final"][0]
    # Setting 2 (‖w‖ = 1 after each step): the same η_w = 10, 100 never converge
    assert np.all(proj["min_grad"][1:, -1] > 0.1)
    assert proj["min_grad"][0, -1] < 0.02  # while a small η_w is fine there too


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown eps_mode .*; valid eps_modes: scaled, "
                                         "linear, constant"):
        arora.ScaleInvariantNet(eps_mode="sqrt")
    with pytest.raises(ValueError, match="lr_w"):
        arora.run_intrinsic_pair(lr_w=0.0)


def test_cli_arora_equivalence_json():
    import json

    from typer.testing import CliRunner

    from bnlab.cli import app

    out = CliRunner().invoke(app, ["theory", "arora-equivalence", "--steps", "50", "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert max(max(res["dev_v"]), max(res["dev_G"])) < 1e-11
