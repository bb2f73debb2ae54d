"""End-to-end integrity of an ended run's record: a seal of its config, summary and metric rows.

SQLite's own checks (``PRAGMA quick_check``) find a damaged page, not a changed value: one flipped
bit in a stored metric, a config digit edited on disk, rows deleted or a table dropped all leave a
valid database. So when a run ends (``finished`` or ``diverged``) its record gets a *seal*: SHA-256
digests of the config text as stored, of the summary (final metrics) and of its metric rows, with
the row count. Every read of an ended run (``runs show/list/export``, ``bnlab report``, the
catalogue's analysis, ``train``'s "already finished" answer) recomputes them and, on a mismatch,
raises :class:`StoreIntegrityError` naming the run, the store file, what differs and the way out.
The metric rows, most of a read's cost, are hashed once per open store while the store is
unchanged (:meth:`IntegrityMixin._seal_problems`).

The trainer seals with the rows it kept in memory (never read back from the store), so a store
that silently drops inserts (a trigger, a lost write-ahead log) cannot bless its own loss. A run of
an earlier bnlab carries no seal and is read as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from bnlab.jsonsafe import dumps
from bnlab.store.run_files import UnsafePathError, check_run_id
from bnlab.store.metrics import sql_float

SEALED = ("finished", "diverged")
SEAL_KEY = "seal"


class StoreIntegrityError(ValueError):
    """An ended run's stored config, summary or metric rows no longer match its seal."""


# a run's rows in the canonical order, sorted by SQLite (NULL first, then numbers ascending)
ROWS_QUERY = "SELECT step, name, value FROM metrics WHERE run_id = ? ORDER BY step, name, value"


def rows_digest(
    rows: Iterable[tuple[int, str, float | None]], *, ordered: bool = False
) -> tuple[str, int]:
    """SHA-256 of ``(step, name, value)`` rows in a canonical order, and their count. NaN and
    ``None`` are one value (SQLite stores NaN as NULL), as are -0.0 and 0.0. ``ordered``: the rows
    come from :data:`ROWS_QUERY` already in that order (no sort in Python)."""
    canon = [
        (int(s), str(n), None if v is None or v != v else (float(v) or 0.0)) for s, n, v in rows
    ]
    if not ordered:
        canon.sort(key=_order)
    return hashlib.sha256(repr(canon).encode()).hexdigest(), len(canon)


def _order(row: tuple[int, str, float | None]) -> tuple:
    return row[0], row[1], row[2] is not None, row[2] or 0.0


def text_digest(text: str | None) -> str:
    return hashlib.sha256((text or "").encode()).hexdigest()


def summary_digest(summary: dict[str, Any] | None) -> str:
    """Of the summary without its seal, canonically (sorted keys, strict JSON)."""
    body = {k: v for k, v in (summary or {}).items() if k != SEAL_KEY}
    return text_digest(json.dumps(body, sort_keys=True, allow_nan=False))


def make_seal(
    config_text: str, summary: dict[str, Any] | None, rows: Iterable[tuple[int, str, float | None]]
) -> dict[str, Any]:
    digest, count = rows_digest(rows)
    return {
        "version": 1,
        "config": text_digest(config_text),
        "summary": summary_digest(summary),
        "rows": digest,
        "rows_count": count,
    }


def seal_problems(
    seal: dict[str, Any],
    config_text: str,
    summary: dict[str, Any] | None,
    rows: Iterable[tuple[int, str, float | None]] | None,
    *,
    ordered: bool = False,
) -> list[str]:
    """What no longer matches ``seal`` (empty when everything does); ``rows`` None: the rows are
    known to match (verified on this connection since the store last changed)."""
    problems = []
    if seal.get("config") != text_digest(config_text):
        problems.append("its config was changed")
    if seal.get("summary") != summary_digest(summary):
        problems.append("its final metrics (summary) were changed")
    if rows is None:
        return problems
    digest, count = rows_digest(rows, ordered=ordered)
    if seal.get("rows") != digest:
        expected = seal.get("rows_count")
        if isinstance(expected, int) and count != expected:
            problems.append(f"its metric rows number {count}, {expected} were sealed")
        else:
            problems.append(f"its {count} metric rows hold changed values")
    return problems


def recovery(run_id: str, status: str, runs_dir: str) -> str:
    """The way out of a damaged record (docs/readme/train.md, "Reliability")."""
    if status == "finished":
        return (
            f"Recovery: `bnlab runs repair {run_id} --runs-dir {runs_dir}` re-creates its config, "
            "summary and metric rows from its final checkpoint "
            f"({runs_dir}/checkpoints/{run_id}.pt; "
            f"re-running its training command does the same); without that checkpoint, "
            f"`bnlab runs delete {run_id}` and train it again"
        )
    return (
        f"Recovery: `bnlab runs delete {run_id} --runs-dir {runs_dir}` and re-run its config "
        f"(a {status} run keeps no final checkpoint to rebuild from)"
    )


