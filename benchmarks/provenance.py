"""When and at which code a benchmark ran: every results file records a ``date`` and a ``commit``.

A stored measurement is dated by these two fields, never by its file name: a later run of the same
measurement replaces the file (``benchmarks/tables.py`` renders the docs' tables from them).
"""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def provenance() -> dict:
    """``{"date": "YYYY-MM-DD", "time_utc": "HH:MM", "commit": short hash}`` (date and time in UTC:
    they order two runs of one measurement on a day); the commit ends in ``+dirty`` when
    the tree had uncommitted changes (the code measured is then not exactly that commit), and is
    ``"unknown"`` outside a git checkout."""
    now = datetime.datetime.now(datetime.timezone.utc)
    when = {"date": now.date().isoformat(), "time_utc": now.strftime("%H:%M")}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {**when, "commit": "unknown"}
    return {**when, "commit": commit + ("+dirty" if dirty else "")}
