"""Normalization layers from the five papers, as drop-in ``torch.nn`` modules.

``create(spec, num_features)`` builds a layer from a spec string such as ``"cbn(rho=2, amat=true)"``;
``bnlab norms list`` prints the catalogue. User guide: docs/readme/norms.md ("Layers" on the docs site).
"""

from . import catalog as _catalog  # noqa: F401  (registers the layers)
from .base import ChannelNorm, plain_autograd
from .batchnorm import BatchNorm, MeanOnlyBatchNorm, NativeBatchNorm, VarOnlyBatchNorm
from .complete import CompleteBatchNorm, amat_eta
from .lp import LpBatchNorm, hoffer_linf_constant
from .momentum import MomentumBatchNorm, mbn_lambda
from .noisy import NoisyBatchNorm, StochasticLayer
from .convert import NormAct, convert, convert_sync
from .fold import FoldReport, fold
from .ops import (
    PLACEMENTS,
    create,
    describe,
    normalized,
    regularization_loss,
    removes_mean,
    seed_layers,
    stochastic_layers,
    validate,
)
from .progress import ProgressTracker, set_progress, track
from .registry import REGISTRY, NormInfo, Param, lookup, parse_spec
from .renorm import BatchRenorm
from .wrappers import ScaleInvariantBN, ScaleInvariantConvBN, ScaleInvariantLinearBN, WeightNorm

__all__ = [
    "BatchNorm", "BatchRenorm", "ChannelNorm", "CompleteBatchNorm", "LpBatchNorm", "MeanOnlyBatchNorm",
    "MomentumBatchNorm", "NativeBatchNorm", "NoisyBatchNorm", "NormInfo", "PLACEMENTS", "Param", "REGISTRY",
    "ScaleInvariantBN", "ScaleInvariantConvBN", "ScaleInvariantLinearBN", "StochasticLayer",
    "VarOnlyBatchNorm", "WeightNorm", "amat_eta", "plain_autograd", "convert", "create", "describe", "fold",
    "FoldReport", "NormAct", "ProgressTracker", "track", "convert_sync",
    "hoffer_linf_constant", "lookup", "mbn_lambda", "normalized", "parse_spec", "regularization_loss",
    "removes_mean", "seed_layers", "set_progress", "stochastic_layers", "validate",
]
