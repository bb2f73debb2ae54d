"""The catalogue: each layer registers itself with ``@norm(...)`` next to its class (its spec name,
paper, equation and typed parameters; :mod:`.registry`). Importing the layer modules here, in this
order, fills ``REGISTRY`` in the order ``bnlab norms list`` prints."""

from __future__ import annotations

import torch.nn as nn

# the import order is the catalogue's order
from .variants import batchnorm  # noqa: F401  (bn, mean_only_bn, var_only_bn, native_bn)
from .variants import noisy, lp, momentum, complete, renorm  # noqa: F401
from .variants import wrappers  # noqa: F401  (si_bn, wn)
from .variants import group  # noqa: F401  (gn: torch's GroupNorm)
from .registry import NormInfo, register

register(NormInfo("none", lambda num_features: nn.Identity(), "no normalization (identity)",
                  "-", "-", {}, removes_mean=False))
