"""Each probe against a case computed by hand or by brute force."""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch
from torch import nn

import bnlab.norms as norms
import bnlab.probes as probes


def run_lab(model, loss_fn, batches, probe_list, lr, momentum=0.0, steps=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    lab = probes.Lab(model, loss_fn, probe_list, optimizer=opt)
    for step, (x, y) in enumerate(batches if steps is None else batches[:steps]):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        lab.after_backward((x, y), step)
        opt.step()
        lab.after_step((x, y), step)
    return lab, opt


def last(lab, name):
    values = [v for _, n, v in lab.records if n == name]
    assert values, f"no metric {name}; have {sorted({n for _, n, _ in lab.records})[:20]}"
    return values[-1]


# ----------------------------------------------------------------------------------------------
# registry

def test_create_rejects_bad_names_and_options():
    with pytest.raises(ValueError, match="valid probes: .*landscape"):
        probes.create("landscpe")
    with pytest.raises(ValueError, match="search over training runs"):
        probes.create("max_stable_lr")
    with pytest.raises(ValueError, match="valid options: .*multipliers"):
        probes.create("landscape", every=5, bogus=1)
    with pytest.raises(ValueError, match="every must be a positive integer"):
        probes.create("gamma", every=0)
    with pytest.raises(ValueError, match="valid methods"):
        probes.create("landscape", method="fast")
    assert set(probes.available()) == {"ics", "moments", "histograms", "landscape", "effective_lr",
                                       "grad_stats", "cbn_ratios", "batch_noise", "gamma",
                                       "bn_regularization", "hessian"}
    assert all(summary and cost for _, summary, cost in probes.describe())


# ---------------------------------------------------------------------------------------------
# landscape

def quadratic_problem(h, w_star, w0):
    """L(w) = mean_j (x_jᵀw − y_j)² with XᵀX/n = diag(h)/2, so the Hessian is exactly diag(h)."""
    n = len(h)
    x = torch.diag(torch.sqrt(torch.tensor(h, dtype=torch.float64) * n / 2))
    y = x @ torch.tensor(w_star, dtype=torch.float64)
    model = nn.Linear(n, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([w0], dtype=torch.float64))
    return model, nn.MSELoss(), x, y.unsqueeze(1)


@pytest.mark.parametrize("method", ["naive", "batched"])
def test_landscape_beta_equals_known_curvature(method):
    # Gradient along an eigenvector (w0 − w* ∝ e_1): β-smoothness is exactly the curvature h_1 = 3.
    model, loss_fn, x, y = quadratic_problem([3.0, 0.5, 8.0], [1.0, -1.0, 2.0], [2.5, -1.0, 2.0])
    probe = probes.create("landscape", method=method, multipliers=(0.1, 2.0), num=5)
    lab, _ = run_lab(model, loss_fn, [(x, y)], [probe], lr=0.1)
    assert last(lab, "probe/landscape/beta_smoothness") == pytest.approx(3.0, rel=1e-10)
    assert last(lab, "probe/landscape/batched") == (1.0 if method == "batched" else 0.0)


@pytest.mark.parametrize("method", ["naive", "batched"])
def test_landscape_generic_direction_matches_closed_form(method):
    h = torch.tensor([3.0, 0.5, 8.0], dtype=torch.float64)
    model, loss_fn, x, y = quadratic_problem(h.tolist(), [1.0, -1.0, 2.0], [0.0, 0.0, 0.0])
    w = model.weight.detach().clone().reshape(-1)
    g = h * (w - torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))  # ∇L = H (w − w*)
    loss0 = float(loss_fn(model(x), y).detach())
    lr, mult = 0.05, (0.5, 4.0)
    probe = probes.create("landscape", method=method, multipliers=mult, num=4)
    lab, _ = run_lab(model, loss_fn, [(x, y)], [probe], lr=lr)
    s = torch.linspace(*mult, 4, dtype=torch.float64) * lr
    curve = loss0 - s * g.dot(g) + 0.5 * s**2 * (g * h * g).sum()  # exact for a quadratic
    assert last(lab, "probe/landscape/loss") == pytest.approx(loss0, rel=1e-12)
    assert last(lab, "probe/landscape/loss_min") == pytest.approx(float(curve.min()), rel=1e-10)
    assert last(lab, "probe/landscape/loss_max") == pytest.approx(float(curve.max()), rel=1e-10)
    # ∇L(θ) − ∇L(θ − s g) = s H g, so the change grows linearly and β = ‖Hg‖/‖g‖ for every s.
    hg = float((h * g).norm())
    assert last(lab, "probe/landscape/grad_change_max") == pytest.approx(
        float(s.max()) * hg, rel=1e-10)
    assert last(lab, "probe/landscape/beta_smoothness") == pytest.approx(
        hg / float(g.norm()), rel=1e-10)


