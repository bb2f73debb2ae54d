"""Warnings that point at the user's line, however deep in torch and bnlab they are raised.

A fixed ``stacklevel`` is right for one call path only: a layer's ``forward`` is reached through
``nn.Module.__call__`` (two torch frames), and through every container above it (two more each), so
``stacklevel=4`` would name torch's ``container.py`` for a layer inside an ``nn.Sequential``.
:func:`warn` walks up to the first frame outside the torch and bnlab packages instead (what
Python 3.12's ``skip_file_prefixes`` does; bnlab supports 3.10).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

import bnlab

_INTERNAL = tuple(os.path.dirname(os.path.abspath(str(m.__file__))) + os.sep
                  for m in (bnlab, torch))


def user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside torch and bnlab, for a ``warnings.warn`` called
    by the caller of this function."""
    frame, level = sys._getframe(1), 1  # level 1: the frame that calls warnings.warn
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _INTERNAL
    ):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
