"""bnlab doctor: the five papers as a diagnosis of the user's own BatchNorm network.

:func:`examine` checks a model as it stands (no training); :class:`Doctor` watches a training loop.
Both return a :class:`Report` of :class:`Finding` objects, whose codes are exactly :data:`CODES`.
"""

from .findings import CODES, Finding
from .report import Report


def __getattr__(name):
    # examine and Doctor are imported lazily so that the contract (findings, report) imports on
    # its own while the checks are built.
    if name == "examine":
        from .examine import examine

        return examine
    if name == "Doctor":
        from .watcher import Doctor

        return Doctor
    raise AttributeError(f"module 'bnlab.doctor' has no attribute {name!r}")


__all__ = ["CODES", "Doctor", "Finding", "Report", "examine"]
