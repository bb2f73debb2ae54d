"""Ctrl-C at a step boundary: the first SIGINT asks the run to stop, the step in flight completes.

A ``KeyboardInterrupt`` raised wherever the signal lands can cut a store write or a checkpoint in two,
and the run's last record is then whatever state that write left. Deferring it to the next step
boundary (as Lightning does for SIGTERM) makes an interrupted run always end with its rows flushed and
its status ``interrupted``. A second Ctrl-C raises at once, for a step that hangs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class DeferredInterrupt:
    """Context manager: while active, the first SIGINT sets :attr:`requested` instead of raising.

    Only installed when ``enabled``, from the main thread, and only over Python's default SIGINT
    handler (a handler the user or a framework set is left alone); otherwise it does nothing and
    Ctrl-C raises as usual. Data-parallel ranks don't defer: each would stop at a different step and
    leave the others waiting in a collective.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self._previous: object = None
        self._installed = False

    def __enter__(self) -> DeferredInterrupt:
        if (self.enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # the second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def raise_if_requested(self) -> None:
        """At a step boundary: turn a pending Ctrl-C into the ``KeyboardInterrupt`` the run handles."""
        if self.requested:
            raise KeyboardInterrupt
