"""The run store: every run's config, status, metric rows and the catalogue's results in one SQLite
file (default ``runs/bnlab.db``), shared by every process that trains.

- :mod:`bnlab.store.database`: :class:`Store`, the one access path (WAL mode, busy timeout, retries,
  read-only opening); its methods come from the modules below.
- :mod:`bnlab.store.schema`: the tables, the schema version, migration and opening a file.
- :mod:`bnlab.store.metrics`: a run's metric rows (writing, syncing, reading, exporting).
- :mod:`bnlab.store.integrity`: the seal of an ended run and its checks on every read.
- :mod:`bnlab.store.entries`: the catalogue's results (the ``experiments`` table).
- :mod:`bnlab.store.run_files`: a run's files beside the store (checkpoint paths, the run lock).

``from bnlab.store import Store`` is what a user needs; the errors are here to be caught.
"""

from bnlab.store.database import STATUSES, Store
from bnlab.store.integrity import StoreIntegrityError
from bnlab.store.metrics import EXPORT_FORMATS
from bnlab.store.schema import (
    SCHEMA_VERSION, ReadOnlyStoreError, StoreCorruptError, StoreVersionError,
)

__all__ = [
    "Store",
    "STATUSES",
    "SCHEMA_VERSION",
    "EXPORT_FORMATS",
    "StoreIntegrityError",
    "StoreCorruptError",
    "StoreVersionError",
    "ReadOnlyStoreError",
]
