"""Sharpness of the training loss with train-mode BN: top Hessian eigenvalue and Hessian trace.

The "edge of stability" reading of Santurkar et al.'s step-size experiments (BN lets SGD run at a
larger learning rate η) needs the sharpness λ_max(∇²L) next to the stability threshold 2/η of
gradient descent on a quadratic (Cohen et al., "Gradient Descent on Neural Networks Typically Occurs
at the Edge of Stability", 2021). Tools such as PyHessian put BN in eval mode (running statistics),
which is a different function from the one SGD descends: here the loss is the train-mode loss of
this step's batch, with BN normalizing by the batch statistics μ_B, σ_B, so the Hessian includes the
curvature that flows through them.
"""

from __future__ import annotations

import math

import torch

from bnlab.norms import plain_autograd

from .base import PROBES, Probe, ProbeContext, named_params


def hessian_vector_product(ctx: ProbeContext, names: list[str]):
    """(loss, hvp) for the train-mode loss of ``ctx``'s batch: ``hvp(v) = ∇²L · v`` on the flat
    parameters.

    One forward and one backward with ``create_graph=True``; each ``hvp`` call is one more backward
    (Pearlmutter's trick, ∇(∇L·v)). BN layers are built from plain autograd ops (the fused kernels
    refuse double backward), and the forward state (buffers, RNG) is rewound first so that the
    graph sees exactly what the training step saw.
    """
    if ctx.snapshot is not None:
        ctx.snapshot.reset_forward_state()
    params = named_params(ctx.model)
    wrt = [params[n] for n in names]
    with torch.enable_grad(), plain_autograd():
        loss = ctx.loss()
        grads = torch.autograd.grad(loss, wrt, create_graph=True, allow_unused=True)
    live = [(p, g) for p, g in zip(wrt, grads) if g is not None]
    sizes = [p.numel() for p in wrt]

    def hvp(v: torch.Tensor) -> torch.Tensor:
        parts = dict(zip(map(id, wrt), torch.split(v, sizes)))
        outs = [parts[id(p)].view_as(p).to(p.dtype) for p, _ in live]
        with torch.enable_grad():
            hv = torch.autograd.grad([g for _, g in live], [p for p, _ in live], outs,
                                     retain_graph=True, allow_unused=True)
        hv_by_id = {id(p): (torch.zeros_like(p) if h is None else h) for (p, _), h in zip(live, hv)}
        return torch.cat([hv_by_id.get(id(p), torch.zeros_like(p)).reshape(-1)
                          for p in wrt]).to(v.dtype)

    return float(loss.detach()), hvp, sum(sizes)


def work_dtype(device: torch.device | str) -> torch.dtype:
    """float64 for the Krylov vectors and Hutchinson sums, except where the device has none
    (MPS)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _draw(draw, generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """``draw(generator)`` on the generator's device, then moved to ``device`` in
    :func:`work_dtype`: the same vectors for the same seed on every device, and ``autograd.grad``
    gets grad_outputs on the parameters' device (a CPU vector on a CUDA model fails: "expected
    device cuda:0 but got cpu")."""
    return draw(generator).to(device=device, dtype=work_dtype(device))


def lanczos_extremes(hvp, dim: int, iters: int, generator: torch.Generator,
                     device: torch.device | str = "cpu") -> tuple[float, float, int]:
    """Largest and smallest Ritz values of the symmetric operator ``hvp`` after ``iters`` Lanczos
    steps.

    Lanczos with full re-orthogonalization (float64) on a Gaussian start vector: the Krylov space
    span{v, Hv, …, H^{k−1}v} contains the power-iteration iterate, so λ_max(T_k) ≥ the power-method
    estimate after k products and converges faster. With k = dim the Ritz values are H's spectrum.
    Stops early when the Krylov space is invariant (β < 1e-10·‖T‖). Returns (λ_max, λ_min, steps).
    The basis lives on ``device`` (where ``hvp`` takes and returns its vectors: the parameters').
    """
    k = min(iters, dim)
    basis = torch.zeros(k, dim, dtype=work_dtype(device), device=device)
    alphas: list[float] = []
    betas: list[float] = []
    v = _draw(lambda g: torch.randn(dim, generator=g, dtype=torch.float64, device=g.device),
              generator, device)
    v /= v.norm()
    for j in range(k):
        basis[j] = v
        w = hvp(v)
        alpha = float(w @ v)
        alphas.append(alpha)
        # full re-orthogonalization (twice is enough)
        w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta = float(w.norm())
        scale = max(abs(a) for a in alphas) + max(betas, default=0.0)
        if j == k - 1 or beta <= 1e-10 * max(scale, 1e-30):
            break
        betas.append(beta)
        v = w / beta
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64, device="cpu"))  # k×k: on the host
    if betas:
        off = torch.tensor(betas, dtype=torch.float64, device="cpu")
        t += torch.diag(off, 1) + torch.diag(off, -1)
    ritz = torch.linalg.eigvalsh(t)
    return float(ritz[-1]), float(ritz[0]), len(alphas)


