"""``bnlab.doctor.examine``: the checkup of a model as it stands.

Runs the seven checks (:data:`bnlab.doctor.CODES`, one module each: ``checks_stale``,
``checks_small_batch``, ``checks_beta``, ``checks_sharpness``, ``checks_effective_lr``,
``checks_accumulation``, ``checks_double``) on the user's batches and returns a
:class:`bnlab.doctor.Report`. The model, its buffers, the optimizer state and torch's RNG states
are left bitwise as found (:func:`bnlab.doctor.state.kept`); work that changes buffers runs on deep
copies or inside the snapshot, which is rewound after every check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from . import (checks_accumulation, checks_beta, checks_double, checks_effective_lr,
               checks_sharpness, checks_small_batch, checks_stale)
from .context import MAX_BATCHES as MAX_BATCHES  # re-exported: the watcher reads it here
from .context import MIN_SAMPLES, Checkup, collect_batches, model_device
from .findings import CODES
from .report import Report
from .state import kept

CHECKS = {
    "stale-running-stats": (checks_stale.check, False),
    "small-batch": (checks_small_batch.check, False),
    "beta-swamping": (checks_beta.check, False),
    "sharpness": (checks_sharpness.check, True),
    "effective-lr": (checks_effective_lr.check, True),
    "micro-batch-statistics": (checks_accumulation.check, False),
    "double-update": (checks_double.check, True),
}
"""code -> (check function, whether it takes the snapshot)."""

def examine(model: nn.Module, loss_fn: Callable, batches: Iterable, *,
            optimizer: torch.optim.Optimizer | None = None, accumulation_steps: int = 1,
            checks: Sequence[str] | None = None, max_batches: int | None = None,
            min_samples: int = MIN_SAMPLES, hessian_iters: int = 6) -> Report:
    """Examine ``model`` as it stands and return a :class:`~bnlab.doctor.Report`.

    ``batches``: (inputs, targets) pairs at the batch size you train with (a list, a DataLoader,
    an iterator: read until ``min_samples`` samples or ``max_batches`` batches; the population
    statistics are recollected over them, so more samples make them more precise).
    ``loss_fn(model(inputs), targets)`` is the training loss. ``optimizer``: the one you train
    with (thresholds of ``sharpness`` and ``effective-lr`` need its learning rate and momentum).
    ``accumulation_steps``: micro-batches per optimizer step. ``checks``: a subset of
    :data:`~bnlab.doctor.CODES` (default all). ``hessian_iters``: Lanczos steps of the sharpness
    check. Runs on the model's device; leaves the model, its buffers, the optimizer and torch's RNG
    states bitwise as found.
    """
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) \
            or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
    chosen = list(CODES) if checks is None else list(checks)
    unknown = [c for c in chosen if c not in CODES]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; the codes are {', '.join(CODES)}")
    if not callable(loss_fn):
        raise ValueError("examine: loss_fn must be callable as loss_fn(model(inputs), targets)")
    start = time.perf_counter()
    device = model_device(model)
    report = Report()
    with kept(model, optimizer) as snapshot:
        data = collect_batches(batches, device, max_batches, min_samples)
        checkup = Checkup(model, loss_fn, data, optimizer, accumulation_steps, hessian_iters)
        seconds = {}
        for code in CODES:
            if code not in chosen:
                continue
            fn, needs_snapshot = CHECKS[code]
            t0 = time.perf_counter()
            try:
                if needs_snapshot:
                    fn(checkup, report, snapshot)
                else:
                    fn(checkup, report)
            finally:
                snapshot.restore()
            seconds[code] = time.perf_counter() - t0
    report._optimizer = optimizer  # for try_remedies' short runs; not part of to_dict()
    report.context.update({
        "model": type(model).__name__, "batch_size": checkup.batch_size, "batches": len(data),
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "lr": checkup.lr,
        "momentum": (None if optimizer is None
                     else optimizer.param_groups[0].get("momentum",
                                                        optimizer.param_groups[0].get("betas"))),
        "device": str(device), "steps": 0, "accumulation_steps": accumulation_steps,
        "checks": chosen, "seconds": time.perf_counter() - start, "seconds_by_check": seconds,
    })
    return report
