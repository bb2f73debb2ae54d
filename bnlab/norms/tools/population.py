"""One pass over data that recomputes every normalization layer's statistics for the final network.

What "recomputed" means, layer by layer. Each buffer a layer keeps is a moving average of a
per-batch quantity; recomputed, it is the equal-weight average of that quantity over the batches of
the pass, with the final weights — what torch's ``torch.optim.swa_utils.update_bn`` computes for
``nn.BatchNorm`` (its ``momentum=None`` cumulative average: Ioffe & Szegedy 2015, "Batch
Normalization: Accelerating Deep Network Training by Reducing Internal Covariate Shift", Alg. 2,
steps 8-10), extended to the buffers torch's BN does not have:

* torch's BN, ``bn``, ``mean_only_bn``, ``var_only_bn``, ``noisy_bn``, ``lp_bn``, ``brn``: their
  own update with ``momentum=None`` (a cumulative average): ``running_mean = E_B[μ_B]``,
  ``running_var = E_B[m/(m−1)·σ²_B]`` (lp_bn: the ℓp scale it keeps, squared; brn: Ioffe 2017's
  average of σ_B, stored as σ² − ε).
* ``mbn`` (Yong et al. 2020, "Momentum Batch Normalization for Deep Learning with Small Batch
  Size", Eqs. 3-4): the moving statistics that training normalizes with, ``train_mean = E_B[μ_B]``
  and ``train_var = E_B[σ²_B]`` (biased, as the moving average takes them); the inference EMA
  ``running_*`` as torch's BN above (its τ-weighted update would keep a trace of old networks).
* ``cbn`` (Peng et al., "Towards Better Generalization of Batch Normalization: Complete Batch
  Normalization", Eqs. 8-9): ``amat_mean = E_B[μ_B]`` (the centre) and ``amat_var`` the batch
  average of the second moment Eq. 9 folds in, taken about that final centre
  (``E_B[σ²_B + (μ_B − μ_A + β)²]`` with ``decouple=True``, ``E_B[σ²_B]`` without); the inference
  buffers then hold what eval needs to divide by exactly ``√(amat_var + ε)``, as training did.

During the pass every layer normalizes with its batch statistics (mbn with λ = 0, cbn with η = 0
and its batch folded in first, brn with r = 1, d = 0, noisy_bn without its noise unless asked),
so each later layer sees the activations of the final network, as with torch's BN in
``update_bn``. Layers frozen with
:func:`bnlab.norms.freeze` are left alone. :class:`StatisticsPass` is the pass itself, driven by
:func:`bnlab.norms.recollect_running_stats` or by a training loop that runs the batches (Lightning's
SWA epoch, :mod:`bnlab.integrations.lightning`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ..variants.complete import CompleteBatchNorm
from .freeze import stats_frozen
from ..engine.guard import nonfinite_guard_enabled, replaying
from ..variants.momentum import MomentumBatchNorm
from ..variants.noisy import NoisyBatchNorm
from ..variants.renorm import BatchRenorm

# layers whose training buffers go beyond torch's running statistics: collected by hooks
_MOVING = (MomentumBatchNorm, CompleteBatchNorm)


def tracking_layers(model: nn.Module, *, torch_layers: bool = True) -> list[nn.Module]:
    """The layers whose statistics a pass recomputes: running buffers, or mbn's/cbn's moving
    statistics (kept also with ``track_running_stats=False``); frozen layers excluded."""
    found = []
    for m in model.modules():
        if stats_frozen(m) or (not torch_layers and isinstance(m, _BatchNorm)):
            continue
        if (isinstance(m, _MOVING) or getattr(m, "running_mean", None) is not None
                or getattr(m, "running_var", None) is not None):
            found.append(m)
    return found


class _Sums:
    """Per-channel batch averages of μ_B, μ_B², σ²_B and m/(m−1)·σ²_B, in float64."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = self.mean_sq = self.var = self.var_unbiased = torch.zeros(())

    def add(self, mean: Tensor, var: Tensor, n: int) -> None:
        mean, var = mean.double(), var.double()
        self.mean = self.mean + mean
        self.mean_sq = self.mean_sq + mean * mean
        self.var = self.var + var
        self.var_unbiased = self.var_unbiased + var * (n / max(n - 1, 1))
        self.count += 1

    def averages(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        c = self.count
        return self.mean / c, self.mean_sq / c, self.var / c, self.var_unbiased / c


class StatisticsPass:
    """Reset the statistics of ``model``'s layers, let batches run through it, write the averages.

    ``start()`` resets each layer of :func:`tracking_layers`, sets ``momentum=None`` and puts the
    layers into batch-statistics mode (see the module docstring); every training-mode forward of an
    mbn/cbn layer is then counted by a forward pre-hook. ``finish()`` writes the averages, removes
    the hooks and restores momentum, λ, η, brn's limits and noisy_bn's noise. ``torch_layers=False``
    leaves torch's own BatchNorm layers to someone else (Lightning's SWA callback resets them).
    ``noise``: whether noisy_bn adds its noise during the pass.
    """

    def __init__(self, model: nn.Module, *, noise: bool = False, torch_layers: bool = True):
        self.model, self.noise = model, noise
        self.layers = tracking_layers(model, torch_layers=torch_layers)
        self.sums: dict[nn.Module, _Sums] = {}
        self._saved: list[tuple[nn.Module, str, object]] = []
        self._handles: list = []

    def _set(self, module: nn.Module, name: str, value) -> None:
        self._saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    @torch.no_grad()
    def start(self) -> StatisticsPass:
        for m in self.layers:
            getattr(m, "reset_running_stats")()  # nn.Module's typing has no such method
            self._set(m, "momentum", None)
            if isinstance(m, BatchRenorm):  # r = 1, d = 0: BN with the batch statistics
                self._set(m, "r_max", 1.0)
                self._set(m, "d_max", 0.0)
            if getattr(m, "order", "fold_first") != "fold_first":  # cbn(order=literal): the
                self._set(m, "order", "fold_first")  # batch itself at η = 0, not the previous one
            if isinstance(m, _MOVING):
                self.sums[m] = _Sums()
                self._handles.append(m.register_forward_pre_hook(self._collect))
        for m in self.model.modules():
            if isinstance(m, NoisyBatchNorm) and not stats_frozen(m):
                self._set(m, "noise", self.noise)
        return self

    def _collect(self, module: nn.Module, args: tuple) -> None:
        """Before an mbn/cbn forward: λ = 0 or η = 0 for this step, and its batch moments."""
        if not module.training or not args or not torch.is_tensor(args[0]) or args[0].numel() == 0:
            return
        with torch.no_grad():
            if isinstance(module, MomentumBatchNorm):
                module._lambda_exponent.fill_(1.0)  # λ = r¹ − r = 0
            elif isinstance(module, CompleteBatchNorm):
                module._eta.fill_(0.0)
            else:
                return
            mean, var, n = module.batch_moments(args[0])
        if replaying():  # a checkpoint's recomputation: this batch was counted in the first pass
            return
        if nonfinite_guard_enabled() and not bool(mean.isfinite().all() & var.isfinite().all()):
            return  # the guard's rule: such a batch leaves every buffer untouched
        self.sums[module].add(mean, var, n)

    @torch.no_grad()
    def finish(self) -> int:
        """Write the averages and restore the layers; returns the number of batches counted (the
        largest count of any mbn/cbn layer, else -1 when there is none)."""
        for handle in self._handles:
            handle.remove()
        for module, name, value in reversed(self._saved):
            setattr(module, name, value)
        for m in self.model.modules():
            if isinstance(m, NoisyBatchNorm) and not stats_frozen(m):
                m.noisy_statistics = self.noise and m.track_running_stats
        counts = [-1]
        for layer, sums in self.sums.items():
            _restore_schedule(layer)
            if sums.count:
                _write(layer, sums)
            counts.append(sums.count)
        return max(counts)


def _restore_schedule(layer: nn.Module) -> None:
    """λ and η from the layer's own state (its epoch, epochs, learning rate)."""
    if isinstance(layer, MomentumBatchNorm):
        if layer.epoch is not None and layer.epochs is not None and layer.epochs > 1:
            layer.set_progress(epoch=layer.epoch, epochs=layer.epochs)
        else:
            layer._lambda_exponent.fill_(1.0)
    elif isinstance(layer, CompleteBatchNorm):
        layer._eta.fill_(layer._python_eta())


def _copy(buffer: Tensor | None, value: Tensor) -> None:
    if buffer is not None:
        buffer.copy_(value.to(buffer.dtype))


def _write(layer: nn.Module, sums: _Sums) -> None:
    mean, mean_sq, var, var_unbiased = sums.averages()
    count = torch.tensor(sums.count)
    if isinstance(layer, MomentumBatchNorm):
        _copy(layer.train_mean, mean)
        _copy(layer.train_var, var)
        _copy(layer.running_mean, mean)
        _copy(layer.running_var, var_unbiased)
        _copy(layer.num_batches_tracked, count)
        return
    assert isinstance(layer, CompleteBatchNorm)
    beta = layer.bias.detach().double() if layer.bias is not None else torch.zeros_like(mean)
    centre = mean if layer.center else torch.zeros_like(mean)
    # E_B[(μ_B + a)²] = E[μ_B²] + 2a·E[μ_B] + a², the term Eq. 9 adds to σ²_B, about the centre
    shift = beta - centre if layer.decouple else torch.zeros_like(mean)
    second = var + mean_sq + 2 * shift * mean + shift**2
    if layer.center and not layer.decouple:
        second = var
    offset = mean - centre  # of the mean about the removed centre (0 when centring)
    k = offset + beta if layer.decouple else offset
    _copy(layer.amat_mean, centre)
    _copy(layer.amat_var, second)
    _copy(layer._amat_steps, count)
    _copy(layer.running_mean, centre if layer.center else mean)
    _copy(layer.running_var, second - k**2)
    _copy(layer.num_batches_tracked, count)