def test_landscape_batched_agrees_with_naive_on_bn_net_and_falls_back_for_noisy_bn():
    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randn(64, 2)

    def net(spec):
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(5, 6, bias=False), norms.create(spec, 6),
                             nn.ReLU(), nn.Linear(6, 2))

    result = {}
    for method in ("naive", "batched"):
        probe = probes.create("landscape", method=method, num=4)
        lab, _ = run_lab(net("bn"), nn.MSELoss(), [(x, y)], [probe], lr=0.1)
        result[method] = {n: v for _, n, v in lab.records
                          if "seconds" not in n and "batched" not in n}
        assert probe.fallback_reason is None
    for name, value in result["naive"].items():
        assert result["batched"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    probe = probes.create("landscape", num=4)
    with pytest.warns(UserWarning, match="noisy|Generator"):
        lab, _ = run_lab(net("noisy_bn"), nn.MSELoss(), [(x, y)], [probe], lr=0.1)
    assert last(lab, "probe/landscape/batched") == 0.0
    assert "Generator" in probe.fallback_reason


def test_landscape_auto_picks_naive_for_conv_nets_on_cpu():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(2, 3, 3, bias=False), norms.create("bn", 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(12, 2))
    fc = nn.Sequential(nn.Flatten(), nn.Linear(32, 3, bias=False),
                       norms.create("bn", 3), nn.Linear(3, 2))
    x, y = torch.randn(8, 2, 4, 4), torch.randn(8, 2)
    for model, expected in ((conv, 0.0), (fc, 1.0)):
        probe = probes.create("landscape", num=3)
        lab, _ = run_lab(model, nn.MSELoss(), [(x, y)], [probe], lr=0.1)
        assert last(lab, "probe/landscape/batched") == expected
        assert probe.fallback_reason is None
    assert probes.default_range(conv) == (0.5, 4.0) and probes.default_range(fc) == (0.01, 30.0)


# ---------------------------------------------------------------------------------------------- ics

@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_ics_two_layer_linear_matches_direct_computation(momentum):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 2, bias=False)).double()
    loss_fn = nn.MSELoss()
    batches = [(torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64))
               for _ in range(2)]
    probe = probes.create("ics")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    lab = probes.Lab(model, loss_fn, [probe], optimizer=opt)
    buf = torch.zeros(4, 3, dtype=torch.float64)
    for step, (x, y) in enumerate(batches):
        w1, w2 = model[0].weight.detach().clone(), model[1].weight.detach().clone()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        lab.after_backward((x, y), step)
        # by hand: G = ∇_{W2} L(W1, W2), G' = ∇_{W2} L(W1', W2), W1' = SGD(momentum) update of W1
        n_out = y.numel()
        def grad_w2(w1_):
            hidden = x @ w1_.T
            return 2.0 / n_out * (hidden @ w2.T - y).T @ hidden
        out = x @ w1.T @ w2.T
        g1 = 2.0 / n_out * ((out - y) @ w2).T @ x
        buf = g1 if step == 0 else momentum * buf + g1
        w1_new = w1 - 0.1 * (buf if momentum else g1)
        g, g_new = grad_w2(w1), grad_w2(w1_new)
        records = {n: v for s, n, v in lab.records if s == step}
        assert records["probe/ics/l2/1"] == pytest.approx(float((g - g_new).norm()), rel=1e-10)
        cos = float((g * g_new).sum() / (g.norm() * g_new.norm()))
        assert records["probe/ics/cos/1"] == pytest.approx(cos, rel=1e-12)
        assert records["probe/ics/l2/0"] == 0.0 and records["probe/ics/cos/0"] == pytest.approx(1.0)
        assert records["probe/ics/l2/1"] > 1e-4  # the case is not degenerate
        opt.step()


