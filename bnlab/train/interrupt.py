"""Ctrl-C and SIGTERM at a step boundary: the first signal asks the run to stop, the step in flight
completes, a checkpoint is written, and the run ends ``interrupted``.

A ``KeyboardInterrupt`` raised wherever the signal lands can cut a store write or a checkpoint in
two, and the run's last record is then whatever state that write left. Deferring it to the next
step boundary (as Lightning does for SIGTERM) makes an interrupted run always end with its rows
flushed, a checkpoint at that step and its status ``interrupted``. SIGTERM -- what ``timeout``,
``kill`` and schedulers (Slurm, Kubernetes) send -- is handled exactly like Ctrl-C. A second signal
raises at once, for a step that hangs; after that, and while the run records how it ended
(:meth:`hold`), further signals are counted and ignored, so a third Ctrl-C cannot cut the ending
short. The signal that stopped the run is kept (:attr:`signum`): the CLI exits with
``128 + signum`` as a shell does.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# the signals deferred, each only over Python's default handler (a user's is left alone)
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class InterruptedBeforeTraining(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM while the run was still being set up (before anything was
    stored): nothing to resume. ``signum``: the first signal."""

    def __init__(self, signum: int | None) -> None:
        self.signum = int(signum or signal.SIGINT)
        super().__init__(f"interrupted during set-up ({signal.Signals(self.signum).name}), "
                         "before the run was stored: nothing to resume, re-run the command")


class DeferredInterrupt:
    """Context manager: while active, the first SIGINT or SIGTERM sets :attr:`requested` instead of
    raising; the second raises ``KeyboardInterrupt``; later ones are ignored.

    Only installed when ``enabled``, from the main thread, and per signal only over its default
    handler; otherwise it does nothing and Ctrl-C raises as usual. Data-parallel ranks don't defer:
    each would stop at a different step and leave the others waiting in a collective.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self.signum: int | None = None  # the first signal received
        self.count = 0
        self.held = False
        # set while the run is set up (bnlab.train.loop.run installs this before it builds data,
        # model and optimizer): a second signal then says nothing was stored
        self.setting_up = False
        self._previous: dict[int, object] = {}
        self._depth = 0  # re-entered by the engine inside the loop's own `with` (one installation)

    def __enter__(self) -> DeferredInterrupt:
        self._depth += 1
        if (
            self._depth == 1
            and self.enabled
            and threading.current_thread() is threading.main_thread()
        ):
            for signum, default in _DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if not self.requested:
            self.requested, self.signum = True, signum
        elif self.count == 2 and not self.held:  # the second signal: stop now (a hung step)
            if self.setting_up:
                raise InterruptedBeforeTraining(self.signum)
            raise KeyboardInterrupt

    def hold(self) -> None:
        """From now on signals are only counted: the run is recording how it ended."""
        self.held = True

    def raise_if_requested(self) -> None:
        """At a step boundary: a pending signal becomes the run's ``KeyboardInterrupt``."""
        if self.requested:
            raise KeyboardInterrupt
