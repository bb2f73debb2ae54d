"""The metric window: the one owner of a run's per-step training values (:mod:`bnlab.train.engine`).

Each step :meth:`MetricWindow.push` keeps its loss (and, for classification, its correct count) on
the device: no host sync. :meth:`MetricWindow.read` reads every value since the last read in one
transfer each, adds them to the epoch sums on the host, and returns the rows to record. The window
also keeps the first loss (the divergence reference), the last loss read (shown by the progress
line) and the losses read but not yet scanned for divergence; its :meth:`state_dict` is the part of
a checkpoint that makes a resumed run's epoch means bitwise those of an uninterrupted run.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class MetricWindow:
    """The steps since the last read, the epoch's sums, the first and the last loss.

    ``steps_per_epoch``, ``log_every`` and ``total_steps`` fix which steps give rows:
    ``train_loss``/``train_accuracy`` every ``log_every`` steps (and step 1), the epoch means
    (``epoch_train_loss``, ...) at each epoch's last step."""

    def __init__(self, *, steps_per_epoch: int, log_every: int, total_steps: int,
                 classification: bool) -> None:
        self.steps_per_epoch, self.log_every = steps_per_epoch, log_every
        self.total_steps, self.classification = total_steps, classification
        self._losses: list[torch.Tensor] = []  # on the device, one 0-d tensor per step
        self._correct: list[torch.Tensor] = []
        self._sizes: list[int] = []  # batch sizes, on the host
        self._unscanned: list[tuple[int, list[float]]] = []  # (first step, losses) not yet checked
        self.start_loss: float | None = None  # the first step's loss: the divergence reference
        self.last_loss = math.nan  # the latest loss read
        self.reset_epoch()

    def __len__(self) -> int:
        """Steps pushed and not yet read."""
        return len(self._losses)

    def reset_epoch(self) -> None:
        """The epoch's sums (host numbers, fed from the steps read)."""
        self.loss_sum, self.correct, self.count, self.batches = 0.0, 0, 0, 0

    def push(self, loss: torch.Tensor, size: int, correct: torch.Tensor | None = None) -> None:
        """One step's detached loss, its batch size and (classification) correct count."""
        self._losses.append(loss)
        self._sizes.append(size)
        if correct is not None:
            self._correct.append(correct)

    def read(self, step: int) -> list[tuple[int, str, float]]:
        """Read the steps up to ``step`` (the last one pushed), add them to the epoch sums, and
        return their rows."""
        if not self._losses:
            return []
        losses = torch.stack(self._losses).tolist()
        corrects = torch.stack(self._correct).tolist() if self._correct else None
        sizes, first = self._sizes, step - len(losses) + 1
        self._losses, self._correct, self._sizes = [], [], []
        rows: list[tuple[int, str, float]] = []
        for i, loss in enumerate(losses):
            rows += self._add(first + i, loss, sizes[i], corrects[i] if corrects else None)
        if self.start_loss is None and first == 1:
            self.start_loss = losses[0]
        self.last_loss = losses[-1]
        self._unscanned.append((first, losses))
        return rows

    def _add(self, step: int, loss: float, size: int, correct: float | None
             ) -> list[tuple[int, str, float]]:
        if (step - 1) % self.steps_per_epoch == 0:
            self.reset_epoch()
        self.loss_sum += loss
        self.batches += 1
        self.count += size
        if correct is not None:
            self.correct += int(correct)
        rows: list[tuple[int, str, float]] = []
        if step % self.log_every == 0 or step == 1:
            rows.append((step, "train_loss", loss))
            if correct is not None:
                rows.append((step, "train_accuracy", correct / size))
        if step % self.steps_per_epoch == 0 or step == self.total_steps:
            means = self.epoch_means()
            rows.extend((step, f"epoch_{name}", value) for name, value in means.items())
        return rows

    def take_unscanned(self) -> list[tuple[int, list[float]]]:
        """The losses read since the last divergence scan, as ``(first step, losses)``."""
        out, self._unscanned = self._unscanned, []
        return out

    def epoch_means(self) -> dict[str, float]:
        if self.batches == 0:
            return {}
        out = {"train_loss": self.loss_sum / self.batches}
        if self.classification and self.count:
            out["train_accuracy"] = self.correct / self.count
        return out

    # -- checkpoints (the keys of earlier bnlab checkpoints: they load unchanged) -----------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "accumulators": {"loss_sum": self.loss_sum, "correct": self.correct,
                             "count": self.count, "batches": self.batches},
            "last_loss": self.last_loss,
            "start_loss": self.start_loss,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        acc = state["accumulators"]
        self.loss_sum, self.correct = float(acc["loss_sum"]), int(acc["correct"])
        self.count, self.batches = int(acc["count"]), int(acc["batches"])
        self.last_loss = float(state["last_loss"])
        start = state.get("start_loss")
        self.start_loss = float(start) if start is not None else None