# ------------------------------------------------------------------------------------------
# effective_lr

def si_net():
    torch.manual_seed(0)
    return nn.Sequential(
        norms.ScaleInvariantBN(nn.Linear(4, 8, bias=False)), nn.ReLU(),
        norms.ScaleInvariantBN(nn.Linear(8, 8, bias=False)), nn.ReLU(), nn.Linear(8, 1),
    ).double()


@pytest.mark.parametrize("momentum,exact", [(0.0, True), (0.9, False)])
def test_effective_lr_lemma_2_4_residual(momentum, exact):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 4, generator=g, dtype=torch.float64),
                torch.randn(32, 1, generator=g, dtype=torch.float64)) for _ in range(4)]
    model = si_net()
    lab, _ = run_lab(model, nn.MSELoss(), batches, [probes.create("effective_lr")], lr=0.5,
                     momentum=momentum)
    names = probes.scale_invariant_weights(model)
    assert names == ["0.layer.weight", "2.layer.weight"]
    for name in names:
        residuals = [abs(v) for _, n, v in lab.records
                     if n == f"probe/effective_lr/residual_rel/{name}"]
        assert len(residuals) == 4
        cosines = [abs(v) for _, n, v in lab.records if n == f"probe/effective_lr/cos/{name}"]
        assert max(cosines) < 1e-10  # Lemma 2.4: ⟨w, ∇w⟩ = 0
        if exact:
            assert max(residuals) < 1e-12
        else:
            assert max(residuals[1:]) > 1e-6  # momentum breaks the identity, and the probe sees it
        norm = last(lab, f"probe/effective_lr/norm/{name}")
        assert last(lab, f"probe/effective_lr/eff_lr/{name}") == pytest.approx(
            0.5 / norm**2, rel=1e-12)


# --------------------------------------------------------------------------------------------
# grad_stats

class Constant(nn.Module):
    """Predicts θ for every sample: the micro-batch gradient of ½‖θ − y‖² is θ − ȳ_m."""

    def __init__(self, theta):
        super().__init__()
        self.theta = nn.Parameter(theta)

    def forward(self, x):
        return self.theta.expand(x.shape[0], -1)


