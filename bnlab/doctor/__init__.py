"""bnlab doctor: the five papers as a diagnosis of the user's own BatchNorm network.

:func:`examine` checks a model as it stands (no training); :class:`Doctor` watches a training loop.
Both return a :class:`Report` of :class:`Finding` objects, whose codes are exactly :data:`CODES`.
User guide: docs/readme/doctor.md.
"""

from .findings import CODES, Finding
from .report import Report
from .examine import examine  # isort: skip (binds the function over the submodule's name)
from .watcher import Doctor


__all__ = ["CODES", "Doctor", "Finding", "Report", "examine"]
