"""GroupNorm as a bnlab spec (``gn``): torch's own ``nn.GroupNorm``, per-sample statistics.

Yuxin Wu and Kaiming He, *Group Normalization* (ECCV 2018), Eq. 1 with the set of Eq. 7: each
sample's channels split into G groups, each group normalized by its own mean and variance
(biased, over its C/G channels and all spatial positions), then a per-channel γ, β. No batch
statistics: training and eval compute the same thing at any batch size, which is why it is the
usual answer to small batches and an arm of ``mbn-batch-size``.
"""

from __future__ import annotations

import torch.nn as nn

from ..registry import Param, norm

DEFAULT_GROUPS = 32  # Wu & He's default G


def group_count(num_groups: int, num_features: int) -> int:
    """G for ``num_features`` channels: ``num_groups`` clipped to the channels (a layer narrower
    than 32 channels gets one channel per group); it must divide the channels."""
    groups = min(int(num_groups), int(num_features))
    if num_features % groups:
        valid = [g for g in range(1, num_features + 1) if num_features % g == 0]
        raise ValueError(f"gn: num_groups={num_groups} does not divide {num_features} channels; "
                         f"valid num_groups for this layer: {', '.join(map(str, valid))}")
    return groups


@norm("gn", "GroupNorm: per-sample statistics over groups of channels (torch's nn.GroupNorm)",
      "Wu & He 2018", "Eq. 1 with Eq. 7's groups", {
          "num_groups": Param(DEFAULT_GROUPS, int, minimum=1,
                              help="groups G, clipped to the layer's channels"),
          "eps": Param(1e-5, float, positive=True, help="added to the variance"),
          "affine": Param(True, bool, help="learnable per-channel γ (weight) and β (bias)"),
      }, kind="sample", removes_mean=False)
class GroupNorm(nn.GroupNorm):
    """torch's ``nn.GroupNorm(G, num_features)`` built like the other specs, from the channel
    count, with G from :func:`group_count` (Wu & He 2018, Eq. 1 with Eq. 7's groups).

    ``removes_mean`` is False: a group's mean is shared by its channels, so a per-channel bias of
    the preceding layer is not removed (only its mean over the group is)."""

    def __init__(self, num_features: int, num_groups: int = DEFAULT_GROUPS, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(group_count(num_groups, num_features), num_features, eps=eps,
                         affine=affine, device=device, dtype=dtype)
