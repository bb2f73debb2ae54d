"""Normalization layers from the five papers, as drop-in ``torch.nn`` modules.

``create(spec, num_features)`` builds a layer from a spec string such as ``"cbn(rho=2,
amat=true)"``; ``bnlab norms list`` prints the catalogue. User guide: docs/readme/norms.md ("Layers"
on the docs site).
"""

from . import catalog as _catalog  # noqa: F401  (registers the layers)
from .variants.base import ChannelNorm
from .variants.batchnorm import BatchNorm, MeanOnlyBatchNorm, NativeBatchNorm, VarOnlyBatchNorm
from .engine.switches import (
    compiled_steps, nonfinite_guard_enabled, plain_autograd, set_compiled_steps,
    set_nonfinite_guard,
)
from .variants.complete import CompleteBatchNorm, amat_eta
from .variants.lp import LpBatchNorm, hoffer_linf_constant
from .variants.momentum import MomentumBatchNorm, mbn_lambda
from .variants.noisy import NoisyBatchNorm, StochasticLayer
from .tools.convert import NormAct, convert, convert_sync
from .tools.accumulate import accumulate
from .tools.fold import FoldReport, fold
from .engine.guard import nonfinite_batches
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
from .tools.progress import ProgressTracker, set_progress, track
from .tools.recollect import INPUT_KEY, recollect_running_stats, update_bn
from .tools.freeze import freeze, frozen_layers, unfreeze
from .tools.ecosystem import (
    BATCH_NORMS, fuse_conv_bn_eval, fuse_linear_bn_eval, is_batch_norm, param_groups_no_decay,
)
from .registry import NormInfo
from .variants.renorm import BatchRenorm
from .variants.wrappers import (
    ScaleInvariantBN, ScaleInvariantConvBN, ScaleInvariantLinearBN, WeightNorm,
)

# What a user needs (torch.nn's style): the layers, building and converting models, and the
# training-progress hooks. The registry itself (REGISTRY, Param, lookup, parse_spec) is in
# bnlab.norms.registry, for code that registers or inspects layers.
__all__ = [
    "BatchNorm", "BatchRenorm", "ChannelNorm", "CompleteBatchNorm", "FoldReport", "LpBatchNorm",
    "MeanOnlyBatchNorm", "MomentumBatchNorm", "NativeBatchNorm", "NoisyBatchNorm", "NormAct",
    "NormInfo", "ProgressTracker", "ScaleInvariantBN", "ScaleInvariantConvBN",
    "ScaleInvariantLinearBN", "StochasticLayer", "VarOnlyBatchNorm", "WeightNorm",
    "PLACEMENTS", "accumulate", "amat_eta", "compiled_steps", "convert", "convert_sync", "create",
    "describe", "fold",
    "hoffer_linf_constant", "mbn_lambda", "nonfinite_batches", "nonfinite_guard_enabled",
    "normalized", "plain_autograd", "recollect_running_stats",
    "regularization_loss", "removes_mean", "seed_layers", "set_compiled_steps",
    "set_nonfinite_guard", "set_progress",
    "stochastic_layers", "track", "validate",
    # with other tools (docs/readme/tools.md)
    "BATCH_NORMS", "INPUT_KEY", "freeze", "frozen_layers", "fuse_conv_bn_eval",
    "fuse_linear_bn_eval", "is_batch_norm", "param_groups_no_decay", "unfreeze", "update_bn",
]
