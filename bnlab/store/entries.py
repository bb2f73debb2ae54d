"""The catalogue's results in the run store: the ``experiments`` table, as methods of
:class:`bnlab.store.Store` (one access path: its busy timeout, retries, version check, read-only
opening). For each (entry, preset): the run ids by label with their factors, the JSON data of
the entry's computations and, once analysed, its outcome (verdict as data, summary, table, figures;
:meth:`EntriesMixin.save_outcome`), which a new :meth:`EntriesMixin.save_entry` of the same entry
clears.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bnlab.store.integrity import StoreIntegrityError
from bnlab.store.schema import columns, tables


class EntriesMixin:
    """``save_entry``/``load_entry``/``entries``/``entry_of_runs``; needs ``_conn``, ``_write`` and
    ``path``."""

    def save_entry(
        self, experiment_id: str, preset: str, runs: list[dict], data: dict, *, tiny: bool,
        seconds: float, default: Any = None,
    ) -> None:
        """Store (replace) a catalogue entry's run ids by label and its computations' JSON data."""
        row = (experiment_id, preset, json.dumps(runs), json.dumps(data, default=default),
               int(tiny), time.time(), seconds)
        self._write(lambda c: c.execute(
            "INSERT OR REPLACE INTO experiments(id, preset, runs, data, tiny, created, seconds)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)", row))

    def save_outcome(self, experiment_id: str, preset: str, outcome: dict) -> bool:
        """Store the analysed outcome of a stored entry (JSON-able: its verdict as data, summary,
        table, figures and what it was analysed from); False when the entry is not stored (a
        new :meth:`save_entry` replaced it meanwhile, or it never was)."""
        text = json.dumps(outcome)
        return bool(self._write(lambda c: c.execute(
            "UPDATE experiments SET outcome = ? WHERE id = ? AND preset = ?",
            (text, experiment_id, preset)).rowcount))

    def load_entry(self, experiment_id: str, preset: str) -> dict[str, Any] | None:
        """The stored entry: ``runs``, ``data``, ``tiny``, ``created``, ``seconds`` and
        ``outcome`` (None until analysed, and in a read-only store of an earlier layout)."""
        if "experiments" not in self._tables():
            return None
        has_outcome = "outcome" in columns(self._conn).get("experiments", [])
        row = self._conn.execute(
            "SELECT runs, data, tiny, created, seconds, "
            f"{'outcome' if has_outcome else 'NULL'} FROM experiments "
            "WHERE id = ? AND preset = ?",
            (experiment_id, preset),
        ).fetchone()
        if row is None:
            return None
        try:
            runs, data = json.loads(row[0]), json.loads(row[1])
        except (ValueError, TypeError) as err:
            raise StoreIntegrityError(
                f"catalogue entry {experiment_id} ({preset}) in {self.path} is damaged ({err}); "
                f"re-run `bnlab reproduce {experiment_id} --preset {preset}` (its finished runs "
                "are not retrained)"
            ) from None
        return {"runs": runs, "data": data, "tiny": bool(row[2]), "created": row[3],
                "seconds": row[4], "outcome": _outcome(row[5])}

    def entries(self) -> list[tuple[str, str]]:
        """``(experiment id, preset)`` of every stored entry."""
        if "experiments" not in self._tables():
            return []
        rows = self._conn.execute("SELECT id, preset FROM experiments ORDER BY id, preset")
        return [(r[0], r[1]) for r in rows]

    def entry_of_runs(self) -> dict[str, str]:
        """``{run id: "entry/preset:label"}`` for the runs of stored catalogue entries."""
        out: dict[str, str] = {}
        for experiment_id, preset in self.entries():
            try:
                entry = self.load_entry(experiment_id, preset) or {}
            except StoreIntegrityError:
                continue  # a damaged entry never hides the runs (`bnlab report` names it)
            for r in entry.get("runs", []) if isinstance(entry.get("runs"), list) else []:
                if isinstance(r, dict) and r.get("id"):
                    out.setdefault(r["id"], f"{experiment_id}/{preset}:{r.get('label')}")
        return out

    def _tables(self) -> set[str]:
        return tables(self._conn)


def _outcome(text: str | None) -> dict | None:
    """A stored outcome, or None: an unreadable one is not evidence (the entry is analysed again
    from its runs, which the seals check), so it never makes the entry unreadable."""
    try:
        outcome = json.loads(text) if text is not None else None
    except (ValueError, TypeError):
        return None
    return outcome if isinstance(outcome, dict) else None
