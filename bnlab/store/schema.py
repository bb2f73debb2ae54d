"""The run store's layout, its version, and how a store file is opened (see :mod:`bnlab.store`).

The layout's version is kept in SQLite's ``PRAGMA user_version``. Version 0 is an unversioned
store of an earlier bnlab, version 1 one without the entries' stored outcomes
(``experiments.outcome``): read if it has the columns a store needs, migrated (missing optional
columns added with their defaults, the version stamped) on the first writable open. A newer
version, or a file whose tables lack those columns, is refused with :class:`StoreVersionError`
naming what it found, never misread.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import urllib.parse
from pathlib import Path

from bnlab.store.run_files import RunDirError, umask

#: Version of the layout below, stored in ``PRAGMA user_version``.
SCHEMA_VERSION = 2
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
    tiny INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, seconds REAL, outcome TEXT,
    PRIMARY KEY (id, preset)
);
"""

# Columns a store must have to be read at all, and those an older layout may lack (added with
# their defaults by the migration from an earlier version).
REQUIRED = {"runs": ("id", "config", "status", "created"),
            "metrics": ("run_id", "step", "name", "value")}
ADDABLE = {
    "runs": {
        "config_hash": "TEXT NOT NULL DEFAULT ''",
        "updated": "REAL NOT NULL DEFAULT 0",
        "finished": "REAL",
        "env": "TEXT",
        "steps": "INTEGER NOT NULL DEFAULT 0",
        "error": "TEXT",
        "summary": "TEXT",
    },
    # version 2: the entry's analysed outcome with its verdict as data (NULL until analysed)
    "experiments": {"outcome": "TEXT"},
}


class StoreVersionError(ValueError):
    """The store was written by a bnlab this version cannot read (newer, or an unknown layout)."""


class StoreCorruptError(ValueError):
    """The store file is not a readable SQLite database (garbled, truncated, not a database)."""


class ReadOnlyStoreError(RunDirError, PermissionError):
    """A write was attempted on a store opened read-only."""


def refuse_empty(path: Path) -> None:
    """A 0-byte file where the store should be is no store (bnlab creates its stores complete,
    :func:`create_atomically`): refused, never filled with our tables."""
    try:
        empty = path.stat().st_size == 0
    except OSError:
        return
    if empty:
        raise StoreCorruptError(
            f"run store {path} is an empty (0-byte) file, not a bnlab run store (a copy cut "
            "short, or a file created by something else); move it away to start a new store "
            "there, or pass another --runs-dir"
        )


def create_atomically(path: Path) -> None:
    """A new store, complete with its tables and version, appears at ``path`` in one step (built
    beside it, then hard-linked into place; a store another process created meanwhile is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.executescript(TABLES)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
        finally:
            conn.close()
        os.chmod(tmp, 0o666 & ~umask())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: theirs is complete too
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(tmp, path)
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def quick_check(conn: sqlite3.Connection, path: Path) -> None:
    """``PRAGMA quick_check`` at open: a damaged page or index is :class:`StoreCorruptError` naming
    the file, before any query misreads it."""
    found = [r[0] for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
    if found != ["ok"]:
        raise sqlite3.DatabaseError(f"quick_check: {'; '.join(found)[:300]}")


def _expected_columns() -> dict[str, dict[str, tuple]]:
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES)
        return {t: _table_info(mem, t) for t in tables(mem)}
    finally:
        mem.close()


def _table_info(conn: sqlite3.Connection, table: str) -> dict[str, tuple]:
    """``{column: (declared type, not null, primary-key position)}``."""
    rows = conn.execute(f"PRAGMA table_info({table})")
    return {r[1]: (str(r[2]).upper(), r[3], r[5]) for r in rows}


def check_content(conn: sqlite3.Connection, path: Path) -> None:
    """The layout by content, not only ``user_version``: our tables with our columns (same names,
    types and keys; no NOT NULL we do not write), and no trigger or view bnlab did not create
    (a trigger could swallow inserts)."""
    extra = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')").fetchall()
    problems = [f"a {kind} {name!r} bnlab did not create" for kind, name in extra]
    found = {t: _table_info(conn, t) for t in tables(conn)}
    for table, columns_ in _expected_columns().items():
        have = found.get(table)
        if have is None:
            continue  # a missing table is re-created by migrate (a writable store)
        if set(have) != set(columns_):
            odd = sorted(set(have) ^ set(columns_))
            problems.append(f"table {table} has other columns ({', '.join(odd)})")
            continue
        for name, (kind, notnull, pk) in columns_.items():
            if have[name][0] != kind or have[name][2] != pk or (have[name][1] and not notnull):
                problems.append(f"column {table}.{name} is declared differently")
    if problems:
        raise StoreVersionError(
            f"run store {path} has schema version {SCHEMA_VERSION} but not its layout: "
            f"{'; '.join(problems[:3])}. It was altered by something other than bnlab; copy "
            "the runs you need elsewhere, or use another --runs-dir"
        )


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
    if version == SCHEMA_VERSION:
        check_content(conn, path)
        missing = set(REQUIRED) - tables(conn)
        if missing and readonly:
            raise StoreVersionError(
                f"run store {path} lacks table {', '.join(sorted(missing))} (dropped?); open it "
                "from a writable folder to re-create it, then re-run the runs' configs to "
                "re-create their rows"
            )
        return bool(missing) and not readonly
    found = columns(conn)
    if not found or "runs" not in found:
        raise StoreVersionError(
            f"{path} is not a bnlab run store (tables: {', '.join(sorted(found)) or 'none'}); "
            "bnlab adds nothing to a database it did not create -- pass another --runs-dir"
        )
    # a store of an earlier bnlab (or one missing a table): ours only if the columns it has are
    for table, needed in REQUIRED.items():
        lacking = [c for c in needed if table in found and c not in found[table]]
        if lacking:
            raise StoreVersionError(
                f"run store {path} has an unknown layout (table {table} lacks "
                f"{', '.join(lacking)}); it was not written by bnlab, or by a version this one "
                "cannot read -- use another --runs-dir"
            )
    return not readonly  # a read-only store is read as it is (queries default missing columns)


def migrate(conn: sqlite3.Connection) -> None:
    """Inside the caller's write transaction: an earlier version (0: unversioned, 1: without
    ``experiments.outcome``) to this one (add the missing optional columns with their defaults,
    stamp the version), and (re)create missing tables (a new store, or one dropped by accident)."""
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


def writable(path: Path) -> bool:
    """Can this process write the store file and its folder (SQLite needs both, for the WAL)?"""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def open_readonly(path: Path) -> sqlite3.Connection:
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
