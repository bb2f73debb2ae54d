"""An entry's analysed outcome stored with its runs, so that it is analysed once.

``bnlab reproduce`` analyses an entry when its runs are stored; the report, the README builder and
``bnlab experiments show ID --json`` then read that outcome (its verdict as data,
:class:`~bnlab.experiments.verdict_data.Verdict`, its summary, table and figures) instead of
analysing it again. A stored outcome is used only while it is what an analysis would give now: it
carries a fingerprint of what it was analysed from (each run's id, status, steps and final metrics,
and the source of the bnlab that analysed it); a run that changed since, a new save of the entry
(which clears the outcome) or another bnlab's code makes it stale, and the entry is analysed again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bnlab.jsonsafe import jsonable

from .base import Outcome
from .verdict_data import Verdict

#: Version of a stored outcome's layout (beside :data:`verdict_data.VERDICT_SCHEMA`).
OUTCOME_SCHEMA = 1
_PACKAGE = Path(__file__).resolve().parents[1]
_SOURCE_DIGEST: list[str] = []


def source_digest() -> str:
    """SHA-256 over the source of the installed bnlab package (once per process): an outcome
    analysed by other code is stale."""
    if not _SOURCE_DIGEST:
        digest = hashlib.sha256()
        for path in sorted(_PACKAGE.rglob("*.py")):
            digest.update(path.relative_to(_PACKAGE).as_posix().encode())
            digest.update(path.read_bytes())
        _SOURCE_DIGEST.append(digest.hexdigest())
    return _SOURCE_DIGEST[0]


def fingerprint(ctx) -> str:
    """What an outcome of ``ctx`` (an :class:`~bnlab.experiments.views.AnalysisContext`) was
    analysed from: its runs (id, status, steps, final metrics), preset, tiny flag, the entry's
    computed data and :func:`source_digest`."""
    runs = [[r.label, r.id, r.status, r.record.get("steps"), r.record.get("metrics")]
            for r in ctx.runs]
    text = json.dumps([ctx.experiment.id, ctx.preset, bool(ctx.tiny), runs, ctx.data,
                       source_digest()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def to_stored(outcome: Outcome, ctx) -> dict[str, Any]:
    """The JSON-able form of ``outcome`` kept in the store (``Store.save_outcome``)."""
    record = outcome.record or Verdict.text_only(outcome.verdict, "")
    return {"schema": OUTCOME_SCHEMA, "fingerprint": fingerprint(ctx),
            "verdict": outcome.verdict, "summary": outcome.summary,
            "record": jsonable(record.to_dict(), nonfinite="keep"),
            "table": jsonable(outcome.table, nonfinite="keep", objects=True),
            "figures": [str(f) for f in outcome.figures]}


def from_stored(stored: dict[str, Any] | None, ctx, *, figures: bool = True) -> Outcome | None:
    """The stored outcome of ``ctx``'s entry when it is current (same :func:`fingerprint`, a
    layout this bnlab reads, and — with ``figures`` — every figure still on disk where ``ctx``
    draws them); None otherwise (analyse it again)."""
    if not stored or stored.get("schema") != OUTCOME_SCHEMA:
        return None
    if stored.get("fingerprint") != fingerprint(ctx):
        return None
    paths = [Path(f) for f in stored.get("figures") or []]
    where = ctx.out_dir.resolve()
    if figures and not all(p.is_file() and where in p.resolve().parents for p in paths):
        return None
    try:
        record = Verdict.from_dict(stored["record"])
    except (KeyError, TypeError, ValueError):
        return None
    return Outcome(paths, list(stored.get("table") or []), stored["verdict"], stored["summary"],
                   record)


def analysed(ctx, store, *, figures: bool = True) -> Outcome:
    """``ctx``'s entry's outcome: the stored one when current (:func:`from_stored`), else
    analysed now and stored (where the store is writable)."""
    saved = store.load_entry(ctx.experiment.id, ctx.preset) or {}
    outcome = from_stored(saved.get("outcome"), ctx, figures=figures)
    if outcome is not None:
        return outcome
    outcome = ctx.experiment.outcome(ctx)
    if not store.readonly:
        store.save_outcome(ctx.experiment.id, ctx.preset, to_stored(outcome, ctx))
    return outcome
