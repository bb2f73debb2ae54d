"""The trainer's window: the steps since the last read of the device values (see :mod:`bnlab.train.engine`).

Read in one transfer each for the losses and the correct counts, added to the epoch sums on the host.
"""

from __future__ import annotations

from typing import Any

import torch


def read_window(trainer: Any) -> list[tuple[int, str, float]]:
    """Read the steps since the last read (one transfer each for losses and correct counts),
    add them to the epoch sums, and return their rows: ``train_loss``/``train_accuracy`` every
    ``log_every`` steps (and step 1), the epoch means at each epoch's last step."""
    if not trainer.window:
        return []
    losses = torch.stack(trainer.window).tolist()
    corrects = torch.stack(trainer.window_correct).tolist() if trainer.window_correct else None
    sizes, first = trainer.window_sizes, trainer.step - len(losses) + 1
    trainer.window, trainer.window_correct, trainer.window_sizes = [], [], []
    rows: list[tuple[int, str, float]] = []
    for i, loss in enumerate(losses):
        step = first + i
        if (step - 1) % trainer.spe == 0:
            trainer._reset_accumulators()
        trainer.acc_loss += loss
        trainer.acc_batches += 1
        trainer.acc_count += sizes[i]
        if corrects is not None:
            trainer.acc_correct += int(corrects[i])
        if step % trainer.log_every == 0 or step == 1:
            rows.append((step, "train_loss", loss))
            if corrects is not None:
                rows.append((step, "train_accuracy", corrects[i] / sizes[i]))
        if step % trainer.spe == 0 or step == trainer.total_steps:
            rows.extend((step, f"epoch_{name}", value) for name, value in trainer.epoch_means().items())
    if trainer.start_loss is None and first == 1:
        trainer.start_loss = losses[0]
    trainer.last_loss = losses[-1]
    trainer.unscanned.append((first, losses))
    return rows
