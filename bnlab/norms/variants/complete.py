"""Complete Batch Normalization (Peng et al., Eqs. 4–9 and Algorithm 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChannelNorm
from .conventions import factory_kwargs
from ..registry import BN_OPTIONS, Param, norm
from ..user_line import warn as warn_at_user_line


def amat_eta(lr: float | None, omega: float) -> float:
    """AMAT's moving-average weight η = max(1 − ω·lr, 0) (Peng Algorithm 1); 0 while lr is
    unknown."""
    if lr is None:
        return 0.0
    return max(1.0 - omega * float(lr), 0.0)


def _forward_as(value: Tensor, carrier: Tensor) -> Tensor:
    """A tensor equal to ``value`` in the forward pass whose gradient flows into ``carrier``.

    ``carrier + stop_grad(value − carrier)``: Batch-Renorm's additive correction.
    """
    return carrier + (value - carrier).detach()


@norm("cbn", "Complete BN: decoupled centring + ℓ2 scale, ρ, AMAT", "Peng et al.",
      "Eqs. 4-9, Alg. 1", {
    "rho": Param(1.0, float, positive=True), "amat": Param(True, bool),
    "omega": Param(10.0, float, minimum=0.0), "decouple": Param(True, bool),
    "center": Param(True, bool, help="remove the mean (false: Eq. 5 alone)"),
    "eta": Param(None, float, minimum=0.0, nullable=True,
                 help="fixed moving weight instead of AMAT's rule"),
    "order": Param("fold_first", str, choices=("fold_first", "literal"),
                   help="fold this batch in before normalizing (bnlab) or after (Alg. 1)"),
    **BN_OPTIONS})
class CompleteBatchNorm(ChannelNorm):
    """CBN, placed before the linear layer (``placement="pre_linear"``).

    Training with ``decouple=True`` (Peng Eqs. 4–5 with AMAT, Eqs. 8–9), per channel, η as in
    :func:`amat_eta` when ``amat`` is on, else η = 0::

        μ_A ← η μ_A + (1−η) μ_B                 (the current batch is folded in first)
        x'  = x − μ_A + β
        σ²_B = mean(x'²)                         (second moment of x', β included)
        σ²_A ← η σ²_A + (1−η) σ²_B
        x'' = (γ/ρ) · x' / √(σ²_A + ε)

    The forward pass uses the moving values, the backward pass the batch ones, through stop-gradient
    corrections (the exact form): ``μ_A = μ_B + sg(μ_A − μ_B)`` (additive, as Batch Renorm's d) and
    ``√(σ²_A+ε) = √(σ²_B+ε) · sg(√(σ²_A+ε)/√(σ²_B+ε))`` (multiplicative, as Batch Renorm's r).
    Algorithm 1 prints the mean correction as a ratio r_μ = μ_A/μ_B, which is singular when μ_B → 0
    (e.g. after tanh); the additive form has the same forward value and an unscaled gradient. Its
    σ²_A update prints (η σ_A)² where Eq. 9 has η σ²_A; we follow Eq. 9. With η = 0 the layer is
    exactly the decoupled normalization of Eqs. 4–5. The first training batch initializes μ_A, σ²_A.

    ``decouple=False``: vanilla centring and normalization with the same moving statistics,
    ``y = (γ/ρ)(x − μ_A)/√(σ²_A + ε) + β`` (σ²_A the moving variance) — rows ③, ⑥, ⑦ of Tables 1–4.

    ``eta=0.9`` fixes the moving-average weight instead of AMAT's learning-rate rule (the "fixed η"
    arm of Peng's Fig. 10); it overrides ``amat``.

    ``center=False`` drops the mean removal (μ_A ≡ 0): with ``decouple=True`` that is Eq. 5 alone,
    ``x'' = (γ/ρ)(x + β)/√(mean((x+β)²) + ε)`` — the "normalization with the ℓ2-norm" ablation of
    Table 6 (root mean square, not standard deviation).

    ``order="literal"``: Algorithm 1's order read literally: normalize with the moving statistics
    of the previous steps, μ_A,k and σ²_A,k, and fold this batch in afterwards (μ_A,k+1 = η μ_A,k +
    (1−η) μ_B; σ²_A,k+1 = η σ²_A,k + (1−η) σ²_B, σ²_B the second moment of x' = x − μ_A,k + β).
    The default ``"fold_first"`` folds the batch in first (the schematic above), so at η = 0 (AMAT
    at lr ≥ 1/ω) it normalizes with the batch alone, where the literal order normalizes with the
    previous batch's statistics. Both keep Eq. 9 and the additive mean correction; the first batch
    initializes μ_A, σ²_A either way.

    Inference normalizes as training did: ``running_mean`` holds the centre that training removed
    and ``running_var`` the part of the divisor σ²_A that does not depend on β, ``σ²_A − (off +
    β)²`` (off = μ_B − centre, 0 when centring), so eval divides by ``√(running_var + (off + β)² +
    ε)`` with the current β (BN-style running statistics of x + β² overstate the AMAT second moment
    when its moving values lag, and are unbiased where training divides by the biased one). With
    AMAT (or a fixed ``eta``) they are the last step's μ_A and σ²_A − (off + β)², the moving
    statistics themselves; with ``amat=false`` an EMA of each batch's values whose start values
    leave no trace (:meth:`inference_weight` says why BN's plain EMA fails CBN). Before the first
    training step they are BN's statistics, so a converted ``nn.BatchNorm`` keeps its inference map.
    ``track_running_stats=False``: no inference buffers, eval normalizes with the batch (η = 0).

    AMAT needs the learning rate: call :func:`bnlab.norms.set_progress` (or let
    ``bnlab.norms.track`` do it); training without it warns once and runs with η = 0.
    """

    reads_own_updates = True  # refused in checkpoint recomputation (ChannelNorm.check_input)

    # running_var holds σ²_A − (off + β)², a signed part of the eval divisor (negative when β grew
    # faster than the moving second moment followed): not a variance the health check may hold to
    # be ≥ 0 (bnlab.train.health.variance_buffers). amat_var, a second moment, is checked.
    signed_buffers = ("running_var",)

    amat_mean: Tensor  # buffers, declared for the type checker (see ChannelNorm)
    amat_var: Tensor
    _eta: Tensor
    _amat_steps: Tensor
    counts_empty_batches = False  # num_batches_tracked also says whether μ_A, σ²_A hold a batch yet

    def __init__(self, num_features: int, rho: float = 1.0, amat: bool = True, omega: float = 10.0,
                 decouple: bool = True, center: bool = True, eta: float | None = None,
                 order: str = "fold_first", **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if eta is not None and not 0 <= eta < 1:
            raise ValueError(f"cbn: eta must be in [0, 1), got {eta!r}")
        if order not in ("fold_first", "literal"):
            raise ValueError(f"cbn: order must be 'fold_first' or 'literal', got {order!r}")
        self.order = order
        self.rho, self.amat, self.omega = rho, amat, omega
        self.decouple, self.center = decouple, center
        self.eta = eta
        self.lr: float | None = None
        self._warned_progress = False
        factory = factory_kwargs(kwargs)
        self.register_moving_buffers(factory)
        # η as a tensor (not a Python float) so a changing learning rate never recompiles a compiled
        # model; the step counter says whether μ_A, σ²_A hold a batch yet (the first batch
        # initializes them).
        self.register_buffer("_eta", torch.tensor(self._python_eta(), **factory), persistent=False)
        steps = torch.tensor(0, dtype=torch.long, device=factory["device"])
        self.register_buffer("_amat_steps", steps, persistent=False)

    def moving_buffers(self, **factory) -> dict[str, Tensor]:
        return {"amat_mean": torch.zeros(self.num_features, **factory),
                "amat_var": torch.ones(self.num_features, **factory)}

    def transient_buffers(self) -> dict[str, Tensor]:
        return {"_eta": torch.tensor(self._python_eta()), "_amat_steps": torch.tensor(0)}

    @torch.no_grad()
    def reset_running_stats(self) -> None:
        """BN's buffers and AMAT's moving statistics (the next training batch initializes them)."""
        super().reset_running_stats()
        self.reset_moving_buffers()
        self._amat_steps.zero_()

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", rho={self.rho}, amat={self.amat}, omega={self.omega}, "
                f"decouple={self.decouple}, center={self.center}, eta={self.eta}"
                + (f", order={self.order}" if self.order != "fold_first" else ""))

    def set_progress(self, *, lr=None, epoch=None, epochs=None) -> None:
        if lr is not None:
            self.lr = float(lr)
            self._eta.fill_(self._python_eta())

    def _python_eta(self) -> float:
        if self.eta is not None:  # a fixed moving weight (Peng §6.4's "fixed η = 0.9" comparison)
            return self.eta
        return amat_eta(self.lr, self.omega) if self.amat else 0.0

    def _steps(self) -> Tensor:
        return self.num_batches_tracked if self.track_running_stats else self._amat_steps

    def current_eta(self) -> float:
        return 0.0 if int(self._steps()) == 0 else self._python_eta()

    def eta_tensor(self) -> Tensor:
        return torch.where(self._steps() > 0, self._eta, torch.zeros_like(self._eta))

    def _previous_eta(self) -> Tensor:
        """η = 1 once μ_A, σ²_A hold a batch (so :meth:`moving_statistics` returns them as they
        were before this batch: ``order="literal"``), 0 at the first batch (which initializes
        them)."""
        return torch.where(self._steps() > 0, torch.ones_like(self._eta),
                           torch.zeros_like(self._eta))

    def _warn_without_progress(self) -> None:
        if self.amat and self.eta is None and self.lr is None and not self._warned_progress:
            self._warned_progress = True
            warn_at_user_line("cbn with AMAT is training without a learning rate, so AMAT is off "
                              "(η = 0): call bnlab.norms.set_progress(model, lr=...) every step, "
                              "or bnlab.norms.track(model, optimizer, epochs=...) once")

    def moving_statistics(self, mean_b: Tensor, var_b: Tensor, beta: Tensor, eta: Tensor):
        """(μ_A or 0, σ²_A, σ²_B, off + β or off): the moving centre and second moment after folding
        in this batch (Peng Eqs. 8–9), the batch second moment and the β-dependent offset of x'."""
        centre = (eta * self.amat_mean + (1 - eta) * mean_b.detach() if self.center
                  else torch.zeros_like(mean_b))
        off = mean_b - centre if not self.center else torch.zeros_like(mean_b)
        # forward value μ_A, gradient through μ_B (Batch-Renorm's additive correction)
        if self.center:
            centre = _forward_as(centre, mean_b)
        k = (mean_b - centre + beta) if self.decouple else off  # mean of x' = x − centre (+ β)
        second_b = var_b + k**2 if (self.decouple or not self.center) else var_b
        second_a = eta * self.amat_var + (1 - eta) * second_b.detach()
        return centre, second_a, second_b, (off + beta) if self.decouple else off

    def normalize(self, x: Tensor) -> Tensor:
        self.check_input(x)
        if (empty := self.empty_batch(x)) is not None:
            return empty
        gamma, beta = self.gamma_beta(x)
        if not self.use_batch_stats():
            return self.apply_affine(x, *self._affine(gamma, beta))
        learning = self.training
        if learning and not torch.compiler.is_compiling():
            self._warn_without_progress()

        # called inside the fused operator: no dispatched operations of its own
        def eta() -> Tensor:
            return self.eta_tensor() if learning else torch.zeros_like(self._eta)

        def forward_eta() -> Tensor:  # literal order: the moving statistics before this batch
            return self._previous_eta() if learning and self.order == "literal" else eta()

        def coefficients(mean_b, var_b, gamma, beta):
            centre, second_a, second_b, _ = self.moving_statistics(mean_b, var_b, beta,
                                                                   forward_eta())
            std_b = torch.sqrt(second_b + self.eps)
            std = std_b * (torch.sqrt(second_a + self.eps) / std_b).detach()
            scale = gamma / (self.rho * std)
            return scale, ((beta - centre) * scale if self.decouple else beta - centre * scale)

        def update(mean_b, var_b, n):  # without grad, after the coefficients were taken
            if learning:
                self._update_statistics(mean_b, var_b, beta.detach(), eta())

        return self.normalize_with_batch_stats(x, coefficients, gamma, beta, update=update)[0]

    @torch.no_grad()
    def update_from_batch(self, mean: Tensor, var: Tensor, n: int, samples: int) -> None:
        """AMAT's moving statistics (Eqs. 8–9, with the current β) and the inference ones."""
        beta = self.bias if self.bias is not None else torch.zeros_like(mean)
        self._update_statistics(mean, var, beta.detach(), self.eta_tensor())

    @torch.no_grad()
    def _update_statistics(self, mean_b: Tensor, var_b: Tensor, beta: Tensor, eta: Tensor) -> None:
        centre, second_a, _, k = self.moving_statistics(mean_b, var_b, beta, eta)
        if self.order == "literal":  # σ²_B of x' = x − μ_A,k + β, the x' this step normalized
            _, _, second_b, k = self.moving_statistics(mean_b, var_b, beta, self._previous_eta())
            second_a = eta * self.amat_var + (1 - eta) * second_b
        self.write_buffer("amat_mean", centre)  # (read by this step's graph: see write_buffer)
        self.write_buffer("amat_var", second_a)
        self.write_buffer("_amat_steps", self._amat_steps + 1)
        # the inference statistics: EMAs of what training normalized with
        if self.track_running_stats:
            self.write_buffer("num_batches_tracked", self.num_batches_tracked + 1)
            m = self.inference_weight()
            self.running_mean.lerp_((centre if self.center else mean_b).to(self.running_mean.dtype),
                                    m)
            self.running_var.lerp_((second_a - k**2).to(self.running_var.dtype), m)

    def inference_weight(self) -> float | Tensor:
        """This step's weight w for the inference statistics (running ← (1 − w)·running + w·this
        step's).

        * Moving statistics in training (AMAT, or a fixed ``eta``): w = 1, so ``running_mean``,
          ``running_var`` are μ_A and σ²_A − β² of the last step — what training normalized with
          (Peng et al.: the moving averages are what "are used in the testing stage"). Their window
          is AMAT's, about 1/(ω·lr) batches: Peng's trade-off between the variance of few batches
          and the bias of old ones, which grows with the learning rate (App. E).
        * ``amat=false`` (each batch normalized by itself): BN's EMA of the batch statistics, with
          weight max(momentum, 1/t) at the t-th batch: a cumulative average until t = 1/momentum, so
          the start values 0, 1 leave no trace. (A floor ω·lr on the weight, AMAT's window, measured
          worse: resnet20 eval 0.504 against 0.524 without it, 0.579 in train mode; see the docs for
          what is left.)
        * ``momentum=None``: 1/t (the cumulative average asked for); ``momentum=0``: frozen.

        Why not BN's plain EMA: CBN's β sits inside the normalized quantity, so an error of the
        divisor also moves the output's mean (by γβ/ρ·Δ(1/σ)), which the next layer sees as an error
        of its centre: errors compound with depth. The start values left after 48 steps (0.9^48 =
        0.6 % of var 1 against a variance of 0.003 after a sigmoid) and a 10-batch window at lr 0.1
        put resnet20's eval accuracy at chance (docs/readme/norms.md, "CBN inference").
        """
        if not self.momentum:
            return self.momentum_weight()  # None: 1/t; 0: frozen statistics, as in BN
        if self.eta is not None or self.amat:
            return 1.0
        return torch.clamp(1.0 / self.num_batches_tracked.to(self.running_mean.dtype),
                           min=self.momentum)

    def _affine(self, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        centre = self.running_mean if self.center else torch.zeros_like(self.running_mean)
        offset = self.running_mean - centre  # mean of x about the centre that is removed
        if self.decouple:  # second moment of x' = x − centre + β
            scale = gamma / (
                self.rho * torch.sqrt(self.running_var + (offset + beta) ** 2 + self.eps)
            )
            return scale, (beta - centre) * scale
        scale = gamma / (self.rho * torch.sqrt(self.running_var + offset**2 + self.eps))
        return scale, beta - centre * scale

    def inference_affine(self):
        return self._affine(self.weight_or_one(), self.bias_or_zero())
