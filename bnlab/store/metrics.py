"""A run's metric rows in the run store: writing, syncing, reading and exporting them, as methods of
:class:`bnlab.store.Store` (one access path: its busy timeout, retries and read-only opening)."""

from __future__ import annotations

import csv
import io
import math
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from bnlab.jsonsafe import dumps
from bnlab.store.run_files import disk_full

EXPORT_FORMATS = ("csv", "json")


class MetricsMixin:
    """``log_metrics``/``log_rows``/``sync_rows``/``metrics``/``export`` and kin; needs ``_conn``,
    ``_write``, ``_retry`` and ``get_run``."""

    def log_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> None:
        """Record several metrics of one step in one transaction (one ``executemany``)."""
        self.log_rows(run_id, ((step, name, value) for name, value in values.items()))

    def log_rows(self, run_id: str, rows: Iterable[tuple[int, str, float | None]]) -> None:
        """Record many ``(step, name, value)`` rows in one transaction (the trainer's buffer flush).

        The run's ``steps`` rises to the last step among them in the same transaction, so
        ``runs list`` shows a running run's progress.
        """
        payload = [(run_id, int(step), str(name), sql_float(value)) for step, name, value in rows]
        if not payload:
            return
        last = max(p[1] for p in payload)

        def insert(c):
            c.executemany("INSERT INTO metrics(run_id, step, name, value) VALUES (?, ?, ?, ?)",
                          payload)
            c.execute(
                "UPDATE runs SET steps = MAX(steps, ?), updated = ? "
                "WHERE id = ? AND status = 'running'",
                (last, time.time(), run_id),
            )

        self._write(insert)

    def sync_rows(self, run_id: str, step: int) -> list[tuple[int, str, float | None]]:
        """At a training checkpoint: move the write-ahead log into the database file and return the
        run's rows up to ``step`` in insertion order (the checkpoint carries them, so a resume can
        re-create rows the store lost). ``value`` is None where it was not finite-or-inf (NaN)."""
        # PASSIVE never waits for other processes; whatever it cannot copy stays in the fsynced WAL
        try:
            self._retry(lambda: self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())
        except sqlite3.OperationalError as err:  # the rows' flush into the file: name it
            full = disk_full(err, self.path, "the metric rows into the run store")
            if full is not None:
                raise full from None
            raise
        return [
            (s, n, v)
            for s, n, v in self._conn.execute(
                "SELECT step, name, value FROM metrics "
                "WHERE run_id = ? AND step <= ? ORDER BY rowid",
                (run_id, int(step)),
            )
        ]

    def check_rows_up_to(
        self, run_id: str, step: int,
        expected: Iterable[tuple[int, str, float | None]] | None = None
    ) -> list[int]:
        """On resume from a checkpoint at ``step``: the steps whose rows the store lacks.

        ``expected`` are the rows the checkpoint carried (:meth:`sync_rows`); any of them missing
        from the store are re-created, so the returned steps are what *was* missing. Without
        ``expected`` (a checkpoint of an earlier bnlab) only a store with no row at all up to a
        step > 0 can be detected: ``[step]`` is returned then, nothing re-created.
        """
        stored = self._conn.execute(
            "SELECT step, name, value FROM metrics WHERE run_id = ? AND step <= ?",
            (run_id, int(step))
        ).fetchall()
        if expected is None:
            return [int(step)] if step > 0 and not stored else []
        expected = [(int(s), str(n), sql_float(v)) for s, n, v in expected]
        have: dict[tuple, int] = {}
        for row in stored:
            key = (row[0], row[1], row[2])
            have[key] = have.get(key, 0) + 1
        missing = []
        for row in expected:
            if have.get(row, 0) > 0:
                have[row] -= 1
            else:
                missing.append(row)
        if missing:
            # replace the run's rows up to the checkpoint with the checkpoint's, in their order
            payload = [(run_id, s, n, v) for s, n, v in expected]

            def replace(c):
                c.execute("DELETE FROM metrics WHERE run_id = ? AND step <= ?", (run_id, int(step)))
                c.executemany("INSERT INTO metrics(run_id, step, name, value) VALUES (?, ?, ?, ?)",
                              payload)

            self._write(replace)
        return sorted({s for s, _, _ in missing})

    def delete_metrics_after(self, run_id: str, step: int) -> int:
        """Drop rows logged after ``step``: a resumed run replays those steps and logs them
        again."""
        return self._write(
            lambda c: c.execute(
                "DELETE FROM metrics WHERE run_id = ? AND step > ?", (run_id, int(step))
            ).rowcount
        )

    def metrics(
        self, run_id: str, names: Iterable[str] | str | None = None
    ) -> dict[str, list[tuple[int, float]]]:
        """``{name: [(step, value), ...]}`` in step order (value is NaN where it was not finite)."""
        query = "SELECT step, name, value FROM metrics WHERE run_id = ?"
        args: list[Any] = [run_id]
        if isinstance(names, str):
            names = [names]
        if names is not None:
            names = list(names)
            query += f" AND name IN ({', '.join('?' * len(names))})"
            args.extend(names)
        query += " ORDER BY name, step, rowid"
        out: dict[str, list[tuple[int, float]]] = {}
        for step, name, value in self._conn.execute(query, args):
            out.setdefault(name, []).append((step, math.nan if value is None else value))
        return out

    def metric_names(self, run_id: str) -> list[str]:
        """The names of the series recorded for a run, sorted."""
        return [r[0] for r in self._conn.execute(
            "SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name", (run_id,)
        )]

    def count_metrics(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
        return self._conn.execute(
            "SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run_id,)
        ).fetchone()[0]

    # -- export --------------------------------------------------------------------------------

    def export(self, run_id: str, fmt: str = "json") -> str:
        """The run and its metrics as text: ``json`` (one object) or ``csv`` (step,name,value
        rows)."""
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(EXPORT_FORMATS)}")
        run = self.get_run(run_id)
        if run is None:
            raise KeyError(f"no run with id {run_id!r} in {self.path}")
        metrics = self.metrics(run["id"])
        if fmt == "json":
            run["metrics"] = {name: [[s, v] for s, v in rows] for name, rows in metrics.items()}
            return dumps(run, indent=2, sort_keys=True)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["run_id", "step", "name", "value"])
        flat = sorted(
            ((s, name, v) for name, rows in metrics.items() for s, v in rows),
            key=lambda r: (r[0], r[1]),
        )
        for step, name, value in flat:
            writer.writerow([run["id"], step, name, repr(float(value))])
        return buf.getvalue()


def sql_float(value: Any) -> float | None:
    """SQLite turns NaN into NULL on its own; do it explicitly (and accept 0-d tensors)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    value = float(value)
    return None if math.isnan(value) else value

