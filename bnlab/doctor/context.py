"""What every check of :func:`bnlab.doctor.examine` shares: the model, the batches on the model's
device, the optimizer, and the evaluations the checks repeat (eval loss and accuracy under a
choice of statistics, the population statistics recollected on a copy).

The BN layers the doctor examines are torch's ``nn.modules.batchnorm._BatchNorm`` subclasses
(``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``, timm's ``BatchNormAct2d``) and bnlab's
``ChannelNorm`` layers (:func:`bnlab.probes.base.is_bn_layer`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bnlab.norms import recollect_running_stats
from bnlab.probes.base import bn_layers, is_bn_layer

MIN_SAMPLES = 512
"""Samples read from the user's batches by default (the population statistics' sample)."""
MAX_BATCHES = 64


def model_device(model: nn.Module) -> torch.device:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


def tracking_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """BN layers that keep running statistics (eval normalizes with them)."""
    return [(n, m) for n, m in bn_layers(model)
            if getattr(m, "running_mean", None) is not None
            and getattr(m, "running_var", None) is not None]


def as_trained(model: nn.Module) -> nn.Module:
    """Put ``model`` in the modes it trains in: a model in train mode keeps each module's flag (a
    BN layer the user froze in eval mode stays frozen); a model in eval mode is switched to train
    mode throughout. The caller restores the flags (examine's snapshot, or a discarded copy)."""
    if not model.training:
        model.train()
    return model


def frozen_layers(model: nn.Module) -> set[str]:
    """BN layers kept in eval mode inside a model in train mode: they normalize with their running
    statistics while the model trains, and neither compute nor update batch statistics."""
    if not model.training:
        return set()
    return {name for name, module in bn_layers(model) if not module.training}


def optimizer_lr(optimizer: torch.optim.Optimizer | None) -> float | None:
    if optimizer is None or not optimizer.param_groups:
        return None
    return float(optimizer.param_groups[0]["lr"])


@dataclass
class Checkup:
    """The inputs of one examination, and cached measurements the checks share."""

    model: nn.Module
    loss_fn: Callable
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    optimizer: torch.optim.Optimizer | None = None
    accumulation_steps: int = 1
    hessian_iters: int = 6
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    @property
    def batch_size(self) -> int:
        return int(self.batches[0][0].shape[0])

    @property
    def lr(self) -> float | None:
        return optimizer_lr(self.optimizer)

    # -- evaluations ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None, train: bool = False) -> dict[str, float]:
        """Mean loss (and accuracy when the outputs are class scores) over the batches, in eval mode
        (running statistics) or, with ``train=True``, train mode (batch statistics; the caller
        owns the buffers this updates)."""
        model = self.model if model is None else model
        modes = {m: m.training for m in model.modules()}
        if train:
            as_trained(model)
        else:
            model.eval()
        total, correct, count, scored = 0.0, 0, 0, True
        try:
            for x, y in self.batches:
                out = model(x)
                total += float(self.loss_fn(out, y)) * x.shape[0]
                count += x.shape[0]
                if (torch.is_tensor(out) and out.dim() == 2 and y.dim() == 1
                        and not y.dtype.is_floating_point):
                    correct += int((out.argmax(1) == y).sum())
                else:
                    scored = False
        finally:
            for m, mode in modes.items():
                m.training = mode
        result = {"loss": total / max(count, 1)}
        if scored:
            result["accuracy"] = correct / max(count, 1)
        return result

    def population_model(self) -> nn.Module:
        """A deep copy of the model whose running statistics are recollected over the batches
        (:func:`bnlab.norms.recollect_running_stats`, momentum None: Ioffe & Szegedy's Alg. 2)."""
        if "population_model" not in self.cache:
            twin = copy.deepcopy(self.model)
            if tracking_layers(twin):
                recollect_running_stats(twin, [x for x, _ in self.batches])
            self.cache["population_model"] = twin
        return self.cache["population_model"]

    def population_stats(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        twin = dict(self.population_model().named_modules())
        return {name: (twin[name].running_mean.detach().double().clone(),
                       twin[name].running_var.detach().double().clone())
                for name, _ in tracking_layers(self.model)}

    def stat_modes(self) -> dict[str, dict[str, float]]:
        """Eval loss/accuracy with the running statistics, the population statistics, and train
        mode (each batch's own statistics)."""
        if "stat_modes" not in self.cache:
            twin = self.population_model()
            modes = {"running": self.evaluate(), "population": self.evaluate(twin)}
            batch_twin = copy.deepcopy(self.model)
            modes["batch"] = self.evaluate(batch_twin, train=True)
            self.cache["stat_modes"] = modes
        return self.cache["stat_modes"]


def finite(value: float, default: float = math.nan) -> float:
    return value if math.isfinite(value) else default


@torch.no_grad()
def dataflow(model: nn.Module, x: torch.Tensor) -> list[tuple[str, str]]:
    """(producer, consumer) pairs of leaf modules where the consumer's first input is the very
    tensor the producer returned, from one train-mode forward of ``x`` (call it on a copy: the
    forward updates buffers). Functional calls between modules (``torch.tanh(x)``) break the chain
    and are not seen."""
    produced: dict[int, str] = {}
    keep: list[torch.Tensor] = []  # holds the tensors so their ids are not reused
    edges: list[tuple[str, str]] = []
    handles = []
    for name, module in model.named_modules():
        if any(True for _ in module.children()) and not is_bn_like(module):
            continue

        def pre(mod, inputs, name=name):
            if inputs and torch.is_tensor(inputs[0]) and id(inputs[0]) in produced:
                edges.append((produced[id(inputs[0])], name))

        def post(mod, inputs, output, name=name):
            if torch.is_tensor(output):
                produced[id(output)] = name
                keep.append(output)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        as_trained(model)
        model(x)
    finally:
        for h in handles:
            h.remove()
    return edges


def is_bn_like(module: nn.Module) -> bool:
    return is_bn_layer(module)


def collect_batches(batches, device: torch.device, max_batches: int | None,
                    min_samples: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The user's (inputs, targets) pairs on ``device``: until ``min_samples`` samples, or
    ``max_batches`` batches when given. A single pair is one batch. A batch smaller than the first
    (a loader's ragged last batch) is skipped: the checks measure statistics at one batch size,
    and a last batch of one sample cannot be normalized in train mode."""
    if isinstance(batches, (tuple, list)) and len(batches) == 2 and torch.is_tensor(batches[0]):
        batches = [batches]
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    samples = 0
    limit = MAX_BATCHES if max_batches is None else max_batches
    for batch in batches:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2 or not torch.is_tensor(batch[0]):
            raise ValueError("examine: batches must yield (inputs, targets) pairs of tensors, got "
                             f"{type(batch).__name__}")
        x, y = batch[0], batch[1]
        if out and x.shape[0] < out[0][0].shape[0]:
            continue
        out.append((x.to(device), y.to(device) if torch.is_tensor(y) else y))
        samples += int(x.shape[0])
        if len(out) >= limit or (max_batches is None and samples >= min_samples):
            break
    if not out:
        raise ValueError("examine: batches is empty; pass an iterable of (inputs, targets)")
    return out
