"""The run store's layout, its version, and how a store file is opened (see :mod:`bnlab.store`).

The layout's version is kept in SQLite's ``PRAGMA user_version``. Version 0 is an unversioned
store of an earlier bnlab: read if it has the columns a store needs, migrated (missing optional
columns added with their defaults, the version stamped) on the first writable open. A newer
version, or a file whose tables lack those columns, is refused with :class:`StoreVersionError`
naming what it found, never misread.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

#: Version of the layout below, stored in ``PRAGMA user_version``.
SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 60_000

TABLES = """
CREATE TABLE IF NOT EXISTS runs (
    id          TEXT PRIMARY KEY,
    config      TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    status      TEXT NOT NULL,
    created     REAL NOT NULL,
    updated     REAL NOT NULL,
    finished    REAL,
    env         TEXT,
    steps       INTEGER NOT NULL DEFAULT 0,
    error       TEXT,
    summary     TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_hash ON runs(config_hash);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL,
    step   INTEGER NOT NULL,
    name   TEXT NOT NULL,
    value  REAL
);
CREATE INDEX IF NOT EXISTS metrics_by_run ON metrics(run_id, name, step);
CREATE TABLE IF NOT EXISTS experiments (
    id TEXT NOT NULL, preset TEXT NOT NULL, runs TEXT NOT NULL, data TEXT NOT NULL,
    tiny INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, seconds REAL,
    PRIMARY KEY (id, preset)
);
"""

# Columns a store must have to be read at all, and those an older layout may lack (added with
# their defaults by the migration from version 0).
REQUIRED = {"runs": ("id", "config", "status", "created"), "metrics": ("run_id", "step", "name", "value")}
ADDABLE = {
    "runs": {
        "config_hash": "TEXT NOT NULL DEFAULT ''",
        "updated": "REAL NOT NULL DEFAULT 0",
        "finished": "REAL",
        "env": "TEXT",
        "steps": "INTEGER NOT NULL DEFAULT 0",
        "error": "TEXT",
        "summary": "TEXT",
    }
}


class StoreVersionError(ValueError):
    """The store was written by a bnlab this version cannot read (newer, or an unknown layout)."""


class StoreCorruptError(ValueError):
    """The store file is not a readable SQLite database (garbled, truncated, not a database)."""


class ReadOnlyStoreError(PermissionError):
    """A write was attempted on a store opened read-only."""


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables(conn)}


def check_schema(conn: sqlite3.Connection, path: Path, *, readonly: bool) -> bool:
    """Refuse a newer or unknown layout; True if a writable store needs :func:`migrate`."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreVersionError(
            f"run store {path} has schema version {version}, newer than this bnlab reads "
            f"(up to {SCHEMA_VERSION}); upgrade bnlab, or use another --runs-dir"
        )
    if version == SCHEMA_VERSION and (readonly or set(REQUIRED) <= tables(conn)):
        return False
    found = columns(conn)
    # a store of an earlier bnlab (or one missing a table): ours only if the columns it has are
    for table, needed in REQUIRED.items():
        lacking = [c for c in needed if table in found and c not in found[table]]
        if lacking:
            raise StoreVersionError(
                f"run store {path} has an unknown layout (table {table} lacks {', '.join(lacking)}); "
                "it was not written by bnlab, or by a version this one cannot read -- use another --runs-dir"
            )
    return not readonly  # a read-only store is read as it is (queries default missing columns)


def migrate(conn: sqlite3.Connection) -> None:
    """Inside the caller's write transaction: version 0 -> 1 (add missing optional columns, stamp
    the version), and (re)create missing tables (a new store, or a table dropped by accident)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:  # not done meanwhile
        found = columns(conn)
        for table, added in ADDABLE.items():
            for column, decl in added.items():
                if table in found and column not in found[table]:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
    for statement in TABLES.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _writable(path: Path) -> bool:
    """Can this process write the store file and its folder (SQLite needs both, for the WAL)?"""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. With no write-ahead log beside the file (a store whose writers all
    closed) ``immutable=1``: nothing at all is written, not even a WAL index. With one (a writer
    is active or was killed) ``mode=ro``, which reads the log's rows; where the WAL index cannot
    be created (a folder we cannot write) that fails and ``immutable=1`` reads the file alone."""
    base = "file:" + urllib.parse.quote(str(path.resolve()))
    if Path(f"{path}-wal").exists():
        try:
            conn = sqlite3.connect(f"{base}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            pass
    return sqlite3.connect(f"{base}?immutable=1", uri=True)