def hutchinson_trace(hvp, dim: int, samples: int, generator: torch.Generator,
                     device: torch.device | str = "cpu") -> tuple[float, float]:
    """tr H ≈ (1/s) Σ zᵢᵀHzᵢ with Rademacher zᵢ (Hutchinson 1990): unbiased, E[zzᵀ] = I.

    The zᵢ are drawn from ``generator`` and moved to ``device`` (the parameters'). Returns the mean
    and its standard error (sample std / √s; NaN for s = 1).
    """
    values = []
    for _ in range(samples):
        z = _draw(lambda g: torch.randint(0, 2, (dim,), generator=g, dtype=torch.float64,
                                          device=g.device),
                  generator, device).mul_(2).sub_(1)
        values.append(float(z @ hvp(z)))
    t = torch.tensor(values, dtype=torch.float64, device="cpu")
    se = float(t.std(correction=1) / math.sqrt(samples)) if samples > 1 else float("nan")
    return float(t.mean()), se


def stability_threshold(ctx: ProbeContext) -> float:
    """2/η for SGD, (2 + 2β)/η with heavy-ball momentum β (Cohen et al. 2021, App. "momentum").

    ``inf`` when η = 0 (a warm-up's first step): a zero step is stable at any curvature.
    """
    lr = ctx.learning_rate()
    momentum = 0.0
    if isinstance(ctx.optimizer, torch.optim.SGD):
        momentum = float(ctx.optimizer.param_groups[0].get("momentum", 0.0))
    return (2.0 + 2.0 * momentum) / lr if lr != 0 else math.inf


@PROBES.register()
class HessianProbe(Probe):
    """Top Hessian eigenvalue and Hessian trace of this step's train-mode loss (Santurkar §3, edge
    of stability).

    H = ∇²_θ L(θ; B) for the loss ``loss_fn(model(x), y)`` of the step's batch B, every trainable
    parameter θ, BN in *training* mode (normalized by μ_B, σ_B, which depend on θ). Records

    * ``top_eigenvalue``  = λ_max(H), the sharpness: the largest Ritz value after ``iters`` Lanczos
      steps on Hessian-vector products (a lower bound that converges from below; exact once iters ≥
      #params),
    * ``bottom_eigenvalue`` = the smallest Ritz value (negative curvature, if any),
    * ``trace`` = tr H by Hutchinson's estimator with ``samples`` Rademacher vectors, and
      ``trace_se``, its standard error,
    * ``threshold`` = 2/η (SGD) or (2 + 2β)/η (momentum β): gradient descent on a quadratic with
      curvature λ diverges when λ > threshold, so ``top_eigenvalue / threshold`` near 1 is the edge
      of stability; ``inf`` at η = 0 (warm-up's first steps: no curvature makes a zero step
      unstable),
    * ``loss``, the loss the Hessian belongs to.

    Weight decay is not part of ``loss_fn``: the full objective's Hessian is H + wd·I.

    Every random vector comes from a ``torch.Generator`` seeded with ``seed`` (+ step), never from
    the global RNG. Train-mode forwards update BN running statistics; the probe's snapshot rewinds
    them, and the RNG, gradients and modes, so training is unchanged.

    Cost: one forward and a double-backward graph, then ``iters + samples`` Hessian-vector products
    (each ≈ 2 backward passes) on the batch, with plain-autograd (unfused) BN.
    """

    name = "hessian"
    summary = ("top Hessian eigenvalue (Lanczos) and trace (Hutchinson) of the train-mode BN loss "
               "vs 2/lr")
    cost = "one double-backward graph + (iters + samples) Hessian-vector products on the batch"

    def __init__(self, every: int = 1, iters: int = 20, samples: int = 10, seed: int = 0) -> None:
        super().__init__(every)
        for label, value, low in (("iters", iters, 1), ("samples", samples, 0), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
        self.iters = iters
        self.samples = samples
        self.seed = seed

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        model = ctx.model
        model.train()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        loss, hvp, dim = hessian_vector_product(ctx, names)
        device = next((p.device for p in model.parameters()), ctx.x.device)
        # CPU: same draws on any device
        generator = torch.Generator().manual_seed(self.seed + int(ctx.step))
        top, bottom, steps = lanczos_extremes(hvp, dim, self.iters, generator, device)
        out = {"top_eigenvalue": top, "bottom_eigenvalue": bottom, "lanczos_steps": float(steps),
               "loss": loss}
        if self.samples:
            out["trace"], out["trace_se"] = hutchinson_trace(hvp, dim, self.samples, generator,
                                                             device)
        if ctx.optimizer is not None or ctx.lr is not None:
            out["threshold"] = stability_threshold(ctx)
        return out
