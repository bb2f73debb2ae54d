"""The catalogue: every layer's spec name, paper, equation and parameters."""

from __future__ import annotations

import torch.nn as nn

from .batchnorm import BatchNorm, MeanOnlyBatchNorm, NativeBatchNorm, VarOnlyBatchNorm
from .complete import CompleteBatchNorm
from .lp import LpBatchNorm
from .momentum import MomentumBatchNorm
from .noisy import NoisyBatchNorm
from .registry import NormInfo, Param, register
from .renorm import BatchRenorm
from .wrappers import ScaleInvariantBN, WeightNorm

_BN = {  # torch.nn.BatchNorm2d's options, with torch's names and semantics
    "eps": Param(1e-5, float, positive=True, help="added to the variance"),
    "momentum": Param(0.1, float, minimum=0.0, nullable=True,
                      help="running-statistics update weight; none = cumulative moving average"),
    "affine": Param(True, bool, help="learnable γ (weight) and β (bias)"),
    "track_running_stats": Param(True, bool, help="false: no running statistics, batch statistics in eval"),
    "sync": Param(False, bool, help="batch statistics over all ranks of torch.distributed (bnlab.norms.sync)"),
}
_POS = {"positive": True}

register(NormInfo("bn", BatchNorm, "BatchNorm from tensor ops; equals nn.BatchNorm2d",
                  "Ioffe & Szegedy 2015", "Alg. 1", dict(_BN)))
register(NormInfo("native_bn", NativeBatchNorm, "torch's own fused BatchNorm",
                  "Ioffe & Szegedy 2015", "Alg. 1", {k: v for k, v in _BN.items() if k != "sync"}))  # convert_sync: nn.SyncBatchNorm
register(NormInfo("mean_only_bn", MeanOnlyBatchNorm, "subtract the batch mean only",
                  "Luo et al. 2019", "§5 (with WN)", dict(_BN)))
register(NormInfo("var_only_bn", VarOnlyBatchNorm, "divide by the batch std only",
                  "Luo et al. 2019", "§5 (with WN)", dict(_BN), removes_mean=False))
register(NormInfo("noisy_bn", NoisyBatchNorm, "BN + time-varying non-zero-mean, non-unit-variance noise",
                  "Santurkar et al. 2018", "App. A.2.1, Alg. 1", {
                      "n_mu": Param(0.5, float, minimum=0.0), "n_sigma": Param(1.25, float, minimum=1.0),
                      "r_mu": Param(0.1, float, minimum=0.0), "r_sigma": Param(0.1, float, minimum=0.0), **_BN}))
register(NormInfo("lp_bn", LpBatchNorm, "centre, divide by a Gaussian-calibrated ℓp scale",
                  "Santurkar et al. 2018 / Hoffer et al. 2018", "§3.3, App. B", {
                      "p": Param("2", str, choices=("1", "2", "inf")), "topk": Param(10, int, minimum=1), **_BN}))
register(NormInfo("mbn", MomentumBatchNorm, "normalize with moving statistics, λ scheduled by epoch",
                  "Yong et al. 2020 (Momentum BN)", "Eqs. 3-4, λ schedule", {
                      "ideal_batch": Param(32, int, minimum=1), "tau0": Param(0.9, float, minimum=0.0), **_BN}))
register(NormInfo("cbn", CompleteBatchNorm, "Complete BN: decoupled centring + ℓ2 scale, ρ, AMAT",
                  "Peng et al.", "Eqs. 4-9, Alg. 1", {
                      "rho": Param(1.0, float, **_POS), "amat": Param(True, bool),
                      "omega": Param(10.0, float, minimum=0.0), "decouple": Param(True, bool),
                      "center": Param(True, bool, help="remove the mean (false: Eq. 5 alone)"),
                      "eta": Param(None, float, minimum=0.0, nullable=True,
                                   help="fixed moving weight instead of AMAT's rule"),
                      **_BN}))
register(NormInfo("brn", BatchRenorm, "Batch Renormalization (stop-gradient r, d corrections)",
                  "Ioffe 2017", "Alg. 1", {
                      "r_max": Param(3.0, float, minimum=1.0), "d_max": Param(5.0, float, minimum=0.0),
                      "relax_from": Param(0, int, minimum=0, help="warm-up: r_max=1, d_max=0 before this step"),
                      "r_max_at": Param(0, int, minimum=0, help="warm-up: step at which r_max is reached"),
                      "d_max_at": Param(0, int, minimum=0, help="warm-up: step at which d_max is reached"),
                      **_BN}))
register(NormInfo("none", lambda num_features: nn.Identity(), "no normalization (identity)",
                  "-", "-", {}, removes_mean=False))
register(NormInfo("si_bn", ScaleInvariantBN, "BN with ε‖w‖² smoothing: keeps the weight scale-invariant",
                  "Arora et al. 2019", "Eq. 8, Lemma 2.4", dict(_BN), kind="wrapper"))
register(NormInfo("wn", WeightNorm, "weight normalization w = γ v/‖v‖, optional γ-decay ζ Σγ²",
                  "Salimans & Kingma 2016; Luo et al. 2019", "Luo Eq. 15", {
                      "zeta": Param(0.0, float, minimum=0.0)}, kind="wrapper", removes_mean=False))
