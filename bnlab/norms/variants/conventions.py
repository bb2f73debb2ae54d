"""torch.nn.BatchNorm's module conventions, shared by every bnlab channel-normalization layer.

What a user of ``torch.nn.BatchNorm1d/2d/3d`` relies on beyond the formula (torch 2.13's
``_NormBase`` and ``_BatchNorm``), so that a bnlab layer drops in:

* the constructor ``(num_features, eps, momentum, affine, track_running_stats, device, dtype, *,
  bias)`` (``bias=False``: γ only); ``eps`` and ``momentum`` checked where they enter (finite);
* ``reset_running_stats()`` and ``reset_parameters()``;
* state_dict version 2: a checkpoint without ``num_batches_tracked`` (version 1) loads (the counter
  kept, or 0), also into a module on the ``meta`` device with ``assign=True``;
* moving buffers beyond torch's (mbn's, cbn's) registered, reset and loaded from one
  declaration, and a torch BatchNorm checkpoint loading strictly into a layer that has them.

The forward conventions (the batch-statistics rule, zero-size batches, dtypes) are part of the
step and live with it in :mod:`.base`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor



def checked_eps(eps: float) -> float:
    """ε as a float; ``ValueError`` unless finite and > 0 (torch: "eps must be positive")."""
    try:
        value = float(eps)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"eps must be positive and finite, got {eps!r}") from None
    if isinstance(eps, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"eps must be positive and finite (added to the variance), got {eps!r}")
    return value


def checked_momentum(momentum: float | None) -> float | None:
    """momentum in [0, 1], or None (cumulative moving average); else ``ValueError`` (NaN, ∞ too)."""
    if momentum is None:
        return None
    try:
        value = float(momentum)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if isinstance(momentum, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"momentum must be in [0, 1] or None (cumulative average), "
                         f"got {momentum!r}")
    return value


def factory_kwargs(options: dict) -> dict:
    """The ``device``/``dtype`` keywords a subclass received, for the buffers it adds itself."""
    return {"device": options.get("device"), "dtype": options.get("dtype")}


# What torch's BatchNorm puts in a state_dict
TORCH_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


class BatchNormConventions(nn.Module):
    """Parameters, buffers and module protocol of ``torch.nn.modules.batchnorm._NormBase``."""

    _version = 2  # torch's: version 2 added num_batches_tracked
    # Declared for the type checker (nn.Module.__getattr__ would type them ``Tensor | Module``).
    # None when affine=False (bias: or bias=False) / without running buffers; reads check that.
    weight: Tensor
    bias: Tensor
    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive integer, got {num_features!r}")
        factory = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.eps = checked_eps(eps)
        self.momentum = checked_momentum(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        weight = nn.Parameter(torch.ones(num_features, **factory)) if affine else None
        self.register_parameter("weight", weight)
        shift = nn.Parameter(torch.zeros(num_features, **factory)) if affine and bias else None
        self.register_parameter("bias", shift)
        tracked = self.track_running_stats
        mean = torch.zeros(num_features, **factory) if tracked else None
        self.register_buffer("running_mean", mean)
        var = torch.ones(num_features, **factory) if tracked else None
        self.register_buffer("running_var", var)
        counter = torch.tensor(0, dtype=torch.long, device=device) if tracked else None
        self.register_buffer("num_batches_tracked", counter)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")

    @torch.no_grad()
    def reset_running_stats(self) -> None:
        """Running mean 0, variance 1, counter 0 (torch's ``_NormBase.reset_running_stats``)."""
        if self.track_running_stats and self.running_mean is not None:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Running statistics reset, γ = 1, β = 0 (torch's ``_NormBase.reset_parameters``)."""
        self.reset_running_stats()
        if self.weight is not None:
            self.weight.fill_(1)
        if self.bias is not None:
            self.bias.zero_()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # torch's _NormBase: a version-1 checkpoint (no num_batches_tracked) loads; the counter is
        # kept, or 0 on the meta device (assign=True then gives a real tensor)
        version = local_metadata.get("version", None)
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            current = self.num_batches_tracked
            state_dict[key] = (current if current is not None and current.device.type != "meta"
                               else torch.tensor(0, dtype=torch.long))
        self._keep_moving_buffers(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if local_metadata.get("assign_to_params_buffers", False):
            self._materialize_transient_buffers()

    def moving_buffers(self, **factory) -> dict[str, Tensor]:
        """Persistent buffers beyond torch's BatchNorm (mbn's and cbn's moving statistics), with
        their initial values (``factory``: device, dtype); empty for the layers that have none.
        The one place those values are written: registration, reset and loading read them."""
        return {}

    def register_moving_buffers(self, factory: dict) -> None:
        for name, initial in self.moving_buffers(**factory).items():
            self.register_buffer(name, initial)

    @torch.no_grad()
    def reset_moving_buffers(self) -> None:
        with torch.device("cpu"):  # real values also inside a `torch.device("meta")` block
            initial = self.moving_buffers()
        for name, value in initial.items():
            getattr(self, name).copy_(value)

    def _keep_moving_buffers(self, state_dict, prefix: str) -> None:
        """A checkpoint of a layer without moving statistics (torch's BatchNorm: a pretrained
        torchvision or timm model) loads strictly into one that has them: they keep their values,
        as torch keeps ``num_batches_tracked`` for a version-1 checkpoint (their initial values on
        the meta device). A checkpoint holding some of them but not all still fails as missing."""
        with torch.device("cpu"):  # real values also inside a `torch.device("meta")` block
            own = self.moving_buffers()
        theirs = [state_dict[prefix + k] for k in TORCH_KEYS if prefix + k in state_dict]
        if not own or not theirs or any(prefix + name in state_dict for name in own):
            return
        ref = next((t for t in theirs if t.is_floating_point()), theirs[0])
        for name, initial in own.items():
            current = getattr(self, name)
            state_dict[prefix + name] = (current if current.device.type != "meta"
                                         else initial.to(ref.device, current.dtype))

    def transient_buffers(self) -> dict[str, Tensor]:
        """Initial values of the non-persistent buffers (η, step counters: not in a state_dict),
        which a ``load_state_dict(..., assign=True)`` into a ``meta``-device module cannot fill."""
        return {}

    def _materialize_transient_buffers(self) -> None:
        """After ``assign=True``: non-persistent buffers still on ``meta`` get their initial values
        on the loaded tensors' device and float dtype (else the first forward mixes devices)."""
        loaded = [t for t in (*self._parameters.values(), *self._buffers.values())
                  if t is not None and t.device.type != "meta"]
        if not loaded:
            return
        ref = next((t for t in loaded if t.is_floating_point()), loaded[0])
        with torch.device("cpu"):  # real values also inside a `torch.device("meta")` block
            transient = self.transient_buffers()
        for name, value in transient.items():
            current = self._buffers.get(name)
            if current is not None and current.device.type == "meta":
                dtype = ref.dtype if value.is_floating_point() else value.dtype
                self._buffers[name] = value.to(device=ref.device, dtype=dtype)
