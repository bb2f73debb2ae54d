"""Helpers shared by the store tests: a Store that records its opens, and a damaged index page."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bnlab.store import Store


def track_stores(monkeypatch, module) -> list:
    """Every :class:`Store` that ``module`` opens from now on, each with ``closed`` telling whether
    it was closed (``module.Store`` is replaced for the test)."""
    stores: list[Store] = []

    class Tracked(Store):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            stores.append(self)

        def close(self) -> None:
            self.closed = True
            super().close()

    monkeypatch.setattr(module, "Store", Tracked)
    return stores


def garble_an_index(db: Path) -> None:
    """Zero bytes of the metrics index's root page: damage SQLite's ``quick_check`` finds."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'metrics_by_run'").fetchone()[0]
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    raw[(root - 1) * page + 8:(root - 1) * page + 64] = bytes(56)
    db.write_bytes(bytes(raw))
