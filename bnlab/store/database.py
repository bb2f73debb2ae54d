"""Durable record of training runs: a SQLite database shared by every process that trains.

One file (default ``runs/bnlab.db``) holds three tables::

    runs(id, config, config_hash, status, created, updated, finished, env, steps, error, summary)
    metrics(run_id, step, name, value)
    experiments(id, preset, runs, data, tiny, created, seconds)   -- catalogue entries' results

``config``, ``env`` and ``summary`` are JSON text; times are UNIX seconds (float). Status is one of
``running``, ``finished``, ``diverged``, ``failed`` or ``interrupted``. ``steps`` follows a
running run: every flush of its metric rows raises it to the last step logged.

Several processes may write at once (a learning-rate sweep launched as separate jobs): the database
runs in WAL mode so readers never block the writer, every write is a short ``BEGIN IMMEDIATE``
transaction (the write lock is taken up front, so two writers cannot deadlock upgrading a read
lock), ``busy_timeout`` makes a writer wait for the lock instead of failing, and a bounded retry
loop covers the rare ``database is locked`` that SQLite still reports under heavy contention.

Durability: ``synchronous=FULL`` (every commit is on disk before it returns), and
:meth:`Store.sync_rows`, called at each training checkpoint, copies the write-ahead log into the
database file and returns the run's rows so the checkpoint can carry them; on resume
:meth:`Store.check_rows_up_to` re-creates any row the store lost (a deleted or garbled WAL, a
dropped table). The schema is versioned (``PRAGMA user_version``): an unversioned store of an
earlier bnlab is migrated, a newer or unknown one refused with a message, never misread. A store
in a folder this process cannot write (a shared results folder) opens read-only.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# strict JSON (a diverged loss is null) for every column and export
from bnlab.jsonsafe import dumps
from bnlab.store.entries import EntriesMixin
from bnlab.store.integrity import IntegrityMixin, StoreIntegrityError
from bnlab.store.metrics import MetricsMixin
from bnlab.store.run_files import (
    RunLock, check_run_id, disk_full, lock_path, remove_checkpoint_files,
)
from bnlab.store.schema import (
    BUSY_TIMEOUT_MS,
    ReadOnlyStoreError,
    StoreCorruptError,
    check_schema,
    create_atomically,
    migrate,
    open_readonly,
    quick_check,
    refuse_empty,
    writable,
)

STATUSES = ("running", "finished", "diverged", "failed", "interrupted")

_LOCK_RETRIES = 50


class Store(IntegrityMixin, MetricsMixin, EntriesMixin):
    """A run store backed by the SQLite file at ``path``.

    ``readonly``: ``None`` (default) opens read-only when the file exists and this process cannot
    write it or its folder, else read-write (creating the file and folder if missing); ``True``
    forces read-only (the file must exist; nothing is ever written, not even the WAL index),
    ``False`` forces read-write. Each ``Store`` owns one connection; open one per process
    (connections must not cross a ``fork``). All methods are safe to call from several processes on
    the same file.
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool | None = None):
        self.path = Path(path)
        self._rows_verified = {}
        if readonly is None:
            readonly = self.path.exists() and not writable(self.path)
        self.readonly = bool(readonly)
        if self.readonly and not self.path.exists():
            raise FileNotFoundError(f"no run store at {self.path}")
        refuse_empty(self.path)  # a 0-byte file is no store (ours are never created empty)
        try:
            if not self.readonly and not self.path.exists():
                self._create()
            self._conn = open_readonly(self.path) if self.readonly else self._open_writable()
            self._conn.row_factory = sqlite3.Row
            quick_check(self._conn, self.path)
            self._check_schema()
            # only once the file is known to be ours (a foreign one: as it was)
            if not self.readonly:
                self._retry(lambda: self._conn.execute("PRAGMA journal_mode=WAL").fetchone())
        except sqlite3.DatabaseError as err:
            self.close()
            if isinstance(err, sqlite3.OperationalError) and "malformed" not in str(err):
                full = disk_full(err, self.path, "the run store")
                if full is not None:  # the file and the way out, as every write says
                    raise full from None
                raise  # locked, unable to open: as they are (the CLI words them)
            raise StoreCorruptError(
                f"run store {self.path} is damaged ({err}). Its runs' checkpoints carry their "
                "rows: move the file away and re-run each run's config (or `bnlab reproduce`) -- "
                "every run with a checkpoint is rebuilt from it without retraining what it had done"
            ) from None
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        """A new store, complete with its tables, or none at all (:func:`create_atomically`)."""
        try:
            create_atomically(self.path)
        except (OSError, sqlite3.OperationalError) as err:
            full = disk_full(err, self.path, "a new run store")
            if full is not None:
                raise full from None
            why = getattr(err, "strerror", None) or err
            raise ReadOnlyStoreError(f"cannot create the run store {self.path} ({why}); its "
                                     "folder is not writable: pass another --runs-dir") from None

    def _open_writable(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so that each write is one
        # explicit IMMEDIATE transaction.
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # FULL: a commit is on disk (WAL fsynced) before it returns, so a crash -- of the
        # process or of the machine -- never loses a row the trainer believes stored.
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    # -- plumbing ----------------------------------------------------------------------------

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_schema(self) -> None:
        """Refuse a newer or unknown layout; create or migrate ours (writable stores only)."""
        if check_schema(self._conn, self.path, readonly=self.readonly):
            self._write(lambda c: migrate(c))

    @staticmethod
    def _retry(fn):
        for attempt in range(_LOCK_RETRIES):
            try:
                return fn()
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err):
                    raise
                if attempt == _LOCK_RETRIES - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        return None  # pragma: no cover

    def _write(self, fn):
        """Run ``fn(conn)`` inside one IMMEDIATE transaction, retrying if the lock is contended."""
        if self.readonly:
            raise ReadOnlyStoreError(
                f"run store {self.path} is open read-only (its folder or file is not writable); "
                f"train into another --runs-dir"
            )

        def attempt():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return result

        try:
            return self._retry(attempt)
        except sqlite3.OperationalError as err:
            full = disk_full(err, self.path, "the run store")
            if full is not None:
                raise full from None
            if "readonly" in str(err):
                raise ReadOnlyStoreError(f"run store {self.path} cannot be written ({err}); "
                                         "train into another --runs-dir") from None
            raise

    # -- runs ----------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        config: Mapping[str, Any],
        *,
        config_hash: str | None = None,
        env: Mapping[str, Any] | None = None,
        status: str = "running",
    ) -> str:
        """Insert a run; if a run with this id already exists it is left untouched. Returns the
        id."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; valid: {', '.join(STATUSES)}")
        check_run_id(run_id)
        now = time.time()
        self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO runs(id, config, config_hash, status, created, updated, env)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    dumps(dict(config), sort_keys=True),
                    config_hash or run_id,
                    status,
                    now,
                    now,
                    dumps(dict(env or {}), sort_keys=True),
                ),
            )
        )
        return run_id

    def set_status(
        self,
        run_id: str,
        status: str,
        *,
        steps: int | None = None,
        error: str | None = None,
        summary: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        rows: list[tuple[int, str, float | None]] | None = None,
    ) -> None:
        """Update a run's status (and optionally its step count, error text, summary, env).

        ``finished`` time is set when the status is terminal (finished/diverged/failed/interrupted)
        and cleared when a run goes back to ``running`` (a resumed run). An ended run
        (``finished``/``diverged``) is sealed in the same transaction
        (:mod:`bnlab.store.integrity`): with ``rows`` -- the rows the trainer kept in memory -- the
        stored rows are first made equal to them (re-created if the store lost any), and a store
        that still does not hold them is :class:`StoreIntegrityError`; without, the rows as stored
        are sealed.
        """
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; valid: {', '.join(STATUSES)}")
        now = time.time()
        sets = ["status = ?", "updated = ?", "finished = ?", "error = ?"]
        args: list[Any] = [status, now, None if status == "running" else now, error]
        if steps is not None:
            sets.append("steps = ?")
            args.append(int(steps))
        if env is not None:
            sets.append("env = ?")
            args.append(dumps(dict(env), sort_keys=True))
        args.append(run_id)

        def update(c):
            cur = c.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", args)
            if cur.rowcount == 0:
                raise KeyError(f"no run with id {run_id!r} in {self.path}")
            self._set_summary(c, run_id, status, summary, rows)

        self._write(update)

    def set_steps(self, run_id: str, steps: int) -> None:
        """Progress of a running run (``runs list`` shows it)."""
        self._write(
            lambda c: c.execute(
                "UPDATE runs SET steps = ?, updated = ? WHERE id = ?",
                (int(steps), time.time(), run_id)
            )
        )

    def get_run(self, run_id: str, *, verify: bool = True) -> dict[str, Any] | None:
        """The run as a dict (JSON columns decoded), or None. A unique id prefix is accepted.

        ``verify``: an ended run is checked against its seal and a damaged record (changed config,
        summary or rows; undecodable JSON; an invalid id) is :class:`StoreIntegrityError` naming
        the run, this file and the recovery. ``verify=False`` returns what is there (``problem``
        then says what is wrong, or is None): ``runs delete`` must reach a damaged run."""
        rows = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchall()
        if not rows:
            rows = self._conn.execute(
                "SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' LIMIT 2",
                (run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
            ).fetchall()
            if len(rows) > 1:
                raise ValueError(f"run id prefix {run_id!r} is ambiguous; give more characters")
        if not rows:
            return None
        run = self._checked(rows[0])
        if verify and run["problem"]:
            raise StoreIntegrityError(run["problem"])
        return run

    def list_runs(self, *, status: str | None = None,
                  limit: int | None = None) -> list[dict[str, Any]]:
        """Runs, newest first, optionally only those with ``status``. Each is verified as by
        :meth:`get_run`; a damaged one is listed with ``problem`` set (one bad row never hides
        the others)."""
        query = "SELECT * FROM runs"
        args: list[Any] = []
        if status is not None:
            if status not in STATUSES:
                raise ValueError(f"unknown status {status!r}; valid: {', '.join(STATUSES)}")
            query += " WHERE status = ?"
            args.append(status)
        query += " ORDER BY created DESC, id"
        if limit is not None:
            query += " LIMIT ?"
            args.append(int(limit))
        return [self._checked(r) for r in self._conn.execute(query, args).fetchall()]

    def delete_run(self, run_id: str, *, checkpoints: bool = True) -> dict[str, Any]:
        """Remove a run: its row, its metric rows and (``checkpoints``) its checkpoint files.

        ``run_id`` is the full id. Refused with ``RunLockedError`` while another process trains
        the run. Returns ``{"id", "metrics": rows deleted, "files": [paths removed]}``; a run
        that is not stored is ``KeyError``.
        """
        runs_dir = self.path.parent
        check_run_id(run_id, str(self.path))  # its files are named after it: never outside
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise KeyError(f"no run with id {run_id!r} in {self.path}")
        # hold the run's lock while deleting, so a trainer cannot start (or be) in the middle
        with RunLock(lock_path(runs_dir, run_id)):

            def delete(c):
                rows = c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,)).rowcount
                c.execute("DELETE FROM runs WHERE id = ?", (run_id,))
                return rows

            rows = self._write(delete)
            removed = remove_checkpoint_files(runs_dir, run_id) if checkpoints else []
            files = [str(p) for p in removed if p != lock_path(runs_dir, run_id)]
        return {"id": run_id, "metrics": rows, "files": files}

    # -- metrics -------------------------------------------------------------------------------
