"""Probes of the BN layers' statistics and parameters: Peng's ratios, MBN's batch noise, Luo's γ and ζ."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from bnlab.norms import CompleteBatchNorm

from .base import (
    PROBES, Probe, ProbeContext, bn_affine,
    bn_layers, capture_inputs, cbn_rho, channels_first, select_layers,
)

ACTIVATIONS = ("relu", "linear", "tanh", "sigmoid")


def _bn_inputs(ctx: ProbeContext, layers, x: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Inputs of the given BN layers in one train-mode forward of ``x`` (default: this step's batch)."""
    if ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state()
    ctx.model.train()
    with capture_inputs(layers) as cap, torch.no_grad():
        ctx.model(ctx.x if x is None else x)
    return cap.values


def _quantiles(values: torch.Tensor, prefix: str, layer: str, out: dict) -> None:
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return
    q = torch.quantile(finite, torch.tensor([0.05, 0.5, 0.95], dtype=finite.dtype, device=finite.device))
    for tag, v in zip(("q05", "q50", "q95"), q.tolist()):
        out[f"{prefix}_{tag}/{layer}"] = v


def _heldout_inputs(heldout):
    if heldout is None:
        return None
    if isinstance(heldout, (tuple, list)):
        heldout = heldout[0]
    if not torch.is_tensor(heldout):
        raise ValueError("heldout must be a tensor of inputs or an (inputs, targets) pair, "
                         f"got {type(heldout).__name__}")
    return heldout


@PROBES.register()
class GammaProbe(Probe):
    """|γ| per BN layer over training (Luo et al. 2019, Fig. 5a): ``abs_mean/<layer>`` = mean_c |γ_c| and
    ``sq_mean/<layer>`` = mean_c γ_c² (the quantity Theorem 1's ζγ² penalizes).

    Cost: no forward or backward pass.
    """

    name = "gamma"
    summary = "mean |γ| and γ² per BN layer (Luo Fig. 5a)"
    cost = "0 passes (reads γ)"
    read_only = True

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        out = {}
        for name, module in select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN"):
            weight = getattr(module, "weight", None)
            if weight is None:
                continue
            w = weight.detach().double()
            out[f"abs_mean/{name}"] = float(w.abs().mean())
            out[f"sq_mean/{name}"] = float(w.pow(2).mean())
        return out


@PROBES.register()
class CBNRatiosProbe(Probe):
    """Peng et al.'s η_k and τ_k per channel (Theorems 2–3, Figs 2–3), summarized over channels.

    η_k = (μ_B − β)/E[x] with E[x] replaced, as Peng do, by the moving average μ_A (CBN's ``amat_mean``;
    ``running_mean`` for other BN layers); τ_k = γ/(ρ σ_B) with σ²_B the second moment of
    x' = x − μ_B + β for decoupled CBN (Eq. 5: var_B + β²) and the batch variance otherwise, ε added.
    Theorem 2 assumes 0 ≤ η ≤ 2 and Theorem 3 0 < τ < 1. Records ``eta_q05|q50|q95/<layer>``,
    ``eta_in_range/<layer>`` (fraction of channels with 0 ≤ η ≤ 2) and the same for ``tau`` (0 < τ < 1).
    For non-CBN layers the same formulas are applied (ρ = 1, β the layer's shift) for comparison.

    Cost: 1 forward pass.
    """

    name = "cbn_ratios"
    summary = "Peng's η_k = (μ_B − β)/E[x] and τ_k = γ/(ρσ_B) per channel (Peng Figs 2-3)"
    cost = "1 forward pass"

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        # E[x] ≈ μ_A as the training forward of this step left it (read before our own forward).
        moving = {}
        for name, module in layers:
            buf = getattr(module, "amat_mean", None) if isinstance(module, CompleteBatchNorm) else None
            buf = buf if buf is not None else getattr(module, "running_mean", None)
            if buf is not None:
                moving[name] = buf.detach().clone()
        inputs = _bn_inputs(ctx, layers)
        out = {}
        for name, module in layers:
            if name not in inputs:
                continue
            rows = channels_first(inputs[name].double())
            var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
            gamma, beta = bn_affine(module, mean_b)
            expected = moving[name].double() if name in moving else mean_b
            eta = (mean_b - beta) / expected
            second = var_b + beta**2 if isinstance(module, CompleteBatchNorm) and module.decouple else var_b
            tau = gamma / (cbn_rho(module) * torch.sqrt(second + float(getattr(module, "eps", 0.0))))
            _quantiles(eta, "eta", name, out)
            _quantiles(tau, "tau", name, out)
            out[f"eta_in_range/{name}"] = float(((eta >= 0) & (eta <= 2)).double().mean())
            out[f"tau_in_range/{name}"] = float(((tau > 0) & (tau < 1)).double().mean())
        return out


