"""The watched window of :class:`bnlab.doctor.Doctor`: hooks that live for one watched step.

Armed at the end of the step before a watched one (and at the start), closed at the end of the
watched step, so that the steps in between run with no doctor hook at all:

- ``checks_double.UpdateCounter`` counts the model's training forwards and each BN layer's
  running-statistics updates (its counts add up over the windows: double-update);
- a forward pre-hook on each BN layer that keeps running statistics reads, at the layer's first
  training call in the window, its running statistics (what eval would use, before this batch
  updates them) against the statistics of the batch it normalizes: the mean shift in batch SDs,
  mean_c |μ_run − μ_B| / σ_B, and half the absolute log variance ratio, mean_c |½ log(σ²_run /
  σ²_B)| (the distances of ``checks_stale``, against the batch instead of the population), with m,
  the values per channel. Both are read back once per window (one host transfer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .checks_double import UpdateCounter
from .context import tracking_layers


class WatchWindow:
    """The hooks of one watched step; ``series`` receives ``running_lag`` and
    ``running_lag_detail`` (see :mod:`bnlab.doctor.watcher`)."""

    def __init__(self, series: dict[str, Any]) -> None:
        self.series = series
        self.counter: UpdateCounter | None = None
        self._counting = False
        self._captured: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._handles: list = []

    def arm(self, model: nn.Module | None) -> None:
        if model is None:
            return
        if self.counter is None:
            self.counter = UpdateCounter(model)
        if not self._counting:
            self.counter.attach()
            self._counting = True
        self._remove_capture()
        self._captured = {}
        for name, module in tracking_layers(model):
            self._handles.append(module.register_forward_pre_hook(self._capture_hook(name)))

    def _capture_hook(self, name: str):
        def capture(mod: nn.Module, inputs: tuple) -> None:
            if name in self._captured or not mod.training or not inputs:
                return
            x = inputs[0]
            running_mean, running_var = mod.running_mean, mod.running_var
            if (not torch.is_tensor(x) or not isinstance(running_mean, torch.Tensor)
                    or not isinstance(running_var, torch.Tensor) or x.dim() < 2
                    or x.shape[1] != running_mean.numel()):
                return
            with torch.no_grad():
                dims = [0, *range(2, x.dim())]
                values = x.detach().float()
                var, mean = torch.var_mean(values, dims)
                eps = float(getattr(mod, "eps", 1e-5))
                run_mean = running_mean.detach().float()
                run_var = running_var.detach().float()
                shift = ((run_mean - mean).abs() / (var + eps).sqrt()).mean()
                log_ratio = (0.5 * torch.log((run_var + eps) / (var + eps))).abs().mean()
            self._captured[name] = (shift, log_ratio, x.numel() // x.shape[1])

        return capture

    def close(self, step: int) -> None:
        """End of a step: record what the window captured, remove the capture hooks."""
        if self._captured:
            names = list(self._captured)
            values = torch.stack([torch.stack([self._captured[n][0], self._captured[n][1]]).cpu()
                                  for n in names]).tolist()
            for name, (shift, log_ratio) in zip(names, values):
                m = self._captured[name][2]
                self.series["running_lag"].setdefault(name, []).append((step, shift))
                self.series["running_lag_detail"].setdefault(name, []).append(
                    (step, shift, log_ratio, m))
        self._captured = {}
        self._remove_capture()

    def _remove_capture(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def stop_counting(self) -> None:
        if self.counter is not None and self._counting:
            self.counter.detach()
            self._counting = False

    def disarm(self) -> None:
        self._remove_capture()
        self._captured = {}
        self.stop_counting()
