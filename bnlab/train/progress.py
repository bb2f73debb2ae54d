"""Progress of a training run on stderr: a tqdm bar or occasional lines.

:class:`Progress` owns everything about what is shown (the mode, the bar, when the last line was
printed, the rate's starting point); the trainer hands it the step and the last loss read, and
never the trainer itself.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A tqdm bar (``"bar"``, or ``None`` on a terminal) or at most one line per epoch and 5 s
    (``"lines"``; ``False``: nothing); shows the loss read at the last check (reading it here would
    sync). ``label`` names the run on the bar (``model/norm``), ``run_id`` on the lines."""

    def __init__(self, mode: Any, *, run_id: str, label: str, start_step: int, total_steps: int,
                 total_epochs: int) -> None:
        if mode is None:
            mode = "bar" if _is_tty() else None
        self.run_id, self.total_steps, self.total_epochs = run_id, total_steps, total_epochs
        self.lines = mode == "lines"
        self.started = time.perf_counter()
        self.start_step = start_step
        self.last_line = 0.0
        self.bar = None
        if mode is True or mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", desc=label,
                            file=sys.stderr, dynamic_ncols=True)

    def line_due(self, step: int, epoch_end: bool) -> bool:
        """Whether :meth:`update` will print a line for this step (so the loss must be read)."""
        return bool(epoch_end and self.lines and (time.perf_counter() - self.last_line >= 5.0
                                                  or step == self.total_steps))

    def update(self, step: int, last_loss: float, epoch: int, epoch_end: bool,
               last_eval: dict[str, float]) -> None:
        if self.bar is not None and (step % 10 == 0 or step == self.total_steps):
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix({"loss": last_loss}, refresh=False)
        if epoch_end and self.lines:
            now = time.perf_counter()
            if now - self.last_line >= 5.0 or step == self.total_steps:
                self.last_line = now
                rate = (step - self.start_step) / max(now - self.started, 1e-9)
                shown = {"loss": last_loss, **last_eval}
                print(
                    f"[{self.run_id}] epoch {epoch + 1}/{self.total_epochs} "
                    f"step {step}/{self.total_steps} "
                    + " ".join(f"{k} {v:.4g}" for k, v in shown.items())
                    + f" {rate:.1f} steps/s",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.close()


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