@PROBES.register()
class BatchNoiseProbe(Probe):
    """The noise BN's batch statistics inject, per BN layer (MBN, Yong et al. 2020, Theorem 1).

    For each channel, with μ_B, σ²_B (biased) the statistics of this batch's m values and μ, σ² the
    population statistics: ξ_μ = (μ − μ_B)/σ and ξ_σ = σ²_B/σ². Theorem 1: ξ_μ → N(0, 1/m) and
    ξ_σ → χ²(m−1)/m, so E ξ_σ = (m−1)/m and Var ξ_σ = 2(m−1)/m² (exact for Gaussian inputs; for other
    inputs Var ξ_σ ≈ (κ−1)/m with κ the kurtosis — the supplement's N(1, κ/m) should read N(1, (κ−1)/m),
    the variance of (x−μ)²/σ² being κ − 1, and equals 2/m only for Gaussian data).

    Population statistics: from ``heldout`` (a large batch of inputs, run through the model in training
    mode, whose BN inputs are pooled) or else each layer's running statistics. m counts the values BN
    pools per channel (batch × spatial positions; positions of one image are correlated, so the
    effective m of a conv layer is smaller). Records per layer, over channels: ``xi_mu_mean``,
    ``xi_mu_var``, ``xi_sigma_mean``, ``xi_sigma_var``, ``m``, and the theory's ``xi_mu_var_theory`` = 1/m,
    ``xi_sigma_mean_theory`` = (m−1)/m, ``xi_sigma_var_theory`` = 2(m−1)/m².

    Cost: 1 forward pass (+ 1 on the held-out batch if given).
    """

    name = "batch_noise"
    summary = "ξ_μ, ξ_σ of each BN layer against N(0, 1/m) and χ²(m−1)/m (MBN Thm 1)"
    cost = "1 forward pass (+1 on the held-out batch)"

    def __init__(self, every: int = 1, heldout=None, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.heldout = _heldout_inputs(heldout)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        population = {}
        if self.heldout is None:
            for name, module in layers:
                if getattr(module, "running_mean", None) is not None:
                    population[name] = (module.running_mean.detach().double().clone(),
                                        module.running_var.detach().double().clone())
        inputs = _bn_inputs(ctx, layers)
        if self.heldout is not None:
            held = _bn_inputs(ctx, layers, self.heldout.to(ctx.x.device))
            for name, value in held.items():
                var, mean = torch.var_mean(channels_first(value.double()), dim=1, correction=0)
                population[name] = (mean, var)
        out = {}
        for name, _ in layers:
            if name not in inputs or name not in population:
                continue
            rows = channels_first(inputs[name].double())
            m = rows.shape[1]
            var_b, mean_b = torch.var_mean(rows, dim=1, correction=0)
            mu, var = population[name]
            xi_mu = (mu - mean_b) / var.sqrt()
            xi_sigma = var_b / var
            out[f"xi_mu_mean/{name}"] = float(xi_mu.mean())
            out[f"xi_mu_var/{name}"] = float(xi_mu.var(correction=1)) if xi_mu.numel() > 1 else float("nan")
            out[f"xi_sigma_mean/{name}"] = float(xi_sigma.mean())
            out[f"xi_sigma_var/{name}"] = float(xi_sigma.var(correction=1)) if xi_sigma.numel() > 1 else float("nan")
            out[f"m/{name}"] = float(m)
            out[f"xi_mu_var_theory/{name}"] = 1.0 / m
            out[f"xi_sigma_mean_theory/{name}"] = (m - 1) / m
            out[f"xi_sigma_var_theory/{name}"] = 2.0 * (m - 1) / m**2
        return out


def second_derivative(activation: str, h: torch.Tensor) -> torch.Tensor:
    """A''(h̄) of Luo's generalized-linear view, A' being the activation (ReLU ≈ softplus ⇒ A'' = sigmoid)."""
    if activation == "relu":
        return torch.sigmoid(h)
    if activation == "linear":
        return torch.ones_like(h)
    if activation == "tanh":
        return 1 - torch.tanh(h) ** 2
    if activation == "sigmoid":
        s = torch.sigmoid(h)
        return s * (1 - s)
    raise ValueError(f"unknown activation {activation!r}; valid activations: {', '.join(ACTIVATIONS)}")


def luo_zeta(h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, batch_size: int,
             activation: str = "relu") -> dict[str, torch.Tensor]:
    """Luo et al. 2019, Theorem 1 (Eq. 4), per channel, from the pre-BN values ``h`` of shape (C, P).

    With z = (h − μ_P)/σ_P (population statistics of the P values), h̄ = γ z + β, M the batch size:
    kurtosis ρ = E z⁴ − 3 (the paper's ρ = (C − σ⁴)/σ⁴ − 2), Fisher term F_γ = (1/P) Σ A''(h̄) z²,
    σ_B term (ρ + 2) F_γ /(8M), μ_B term (1/P) Σ A''(h̄) /(2M), ζ = their sum; the implied penalty is ζγ².
    (Eq. 2 prints Var σ_B = (ρ+2)/(4M); it is σ_P²(ρ+2)/(4M), which is what makes E(σ_P/σ_B − 1)² =
    (ρ+2)/(4M) in the proof — ζ is unaffected.)
    """
    h = h.double()
    var, mean = torch.var_mean(h, dim=1, correction=0, keepdim=True)
    z = (h - mean) / var.sqrt()
    kurtosis = z.pow(4).mean(dim=1) - 3.0
    hbar = gamma.double().view(-1, 1) * z + beta.double().view(-1, 1)
    a2 = second_derivative(activation, hbar)
    fisher = (a2 * z * z).mean(dim=1)
    sigma_term = (kurtosis + 2.0) * fisher / (8.0 * batch_size)
    mu_term = a2.mean(dim=1) / (2.0 * batch_size)
    return {"kurtosis": kurtosis, "fisher": fisher, "sigma_term": sigma_term, "mu_term": mu_term,
            "zeta": sigma_term + mu_term}


@PROBES.register()
class BNRegularizationProbe(Probe):
    """Luo et al.'s implicit regularization strength ζ per BN layer (Theorem 1), from the data.

    The pre-BN values of each channel (this batch, or ``heldout`` inputs as the population) give the
    kurtosis ρ, the Fisher term F_γ, the μ_B term and ζ (see :func:`luo_zeta`). ``activation`` picks A''
    (``relu``: sigmoid, the paper's softplus approximation; ``linear``, ``tanh``, ``sigmoid``); M is the
    training batch size (``batch_size`` overrides). Records per layer the channel means of ``zeta``,
    ``sigma_term``, ``mu_term``, ``kurtosis``, ``fisher``, and ``penalty`` = Σ_c ζ_c γ_c².

    Cost: 1 forward pass (on the held-out batch instead if given).
    """

    name = "bn_regularization"
    summary = "Luo's ζ per BN layer from the data: kurtosis, Fisher term, μ_B term (Luo Thm 1)"
    cost = "1 forward pass"

    def __init__(self, every: int = 1, activation: str = "relu", batch_size: int | None = None,
                 heldout=None, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid activations: {', '.join(ACTIVATIONS)}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 2):
            raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}")
        self.activation = activation
        self.batch_size = batch_size
        self.heldout = _heldout_inputs(heldout)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        layers = select_layers(ctx.model, self.layers, bn_layers(ctx.model), "BN")
        x = None if self.heldout is None else self.heldout.to(ctx.x.device)
        inputs = _bn_inputs(ctx, layers, x)
        batch_size = self.batch_size or int(ctx.x.shape[0])
        out = {}
        for name, module in layers:
            if name not in inputs:
                continue
            rows = channels_first(inputs[name].double())
            gamma, beta = bn_affine(module, rows[:, 0])
            terms = luo_zeta(rows, gamma, beta, batch_size, self.activation)
            for key, value in terms.items():
                out[f"{key}/{name}"] = float(value.mean())
            out[f"penalty/{name}"] = float((terms["zeta"] * gamma.double() ** 2).sum())
        return out
