"""Progress of a training run on stderr: a tqdm bar or occasional lines."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A tqdm bar (``"bar"``, or ``None`` on a terminal) or at most one line per epoch and 5 s
    (``"lines"``); shows the loss read at the last check (reading it here would sync)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        mode = trainer.progress_mode
        if mode is None:
            mode = "bar" if _is_tty() else None
        self.lines = mode == "lines"
        self.started = time.perf_counter()
        self.start_step = trainer.step
        self.last_line = 0.0
        self.bar = None
        if mode is True or mode == "bar":
            from tqdm.auto import tqdm

            cfg = trainer.config
            self.bar = tqdm(total=trainer.total_steps, initial=trainer.step, unit="step",
                            desc=f"{cfg.model}/{cfg.norm}", file=sys.stderr, dynamic_ncols=True)

    def line_due(self, epoch_end: bool) -> bool:
        """Whether :meth:`update` will print a line for this step (so the loss must be read)."""
        return bool(epoch_end and self.lines and (time.perf_counter() - self.last_line >= 5.0
                                                  or self.trainer.step == self.trainer.total_steps))

    def update(self, epoch: int, epoch_end: bool, last_eval: dict[str, float]) -> None:
        t = self.trainer
        if self.bar is not None and (t.step % 10 == 0 or t.step == t.total_steps):
            self.bar.update(t.step - self.bar.n)
            self.bar.set_postfix({"loss": t.last_loss}, refresh=False)
        if epoch_end and self.lines:
            now = time.perf_counter()
            if now - self.last_line >= 5.0 or t.step == t.total_steps:
                self.last_line = now
                rate = (t.step - self.start_step) / max(now - self.started, 1e-9)
                shown = {"loss": t.last_loss, **last_eval}
                print(
                    f"[{t.run_id}] epoch {epoch + 1}/{t.prep.total_epochs} step {t.step}/{t.total_steps} "
                    + " ".join(f"{k} {v:.4g}" for k, v in shown.items())
                    + f" {rate:.1f} steps/s",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.trainer.step - self.bar.n)
            self.bar.close()


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