class IntegrityMixin:
    """Sealing and verifying runs, as methods of :class:`bnlab.store.Store` (needs ``_conn``,
    ``_write`` and ``path``)."""

    # (run id, the seal's rows digest and count) -> the store's state when the run's rows last
    # matched them (:meth:`_state`)
    _rows_verified: dict[tuple[str, str, str], tuple]

    def _set_summary(
        self,
        c,
        run_id: str,
        status: str,
        summary: Mapping[str, Any] | None,
        rows: list[tuple[int, str, float | None]] | None,
    ) -> None:
        """Inside ``set_status``'s transaction: write the summary, sealed if the run ended."""
        stored = c.execute("SELECT config, summary FROM runs WHERE id = ?", (run_id,)).fetchone()
        if summary is None and status not in SEALED and SEAL_KEY not in (stored[1] or ""):
            return  # nothing to write: the summary as it is, unsealed
        body = (
            json.loads(dumps(dict(summary), sort_keys=True))
            if summary is not None
            else (self._json(stored[1], "summary", run_id) or {})
        )
        body.pop(SEAL_KEY, None)
        if status in SEALED:
            if rows is not None:
                self._make_rows(c, run_id, rows)
            held = c.execute(ROWS_QUERY, (run_id,)).fetchall()
            body[SEAL_KEY] = make_seal(stored[0], body, held)
        c.execute("UPDATE runs SET summary = ? WHERE id = ?", (dumps(body, sort_keys=True), run_id))

    def _make_rows(self, c, run_id: str, rows: list[tuple[int, str, float | None]]) -> None:
        """Make the stored rows of ``run_id`` those of ``rows`` (the trainer's, from memory)."""

        def held():
            return rows_digest(c.execute(ROWS_QUERY, (run_id,)), ordered=True)

        want = rows_digest(rows)
        if held() == want:
            return
        c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
        c.executemany(
            "INSERT INTO metrics(run_id, step, name, value) VALUES (?, ?, ?, ?)",
            [(run_id, int(s), str(n), sql_float(v)) for s, n, v in rows],
        )
        have = held()
        if have != want:
            raise StoreIntegrityError(
                f"run store {self.path} does not keep the metric rows written to it (run {run_id}: "
                f"{have[1]} of {want[1]} rows held after re-writing them; a trigger or another "
                "writer?). Nothing was sealed; the run's checkpoint "
                f"{self.path.parent}/checkpoints/{run_id}.pt "
                "holds its rows: move the store away and re-run the run's config"
            )

    def restore_run(
        self,
        run_id: str,
        config: Mapping[str, Any],
        summary: Mapping[str, Any],
        rows: list[tuple[int, str, float | None]],
        *,
        steps: int,
    ) -> None:
        """Re-write a finished run's config, summary and rows (from its final checkpoint) and seal
        them, in one transaction (``bnlab runs repair``); the row is created if the store lost
        it."""
        check_run_id(run_id)
        text, now = dumps(dict(config), sort_keys=True), time.time()

        def restore(c):
            c.execute(
                "INSERT OR IGNORE INTO runs(id, config, config_hash, status, created, updated)"
                " VALUES (?, ?, ?, 'finished', ?, ?)",
                (run_id, text, run_id, now, now),
            )
            c.execute(
                "UPDATE runs SET config = ?, status = 'finished', steps = ?, error = NULL,"
                " updated = ?,"
                " finished = COALESCE(finished, ?) WHERE id = ?",
                (text, int(steps), now, now, run_id),
            )
            self._set_summary(c, run_id, "finished", summary, rows)

        self._write(restore)

    def _json(self, text: str | None, column: str, run_id: str) -> Any:
        try:
            return json.loads(text) if text else None
        except (ValueError, TypeError) as err:
            raise StoreIntegrityError(f"its {column} is not valid JSON ({err})") from None

    def _checked(self, row: sqlite3.Row) -> dict[str, Any]:
        """The row decoded and verified; ``problem`` is None or the whole message (what, where, how
        to recover). Undecodable columns are left empty."""
        out = dict(row)
        raw = {key: out.get(key) for key in ("config", "env", "summary")}
        problems = []
        for key, text in raw.items():
            try:
                out[key] = self._json(text, key, out["id"])
            except StoreIntegrityError as err:
                out[key], text = None, None
                problems.append(str(err))
            if key != "summary" and out[key] is None:
                out[key] = {}
        try:
            check_run_id(out["id"])
        except UnsafePathError:
            problems.append(
                "its id is not a valid run id (it could name files outside the runs dir)"
            )
        seal = out["summary"].pop(SEAL_KEY, None) if isinstance(out["summary"], dict) else None
        out["seal"] = seal
        if isinstance(seal, dict) and not problems:
            problems += self._seal_problems(out["id"], seal, raw["config"], out["summary"])
        out["problem"] = None
        if problems:
            out["problem"] = (
                f"run {out['id']!r} in {self.path} is damaged: {'; '.join(problems)}. "
                + recovery(str(out["id"]), out["status"], str(self.path.parent))
            )
        return out

    def _seal_problems(self, run_id: str, seal: dict[str, Any], config_text: str | None,
                       summary: dict[str, Any] | None) -> list[str]:
        """:func:`seal_problems` for a stored run. Re-hashing the metric rows is most of a read's
        cost (a report reads each run of every entry, a run shared by entries more than once),
        so rows that matched this seal are not hashed again while :meth:`_state` is unchanged:
        any commit since (this connection's, another process's) or any change of the file
        re-hashes them."""
        key, state = (run_id, str(seal.get("rows")), str(seal.get("rows_count"))), self._state()
        verified = self._rows_verified
        if verified.get(key) == state:
            return seal_problems(seal, config_text or "", summary, None)
        held = self._conn.execute(ROWS_QUERY, (run_id,))
        problems = seal_problems(seal, config_text or "", summary, held, ordered=True)
        if not problems:
            verified[key] = state
        return problems

    def _state(self) -> tuple:
        """What changes whenever the store's content may have: SQLite's count of commits by
        other connections (``PRAGMA data_version``), this connection's changed rows, and the
        size and modification time of the file and its write-ahead log."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        files = []
        for path in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                st = os.stat(path)
                files.append((st.st_size, st.st_mtime_ns, st.st_ino))
            except OSError:
                files.append(None)
        return version, self._conn.total_changes, tuple(files)
