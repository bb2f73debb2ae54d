"""micro-batch-statistics: BN normalizes over micro-batches smaller than the optimizer's batch.

With gradient accumulation over k micro-batches of b samples, the optimizer steps on k·b samples
but every BN layer normalizes each micro-batch with its own statistics: the training function is
BN at batch b (noise ~1/m per channel, Yong et al., Momentum Batch Normalization, Theorem 1, with m
from b, not k·b), and the running statistics take k EMA steps per optimizer step. The value is the
micro-batch size b, the threshold the optimizer's batch k·b; it warns whenever k > 1 and some BN
layer normalizes with batch statistics in training (a BN layer the user froze in eval mode inside a
training model does not).

Cost: none (reads ``accumulation_steps`` and the layers).
"""

from __future__ import annotations

import bnlab.norms

from bnlab.probes.base import bn_layers

from .context import Checkup, frozen_layers
from .findings import Finding

PAPER = ("Yong, Huang, Meng, Hua & Zhang, Momentum Batch Normalization for Deep Learning with "
         "Small Batch Size (ECCV 2020), Theorem 1: the noise is set by the normalized batch")
WHY = ("BN's statistics come from the batch it sees; accumulation does not enlarge it, so any "
       "k > 1 trains a different function from one step on k·b samples (no false alarm: it "
       "reads the accumulation you declare)")


def remedy(k: int) -> str:
    """Name bnlab's accumulation switch where it exists (``bnlab.norms.accumulate``), else what
    smooths statistics across micro-batches."""
    if hasattr(bnlab.norms, "accumulate"):
        return (f"with bnlab.norms.accumulate(model, steps={k}): one statistics update per "
                "optimizer step from the union of the micro-batches (normalize='full' and "
                "acc.step(inputs, loss_fn) for the full batch's outputs and gradients); it acts on "
                "bnlab's layers: bnlab.norms.convert(model, 'bn') replaces torch's first")
    return ("a larger micro-batch; or smooth the statistics across micro-batches with "
            "bnlab.norms.create('mbn') or 'brn'; divide momentum by "
            f"{k} to keep the running statistics' horizon")


def check(checkup: Checkup, report) -> None:
    k = int(checkup.accumulation_steps)
    frozen = frozen_layers(checkup.model)
    layers = [n for n, _ in bn_layers(checkup.model) if n not in frozen]
    if k <= 1 or not layers:
        return
    b = checkup.batch_size
    report.add(Finding(
        "micro-batch-statistics", "warn", tuple(layers), float(b), float(k * b), WHY, PAPER,
        remedy(k), f"{len(layers)} BN layer(s) normalize over micro-batches of {b}, the optimizer "
        f"steps on {k}×{b} = {k * b}"))