def test_grad_stats_known_variance():
    d, k, m, sigma = 400, 16, 8, 1.5
    mu = torch.linspace(-1, 1, d, dtype=torch.float64)
    theta = torch.zeros(d, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    y = mu + sigma * torch.randn(k * m, d, generator=g, dtype=torch.float64)
    x = torch.zeros(k * m, 1, dtype=torch.float64)
    loss_fn = lambda out, target: 0.5 * (out - target).pow(2).sum(dim=1).mean()  # noqa: E731
    lab, _ = run_lab(Constant(theta), loss_fn, [(x, y)], [probes.create("grad_stats", k=k)], lr=0.0)
    variance = d * sigma**2 / m  # trace of Cov(θ − ȳ_m)
    # relative sd of the unbiased trace estimate: sqrt(2 / ((k − 1) d)) ≈ 1.8 %; allow ~5 sd
    assert last(lab, "probe/grad_stats/variance") == pytest.approx(variance, rel=0.09)
    expected_sq = float((theta - mu).pow(2).sum()) + variance
    assert last(lab, "probe/grad_stats/sq_norm") == pytest.approx(expected_sq, rel=0.09)
    assert last(lab, "probe/grad_stats/micro_batch") == m


# -------------------------------------------------------------------------------------------
# batch_noise

def _batch_noise_moments(draw, m, calls=40, channels=256):
    model = nn.Sequential(nn.BatchNorm1d(channels, affine=False), nn.Linear(channels, 1))
    g = torch.Generator().manual_seed(7)
    # population estimate: ~2 % per channel, <0.5 % on the moments
    heldout = draw((4_000, channels), g)
    probe = probes.create("batch_noise", heldout=heldout)
    lab = probes.Lab(model, nn.MSELoss(), [probe])
    for step in range(calls):
        x = draw((m, channels), g)
        lab.after_backward((x, torch.zeros(m, 1)), step)
    mean = lambda q: sum(v for _, n, v in lab.records  # noqa: E731
                         if n == f"probe/batch_noise/{q}/0") / calls
    return mean("xi_mu_mean"), mean("xi_mu_var"), mean("xi_sigma_mean"), mean("xi_sigma_var"), lab


def test_batch_noise_recovers_chi2_moments():
    m = 16
    _, xi_mu_var, xi_sigma_mean, xi_sigma_var, lab = _batch_noise_moments(
        lambda shape, g: 2.0 + 3.0 * torch.randn(*shape, generator=g), m)
    # 10240 channel draws: sd of the pooled mean of ξ_σ ≈ 0.0034 (tolerance 4 sd), relative sd of
    # the variances ≈ 2 % (tolerance ~5 sd)
    assert xi_sigma_mean == pytest.approx((m - 1) / m, abs=0.014)
    assert xi_sigma_var == pytest.approx(2 * (m - 1) / m**2, rel=0.12)
    assert xi_mu_var == pytest.approx(1 / m, rel=0.12)
    assert last(lab, "probe/batch_noise/xi_sigma_var_theory/0") == pytest.approx(2 * (m - 1) / m**2)


def test_batch_noise_heavy_tails_follow_kurtosis_not_chi2():
    # Laplace inputs (kurtosis κ = 6): Var ξ_σ = ((m−1)/m)² (κ/m − (m−3)/(m(m−1))) ≈ (κ−1)/m, not
    # 2/m — the supplement's N(1, κ/m) should read N(1, (κ−1)/m).
    m, kappa = 16, 6.0
    laplace = torch.distributions.Laplace(0.0, 1.0)
    def draw(shape, g):
        u = torch.rand(*shape, generator=g) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    assert float(laplace.variance) == 2.0
    _, _, xi_sigma_mean, xi_sigma_var, _ = _batch_noise_moments(draw, m)
    exact = ((m - 1) / m) ** 2 * (kappa / m - (m - 3) / (m * (m - 1)))
    assert xi_sigma_mean == pytest.approx((m - 1) / m, abs=0.03)
    assert xi_sigma_var == pytest.approx(exact, rel=0.15)
    assert abs(xi_sigma_var - 2 * (m - 1) / m**2) > 0.5 * exact  # clearly not the Gaussian value


# -------------------------------------------------------------------------------------
# bn_regularization

def test_bn_regularization_zeta_matches_monte_carlo_of_theorem_1():
    """ζγ² (Luo Thm 1) against a brute-force average, over random batches of M drawn from the data,
    of the second-order term mean_j A''(h̄_j)/2 (ĥ_j − h̄_j)² that the theorem reduces to ζγ² (App.,
    R^q).

    Theorem 1 keeps the O(1/M) term; the remainder is O(1/M²), so the relative error must shrink
    like 1/M.
    """
    pop, gamma, beta = 4000, 1.5, 0.3
    g = torch.Generator().manual_seed(11)
    u = torch.rand(pop, generator=g, dtype=torch.float64) - 0.5
    h = 0.7 - 2.0 * torch.sign(u) * torch.log1p(-2 * u.abs())  # Laplace: excess kurtosis 3
    mu_p, sd_p = h.mean(), h.std(correction=0)
    # A'' for ReLU (softplus), the theorem's case
    w = torch.sigmoid(gamma * (h - mu_p) / sd_p + beta)
    w0, w1, w2 = w.mean(), (w * (h - mu_p)).mean(), (w * (h - mu_p) ** 2).mean()
    errors = {}
    for batch_size in (64, 256):
        model = nn.Sequential(nn.BatchNorm1d(1)).double()
        with torch.no_grad():
            model[0].weight.fill_(gamma)
            model[0].bias.fill_(beta)
        lab = probes.Lab(model, nn.MSELoss(),
                         [probes.create("bn_regularization", batch_size=batch_size)])
        lab.after_backward((h.unsqueeze(1), torch.zeros(pop, 1, dtype=torch.float64)), 0)
        kurt = last(lab, "probe/bn_regularization/kurtosis/0")
        assert kurt == pytest.approx(
            float(scipy.stats.kurtosis(h.numpy(), fisher=True, bias=True)), rel=1e-10)
        zeta = last(lab, "probe/bn_regularization/zeta/0")
        assert last(lab, "probe/bn_regularization/penalty/0") == pytest.approx(
            zeta * gamma**2, rel=1e-12)
        assert last(lab, "probe/bn_regularization/sigma_term/0") + last(
            lab, "probe/bn_regularization/mu_term/0") == pytest.approx(zeta, rel=1e-12)
        # brute force: γ²/2 · mean_j w_j [(h_j − μ_P)(1/σ_B − 1/σ_P) − (μ_B − μ_P)/σ_B]², expanded
        # in j
        batches = h[torch.randint(0, pop, (40_000, batch_size), generator=g)]
        mu_b, sd_b = batches.mean(dim=1), batches.std(dim=1, correction=0)
        a, b = 1 / sd_b - 1 / sd_p, (mu_b - mu_p) / sd_b
        # MC sd ≈ 0.6 %
        brute = float((gamma**2 / 2 * (w2 * a * a - 2 * w1 * a * b + w0 * b * b)).mean())
        errors[batch_size] = abs(zeta * gamma**2 / brute - 1)
    assert errors[64] < 0.1 and errors[256] < 0.04
    assert errors[256] < errors[64] / 2  # the neglected terms are O(1/M²)


def test_bn_regularization_agrees_with_theory_module_when_present():
    luo = pytest.importorskip("bnlab.theory.luo")
    if not hasattr(luo, "zeta_relu_estimate"):
        pytest.skip("bnlab.theory.luo.zeta_relu_estimate not available")
    g = torch.Generator().manual_seed(2)
    h = torch.randn(500, 3, generator=g, dtype=torch.float64) ** 3  # heavy-tailed, three channels
    model = nn.Sequential(nn.BatchNorm1d(3)).double()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
        model[0].bias.copy_(torch.tensor([-0.2, 0.0, 0.7]))
    lab = probes.Lab(model, nn.MSELoss(), [probes.create("bn_regularization", batch_size=32)])
    lab.after_backward((h, torch.zeros(500, 1, dtype=torch.float64)), 0)
    gamma, beta = model[0].weight.detach(), model[0].bias.detach()
    expected = [luo.zeta_relu_estimate(h[:, c].numpy(), 32, gamma=float(gamma[c]),
                                       beta=float(beta[c]))["zeta"] for c in range(3)]
    assert last(lab, "probe/bn_regularization/zeta/0") == pytest.approx(
        sum(expected) / 3, rel=1e-10)


# ------------------------------------------------------------------------- moments, histograms,
# gamma, cbn

def test_moments_and_histograms_match_direct_computation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(50, 3, dtype=torch.float64), torch.randn(50, 2, dtype=torch.float64)
    loss_fn = nn.MSELoss()
    w1 = model[0].weight.detach().clone()
    lab, _ = run_lab(model, loss_fn, [(x, y)],
                     [probes.create("moments"), probes.create("histograms", units=4)], lr=0.3)
    w1_new = model[0].weight.detach()  # plain SGD: the probe's W' is what the optimizer produced
    before, after = x @ w1.T, x @ w1_new.T
    assert last(lab, "probe/moments/mean_change/0") == pytest.approx(
        float((after.mean(0) - before.mean(0)).abs().mean()), rel=1e-10)
    assert last(lab, "probe/moments/var_change/0") == pytest.approx(
        float((after.var(0, correction=0) - before.var(0, correction=0)).abs().mean()), rel=1e-10)
    for unit in range(4):
        for level in (0.05, 0.5, 0.95):
            expected = float(torch.quantile(before[:, unit], level))
            name = f"probe/histograms/q{round(level * 100):02d}/0[{unit}]"
            assert last(lab, name) == pytest.approx(expected, rel=1e-12)


def test_gamma_and_cbn_ratios_match_hand_computation():
    torch.manual_seed(0)
    cbn = norms.create("cbn(rho=2)", 4)
    model = nn.Sequential(cbn, nn.Linear(4, 1))
    with torch.no_grad():
        cbn.weight.copy_(torch.tensor([0.5, -1.0, 2.0, 0.1]))
        cbn.bias.copy_(torch.tensor([0.2, 0.0, -0.3, 1.0]))
    x = torch.randn(40, 4) * 2 + 1
    model(x)  # one training forward, as the step before the probe: it sets CBN's μ_A
    moving = cbn.amat_mean.clone()
    lab = probes.Lab(model, nn.MSELoss(), ["gamma", "cbn_ratios"])
    lab.after_backward((x, torch.zeros(40, 1)), 0)
    var, mean = torch.var_mean(x.double(), dim=0, correction=0)
    gamma, beta = cbn.weight.detach().double(), cbn.bias.detach().double()
    eta = (mean - beta) / moving.double()
    tau = gamma / (2.0 * torch.sqrt(var + beta**2 + cbn.eps))
    assert last(lab, "probe/gamma/abs_mean/0") == pytest.approx(float(gamma.abs().mean()), rel=1e-7)
    assert last(lab, "probe/cbn_ratios/eta_q50/0") == pytest.approx(
        float(torch.quantile(eta, 0.5)), rel=1e-6)
    assert last(lab, "probe/cbn_ratios/tau_q05/0") == pytest.approx(
        float(torch.quantile(tau, 0.05)), rel=1e-6)
    assert last(lab, "probe/cbn_ratios/tau_in_range/0") == pytest.approx(
        float(((tau > 0) & (tau < 1)).double().mean()))
    assert torch.equal(cbn.amat_mean, moving)  # the probe's forward did not fold the batch in again


# ----------------------------------------------------------------------------------------
# max_stable_lr

def test_max_stable_lr_on_quadratic_with_known_threshold():
    # ½ h ‖w‖² with h = 4: gradient descent diverges iff lr > 2/h = 0.5.
    model = Constant(torch.ones(5))
    loss_fn = lambda out, target: 0.5 * 4.0 * out[0].pow(2).sum()  # noqa: E731
    batches = [(torch.zeros(2, 1), torch.zeros(2, 5))]
    result = probes.max_stable_lr_for(model, loss_fn, batches, steps=100,
                                      candidates=(0.1, 0.3, 0.45, 0.55, 1.0), strategy="all")
    assert result.lr == 0.45
    assert result.statuses == {1.0: False, 0.55: False, 0.45: True, 0.3: True, 0.1: True}
    assert torch.equal(model.theta.detach(), torch.ones(5))  # the model handed in is untouched
    calls = []
    def fake_train(lr):
        calls.append(lr)
        return "diverged" if lr > 0.01 else {"status": "finished"}
    result = probes.max_stable_lr(fake_train)
    # descending search stops at the first stable lr
    assert result.lr == 0.01 and calls == [1.0, 0.1, 0.01]
    assert probes.max_stable_lr(lambda lr: False).lr is None
    with pytest.raises(ValueError, match="cannot read a training status"):
        probes.max_stable_lr(lambda lr: "maybe")
    with pytest.raises(ValueError, match="valid strategies"):
        probes.max_stable_lr(fake_train, strategy="binary")
    assert not math.isnan(result.metrics()["probe/max_stable_lr/lr"])
