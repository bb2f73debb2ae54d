"""double-update: running statistics updated more than once per training forward.

BN's running statistics are meant to take one EMA step per training batch (Ioffe & Szegedy 2015,
§3.1; the population estimate of Algorithm 2). Activation checkpointing (``torch.utils.checkpoint``)
runs a segment's forward again during backward, in train mode, so every BN inside it updates its
running statistics twice — with ``momentum`` 0.1 the EMA forgets twice as fast, and
``num_batches_tracked`` counts double (fatal for ``momentum=None``'s cumulative average). A BN
module called twice in one forward (shared between branches) does the same.

Measured with :class:`UpdateCounter`: hooks count the model's top-level forward calls and, per BN
layer, the calls that changed its statistics (``num_batches_tracked`` or the version counter of
``running_mean``/``running_var``, which every in-place update bumps) during one forward and
backward. The value is the largest number of updates per forward; it warns above 1 (exactly 1 in any
correct loop: no false alarms are possible short of a BN shared on purpose).

Cost: one forward and backward on the first batch (rewound afterwards).
"""

from __future__ import annotations

import torch
from torch import nn

from bnlab.probes.base import bn_layers

from .context import Checkup, as_trained
from .findings import Finding

THRESHOLD = 1.0
PAPER = ("Ioffe & Szegedy, Batch Normalization (2015), §3.1 and Algorithm 2: one "
         "running-statistics update per training mini-batch")
WHY = ("a BN layer updates its running statistics once per training forward; more is a bug "
       "(exactly 1 in all 320 healthy networks of benchmarks/doctor_false_alarms.py)")


def _marker(module: nn.Module) -> tuple:
    out = []
    for name in ("num_batches_tracked", "running_mean", "running_var"):
        tensor = getattr(module, name, None)
        if torch.is_tensor(tensor):
            out.append(tensor._version)
            if name == "num_batches_tracked":
                out.append(int(tensor))
    return tuple(out)


class UpdateCounter:
    """Count running-statistics updates per BN layer against the model's forward calls.

    ``with UpdateCounter(model) as counter: ...`` (or ``attach()``/``detach()`` for a watcher that
    keeps it across steps). ``forwards``: top-level ``model(...)`` calls in train mode;
    ``updates[layer]``: calls of that layer that changed ``num_batches_tracked`` or bumped the
    version counter of its running statistics; ``per_forward()``: updates / forwards per layer;
    ``reset()`` zeroes the counts.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers = [(n, m) for n, m in bn_layers(model) if _marker(m)]
        self.forwards = 0
        self.updates = {n: 0 for n, _ in self.layers}
        self._before: dict[str, tuple] = {}
        self._handles: list = []

    def reset(self) -> None:
        self.forwards = 0
        self.updates = {n: 0 for n, _ in self.layers}

    def attach(self) -> UpdateCounter:
        def top(module, inputs):
            if module.training:
                self.forwards += 1

        self._handles.append(self.model.register_forward_pre_hook(top))
        for name, module in self.layers:
            def pre(mod, inputs, name=name):
                self._before[name] = _marker(mod)

            def post(mod, inputs, output, name=name):
                if _marker(mod) != self._before.pop(name, None):
                    self.updates[name] += 1

            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> UpdateCounter:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def per_forward(self) -> dict[str, float]:
        return {n: (u / self.forwards if self.forwards else 0.0) for n, u in self.updates.items()}


def finding(per_forward: dict[str, float], forwards: int) -> Finding | None:
    """The double-update finding for counts ``per_forward`` (None when every layer is at most 1):
    shared with the training-time watcher."""
    doubled = {n: v for n, v in per_forward.items() if v > THRESHOLD}
    if not doubled:
        return None
    worst = max(doubled, key=doubled.get)
    return Finding(
        "double-update", "warn", tuple(sorted(doubled, key=lambda n: -doubled[n])),
        doubled[worst], THRESHOLD, WHY, PAPER,
        "activation checkpointing re-runs BN in backward: bnlab.norms.convert(model, 'bn') "
        "(bnlab's layers replay the recomputation from a record and update once), or keep BN "
        "outside "
        "checkpointed segments; then bnlab.norms.recollect_running_stats(model, batches) to "
        "repair the statistics",
        f"{worst} updated {doubled[worst]:g}× per training forward ({forwards} forward(s), one "
        "backward)")


def check(checkup: Checkup, report, snapshot) -> None:
    model = checkup.model
    if not bn_layers(model):
        return
    snapshot.reset_forward_state()
    as_trained(model)
    x, y = checkup.batches[0]
    with UpdateCounter(model) as counter, torch.enable_grad():
        loss = checkup.loss_fn(model(x), y)
        if loss.requires_grad:
            loss.backward()
    per = counter.per_forward()
    report.measurements["updates_per_forward"] = per
    found = finding(per, counter.forwards)
    if found is not None:
        report.add(found)
